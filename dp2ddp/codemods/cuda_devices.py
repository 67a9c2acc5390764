"""Explicit CUDA device indices follow the local rank.

The process-group set-up calls ``torch.cuda.set_device(local_rank)``, so ``"cuda"``
means "this rank's GPU". ``"cuda:0"`` and ``.cuda(0)`` (GPU 0, where DataParallel
gathers) become ``"cuda"`` and ``.cuda()``, and a literal ``torch.cuda.set_device(0)``
is dropped. Other fixed indices and ``CUDA_VISIBLE_DEVICES`` edits are reported.
"""

from __future__ import annotations

import re
from typing import List

import libcst as cst

from dp2ddp.analysis import code
from dp2ddp.codemods.context import MigrationContext
from dp2ddp.engine import Finding, Fix, Remove, Replace

CODE = "DDP134"
CODE_LEFT = "DDP109"
_CUDA_INDEX = re.compile(r"^cuda:(\d+)$")


def propose(ctx: MigrationContext) -> List[Finding]:
    an = ctx.an
    findings: List[Finding] = []
    for s in an.nodes_of(cst.SimpleString):
        try:
            value = s.evaluated_value
        except Exception:  # pragma: no cover - bytes or odd prefixes
            continue
        m = _CUDA_INDEX.match(value) if isinstance(value, str) else None
        if not m:
            continue
        if m.group(1) == "0":
            quote = s.quote
            f = ctx.note(s, CODE, f'"{value}" -> "cuda": the current device, which is this rank\'s GPU')
            f.fix = Fix([Replace(s, cst.SimpleString(f"{s.prefix}{quote}cuda{quote}"))])
            findings.append(f)
        else:
            findings.append(ctx.warn(s, CODE_LEFT, f'fixed device "{value}": under DDP each rank uses its own GPU ("cuda" after set_device)'))
    for call in an.nodes_of(cst.Call):
        fn = call.func
        if (
            isinstance(fn, cst.Attribute)
            and fn.attr.value == "cuda"
            and len(call.args) == 1
            and isinstance(call.args[0].value, cst.Integer)
            and call.args[0].keyword is None
        ):
            if call.args[0].value.value == "0":
                f = ctx.note(call, CODE, ".cuda(0) -> .cuda(): the current device, which is this rank's GPU")
                f.fix = Fix([Replace(call, lambda u: u.with_changes(args=[]))])
                findings.append(f)
            else:
                findings.append(ctx.warn(call, CODE_LEFT, "fixed device index in .cuda(N): under DDP each rank uses its own GPU"))
        elif an.is_name(fn, {"torch.cuda.set_device"}) and call.args and isinstance(call.args[0].value, cst.Integer):
            stmt = an.statement_of(call)
            if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
                owner = an.block_owner(stmt)
                if (
                    isinstance(owner, cst.If)
                    and owner.orelse is None
                    and list(owner.body.body) == [stmt]
                    and "cuda" in code(owner.test)
                    and an.block_of(owner) is not None
                ):
                    stmt = owner  # `if torch.cuda.is_available(): set_device(0)` goes as a whole
                f = ctx.note(call, CODE, "torch.cuda.set_device(<fixed index>) removed: the set-up selects the local rank's GPU")
                f.fix = Fix([Remove(stmt)])
                findings.append(f)
        elif (
            isinstance(fn, cst.Attribute)
            and fn.attr.value in ("to", "cuda")
            and call.args
            and isinstance(call.args[0].value, cst.Subscript)
            and any(w in code(call.args[0].value.value).lower() for w in ("gpu", "device"))
        ):
            findings.append(
                ctx.warn(
                    call,
                    CODE_LEFT,
                    f"placed on a fixed device ({code(call.args[0].value)}): under DDP each rank must use its own GPU "
                    "(torch.cuda.current_device() after the set-up)",
                )
            )
    for sub in an.nodes_of(cst.Subscript):
        if an.is_name(sub.value, {"os.environ"}) and any(
            isinstance(e.slice, cst.Index) and isinstance(e.slice.value, cst.SimpleString) and "CUDA_VISIBLE_DEVICES" in e.slice.value.value
            for e in sub.slice
        ):
            findings.append(
                ctx.warn(sub, CODE_LEFT, "CUDA_VISIBLE_DEVICES set in the script: with torchrun, give every rank all GPUs and let LOCAL_RANK pick one")
            )
    return findings
