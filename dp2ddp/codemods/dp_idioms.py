"""DataParallel idioms that mean nothing under DDP."""

from __future__ import annotations

from typing import List

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Finding


def propose(ctx: Context) -> List[Finding]:
    return []
