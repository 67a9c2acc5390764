from __future__ import annotations

from typing import Iterable

import ast

import libcst as cst

from dp2ddp.analysis import DDP_NAMES, Analysis
from dp2ddp.engine import Finding
from dp2ddp.rules.base import ESCAPE, DDP_CODE, Keep, Nodes, Refs, Rule, Text, Tokens, callee_spelling, has_star_kwargs, kwarg, positional, string_value


class DDPWithoutDeviceIds(Rule):
    code = "DDP007"
    name = "ddp-without-device-ids"
    message = "`DistributedDataParallel` on CUDA without `device_ids=[local_rank]`"
    what = (
        "Checks for `DistributedDataParallel(model)` without `device_ids` in a module that puts work on CUDA "
        "(`.cuda()`, `\"cuda...\"` devices, `torch.cuda.*`)."
    )
    why = (
        "For a single-device module DDP should be told its device: with `device_ids=None` it does not move "
        "inputs to the model's device and relies on the current CUDA device being right, which is GPU 0 "
        "unless `set_device` was called — the classic cause of every rank crowding onto GPU 0 or of "
        "device-mismatch errors in the first forward."
    )
    fix_doc = "Pass `device_ids=[local_rank]` (and `output_device=local_rank`). For CPU (gloo) training leave it out."
    needs = (DDP_CODE, Refs(DDP_NAMES, called=True), Tokens("cuda", ESCAPE))  # "\\x63uda" is "cuda" too
    # the DDP calls that lack device_ids, and one `.cuda` (``_uses_cuda``) or else any "cuda"
    keep = (
        Nodes((ast.Call,), lambda n, names: _bare_call(n, names.spellings(DDP_NAMES))),
        Keep(
            Text(words="cuda", escapes=True),
            witness=Nodes((ast.Attribute,), lambda n, _s: n.attr == "cuda"),
        ),
    )
    invalid = (
        "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n\n"
        "model = DDP(model.cuda())\n",
    )
    valid = (
        "import os\n\nimport torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n\n"
        "local_rank = int(os.environ[\"LOCAL_RANK\"])\nmodel = DDP(model.to(local_rank), device_ids=[local_rank])\n",
        "from torch.nn.parallel import DistributedDataParallel as DDP\n\nmodel = DDP(model)  # CPU / gloo\n",
    )

    def check(self, an: Analysis) -> Iterable[Finding]:
        calls = an.calls(DDP_NAMES)
        if not calls or not _uses_cuda(an):
            return []
        out = []
        for call in calls:
            if kwarg(call, "device_ids") is not None or len(positional(call)) >= 2 or has_star_kwargs(call):
                continue
            out.append(self.finding(call))
        return out


def _uses_cuda(an: Analysis) -> bool:
    for n in an.nodes_of(cst.Attribute):
        if n.attr.value == "cuda":
            return True
    for s in an.nodes_of(cst.SimpleString):
        v = string_value(s)
        if v and v.startswith("cuda"):
            return True
    for s in an.nodes_of(cst.FormattedString):
        if "cuda" in "".join(p.value for p in s.parts if isinstance(p, cst.FormattedStringText)):
            return True
    return False


def _bare_call(call: ast.Call, spellings) -> bool:
    """For pruning: a call of something spelled like DDP that the rule could report."""
    if callee_spelling(call) not in spellings:
        return False
    positional = [a for a in call.args if not isinstance(a, ast.Starred)]
    return not any(k.arg in ("device_ids", None) for k in call.keywords) and len(positional) < 2
