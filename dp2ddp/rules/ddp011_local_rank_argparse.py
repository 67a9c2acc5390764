"""DDP011: the `--local_rank` flag of the deprecated `torch.distributed.launch`."""

from __future__ import annotations

from dp2ddp.model.collectives import is_ddp_code
from dp2ddp.model.ranks import LOCAL_RANK_FLAGS as FLAGS, local_rank_arguments
from dp2ddp.rules.base import DDP_CODE, Hit, Invalid, Rule, Valid, literal


def check(m):
    if not is_ddp_code(m):
        return
    for _call, flag, from_torchrun in local_rank_arguments(m):
        if not from_torchrun:  # a default of torchrun's LOCAL_RANK keeps the flag for launchers that pass it
            yield Hit(flag)


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
