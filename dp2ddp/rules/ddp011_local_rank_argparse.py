"""DDP011: the `--local_rank` flag of the deprecated `torch.distributed.launch`."""

from __future__ import annotations

import ast

from dp2ddp.model.collectives import is_ddp_code
from dp2ddp.rules.base import DDP_CODE, Hit, Invalid, Rule, Valid, literal, string_value

FLAGS = ("--local_rank", "--local-rank")


def check(m):
    if not is_ddp_code(m):
        return
    for call in m.nodes(ast.Call):
        f = call.func
        if isinstance(f, ast.Attribute) and f.attr == "add_argument":
            if _default_from_environment(m, call):
                continue  # the flag is kept for launchers that pass it; torchrun's LOCAL_RANK is the default
            for a in call.args:
                if string_value(a) in FLAGS:
                    yield Hit(a)


def _default_from_environment(m, call: ast.Call) -> bool:
    """``default=int(os.environ.get("LOCAL_RANK", -1))``: torchrun's variable decides."""
    for k in call.keywords:
        if k.arg == "default":
            for n in ast.walk(k.value):
                if isinstance(n, (ast.Name, ast.Attribute)) and m.is_name(n, {"os.environ", "os.getenv", "os.environ.get"}):
                    return any(string_value(c) == "LOCAL_RANK" for c in ast.walk(k.value))
    return False


RULE = Rule(
    code="DDP011",
    name="local-rank-argparse-flag",
    message="`--local_rank` flag of the deprecated `torch.distributed.launch`: read `os.environ[\"LOCAL_RANK\"]`",
    what=(
        "In DDP code, checks for `add_argument(\"--local_rank\")` / `add_argument(\"--local-rank\")` whose default "
        "does not come from the `LOCAL_RANK` environment variable."
    ),
    why=(
        "`torch.distributed.launch` passed `--local_rank=N` to every process; it is deprecated and `torchrun` "
        "does not pass the flag but sets the `LOCAL_RANK` environment variable. A script that relies on the "
        "flag runs every process as local rank 0 (or its default) under torchrun."
    ),
    fix=(
        "Drop the flag and use `local_rank = int(os.environ[\"LOCAL_RANK\"])`. (DeepSpeed's launcher still "
        "passes `--local_rank`; suppress with `# noqa: DDP011` there.)"
    ),
    fix_safety="",
    gate=(DDP_CODE, ("add_argument",), literal(*FLAGS)),
    check=check,
    examples=(
        Invalid(
            "import argparse\n\nimport torch.distributed as dist\n\nparser = argparse.ArgumentParser()\n"
            "parser.add_argument(\"--local_rank\", type=int, default=0)\n",
            6, 21, end=(6, 35),
        ),
        Valid("import os\n\nimport torch.distributed as dist\n\nlocal_rank = int(os.environ[\"LOCAL_RANK\"])\n"),
        Valid(
            "import argparse\nimport os\n\nimport torch.distributed as dist\n\nparser = argparse.ArgumentParser()\n"
            "parser.add_argument(\"--local_rank\", type=int, default=int(os.environ.get(\"LOCAL_RANK\", -1)))\n"
        ),
        Valid("import argparse\n\nparser = argparse.ArgumentParser()\nparser.add_argument(\"--local_rank\", type=int)  # not DDP code\n"),
    ),
)
