"""Scripts that already have a distributed path beside a DataParallel fallback."""

from __future__ import annotations

import ast
from typing import List

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Finding
from dp2ddp.model.names import DDP, INIT, LAUNCH_MODULES, SPAWN


def detect_mode(ctx: Context) -> List[Finding]:
    m = ctx.m
    for ref in m.refs(DDP | INIT | SPAWN | LAUNCH_MODULES):
        names = sorted(m.qualified_names(ref) & (DDP | INIT | SPAWN | LAUNCH_MODULES))
        return [ctx.block(ref, "DDP104", f"script already uses {names[0]}; a mixed DataParallel/distributed script is left for a human to migrate")]
    return []


def propose(ctx: Context) -> List[Finding]:
    return []
