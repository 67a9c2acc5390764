"""Process-group lifecycle: initialise once, destroy at the end (also on errors).

* A script whose main guard calls ``main()`` gets the set-up at the top of ``main()`` and
  ``try: main() finally: destroy_process_group()`` in the guard.
* Otherwise the set-up goes after the imports (or at the top of the guard body) and
  ``atexit`` destroys the group.

The set-up reads ``LOCAL_RANK`` (device), picks ``nccl`` when CUDA is available and
``gloo`` otherwise, and falls back to an in-process store when the script is run with
plain ``python`` (a world of one), so the result runs with and without torchrun.
"""

from __future__ import annotations

import ast
from typing import List

import libcst as cst

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Finding, InsertAfter, InsertBefore, Replace
from dp2ddp.model.core import is_docstring


def propose(ctx: Context) -> List[Finding]:
    if ctx.mode != "plain":
        return []
    m = ctx.m
    kind, where, call_stmt = ctx.setup_site
    values = dict(
        os=ctx.name("os"),
        torch=ctx.name("torch"),
        dist=ctx.name("dist"),
        local_rank=ctx.fresh_name("local_rank"),
        dist_kwargs=ctx.fresh_name("dist_kwargs"),
    )
    setup = ctx.render("setup_process_group.py.tmpl", **values)
    edits = []
    if kind == "function":
        func = where
        body = [s for s in func.body]  # type: ignore[union-attr]
        if body and is_docstring(body[0]):
            body = body[1:]
        if not body:
            return []
        edits.append(InsertBefore(ctx.bridge.statement(body[0]), tuple(setup)))
        teardown = ctx.render("teardown_call.py.tmpl", dist=values["dist"], call="pass")[0]

        def wrap(updated, teardown=teardown):
            inner = updated.with_changes(leading_lines=())
            return teardown.with_changes(body=teardown.body.with_changes(body=[inner]), leading_lines=updated.leading_lines)

        edits.append(Replace(ctx.bridge.statement(call_stmt), wrap))
        anchor = call_stmt
        message = f"initialise the process group at the top of {func.name}() and destroy it when it returns or raises"  # type: ignore[union-attr]
    else:
        teardown = ctx.render("teardown_atexit.py.tmpl", atexit=ctx.name("atexit"), dist=values["dist"])
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


def _spaced(stmts: List[cst.BaseStatement]) -> List[cst.BaseStatement]:
    """Separate a block inserted after the imports from them with a blank line."""
    stmts = list(stmts)
    if stmts:
        stmts[0] = stmts[0].with_changes(leading_lines=[cst.EmptyLine()] + list(stmts[0].leading_lines))
    return stmts
