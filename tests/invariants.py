"""Invariants every migration must keep, checked on the migrated source (tests only)."""

from __future__ import annotations

import ast
from typing import List

from dp2ddp.model.collectives import reaches_collective
from dp2ddp.model.core import build

RANK0_TESTS = ("get_rank() == 0", 'environ.get("RANK", 0))) == 0')


def collectives_under_rank_guards(source: bytes, path: str = "out.py") -> List[str]:
    """Statements under an ``if <rank 0>:`` the migration added that reach a collective,
    a DDP construction or a DDP forward (directly or through the script's functions)."""
    m = build(source, path)
    out = []
    for node in m.nodes(ast.If):
        test = m.source(node.test)
        if not any(t in test for t in RANK0_TESTS):
            continue
        for stmt in node.body + node.orelse:
            what = reaches_collective(m, stmt)
            if what is not None:
                out.append(f"{path}:{stmt.lineno}: {what}")
    return out
