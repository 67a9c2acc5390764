"""`dp2ddp rewrite`: turn DataParallel scripts into DistributedDataParallel scripts.

Never imports torch. All files are migrated in memory first; if any input is bad (missing,
undecodable, syntax error) nothing at all is written and the exit code is 2.
"""

from __future__ import annotations

import difflib
import json
import os
import sys
from typing import List

import click

from dp2ddp.cli import EXIT_FINDINGS as EXIT_NOT_MIGRATED
from dp2ddp.cli import EXIT_OK, EXIT_USAGE
from dp2ddp.source import STDIN, InputError, atomic_write, display_path, iter_python_files, read_source


def default_output(path: str) -> str:
    root, ext = os.path.splitext(path)
    return f"{root}_ddp{ext or '.py'}"


def _fmt(display: str, f) -> str:
    return f"{display}:{f.line}:{f.col + 1}: {f.code} {f.message}"


@click.command("rewrite", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("paths", nargs=-1, required=True, metavar="PATH...")
@click.option("-o", "--output", metavar="OUT", help="Write the migrated script here (one input only; '-' for stdout).")
@click.option("--in-place", "-i", is_flag=True, help="Overwrite the inputs.")
@click.option("--diff", "show_diff", is_flag=True, help="Print a unified diff and write nothing.")
@click.option(
    "--keep-batch-size",
    is_flag=True,
    help="Each rank takes whole batches of the original size, and num_workers is kept per process (default: each rank "
    "takes its share of every batch, keeping DataParallel's global batch).",
)
@click.option(
    "--shard-eval",
    is_flag=True,
    help="Shard evaluation loops over the script's evaluation DataLoaders by whole batches where what they compute "
    "is sums (correct += ..., a summed loss), put together after the loop exactly as the original added them "
    "(default: every rank evaluates the whole set).",
)
@click.option(
    "--accept",
    "accept",
    multiple=True,
    metavar="CODE[,CODE]",
    help="Take the named risk: a refusal with this code (e.g. DDP105) no longer stops the migration; the output "
    "carries a '# dp2ddp: accepted CODE' comment at the spot.",
)
@click.option(
    "--with-helpers",
    is_flag=True,
    help="Migrate the script and the project modules it imports that use DataParallel, as one plan (with "
    "--in-place, --diff, or -o DIR: a copy of the project with the migration).",
)
@click.option("--print-all-ranks", is_flag=True, help="Keep print() on every rank (default: rank 0 only).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True, help="Summary format.")
@click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors.")
def rewrite(paths, output, in_place, show_diff, keep_batch_size, shard_eval, accept, with_helpers, print_all_ranks, fmt, quiet) -> int:
    """Rewrite DataParallel scripts into DistributedDataParallel scripts.

    By default each PATH is written to <stem>_ddp.py beside it. Directories are searched
    for *.py files; '-' reads standard input and writes standard output.

    \b
    Exit codes: 0 migrated (or nothing to migrate), 1 something is left for a human: a
    file refused and left unchanged, or migrated with warnings (both printed as
    path:line:col: CODE message), 2 usage or input error (nothing written).
    """
    from dp2ddp.migrate import Options, migrate_bytes

    from dp2ddp.check.config import ConfigError, find_config, load_config

    modes = sum(bool(x) for x in (output, in_place, show_diff))
    if modes > 1:
        raise click.UsageError("use only one of -o/--output, --in-place and --diff")
    try:  # [tool.dp2ddp] exclude: what `check` leaves out, `rewrite` leaves alone
        cfg = load_config(find_config(next((p for p in paths if p != STDIN), os.getcwd())))
    except ConfigError as e:
        click.echo(f"error: {e}", err=True)
        return EXIT_USAGE
    files = list(iter_python_files(list(paths), list(cfg.exclude), cfg.root))
    for p in paths:
        if p != STDIN and not os.path.isdir(p) and p not in files:
            click.echo(f"{display_path(p)}: excluded by [tool.dp2ddp] exclude in {cfg.path}; left as it is", err=True)
    if output and len(files) != 1:
        raise click.UsageError("-o/--output takes exactly one input file")
    if output and output != "-" and files and files[0] != STDIN and not with_helpers:
        output = _output_file(output, files[0])
    if STDIN in files and len(files) > 1:
        raise click.UsageError("'-' (standard input) cannot be combined with other paths")
    if in_place and STDIN in files:
        raise click.UsageError("--in-place cannot be used with standard input")
    accepted = frozenset(c.strip().upper() for a in accept for c in a.split(",") if c.strip())
    from dp2ddp.registry import BY_CODE

    unknown = sorted(c for c in accepted if c not in BY_CODE)
    if unknown:
        raise click.UsageError(f"--accept: unknown code {', '.join(unknown)}")
    options = Options(keep_batch_size=keep_batch_size, print_all_ranks=print_all_ranks, shard_eval=shard_eval,
                      accept=accepted)
    if with_helpers:
        if len(paths) != 1 or STDIN in files or len(files) != 1:
            raise click.UsageError("--with-helpers takes one script (the one that runs)")
        if not modes:
            raise click.UsageError("--with-helpers changes several files: pass --in-place, --diff, or -o DIR (a copy of the "
                                   "project with the migration)")
        return _rewrite_project(files[0], options, output, in_place, show_diff, fmt, quiet)

    # phase 1: everything in memory
    results = []
    errors: List[str] = []
    for path in files:
        if path not in paths and path.endswith("_ddp.py"):
            continue  # our own outputs, found by walking a folder (a file named explicitly is kept)
        try:
            src = read_source(path)
            results.append((path, migrate_bytes(src.data, src.display, options)))
        except InputError as e:
            errors.append(str(e))
    if errors:
        for e in errors:
            click.echo(f"error: {e}", err=True)
        click.echo("error: nothing was written", err=True)
        return EXIT_USAGE

    # phase 2: write / print
    status = EXIT_OK
    report = []
    for path, result in results:
        display = display_path(path)
        mig = result.migration
        for w in mig.warnings:
            click.echo(_fmt(display, w), err=True)
        if mig.blocked or mig.warnings:
            status = EXIT_NOT_MIGRATED
        dest = None
        if show_diff:
            if result.changed:
                _print_diff(display, result.output, path)
        elif path == STDIN or output == "-":
            sys.stdout.buffer.write(result.output)
            sys.stdout.buffer.flush()
            dest = "-"
        elif result.changed:
            dest = path if in_place else (output or default_output(path))
            try:
                atomic_write(dest, result.output, like=path)
            except (FileNotFoundError, NotADirectoryError, PermissionError, IsADirectoryError) as e:
                click.echo(f"error: {display_path(dest)}: cannot write: {e.strerror or e}", err=True)
                return EXIT_USAGE
        report.append((display, dest, result, path))
    if fmt == "json":
        click.echo(json.dumps([_json_entry(d, dest, r, src) for d, dest, r, src in report], indent=2))
    elif not quiet and not (output == "-" or STDIN in files):
        _print_summary(report, show_diff, err=False)
    elif not quiet:
        _print_summary(report, show_diff, err=True)
    return status


def _output_file(output: str, path: str) -> str:
    """``-o`` for one file: a folder (one that exists, or a name ending in ``/``, made if
    missing) gets the input's name inside it."""
    if output.endswith(("/", os.sep)) or os.path.isdir(output):
        if not os.path.isdir(output):
            if os.path.exists(output.rstrip("/" + os.sep)):
                raise click.UsageError(f"-o {output}: a file, not a folder")
            os.makedirs(output)
        return os.path.join(output, os.path.basename(path))
    return output


def _rewrite_project(entry: str, options, output, in_place: bool, show_diff: bool, fmt: str, quiet: bool) -> int:
    """``rewrite train.py --with-helpers``: one plan for the script and its helpers
    (:mod:`dp2ddp.project`); nothing is written unless every file migrates."""
    from dp2ddp.migrate import migrate_project
    from dp2ddp.project import project_root

    try:
        project = migrate_project(entry, options)
    except InputError as e:
        click.echo(f"error: {e}", err=True)
        click.echo("error: nothing was written", err=True)
        return EXIT_USAGE
    status = EXIT_OK
    for f in project.files:
        for w in f.result.migration.warnings:
            click.echo(_fmt(display_path(f.path), w), err=True)
            status = EXIT_NOT_MIGRATED
    if project.blocked:
        click.echo(f"{display_path(entry)}: project not migrated, no file written (see the warnings above)", err=True)
        return EXIT_NOT_MIGRATED
    report = []
    if show_diff:
        for f in project.changed:
            _print_diff(display_path(f.path), f.result.output, f.path)
        report = [(display_path(f.path), None, f.result, f.path) for f in project.files]
    else:
        root = project_root(project)
        writes = []
        for f in project.changed:
            dest = f.path if in_place else os.path.join(output, os.path.relpath(os.path.abspath(f.path), root))
            writes.append((dest, f))
        if output:
            from dp2ddp.project import copy_project

            try:
                copy_project(root, output)
            except InputError as e:
                click.echo(f"error: {e}", err=True)
                click.echo("error: nothing was written", err=True)
                return EXIT_USAGE
        for dest, f in writes:
            atomic_write(dest, f.result.output, like=f.path)
        dests = {id(f): dest for dest, f in writes}
        report = [(display_path(f.path), dests.get(id(f)), f.result, f.path) for f in project.files]
    if fmt == "json":
        click.echo(json.dumps([_json_entry(d, dest, r, src) for d, dest, r, src in report], indent=2))
    elif not quiet:
        _print_summary(report[:1], show_diff, err=False)
        _print_summary_helpers(report[1:])
    return status


def _print_summary_helpers(report) -> None:
    for display, dest, result, _source in report:
        where = "" if dest is None else f" -> {dest}"
        click.secho(f"{display}{where} (helper module)", bold=True)
        for f in result.migration.notes:
            click.echo(f"  {f.line:>4}  {f.message}")


def _print_diff(display: str, new: bytes, path: str) -> None:
    old = read_source(path).data if path != STDIN else b""
    try:
        a = old.decode("utf-8").splitlines(keepends=True)
        b = new.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        a = old.decode("latin-1").splitlines(keepends=True)
        b = new.decode("latin-1").splitlines(keepends=True)
    for line in difflib.unified_diff(a, b, fromfile=f"a/{display}", tofile=f"b/{display}"):
        if not line.endswith(("\n", "\r")):
            line += "\n"
        color = "green" if line.startswith("+") and not line.startswith("+++") else "red" if line.startswith("-") and not line.startswith("---") else None
        click.secho(line, nl=False, fg=color)


def _json_entry(display, dest, result, source=""):
    mig = result.migration

    def item(f):
        return {"line": f.line, "column": f.col + 1, "code": f.code, "message": f.message}

    return {
        "path": display,
        "output": dest,
        "changed": result.changed,
        "migrated": result.changed and not mig.blocked,
        "blocked": mig.blocked,
        "changes": [item(f) for f in mig.notes],
        "warnings": [item(f) for f in mig.warnings],
        "launch": _launch(dest, source, result.output) if dest and dest != "-" and result.changed else None,
    }


def _launch(dest: str, source: str = "", output: bytes = b"") -> dict:
    from dp2ddp.cli.torchrun_options import shadowed

    env = _pythonpath(source, dest, output)
    script = _script_word(dest, shadowed(output))
    return {
        "gpu": f"{env}torchrun --standalone --nproc_per_node=gpu {script}",
        "cpu": f"{env}torchrun --standalone --nproc_per_node=2 {script}",
        "multi_node": f"dp2ddp template torchrun {dest} --nodes N --gpus-per-node G",
    }


def _script_word(dest: str, shadowed: List[str]) -> str:
    """``dest``, after ``-- `` where the script declares an option torchrun would take for an
    abbreviation of its own (``shadowed``: :func:`dp2ddp.cli.torchrun_options.shadowed`)."""
    return f"-- {dest}" if shadowed else dest


def _pythonpath(source: str, dest: str, output: bytes) -> str:
    """``PYTHONPATH=<the input's folder> `` when the migrated script lies in another folder
    than its input and imports a module that lies only beside the input: Python finds
    imports beside the script it runs, not beside the original. ``""`` otherwise."""
    import ast
    import shlex

    if not source or source == STDIN:
        return ""
    here = os.path.dirname(os.path.abspath(source))
    there = os.path.dirname(os.path.abspath(dest))
    if here == there:
        return ""
    try:
        tree = ast.parse(output)
    except (SyntaxError, ValueError):
        return ""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])

    def beside(folder: str, name: str) -> bool:
        return os.path.isfile(os.path.join(folder, name + ".py")) or os.path.isdir(os.path.join(folder, name))

    if any(beside(here, n) and not beside(there, n) for n in names):
        return f"PYTHONPATH={shlex.quote(here)} "
    return ""


def _print_summary(report, show_diff: bool, err: bool) -> None:
    echo = lambda msg="", **kw: click.secho(msg, err=err, **kw)  # noqa: E731
    migrated = 0
    for display, dest, result, source in report:
        mig = result.migration
        if not mig.applicable:
            echo(f"{display}: no DataParallel found, nothing to migrate", dim=True)
            continue
        if mig.blocked:
            echo(f"{display}: not migrated, left unchanged (see the warnings above)", fg="yellow")
            continue
        migrated += 1
        where = "" if show_diff or dest in (None, "-") else f" -> {dest}"
        echo(f"{display}{where}", bold=True)
        for f in mig.notes:
            echo(f"  {f.line:>4}  {f.message}")
        if mig.warnings:
            echo(f"  {len(mig.warnings)} warning(s): see above; those places were left as they were", fg="yellow")
        if dest and dest != "-":
            from dp2ddp.cli.torchrun_options import shadowed

            env = _pythonpath(source, dest, result.output)
            taken = shadowed(result.output)
            script = _script_word(dest, taken)
            echo("  run it:" + ("  (its imports lie beside the original: PYTHONPATH finds them)" if env else ""))
            echo(f"    {env}torchrun --standalone --nproc_per_node=gpu {script}    # one process per GPU (NCCL)")
            echo(f"    {env}torchrun --standalone --nproc_per_node=2 {script}      # on CPU (gloo)")
            echo(f"    {env}python {dest}                                        # a world of one")
            if taken:
                echo(f"  `--` ends torchrun's options: it would take the script's {', '.join(taken)} for an "
                     "abbreviation of one of its own and stop (pytorch/pytorch#120601)")
            echo(f"  several machines, SLURM or Kubernetes: dp2ddp template torchrun|slurm|k8s {dest} --nodes N --gpus-per-node G")
            echo("  (see docs/scaling-out.md)")
    if len(report) > 1:
        echo(f"{migrated} of {len(report)} file(s) migrated")
