"""`dp2ddp check`: lint for DataParallel usage and the usual DDP mistakes."""

from __future__ import annotations

import difflib
import os
import sys
from typing import List, Optional, Tuple

import click

from dp2ddp.cli import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE


class _InputFailure(click.ClickException):
    exit_code = EXIT_USAGE

    def show(self, file=None) -> None:  # one line, no "Error:" decoration twice
        click.echo(f"dp2ddp check: {self.format_message()}", err=True)


def _codes_option(name: str, help_: str):
    return click.option(name, "codes_" + name.strip("-").replace("-", "_"), multiple=True, metavar="CODES", help=help_)


@click.command("check", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("paths", nargs=-1, type=click.Path(), metavar="PATH...")
@_codes_option(
    "--select",
    "Codes to report: codes (DDP0xx rules, DDP1xx migration codes), prefixes, names or ALL, comma-separated "
    "(default: the default rules and the migration's warnings and errors).",
)
@_codes_option("--extend-select", "Codes to report on top of the selection.")
@_codes_option("--ignore", "Codes not to report: codes, prefixes, names or ALL.")
@click.option("--fix", is_flag=True, help="Apply the fixes (the DataParallel rule's fix is the whole DDP migration).")
@click.option("--diff", "show_diff", is_flag=True, help="Show the fixes as a unified diff; write nothing.")
@click.option(
    "--new-only/--no-new-only",
    "new_only",
    default=None,
    help="Only report findings on lines added relative to HEAD (with pre-commit: the staged change).",
)
@click.option("--since", metavar="REV", help="Only report findings on lines added relative to git revision REV.")
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["text", "json", "sarif", "github"]),
    default="text",
    show_default=True,
    help="Output format.",
)
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when there are findings.")
@click.option("--statistics", is_flag=True, help="Print the number of findings per rule instead of the findings.")
@click.option("-q", "--quiet", is_flag=True, help="Print the findings only, no summary.")
@click.option("--show-rules", is_flag=True, help="List every code (code, name, default, fixable) and exit.")
@click.option("--no-config", is_flag=True, help="Ignore [tool.dp2ddp] in pyproject.toml.")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None, help="Worker processes (default: CPU count).")
@click.option(
    "--cache-dir",
    envvar="DP2DDP_CACHE_DIR",
    type=click.Path(file_okay=False),
    default=None,
    help="Where to keep the result cache (env DP2DDP_CACHE_DIR; default: .dp2ddp_cache in the project root).",
)
@click.option("--no-cache", is_flag=True, envvar="DP2DDP_NO_CACHE", help="Neither read nor write the result cache.")
def check(
    paths: Tuple[str, ...],
    codes_select: Tuple[str, ...],
    codes_extend_select: Tuple[str, ...],
    codes_ignore: Tuple[str, ...],
    fix: bool,
    show_diff: bool,
    new_only: Optional[bool],
    since: Optional[str],
    output_format: str,
    exit_zero: bool,
    statistics: bool,
    quiet: bool,
    show_rules: bool,
    no_config: bool,
    jobs: Optional[int],
    cache_dir: Optional[str],
    no_cache: bool,
) -> int:
    """Lint PATH... (files or directories; `-` for stdin) for DataParallel usage and common
    DistributedDataParallel mistakes.

    Exit status: 0 clean (with --fix: nothing left after fixing), 1 findings, 2 usage,
    config or input errors. Suppress a finding with `# noqa: DDP001` (or a bare `# noqa`) on its line.
    """
    from dp2ddp import lint, lint_cache, lint_git, lint_output, lint_pool
    from dp2ddp.lint_config import ConfigError, find_config, load_config
    from dp2ddp.registry import CODES, UnknownCode, select

    if show_rules:
        for c in CODES:
            flags = ("default" if c.default else "off") + (", fixable" if c.fixable else "")
            kind = "" if c.kind == "rule" else f", migration {c.severity}"
            click.echo(f"{c.code}  {c.name}  ({flags}{kind})")
        return EXIT_OK
    if not paths:
        raise click.UsageError("give at least one PATH (a file, a directory, or - for stdin)")
    if fix and show_diff:
        raise click.UsageError("--fix and --diff cannot be combined (--diff shows what --fix would do)")
    if since is not None and new_only:
        raise click.UsageError("--new-only and --since cannot be combined (--since REV sets what is new)")
    if paths.count("-") > 1:
        raise click.UsageError("- (stdin) can be given only once")

    # ---- configuration
    try:
        cfg = load_config(None if no_config else find_config(next((p for p in paths if p != "-"), os.getcwd())))
    except ConfigError as e:
        raise _InputFailure(str(e)) from None
    try:
        codes = tuple(
            select(
                list(codes_select) if codes_select else cfg.select,
                ignore=list(cfg.ignore) + list(codes_ignore),
                extend_select=list(cfg.extend_select) + list(codes_extend_select),
            )
        )
    except UnknownCode as e:
        raise click.UsageError(str(e)) from None
    if new_only is None:
        new_only = cfg.new_only and since is None
    # the migration's codes come from DDP001's fix: without a lint rule selected, nothing runs
    runs = bool(lint.selected_rules(codes))

    # ---- files
    files: List[str] = []
    missing: List[str] = []
    for p in paths:
        if p != "-" and not os.path.exists(p):
            missing.append(p)
    from dp2ddp.source import STDIN, iter_python_files

    for f in iter_python_files([p for p in paths if p not in missing], list(cfg.exclude), cfg.root):
        files.append(f if f == STDIN else os.path.normpath(f))

    # ---- new lines
    table = None
    if (new_only or since is not None) and files:
        try:
            table = lint_git.added_lines([f for f in files if f != "-"] or ["."], since)
        except lint_git.GitError as e:
            raise _InputFailure(str(e)) from None

    stdin_data = sys.stdin.buffer.read() if "-" in files else None
    jobs_list = []
    for f in files:
        lines = None
        if table is not None and f != "-":
            lines = lint_git.lines_for(f, table)
        jobs_list.append(
            lint.Job(
                path=f,
                codes=codes,
                lines=lines,
                fix=fix or show_diff,
                write=fix and f != "-",
                data=stdin_data if f == "-" else None,
            )
        )
    cache = None
    if runs and jobs_list and not no_cache:
        cache = lint_cache.ResultCache(cache_dir or os.path.join(cfg.root, lint_cache.CACHE_DIR_NAME), codes)
    results = lint_pool.run_jobs(jobs_list, processes=jobs, cache=cache) if runs else [lint.FileResult(f) for f in files]
    results.extend(lint.FileResult(m, error=f"{m}: no such file or directory") for m in missing)

    # ---- output
    out = sys.stdout
    color = out.isatty() and not os.environ.get("NO_COLOR") and output_format == "text"
    if fix and "-" in files:
        # ruff's convention: the fixed source goes to stdout, the report to stderr
        r = next(r for r in results if r.path == "-")
        sys.stdout.buffer.write(r.output if r.output is not None else (stdin_data or b""))
        sys.stdout.flush()
        out = sys.stderr
        color = False
    if show_diff:
        changed = [r for r in results if r.output is not None]
        for r in changed:
            a = r.original.decode("utf-8", "replace").splitlines(keepends=True)
            b = r.output.decode("utf-8", "replace").splitlines(keepends=True)
            shown = "<stdin>" if r.path == "-" else r.path
            click.echo("".join(difflib.unified_diff(a, b, f"a/{shown}", f"b/{shown}")), nl=False, color=color)
        for r in results:
            if r.error:
                click.echo(r.error, err=True)
            for d in r.diagnostics:  # what the migration says about the files it changes or refuses
                if d.code.startswith("DDP1"):
                    click.echo(f"{d.path}:{d.line}:{d.col}: {d.code} {d.message}", err=True)
        fixed = sum(r.fixed for r in changed)
        if not quiet:
            click.echo(
                f"Would fix {fixed} error{'s' if fixed != 1 else ''} in {len(changed)} file{'s' if len(changed) != 1 else ''}."
                if changed
                else "No fixes available.",
                err=True,
            )
        if any(r.error for r in results):
            return EXIT_USAGE
        blocked = any(r.blocked for r in results)  # as `dp2ddp rewrite --diff` exits
        return EXIT_FINDINGS if (changed or blocked) and not exit_zero else EXIT_OK

    if statistics:
        text = lint_output.statistics(results)
    elif output_format == "json":
        text = lint_output.as_json(results)
    elif output_format == "sarif":
        text = lint_output.sarif(results)
    elif output_format == "github":
        text = lint_output.github(results)
    else:
        text = lint_output.text(results, color=bool(color), quiet=quiet, new_only=bool(table is not None))
    click.echo(text, nl=False, file=out, color=bool(color))

    if any(r.error for r in results):
        return EXIT_USAGE
    findings = sum(len(r.diagnostics) for r in results)
    if exit_zero:
        return EXIT_OK
    # with --fix, what is left decides (ruff's rule, and `rewrite`'s: a file migrated with
    # nothing left for a human is 0; the migration's warnings and errors are findings)
    return EXIT_FINDINGS if findings else EXIT_OK

