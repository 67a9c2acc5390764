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
            if _paired_barrier(m, node, stmt):
                continue
            what = reaches_collective(m, stmt)
            if what is not None:
                out.append(f"{path}:{stmt.lineno}: {what}")
    return out


def _is_barrier(m, stmt) -> bool:
    return isinstance(stmt, ast.Expr) and m.source(stmt.value).endswith("barrier()")


def _paired_barrier(m, guard: ast.If, stmt) -> bool:
    """The rank-0-first pair: ``if rank != 0: barrier()`` ... ``if rank == 0: barrier()``
    in one block: every rank reaches one barrier at each of the two points in turn."""
    if not (_is_barrier(m, stmt) and len(guard.body) == 1 and not guard.orelse):
        return False
    parent = m.parent(guard)
    for field in ("body", "orelse"):
        block = getattr(parent, field, None)
        if isinstance(block, list) and any(b is guard for b in block):
            ifs = [b for b in block if isinstance(b, ast.If) and len(b.body) == 1 and not b.orelse and _is_barrier(m, b.body[0])]
            return len(ifs) % 2 == 0 and len(ifs) >= 2
    return False
