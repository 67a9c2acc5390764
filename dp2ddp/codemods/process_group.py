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

from typing import List

import libcst as cst

from dp2ddp.analysis import is_docstring
from dp2ddp.codemods.context import MigrationContext
from dp2ddp.engine import Finding, Fix, InsertAfter, InsertBefore, Replace

CODE = "DDP120"


def propose(ctx: MigrationContext) -> List[Finding]:
    an = ctx.an
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
        first = an.function_body_start(func)
        if first is None:  # only a docstring: nothing to do in there
            return []
        edits.append(InsertBefore(first, tuple(setup)))
        teardown = ctx.render("teardown_call.py.tmpl", dist=values["dist"], call="pass")[0]

        def wrap(updated, teardown=teardown):
            inner = updated.with_changes(leading_lines=())
            return teardown.with_changes(
                body=teardown.body.with_changes(body=[inner]),
                leading_lines=updated.leading_lines,
            )

        edits.append(Replace(call_stmt, wrap))
        anchor = call_stmt
        message = f"initialise the process group at the top of {func.name.value}() and destroy it when it returns or raises"
    else:
        teardown = ctx.render("teardown_atexit.py.tmpl", atexit=ctx.name("atexit"), dist=values["dist"])
        if kind == "guard":
            body = list(where.body.body)
            first = body[0]
            edits.append(InsertBefore(first, tuple(setup + teardown)))
            anchor = where
            message = "initialise the process group at the top of the main guard; atexit destroys it"
        else:
            end = an.top_import_end
            block = setup + teardown
            if end is None:
                body = [s for s in an.module.body]
                first = next((s for s in body if not is_docstring(s)), None)
                if first is None:
                    return []
                edits.append(InsertBefore(first, tuple(block)))
                anchor = first
            else:
                edits.append(InsertAfter(end, tuple(_spaced(block))))
                anchor = end
            message = "initialise the process group after the imports; atexit destroys it"
    f = ctx.note(anchor, CODE, message)
    f.fix = Fix(edits)
    return [f]


def _spaced(stmts: List[cst.BaseStatement]) -> List[cst.BaseStatement]:
    """Separate a block inserted after the imports from them with a blank line."""
    stmts = list(stmts)
    if stmts:
        stmts[0] = stmts[0].with_changes(leading_lines=[cst.EmptyLine()] + list(stmts[0].leading_lines))
    return stmts
