"""Functional DataParallel: ``nn.parallel.data_parallel(module, inputs, device_ids)``.

The call splits each batch over the GPUs inside a model's ``forward`` (pytorch/examples
dcgan). Under DDP each process runs its own batch, so:

* the call becomes a plain call, ``data_parallel(self.main, x, ids)`` -> ``self.main(x)``;
* every instance of the model class that owns the call is wrapped in
  ``DistributedDataParallel`` where it is created (a GAN has two: both), and the uses of
  the instance that read the model itself go through ``.module`` — the original had no
  wrapper, so its checkpoints keep keys without the ``module.`` prefix.
"""

from __future__ import annotations

import ast
from typing import Dict, List, Set

from dp2ddp.codemods.context import Context
from dp2ddp.codemods.find_unused import owners_need_find_unused
from dp2ddp.codemods.wrapper_refs import route_uses
from dp2ddp.engine import Finding, InsertAfter, Replace
from dp2ddp.model.collectives import VarKey, assigned_keys, outer_chain
from dp2ddp.model.kinds import is_module_class
from dp2ddp.model.wrap_placement import absorb_placement
from dp2ddp.model.syntax import FUNCTIONS
from dp2ddp.model.wraps import dp_wraps


def _outside_forward(m, w) -> str:
    """Why a functional ``data_parallel`` outside a module's ``forward`` is left alone: where
    it is, and what the user can do (BigGAN's sampling helpers call it under ``no_grad``)."""
    from dp2ddp.model.training import under_no_grad

    func = m.enclosing_function(w.call)
    where = f"in `{func.name}()`" if func is not None else "at module level"
    module = m.source(w.module)
    why = (f"`{m.source(w.call.func)}({module}, ...)` {where} runs {module} over the GPUs outside an nn.Module's forward of "
           "this script (dp2ddp replaces a functional data_parallel only inside a module's forward, by wrapping the module's "
           "instances in DistributedDataParallel)")
    if under_no_grad(m, w.call):
        return (why + f"; it runs without gradients (sampling or evaluation): call `{module}(...)` directly there, each rank "
                "running its own batch, then migrate")
    return why + "; call the module directly there and wrap it where it is built, then migrate"


def propose(ctx: Context) -> List[Finding]:
    m = ctx.m
    wraps = [w for w in dp_wraps(m) if w.functional]
    if not wraps:
        return []
    out: List[Finding] = []
    owners: Dict[str, ast.ClassDef] = {}
    for w in wraps:
        if w.problem:
            out.append(ctx.block(w.call, "DDP101", f"{w.problem}; left unchanged"))
            continue
        cls = m.enclosing_class(w.call)
        if not is_module_class(m, cls) or m.parent(cls) is not m.tree:
            out.append(ctx.block(w.call, "DDP101", _outside_forward(m, w)))
            continue
        inputs = w.args.get("inputs")
        if isinstance(inputs, ast.Tuple):
            args = ", ".join("*" + m.source(e.value) if isinstance(e, ast.Starred) else m.source(e) for e in inputs.elts)
        else:
            args = m.source(inputs)
        module_text = m.source(w.module)
        if not isinstance(w.module, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
            module_text = f"({module_text})"
        out.append(ctx.note(w.call, "DDP123", f"data_parallel(...) -> {module_text}(...): each process runs its own batch",
                            [Replace(ctx.cst(w.call), ctx.expr("{f}({a})", f=module_text, a=args))]))
        owners[cls.name] = cls
    if any(f.severity == "error" for f in out):
        return out
    seeds: Set[VarKey] = set()
    find_unused = owners_need_find_unused(ctx, out)
    wrap_stmts = []
    for name, cls in owners.items():
        instances = [c for c in m.nodes(ast.Call) if isinstance(c.func, ast.Name) and c.func.id == name and m.resolve(c.func) == name]
        if not instances:
            out.append(ctx.warn(cls, "DDP111", f"no instance of {name} found: wrap it in DistributedDataParallel where it is created"))
            continue
        for inst in instances:
            if m.enclosing_class(inst) is not None and isinstance(m.enclosing_function(inst), FUNCTIONS) and m.is_method(m.enclosing_function(inst)):
                pass
            outer = outer_chain(m, inst)
            stmt = m.statement_of(inst)
            parent = m.parent(outer)
            target = parent.targets[0] if isinstance(parent, ast.Assign) and parent.value is outer and len(parent.targets) == 1 else None
            if not isinstance(target, (ast.Name, ast.Attribute)) or stmt is None or not ctx.bridge.alone_on_line(stmt):
                out.append(ctx.block(inst, "DDP101", f"{name}(...) is not assigned to a variable: wrap it in DistributedDataParallel by hand"))
                return out
            if ctx.mode == "plain" and not ctx.in_setup_region(stmt):
                out.append(ctx.block(inst, "DDP101", f"{name}(...) is created before the process group exists; migrate this by hand"))
                return out
            anchor = absorb_placement(m, stmt, target)
            t = m.source(target)
            new = ctx.stmt("{t} = {call}", t=t, call=ctx.ddp_call(t, find_unused))
            out.append(ctx.note(anchor, "DDP123", f"wrap {t} ({name}) in DistributedDataParallel here", [InsertAfter(ctx.bridge.statement(anchor), (new,))]))
            keys = assigned_keys(m, outer)
            seeds.update(keys)
            wrap_stmts.append((anchor, t))
    out.extend(route_uses(ctx, seeds, seeds, wrap_stmts, bare=True))
    return out
