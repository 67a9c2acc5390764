"""Script options that ``torchrun`` takes for abbreviations of its own.

torchrun parses its whole command line with argparse's prefix matching before it hands the
rest to the script, so a script option that begins like two or more of torchrun's long options
(``--log``: ``--log-dir``, ``--logs-specs``; ``--local``; ``--node``; ``--r``) stops the launch
with "ambiguous option", even after the script's name (pytorch/pytorch#120601). ``--`` before
the script ends torchrun's options. :func:`shadowed` finds such options among those a script
declares (``parser.add_argument("--log", ...)``), so the launch lines ``rewrite`` prints carry
the ``--`` where it is needed. Never imports torch (tests/test_verify_launch_command.py checks
the list against the installed torch's parser).
"""

from __future__ import annotations

import ast
from typing import List

# torch.distributed.run's long options (torch 2.13; each has a dash and an underscore spelling)
TORCHRUN_LONG_OPTIONS = tuple(sorted({
    "--" + name.replace("-", sep)
    for name in (
        "duplicate-stderr-filters", "duplicate-stdout-filters", "event-log-handler", "local-addr",
        "local-ranks-filter", "log-dir", "logs-specs", "master-addr", "master-port", "max-restarts",
        "monitor-interval", "no-python", "node-rank", "nproc-per-node", "numa-binding", "rdzv-backend",
        "rdzv-conf", "rdzv-endpoint", "rdzv-id", "run-path", "shutdown-timeout", "signals-to-handle",
        "start-method", "virtual-local-rank",
    )
    for sep in ("-", "_")
} | {"--help", "--module", "--nnodes", "--redirects", "--role", "--standalone", "--tee"}))


def ambiguous(option: str) -> bool:
    """torchrun stops on ``option`` (``--log`` or ``--log=x``): it is not one of its own
    options but begins like two or more of them."""
    name = option.split("=", 1)[0]
    if not name.startswith("--") or name in TORCHRUN_LONG_OPTIONS:
        return False
    return sum(o.startswith(name) for o in TORCHRUN_LONG_OPTIONS) > 1


def shadowed(source: bytes) -> List[str]:
    """The long options the script declares with ``add_argument`` that torchrun would stop on."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            for a in node.args:
                if isinstance(a, ast.Constant) and isinstance(a.value, str) and ambiguous(a.value) and a.value not in found:
                    found.append(a.value)
    return found
