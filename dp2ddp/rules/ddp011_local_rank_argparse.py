from __future__ import annotations

from typing import Iterable

import libcst as cst

from dp2ddp.analysis import Analysis
from dp2ddp.engine import Finding
import ast

from dp2ddp.rules.base import ESCAPE, DDP_CODE, DDP_CONTEXT, Keep, Rule, Text, Shape, is_ddp_code, string_value


class LocalRankArgparse(Rule):
    code = "DDP011"
    name = "local-rank-argparse-flag"
    message = "`--local_rank` flag of the deprecated `torch.distributed.launch`: read `os.environ[\"LOCAL_RANK\"]`"
    what = "In DDP code, checks for `add_argument(\"--local_rank\")` / `add_argument(\"--local-rank\")`."
    why = (
        "`torch.distributed.launch` passed `--local_rank=N` to every process; it is deprecated and `torchrun` "
        "does not pass the flag but sets the `LOCAL_RANK` environment variable. A script that relies on the "
        "flag runs every process as local rank 0 (or its default) under torchrun."
    )
    fix_doc = (
        "Drop the flag and use `local_rank = int(os.environ[\"LOCAL_RANK\"])`. (DeepSpeed's launcher still "
        "passes `--local_rank`; suppress with `# noqa: DDP011` there.)"
    )
    needs = (DDP_CODE, Shape(lambda ix: _shape(ix), "local_rank", "local-rank", ESCAPE))
    keep = (Keep(Text(words="add_argument"), Text(words="local.rank", escapes=True)), DDP_CONTEXT)
    invalid = (
        "import argparse\n\nimport torch.distributed as dist\n\nparser = argparse.ArgumentParser()\n"
        "parser.add_argument(\"--local_rank\", type=int, default=0)\n",
    )
    valid = (
        "import os\n\nimport torch.distributed as dist\n\nlocal_rank = int(os.environ[\"LOCAL_RANK\"])\n",
        "import argparse\n\nparser = argparse.ArgumentParser()\nparser.add_argument(\"--local_rank\", type=int)  # not DDP code\n",
    )

    def check(self, an: Analysis) -> Iterable[Finding]:
        if not is_ddp_code(an):
            return []
        out = []
        for call in an.nodes_of(cst.Call):
            if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "add_argument"):
                continue
            for a in call.args:
                if a.keyword is None and string_value(a.value) in ("--local_rank", "--local-rank"):
                    out.append(self.finding(a.value))
        return out


def _shape(ix) -> bool:
    """Pre-filter: ``<x>.add_argument("--local_rank" | "--local-rank", ...)``."""
    for call in ix.of(ast.Call):
        if isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument":
            for a in call.args:
                if isinstance(a, ast.Constant) and a.value in ("--local_rank", "--local-rank"):
                    return True
    return False
