"""Command-line entry point: ``dp2ddp COMMAND``, one module of this package per command
(:mod:`dp2ddp.cli.check`, :mod:`dp2ddp.cli.rewrite`, :mod:`dp2ddp.cli.template`; `verify`
is its own package, :mod:`dp2ddp.verify`, whose command is :mod:`dp2ddp.verify.command`).

Sub-commands are imported lazily: `rewrite` and `check` must start instantly and
never import torch, so nothing heavy is imported until a command actually runs.
"""

from __future__ import annotations

import importlib
import sys
from typing import Optional, Sequence

import click

# name -> (module, attribute, one-line help). Keep the help here so that
# `dp2ddp --help` does not import every command module.
_COMMANDS = {
    "rewrite": ("dp2ddp.cli.rewrite", "rewrite", "Rewrite DataParallel scripts into DistributedDataParallel scripts."),
    "check": ("dp2ddp.cli.check", "check", "Lint for DataParallel usage and common DDP mistakes."),
    "verify": ("dp2ddp.verify.command", "verify", "Run original and migrated scripts side by side and compare them."),
    "template": ("dp2ddp.cli.template", "template", "Render launch files for torchrun, SLURM or Kubernetes."),
}

# The exit codes of every command (one home): 0 clean, 1 findings / files changed / a file
# the migration refused, 2 usage, configuration or input errors.
EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> Optional[click.Command]:
        entry = _COMMANDS.get(name)
        if entry is None:
            return None
        module, attr, _help = entry
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, _COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dp2ddp", prog_name="dp2ddp")
def cli() -> None:
    """Move PyTorch scripts from DataParallel to DistributedDataParallel, and prove it."""


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the CLI and return its exit code: 0 clean, 1 findings/changes, 2 usage or input errors."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        rv = cli.main(args=args, prog_name="dp2ddp", standalone_mode=False)
    except click.exceptions.Exit as e:  # --help, --version
        return int(e.exit_code or 0)
    except click.ClickException as e:
        e.show()
        return EXIT_USAGE
    except click.exceptions.Abort:
        click.echo("Aborted!", err=True)
        return 130
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        return 130
    except BrokenPipeError:
        return EXIT_OK
    if isinstance(rv, int):
        return rv
    return EXIT_OK


def console_main() -> None:
    sys.exit(main())
