"""A set-up call that makes the run's folder runs on rank 0; every rank gets its result.

``args = get_args()`` (a project function that names the run's folder by the clock and
makes it with ``exist_ok=False``) becomes ``args = run_on_rank_zero(get_args)``: rank 0
runs it, the others receive its result through the process group (pickled) and the
process state it changed that training reads (random seeds and states, cudnn's flags,
environment variables). The arguments are evaluated on every rank, as before. Without a
process group (plain ``python``, a helper module run on its own) it simply calls. Where the
call does something else the other ranks need (:func:`dp2ddp.model.writers_setup.setup_calls`),
or stands where the ranks may not all reach it once, it is refused (DDP110) with the reason.
Not a transform of its own: :mod:`rank_writers` asks it for each such call.
The soundness argument: ``docs/design-setup-calls.md``.
"""

from __future__ import annotations

import ast
from typing import Optional

import libcst as cst

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Finding, Replace
from dp2ddp.model.ranks import rank_guarded
from dp2ddp.model.syntax import COMPREHENSIONS, LOOPS
from dp2ddp.model.writers_setup import SetupCall


def propose(ctx: Context, sc: SetupCall) -> Finding:
    m = ctx.m
    call = sc.call
    head = f"{sc.name} {sc.why}"
    if sc.refusal is not None:
        return ctx.block(call, "DDP110", f"{head}; it cannot run on rank 0 alone with its result sent to the others: "
                         f"{sc.refusal}; {sc.advice}, then migrate")
    where = _unordered(ctx, call)
    if where is not None:
        return ctx.block(call, "DDP110", f"{head}; dp2ddp would run it on rank 0 alone and send its result to the others, "
                         f"but {where}; {sc.advice}, then migrate")
    helper = _helper(ctx)
    edit = Replace(ctx.cst(call), lambda u: u.with_changes(func=cst.Name(helper), args=[cst.Arg(u.func), *u.args]))
    return ctx.note(call, "DDP114", f"{head}: it runs on rank 0 only and every rank gets its result "
                    "(and the seeds, cudnn flags and environment variables it set)", [edit])


def _unordered(ctx: Context, call: ast.Call):
    """Why the ranks might not all run the call exactly once, in step; ``None`` when they do."""
    m = ctx.m
    stmt = m.statement_of(call)
    if ctx.mode != "plain":
        return "the script has its own distributed path"
    if ctx.role != "helper" and not ctx.in_setup_region(call):
        return "it runs before the process group exists"
    if rank_guarded(m, call):
        return "it is under a rank test"
    if in_a_choosing_expression(m, call, stmt):
        return "it is evaluated inside an expression that may skip it or repeat it"
    if stmt is None or not ctx.bridge.alone_on_line(stmt):
        return "its statement shares its line"
    func = m.enclosing_function(call)
    for a in m.ancestors(stmt):
        if a is func:
            break
        if isinstance(a, LOOPS):
            return f"it is called in a loop (line {a.lineno})"
    if isinstance(call.func, ast.Lambda) or not isinstance(call.func, (ast.Name, ast.Attribute)):
        return "its function is not a name"
    return None


def in_a_choosing_expression(m, call: ast.Call, stmt: Optional[ast.stmt]) -> bool:
    """``call`` stands, within its statement, in an expression that may skip it or run it
    again (a lambda, ``a if c else b``, ``a or b``, a comprehension): the ranks might not all
    run it once."""
    for a in m.ancestors(call):
        if a is stmt:
            return False
        if isinstance(a, (ast.Lambda, ast.IfExp, ast.BoolOp) + COMPREHENSIONS):
            return True
    return False


def _helper(ctx: Context) -> str:
    """The name of the generated ``run_on_rank_zero`` (defined once per module)."""
    name = getattr(ctx, "_rank_zero_setup", None)
    if name is None:
        name = ctx.fresh_name("run_on_rank_zero")
        ctx.define_after_imports("rank_zero_setup.py.tmpl", helper=name, dist=ctx.name("dist"), torch=ctx.name("torch"),
                                 os=ctx.name("os"), sys=ctx.name("sys"), random=ctx.name("random"))
        ctx._rank_zero_setup = name  # type: ignore[attr-defined]
    return name
