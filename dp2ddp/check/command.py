"""`dp2ddp check`: select the codes, find the files, check them, print, exit.

The command-line options are in :mod:`dp2ddp.cli.check`; this module is what they run.
One file is checked by :mod:`dp2ddp.check.engine`, many by :mod:`dp2ddp.check.pool`.
"""

from __future__ import annotations

import difflib
import os
import sys
from dataclasses import dataclass
from typing import List, Optional, Tuple

import click

from dp2ddp.cli import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE


class _InputFailure(click.ClickException):
    exit_code = EXIT_USAGE

    def show(self, file=None) -> None:  # one line, no "Error:" decoration twice
        click.echo(f"dp2ddp check: {self.format_message()}", err=True)


@dataclass
class Options:
    """The options of `dp2ddp check` (see ``dp2ddp check --help``)."""

    paths: Tuple[str, ...] = ()
    codes_select: Tuple[str, ...] = ()
    codes_extend_select: Tuple[str, ...] = ()
    codes_ignore: Tuple[str, ...] = ()
    fix: bool = False
    show_diff: bool = False
    new_only: Optional[bool] = None
    since: Optional[str] = None
    output_format: str = "text"
    exit_zero: bool = False
    statistics: bool = False
    quiet: bool = False
    show_rules: bool = False
    no_config: bool = False
    jobs: Optional[int] = None
    cache_dir: Optional[str] = None
    no_cache: bool = False


def run(opts: Options) -> int:
    """Run `dp2ddp check`; the exit code: 0 clean, 1 findings, 2 usage, config or input errors."""
    from dp2ddp.check import cache as result_cache
    from dp2ddp.check import git, output, pool
    from dp2ddp.check.analyze import selected_rules
    from dp2ddp.check.config import ConfigError, find_config, load_config
    from dp2ddp.check.results import FileResult, Job
    from dp2ddp.registry import CODES, UnknownCode, select

    if opts.show_rules:
        for c in CODES:
            flags = ("default" if c.default else "off") + (", fixable" if c.fixable else "")
            kind = "" if c.kind == "rule" else f", migration {c.severity}"
            click.echo(f"{c.code}  {c.name}  ({flags}{kind})")
        return EXIT_OK
    if not opts.paths:
        raise click.UsageError("give at least one PATH (a file, a directory, or - for stdin)")
    if opts.fix and opts.show_diff:
        raise click.UsageError("--fix and --diff cannot be combined (--diff shows what --fix would do)")
    new_only = opts.new_only
    if opts.since is not None and new_only:
        raise click.UsageError("--new-only and --since cannot be combined (--since REV sets what is new)")
    if opts.paths.count("-") > 1:
        raise click.UsageError("- (stdin) can be given only once")

    # ---- configuration
    try:
        cfg = load_config(None if opts.no_config else find_config(next((p for p in opts.paths if p != "-"), os.getcwd())))
    except ConfigError as e:
        raise _InputFailure(str(e)) from None
    try:
        codes = tuple(
            select(
                list(opts.codes_select) if opts.codes_select else cfg.select,
                ignore=list(cfg.ignore) + list(opts.codes_ignore),
                extend_select=list(cfg.extend_select) + list(opts.codes_extend_select),
            )
        )
    except UnknownCode as e:
        raise click.UsageError(str(e)) from None
    if new_only is None:
        new_only = cfg.new_only and opts.since is None
    # the migration's codes come from DDP001's fix: without a lint rule selected, nothing runs
    runs = bool(selected_rules(codes))

    # ---- files
    files: List[str] = []
    missing: List[str] = []
    for p in opts.paths:
        if p != "-" and not os.path.exists(p):
            missing.append(p)
    from dp2ddp.source import STDIN, iter_python_files

    for f in iter_python_files([p for p in opts.paths if p not in missing], list(cfg.exclude), cfg.root):
        files.append(f if f == STDIN else os.path.normpath(f))

    # ---- new lines
    table = None
    if (new_only or opts.since is not None) and files:
        try:
            table = git.added_lines([f for f in files if f != "-"] or ["."], opts.since)
        except git.GitError as e:
            raise _InputFailure(str(e)) from None

    stdin_data = sys.stdin.buffer.read() if "-" in files else None
    jobs_list = []
    for f in files:
        lines = None
        if table is not None and f != "-":
            lines = git.lines_for(f, table)
        jobs_list.append(
            Job(
                path=f,
                codes=codes,
                lines=lines,
                fix=opts.fix or opts.show_diff,
                write=opts.fix and f != "-",
                data=stdin_data if f == "-" else None,
            )
        )
    cache = None
    if runs and jobs_list and not opts.no_cache:
        cache = result_cache.ResultCache(opts.cache_dir or os.path.join(cfg.root, result_cache.CACHE_DIR_NAME), codes)
    results = pool.run_jobs(jobs_list, processes=opts.jobs, cache=cache) if runs else [FileResult(f) for f in files]
    results.extend(FileResult(m, error=f"{m}: no such file or directory") for m in missing)

    # ---- output
    out = sys.stdout
    color = out.isatty() and not os.environ.get("NO_COLOR") and opts.output_format == "text"
    if opts.fix and "-" in files:
        # ruff's convention: the fixed source goes to stdout, the report to stderr
        r = next(r for r in results if r.path == "-")
        sys.stdout.buffer.write(r.output if r.output is not None else (stdin_data or b""))
        sys.stdout.flush()
        out = sys.stderr
        color = False
    if opts.show_diff:
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
        if not opts.quiet:
            click.echo(
                f"Would fix {fixed} error{'s' if fixed != 1 else ''} in {len(changed)} file{'s' if len(changed) != 1 else ''}."
                if changed
                else "No fixes available.",
                err=True,
            )
        if any(r.error for r in results):
            return EXIT_USAGE
        blocked = any(r.blocked for r in results)  # as `dp2ddp rewrite --diff` exits
        return EXIT_FINDINGS if (changed or blocked) and not opts.exit_zero else EXIT_OK

    if opts.statistics:
        text = output.statistics(results)
    elif opts.output_format == "json":
        text = output.as_json(results)
    elif opts.output_format == "sarif":
        text = output.sarif(results)
    elif opts.output_format == "github":
        text = output.github(results)
    else:
        text = output.text(results, color=bool(color), quiet=opts.quiet, new_only=bool(table is not None))
    click.echo(text, nl=False, file=out, color=bool(color))

    if any(r.error for r in results):
        return EXIT_USAGE
    findings = sum(len(r.diagnostics) for r in results)
    if opts.exit_zero:
        return EXIT_OK
    # with --fix, what is left decides (ruff's rule, and `rewrite`'s: a file migrated with
    # nothing left for a human is 0; the migration's warnings and errors are findings)
    return EXIT_FINDINGS if findings else EXIT_OK

