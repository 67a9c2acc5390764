"""Process-group lifecycle: initialise once, destroy at the end (also on errors).

* A script with a ``__main__`` guard gets the set-up at the top of the guard, before
  anything the script does (option parsing included); one without, or one that does
  work at import, right after the imports. ``atexit`` destroys the group.

The set-up reads ``LOCAL_RANK`` (device), picks ``nccl`` when CUDA is available and
``gloo`` otherwise, and falls back to an in-process store when the script is run with
plain ``python`` (a world of one), so the result runs with and without torchrun. Every
process then goes on from rank 0's random streams (Python's, NumPy's when the script has
imported it, torch's CPU generator): draws made without a seed (``random_split``, a
shuffled file list) come out alike on every rank, as in DataParallel's one process.
"""

from __future__ import annotations

from typing import List

import libcst as cst

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Finding, InsertAfter, InsertBefore
from dp2ddp.model.syntax import is_docstring


def propose(ctx: Context) -> List[Finding]:
    if ctx.mode != "plain" or ctx.role == "helper":
        return []  # a helper module of a project: its entry script sets the group up
    m = ctx.m
    kind, where, _ = ctx.setup_site
    by = _runs_after(m, kind, where)  # the script's imports on later lines are not bound there yet
    values = dict(
        os=ctx.name("os", by),
        torch=ctx.name("torch", by),
        dist=ctx.name("dist", by),
        random=ctx.name("random", by),
        sys=ctx.name("sys", by),
        local_rank=ctx.fresh_name("local_rank"),
        dist_kwargs=ctx.fresh_name("dist_kwargs"),
        streams=ctx.fresh_name("rank0_streams"),
    )
    setup = ctx.render("setup_process_group.py.tmpl", **values)
    edits = []
    teardown = ctx.render("teardown_atexit.py.tmpl", atexit=ctx.name("atexit", by), dist=values["dist"])
    if kind == "guard":
        first = where.body[0]  # type: ignore[union-attr]
        edits.append(InsertBefore(ctx.bridge.statement(first), tuple(setup + teardown)))
        anchor = where
        message = "initialise the process group at the top of the main guard; atexit destroys it"
    else:
        end = m.top_import_end
        block = setup + teardown
        if end is None:
            first = next((s for s in m.tree.body if not is_docstring(s)), None)
            if first is None:
                return []
            edits.append(InsertBefore(ctx.bridge.statement(first), tuple(block)))
            anchor = first
        else:
            edits.append(InsertAfter(ctx.bridge.statement(end), tuple(_spaced(block))))
            anchor = end
        message = "initialise the process group after the imports; atexit destroys it"
    return [ctx.note(anchor, "DDP120", message, edits)]


def _runs_after(m, kind: str, where) -> int:
    """The last line whose imports are bound where the set-up runs: before the main guard,
    after the import section at the top, or before the first statement."""
    if kind == "guard":
        return where.lineno - 1
    end = m.top_import_end
    if end is not None:
        return end.end_lineno
    first = next((s for s in m.tree.body if not is_docstring(s)), None)
    return first.lineno - 1 if first is not None else 0


def _spaced(stmts: List[cst.BaseStatement]) -> List[cst.BaseStatement]:
    """Separate a block inserted after the imports from them with a blank line."""
    stmts = list(stmts)
    if stmts:
        stmts[0] = stmts[0].with_changes(leading_lines=[cst.EmptyLine()] + list(stmts[0].leading_lines))
    return stmts
