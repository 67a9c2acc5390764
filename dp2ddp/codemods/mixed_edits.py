"""The edits of a mixed script (:mod:`mixed`) that need no plan, one call or statement
each: ``init_process_group``'s backend and the group destroyed at exit, CUDA-only calls on
the distributed path (``set_device``, ``device_ids``, ``.cuda()``, a rank's CUDA device)
made to run on CPU too, apex's DistributedDataParallel made torch's, the model wrapped
where no path did, ``MASTER_PORT`` that yields to torchrun's.
"""

from __future__ import annotations

import ast
from typing import List, Optional

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Finding, Guard, InsertAfter, Replace
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.cuda_only import cuda_device_arguments, under_cuda_test
from dp2ddp.model.names import APEX_DDP, DESTROY
from dp2ddp.model.own_path import init_arguments, wrap_assignments
from dp2ddp.model.syntax import kwarg


def init_call(ctx: Context, init: ast.Call, cuda: str) -> List[Finding]:
    m = ctx.m
    out = []
    backend = (init_arguments(m, init) or {}).get("backend")
    if isinstance(backend, ast.Constant) and backend.value == "nccl":
        out.append(ctx.note(backend, "DDP121", "backend nccl with CUDA, gloo on CPU", [Replace(ctx.cst(backend), ctx.expr('"nccl" if {c} else "gloo"', c=cuda))]))
    stmt = m.statement_of(init)
    if not m.calls(DESTROY) and isinstance(stmt, ast.Expr) and ctx.bridge.alone_on_line(stmt):
        atexit = ctx.name("atexit")
        dist = ctx.name("dist")
        out.append(ctx.note(init, "DDP121", "the process group is destroyed at exit",
                            [InsertAfter(ctx.bridge.statement(stmt), (ctx.stmt("{a}.register({d}.destroy_process_group)", a=atexit, d=dist),))]))
    return out


def guard_set_device(ctx: Context, call: ast.Call, cuda: str) -> Optional[Finding]:
    m = ctx.m
    stmt = m.statement_of(call)
    if not (isinstance(stmt, ast.Expr) and stmt.value is call and ctx.bridge.alone_on_line(stmt)):
        return None
    if under_cuda_test(m, stmt):
        return None
    return ctx.note(call, "DDP121", "torch.cuda.set_device only with CUDA", [Guard((ctx.bridge.statement(stmt),), ctx.expr(cuda))])


def ddp_devices(ctx: Context, call: ast.Call, cuda: str) -> Optional[Finding]:
    m = ctx.m
    edits = [Replace(ctx.cst(v), ctx.expr("{v} if {c} else None", v=paren(m, v), c=cuda)) for v in cuda_device_arguments(m, call)]
    if kwarg(call, "device_ids") is None and len(call.args) < 2 and not any(k.arg is None for k in call.keywords):
        torch = ctx.name("torch")
        from dp2ddp.codemods.context import add_kwarg

        value = f"[{torch}.cuda.current_device()] if {cuda} else None"
        edits.append(Replace(ctx.cst(call), lambda u, v=value: add_kwarg(u, "device_ids", v)))
    if not edits:
        return None
    return ctx.note(call, "DDP121", "device_ids only with CUDA (CPU ranks pass None)", edits)


def apex_ddp(ctx: Context) -> List[Finding]:
    """apex's DistributedDataParallel (NVIDIA's, from before torch had its own) becomes
    torch's: the script's distributed path then needs no apex, and runs on CPU."""
    m = ctx.m
    out: List[Finding] = []
    for call in m.calls(APEX_DDP):
        if not call.args or any(isinstance(a, ast.Starred) for a in call.args):
            continue
        dropped = [k.arg for k in call.keywords if k.arg is not None]
        new = ctx.expr(ctx.ddp_call(m.source(call.args[0])))
        msg = "apex.parallel.DistributedDataParallel -> torch's DistributedDataParallel"
        if dropped:
            msg += f" (apex-only arguments dropped: {', '.join(dropped)})"
        out.append(ctx.note(call, "DDP121", msg, [Replace(ctx.cst(call), new)]))
    for imp in m.nodes(ast.ImportFrom):
        if not any(f"{imp.module}.{a.name}" in APEX_DDP for a in imp.names):
            continue
        if len(imp.names) != 1 or not ctx.bridge.alone_on_line(imp):
            continue
        stmt: ast.stmt = imp
        owner = m.parent(imp)
        if isinstance(owner, ast.Try) and owner.body == [imp] and not owner.orelse and not owner.finalbody and ctx.bridge.alone_on_line(owner):
            stmt = owner  # try: from apex... except ImportError: raise ...: the whole try goes
        if m.parent(stmt) is m.tree:
            continue  # a module-level import: left for RemoveImportIfUnused
        from dp2ddp.engine import Remove

        out.append(ctx.note(imp, "DDP121", "the apex import is no longer needed", [Remove(ctx.bridge.statement(stmt))]))
    return out


def ensure_wrapped(ctx: Context, call: ast.Call, ensured: set) -> List[Finding]:
    """After the ``if`` chain that wraps the model on some paths, wrap it where no path did
    (where each assignment of the wrap stands: :func:`wrap_assignments`)."""
    out = []
    for assign, top in wrap_assignments(ctx.m, call):
        target = ctx.m.source(assign.targets[0])
        if top is None or not ctx.bridge.alone_on_line(top) or (id(top), target) in ensured:
            continue
        ensured.add((id(top), target))
        new = ctx.stmt(
            "if {dist}.is_initialized() and not isinstance({t}, {DDP}):  # dp2ddp: a path that did not wrap\n    {t} = {call}\n",
            dist=ctx.name("dist"), t=target, DDP=ctx.name("DDP"), call=ctx.ddp_call(target),
        )
        out.append(ctx.note(top, "DDP121", f"{target} is wrapped in DistributedDataParallel on every path of the distributed run",
                            [InsertAfter(ctx.bridge.statement(top), (new,))]))
    return out


def cuda_device(ctx: Context, node: ast.AST, kind: str, cuda: str) -> Finding:
    """``torch.device("cuda", local_rank)`` or ``'cuda:%d' % local_rank`` in the distributed
    path: the CPU when there is no CUDA (a gloo run on CPU)."""
    m = ctx.m
    cpu = f'{ctx.name("torch")}.device("cpu")' if kind == "device" else '"cpu"'
    text = m.source(node) if isinstance(node, ast.Call) else f"({m.source(node)})"
    return ctx.note(node, "DDP121", "the rank's CUDA device, or the CPU without CUDA",
                    [Replace(ctx.cst(node), ctx.expr("{c} if {cuda} else {cpu}", c=text, cuda=cuda, cpu=cpu))])


def cuda_call(ctx: Context, call: ast.Call, cuda: str) -> Finding:
    """``x.cuda()`` on the distributed path runs on CPU too: ``x.cuda() if CUDA else x``."""
    parent = ctx.m.parent(call)
    why = ".cuda() only with CUDA (the distributed path runs on CPU too)"
    if isinstance(parent, ast.Expr) and ctx.bridge.alone_on_line(parent):
        return ctx.note(call, "DDP121", why, [Guard((ctx.bridge.statement(parent),), ctx.expr(cuda))])
    return ctx.note(call, "DDP121", why, [Replace(ctx.cst(call), ctx.expr("{c} if {cuda} else {r}", c=call, cuda=cuda, r=call.func.value))])  # type: ignore[attr-defined]


def master_env(ctx: Context, assign: ast.Assign) -> Finding:
    """``os.environ["MASTER_PORT"] = "8000"`` -> ``os.environ.setdefault(...)``: torchrun's wins."""
    t = assign.targets[0]
    new = ctx.stmt("{e}.setdefault({k}, {v})", e=t.value, k=t.slice, v=assign.value)  # type: ignore[attr-defined]
    return ctx.note(assign, "DDP121", f"{t.slice.value} keeps torchrun's value",  # type: ignore[attr-defined]
                    [Replace(ctx.bridge.statement(assign), lambda u, n=new: n.with_changes(leading_lines=u.leading_lines))])


def paren(m: SemanticModel, node: ast.AST) -> str:
    text = m.source(node)
    if isinstance(node, (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant, ast.List, ast.Compare)):
        return text
    return f"({text})"
