"""Call ``loader.sampler.set_epoch(epoch)`` at the top of the epoch loop.

Without it, ``DistributedSampler`` shuffles every epoch the same way. The loader is
followed from where it is built (a name, ``self.attr``, or a helper's return value) to
where it is iterated (directly, through ``enumerate``/``tqdm``/``iter``, or as an
argument of a function such as ``train(model, loader, epoch)``), and from there to the
nearest enclosing loop — in the same function, or around the call of that function.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from dp2ddp.analysis import code
from dp2ddp.codemods.context import MigrationContext
from dp2ddp.codemods.distributed_sampler import training_loaders
from dp2ddp.engine import Finding, Fix, InsertBefore

CODE = "DDP131"
CODE_MISSING = "DDP106"
PASS_THROUGH = {"enumerate", "tqdm", "iter", "zip", "trange", "progress_bar", "track"}
MAX_DEPTH = 4

# A handle is where a loader can be named: (scope, text). scope is a FunctionDef (local
# name), a ClassDef (``self.x``) or None (module global).
Handle = Tuple[Optional[cst.CSTNode], str]


def _unwrap(expr: cst.BaseExpression) -> cst.BaseExpression:
    while isinstance(expr, cst.Call) and expr.args:
        fn = expr.func
        name = fn.value if isinstance(fn, cst.Name) else fn.attr.value if isinstance(fn, cst.Attribute) else None
        if name not in PASS_THROUGH:
            break
        expr = expr.args[0].value
    return expr


class _Resolver:
    def __init__(self, ctx: MigrationContext) -> None:
        self.ctx = ctx
        self.an = ctx.an

    # where is an expression valid, and under which handle does it go?
    def handle_of(self, expr: cst.BaseExpression, at: cst.CSTNode) -> Optional[Handle]:
        func = self.an.enclosing_function(at)
        if isinstance(expr, cst.Name):
            if func is not None and self._binds_locally(func, expr.value):
                return (func, expr.value)
            return (None, expr.value)
        if isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name) and expr.value.value == "self":
            cls = self.an.enclosing_class(at)
            return (cls, code(expr)) if cls is not None else None
        return None

    def _binds_locally(self, func: cst.FunctionDef, name: str) -> bool:
        scope = self.an.scope_of(func.body)
        if scope is None or name in self._declared_global(func):
            return False
        return any(a.name == name for a in scope.assignments)

    @staticmethod
    def _declared_global(func: cst.FunctionDef) -> Set[str]:
        names: Set[str] = set()

        class _V(cst.CSTVisitor):
            def visit_Global(self, node: cst.Global) -> None:
                names.update(n.name.value for n in node.names)

        func.visit(_V())
        return names

    def params(self, func: cst.FunctionDef) -> List[str]:
        return [p.name.value for p in list(func.params.posonly_params) + list(func.params.params)]

    def call_sites(self, func: cst.FunctionDef) -> List[cst.Call]:
        cls = self.an.enclosing_class(func) if self.an.is_method(func) else None
        out = []
        for call in self.an.nodes_of(cst.Call):
            fn = call.func
            if cls is None and isinstance(fn, cst.Name) and fn.value == func.name.value and self.an.module_functions.get(fn.value) is func:
                out.append(call)
            elif (
                cls is not None
                and isinstance(fn, cst.Attribute)
                and isinstance(fn.value, cst.Name)
                and fn.value.value == "self"
                and fn.attr.value == func.name.value
                and self.an.enclosing_class(call) is cls
            ):
                out.append(call)
        return out

    def argument_for(self, func: cst.FunctionDef, call: cst.Call, param: str) -> Optional[cst.BaseExpression]:
        names = self.params(func)
        if self.an.is_method(func) and names and names[0] in ("self", "cls"):
            names = names[1:]
        positional = [a for a in call.args if a.keyword is None and not a.star]
        for a in call.args:
            if a.keyword is not None and a.keyword.value == param:
                return a.value
        if param in names and names.index(param) < len(positional):
            return positional[names.index(param)].value
        return None


def _handles_for_loader(res: _Resolver, loader) -> Dict[Handle, str]:
    """handle -> the expression to call ``.sampler.set_epoch`` on, valid in that handle's scope."""
    an = res.an
    out: Dict[Handle, str] = {}
    if loader.target is not None:
        h = res.handle_of(loader.target, loader.call)
        if h is not None:
            out[h] = code(loader.target)
    # returned from a helper: follow its call sites (one level)
    func = loader.function
    if func is not None:
        returned: List[Tuple[Optional[int]]] = []
        for ret in an.nodes_of(cst.Return):
            if an.enclosing_function(ret) is not func or ret.value is None:
                continue
            values = ret.value.elements if isinstance(ret.value, cst.Tuple) else [ret.value]
            for i, el in enumerate(values):
                v = el.value if isinstance(el, cst.Element) else el
                if v is loader.call or (
                    isinstance(v, cst.Name) and loader.target is not None and code(loader.target) == v.value
                ):
                    returned.append(i if isinstance(ret.value, cst.Tuple) else None)
        for index in returned:
            for call in res.call_sites(func):
                parent = an.parent(call)
                if not (isinstance(parent, cst.Assign) and parent.value is call and len(parent.targets) == 1):
                    continue
                tgt = parent.targets[0].target
                if index is not None:
                    if not isinstance(tgt, (cst.Tuple, cst.List)) or index >= len(tgt.elements):
                        continue
                    tgt = tgt.elements[index].value
                if isinstance(tgt, (cst.Name, cst.Attribute)):
                    h = res.handle_of(tgt, call)
                    if h is not None:
                        out[h] = code(tgt)
    # aliases: `it = tqdm(loader)` names the same loader
    for assign in an.nodes_of(cst.Assign):
        if len(assign.targets) != 1:
            continue
        tgt = assign.targets[0].target
        inner = _unwrap(assign.value)
        if inner is assign.value or not isinstance(tgt, (cst.Name, cst.Attribute)):
            continue
        h_inner = res.handle_of(inner, assign) if isinstance(inner, (cst.Name, cst.Attribute)) else None
        if h_inner in out:
            h = res.handle_of(tgt, assign)
            if h is not None and h not in out:
                out[h] = out[h_inner]
    return out


def _enclosing_loop(an, node: cst.CSTNode, stop: Optional[cst.CSTNode]) -> Optional[cst.CSTNode]:
    for a in an.ancestors(node):
        if a is stop or isinstance(a, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return None
        if isinstance(a, (cst.For, cst.While)):
            return a
    return None


def _find_epoch_loops(res: _Resolver, site: cst.CSTNode, expr_text: str, depth: int, seen: Set) -> List[Tuple[cst.CSTNode, str]]:
    """(loop, expression valid inside that loop) for the epoch loop(s) around ``site``."""
    an = res.an
    loop = _enclosing_loop(an, site, None)
    if loop is not None:
        return [(loop, expr_text)]
    func = an.enclosing_function(site)
    if func is None or depth >= MAX_DEPTH or func in seen:
        return []
    seen = seen | {func}
    out = []
    expr = cst.parse_expression(expr_text)
    h = res.handle_of(expr, site)
    for call in res.call_sites(func):
        if h is not None and h[0] is func:
            # a local or a parameter of func: map through the call's argument
            arg = res.argument_for(func, call, expr_text) if expr_text in res.params(func) else None
            if arg is None or not isinstance(arg, (cst.Name, cst.Attribute)):
                continue
            out.extend(_find_epoch_loops(res, call, code(arg), depth + 1, seen))
        else:
            caller_h = res.handle_of(expr, call)
            if caller_h == h:
                out.extend(_find_epoch_loops(res, call, expr_text, depth + 1, seen))
    return out


def _iteration_sites(res: _Resolver, handles: Dict[Handle, str], depth: int = 0) -> List[Tuple[cst.CSTNode, str]]:
    """Places where the loader is iterated: (the For node or the call passing it on, expression)."""
    an = res.an
    sites = []
    for loop in an.nodes_of(cst.For):
        it = _unwrap(loop.iter)
        if not isinstance(it, (cst.Name, cst.Attribute)):
            continue
        h = res.handle_of(it, loop)
        if h in handles:
            sites.append((loop, handles[h]))
            continue
        # a parameter of the enclosing function that receives the loader
        func = an.enclosing_function(loop)
        if func is None or not isinstance(it, cst.Name) or it.value not in res.params(func) or depth >= MAX_DEPTH:
            continue
        for call in res.call_sites(func):
            arg = res.argument_for(func, call, it.value)
            if arg is None:
                continue
            arg = _unwrap(arg)
            if isinstance(arg, (cst.Name, cst.Attribute)):
                h2 = res.handle_of(arg, call)
                if h2 in handles:
                    sites.append((call, handles[h2]))
    return sites


def propose(ctx: MigrationContext) -> List[Finding]:
    res = _Resolver(ctx)
    findings: List[Finding] = []
    done: Set[Tuple[int, str]] = set()
    for loader in training_loaders(ctx):
        handles = _handles_for_loader(res, loader)
        placed = False
        for site, expr_text in _iteration_sites(res, handles):
            start = site if not isinstance(site, cst.For) else res.an.parent(site)
            loops = _find_epoch_loops(res, start, expr_text, 0, set())
            for loop, text in loops:
                key = (id(loop), text)
                if key in done:
                    placed = True
                    continue
                f = _insert(ctx, loop, text)
                if f is not None:
                    done.add(key)
                    findings.append(f)
                    placed = True
        if not placed:
            name = code(loader.target) if loader.target is not None else "the training loader"
            findings.append(
                ctx.warn(
                    loader.call,
                    CODE_MISSING,
                    f"no epoch loop found for {name}: call {name}.sampler.set_epoch(epoch) at the start of every epoch",
                )
            )
    return findings


def _insert(ctx: MigrationContext, loop: cst.CSTNode, expr_text: str) -> Optional[Finding]:
    if not isinstance(loop.body, cst.IndentedBlock):
        return ctx.warn(loop, CODE_MISSING, f"one-line epoch loop: call {expr_text}.sampler.set_epoch(epoch) by hand")
    if isinstance(loop, cst.For) and isinstance(loop.target, cst.Name):
        epoch = loop.target.value
    elif isinstance(loop, cst.For) and isinstance(loop.target, cst.Tuple) and isinstance(_unwrap_enumerate_target(loop), cst.Name):
        epoch = _unwrap_enumerate_target(loop).value
    else:
        return ctx.warn(loop, CODE_MISSING, f"epoch loop without an epoch counter: call {expr_text}.sampler.set_epoch(epoch) by hand")
    first = loop.body.body[0]
    stmt = ctx.stmt("{e}.sampler.set_epoch({epoch})", e=expr_text, epoch=epoch)
    f = ctx.note(loop, CODE, f"{expr_text}.sampler.set_epoch({epoch}) at the start of every epoch, so each epoch shuffles differently")
    f.fix = Fix([InsertBefore(first, (stmt,))])
    return f


def _unwrap_enumerate_target(loop: cst.For):
    """``for epoch, x in enumerate(...)``: the counter is the first element."""
    if isinstance(loop.iter, cst.Call) and isinstance(loop.iter.func, cst.Name) and loop.iter.func.value == "enumerate":
        first = loop.target.elements[0].value
        return first
    return None
