"""Gradient accumulation without an all-reduce on every micro-step.

Where a loop steps the optimizer after only some of its backward passes
(``if (i + 1) % accum == 0: optimizer.step()``), DDP would still all-reduce the gradients
in every backward pass. The forward and backward of each pass go under

    with contextlib.nullcontext() if <the step condition> else model.no_sync():

so only the backward pass an optimizer step follows all-reduces; the others accumulate
locally, and DDP reduces the sum on the next synchronising pass: the same averaged
gradient as before, one all-reduce per optimizer step. The loss scaling of the original
(``loss = loss / accum``) stays as it is. The condition is the loop's own, read as it
will be at the step (:func:`dp2ddp.model.accumulation.accumulations`); where it cannot be read
before the forward the file is refused (DDP141); where the gradients are read between
micro-steps (``clip_grad_norm_`` outside the step's ``if``) every pass keeps all-reducing
(DDP142).
"""

from __future__ import annotations

import ast
from typing import List, Set

import libcst as cst

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Enclose, Finding
from dp2ddp.model.accumulation import Accumulation, accumulations
from dp2ddp.model.collectives import VarKey, assigned_keys, var_key
from dp2ddp.model.uses import wrapper_keys
from dp2ddp.model.wraps import dp_wraps

_LONG = 100  # a longer `with` line is split over several
_COMMENT = "# dp2ddp: all-reduce the gradients only in the backward pass an optimizer step follows"


def propose(ctx: Context) -> List[Finding]:
    out: List[Finding] = []
    for acc in accumulations(ctx.m):
        step = ctx.m.source(acc.step.func.value) + ".step()" if isinstance(acc.step.func, ast.Attribute) else "the step"
        if acc.problem is not None:
            out.append(ctx.block(acc.gate[0][0], "DDP141", (
                f"{step} follows only some backward passes, and dp2ddp cannot read its condition before the forward: "
                f"{acc.problem}; compute the condition from values known before the forward (the loop index, a counter)"
            )))
            continue
        if acc.keep_sync is not None or acc.first is None:
            out.append(ctx.warn(acc.keep_sync_node or acc.gate[0][0], "DDP142", (
                f"{acc.keep_sync}; so every backward pass of this accumulation loop still all-reduces (correct, not faster)"
            )))
            continue
        stmts = _statements(ctx, acc)
        if stmts is None:
            out.append(ctx.warn(acc.first, "DDP142", (
                "the forward and backward share a line with other statements: every backward pass of this "
                "accumulation loop still all-reduces (correct, not faster)"
            )))
            continue
        out.append(_no_sync(ctx, acc, stmts))
    return out


def _statements(ctx: Context, acc: Accumulation):
    body = acc.loop.body  # type: ignore[attr-defined]
    i = next(i for i, s in enumerate(body) if s is acc.first)
    j = next(i for i, s in enumerate(body) if s is acc.last)
    run = body[i : j + 1]
    if not all(ctx.bridge.alone_on_line(s) for s in run):
        return None
    return tuple(ctx.bridge.statement(s) for s in run)


def _no_sync(ctx: Context, acc: Accumulation, stmts) -> Finding:
    m = ctx.m
    wrapper = m.source(acc.wrapper)
    condition = acc.condition
    if not _always_ddp(ctx, acc.wrapper):
        condition = f"{condition} or not isinstance({wrapper}, {ctx.name('DDP')})"
    values = dict(nullcontext=ctx.name("contextlib") + ".nullcontext", condition=condition, wrapper=wrapper)
    template = "with {nullcontext}() if {condition} else {wrapper}.no_sync():\n    pass\n"
    indent = len(m.line_text(acc.first.lineno)) - len(m.line_text(acc.first.lineno).lstrip())  # type: ignore[union-attr]
    if indent + len(ctx._fmt(template, values).splitlines()[0]) > _LONG:
        template = "with (\n    {nullcontext}()\n    if {condition}\n    else {wrapper}.no_sync()\n):\n    pass\n"
    with_stmt = ctx.stmt(template, **values)
    with_stmt = with_stmt.with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(_COMMENT))])
    read = f" (read before the forward: {', '.join(f'{k} as {v}' for k, v in acc.substituted.items())})" if acc.substituted else ""
    message = (
        f"gradient accumulation: the forward and backward of the passes that do not step run under "
        f"{wrapper}.no_sync(), so only the pass before `if {m.source(acc.gate[0][0])}` all-reduces{read}; "
        "the loss scaling is the original's"
    )
    return ctx.note(acc.gate[0][0], "DDP140", message, [Enclose(stmts, with_stmt)])


def _always_ddp(ctx: Context, wrapper: ast.AST) -> bool:
    """The variable holds a DDP wrapper whenever the loop runs: a plain script whose every
    wrap of it is unconditional after the migration (DDP103 hoists a lone guarded wrap)."""
    m = ctx.m
    if ctx.mode != "plain":
        return False
    key = var_key(m, wrapper)
    wraps = [w for w in dp_wraps(m) if not w.functional]
    safe: Set[VarKey] = set()
    unsafe: Set[VarKey] = set()
    for w in wraps:
        keys = set(assigned_keys(m, w.outer))
        if isinstance(m.parent(w.outer), ast.IfExp) or (w.conditions and len(wraps) > 1):
            unsafe |= keys
        else:
            safe |= keys
    return key in wrapper_keys(m, safe) and key not in (wrapper_keys(m, unsafe) if unsafe else set())
