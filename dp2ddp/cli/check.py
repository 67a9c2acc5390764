"""`dp2ddp check`: its options. What it does is :func:`dp2ddp.check.command.run`."""

from __future__ import annotations

import click


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
def check(**options) -> int:
    """Check PATH... (files or directories; `-` for stdin) for DataParallel usage and common
    DistributedDataParallel mistakes.

    Exit status: 0 clean (with --fix: nothing left after fixing), 1 findings, 2 usage,
    config or input errors. Suppress a finding with `# noqa: DDP001` (or a bare `# noqa`) on its line.
    """
    from dp2ddp.check.command import Options, run

    return run(Options(**options))
