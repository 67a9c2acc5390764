"""Collectives, DDP wrappers and the functions of the script that reach them.

A *collective* completes only when every rank calls it: the ``torch.distributed``
collectives, the construction of a ``DistributedDataParallel`` wrapper (it broadcasts
the parameters), and the forward pass of a DDP-wrapped model (it synchronises buffers
and prepares the gradient all-reduce). For the migration, a DataParallel wrap and a
call of a DataParallel-wrapped model count too: they become a DDP construction and a DDP
forward.
"""

from __future__ import annotations

import ast
from typing import Dict, List, Optional, Set, Tuple

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.kinds import SAME_MODULE
from dp2ddp.model.names import COLLECTIVES, DDP, DP, DP_FUNCTIONAL

# A variable is keyed by where it lives: ("local", function, name), ("global", None, name)
# or ("attr", class, "self.x").
VarKey = Tuple[str, Optional[ast.AST], str]


def var_key(m: SemanticModel, node: ast.AST) -> Optional[VarKey]:
    """The variable ``node`` (a Name, or ``self.x``) names at its position."""
    if isinstance(node, ast.Name):
        scope = m.scope_of(node)
        where, _ = m.lookup(node.id, scope)
        if where is None or where.kind == "module":
            return ("global", None, node.id)
        if where.kind == "function":
            return ("local", where.node, node.id)
        return ("other", where.node, node.id)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        if node.value.id == "self":
            cls = m.enclosing_class(node)
            return ("attr", m.root_class(cls), "self." + node.attr) if cls is not None else None
        # trainer.writer where trainer = Trainer(...): the attribute of that class
        cls = m.instance_class(node.value)
        if cls is not None:
            return ("attr", m.root_class(cls), "self." + node.attr)
    return None


def assigned_keys(m: SemanticModel, value: ast.AST) -> List[VarKey]:
    """The variables ``value`` is assigned to (``x = value``, ``self.x = value``)."""
    parent = m.parent(value)
    targets: List[ast.AST] = []
    if isinstance(parent, ast.Assign) and parent.value is value:
        targets = list(parent.targets)
    elif isinstance(parent, (ast.AnnAssign, ast.AugAssign)) and parent.value is value:
        targets = [parent.target]
    out = []
    for t in targets:
        k = var_key(m, t)
        if k is not None:
            out.append(k)
    return out


def outer_chain(m: SemanticModel, call: ast.Call) -> ast.AST:
    """``W(m).cuda().to(d)``: the outermost call of module-returning methods around ``call``."""
    cur: ast.AST = call
    while True:
        attr = m.parent(cur)
        outer = m.parent(attr) if attr is not None else None
        if (
            isinstance(attr, ast.Attribute)
            and attr.value is cur
            and attr.attr in SAME_MODULE
            and isinstance(outer, ast.Call)
            and outer.func is attr
        ):
            cur = outer
            continue
        return cur


def wrapped_vars(m: SemanticModel, dp: bool = False) -> Set[VarKey]:
    """Variables bound to a DDP wrapper (with ``dp``: to a DataParallel wrapper too)."""
    key = f"collectives:wrapped:{dp}"
    got = m.cache.get(key)
    if got is None:
        got = set()
        names = DDP | (DP if dp else frozenset())
        for call in m.calls(names):
            got.update(assigned_keys(m, outer_chain(m, call)))
        m.cache[key] = got
    return got  # type: ignore[return-value]


def is_wrapped_forward(m: SemanticModel, call: ast.Call, dp: bool = False) -> bool:
    """``model(x)`` / ``self.model(x)`` where the variable holds a DDP (or DP) wrapper."""
    k = var_key(m, call.func)
    if k is None:
        return False
    return k in wrapped_vars(m, dp)


def collective_of(m: SemanticModel, call: ast.Call, dp: bool = False) -> Optional[str]:
    """What makes ``call`` a collective (``"all_reduce()"``, ``"DDP construction"``,
    ``"DDP forward"``), or ``None``."""
    q = m.qualified_names(call.func)
    hit = q & COLLECTIVES
    if hit:
        return sorted(n.rsplit(".", 1)[1] for n in hit)[0] + "()"
    if q & DDP or (dp and q & (DP | DP_FUNCTIONAL)):
        return "DDP construction"
    if is_wrapped_forward(m, call, dp):
        return "DDP forward"
    return None


def reaching_functions(m: SemanticModel, dp: bool = False) -> Dict[ast.AST, str]:
    """Functions of the module that reach a collective (directly or through calls), with
    what they reach (``"evaluate() -> DDP forward"``)."""
    key = f"collectives:reach:{dp}"
    got = m.cache.get(key)
    if got is not None:
        return got  # type: ignore[return-value]
    direct: Dict[ast.AST, str] = {}
    funcs = [f for f in m.nodes(ast.FunctionDef)] + [f for f in m.nodes(ast.AsyncFunctionDef)]
    for f in funcs:
        for call in m.calls_in(f):
            what = collective_of(m, call, dp)
            if what is not None:
                direct[f] = what
                break
    out = dict(direct)
    changed = True
    while changed:
        changed = False
        for f in funcs:
            if f in out:
                continue
            for call in m.calls_in(f):
                t = m.resolve_call(call)
                if t is not None and t in out:
                    out[f] = f"{t.name}() -> {out[t]}"  # type: ignore[attr-defined]
                    changed = True
                    break
    m.cache[key] = out
    return out


def reaches_collective(m: SemanticModel, node: ast.AST, dp: bool = False) -> Optional[str]:
    """Whether evaluating ``node`` may reach a collective; says how (``None``: it does not)."""
    reach = reaching_functions(m, dp)
    calls = [node] if isinstance(node, ast.Call) else []
    calls += [c for c in ast.walk(node) if isinstance(c, ast.Call) and c is not node]
    for call in calls:
        what = collective_of(m, call, dp)
        if what is not None:
            return what
        t = m.resolve_call(call)
        if t is not None and t in reach:
            return f"{t.name}() -> {reach[t]}"  # type: ignore[attr-defined]
    return None


# --------------------------------------------------------------------------- DDP code

DIST_PREFIX = "torch.distributed"


def is_ddp_name(qualified: str) -> bool:
    """``torch.distributed`` or anything in it, or ``DistributedDataParallel`` itself (a
    name *below* the class, ``DistributedDataParallel.x``, is not)."""
    return qualified in DDP or qualified == DIST_PREFIX or qualified.startswith(DIST_PREFIX + ".")


_DDP_TAILS = frozenset({"distributed"} | {n.rsplit(".", 1)[1] for n in DDP})


def is_ddp_code(m: SemanticModel) -> bool:
    """The module is distributed code: it imports or names ``torch.distributed`` (or
    anything in it) or ``DistributedDataParallel``. Rules that only make sense under DDP
    read this; a DataParallel script is not DDP code."""
    got = m.cache.get("collectives:ddp-code")
    if got is None:
        got = any(is_ddp_name(q) for q in m.import_names)
        if not got:
            # every other way to name them ends in one of these attributes (or is a name an
            # import binds, which import_names holds)
            got = any(
                n.attr in _DDP_TAILS and any(is_ddp_name(q) for q in m.qualified_names(n))  # type: ignore[attr-defined]
                for n in m.all_nodes(ast.Attribute)
            )
        m.cache["collectives:ddp-code"] = got
    return got  # type: ignore[return-value]


def call_reaches(m: SemanticModel, call: ast.Call, dp: bool = False, unguarded: bool = False) -> Optional[str]:
    """Whether ``call`` itself is a collective or calls a function of the module that
    reaches one (its arguments are not looked at: each call is asked on its own), with
    what it reaches (``"barrier()"``, ``"evaluate() -> DDP forward"``); ``None`` if not.
    With ``unguarded``, through :func:`unguarded_reaching_functions`."""
    what = collective_of(m, call, dp)
    if what is not None:
        return what
    t = m.resolve_call(call)
    if t is not None:
        reach = (unguarded_reaching_functions if unguarded else reaching_functions)(m, dp).get(t)
        if reach is not None:
            return f"{t.name}() -> {reach}"  # type: ignore[attr-defined]
    return None


def collective_sites(m: SemanticModel, dp: bool = False) -> List[Tuple[ast.Call, str]]:
    """Every call of the module that is a collective (:func:`collective_of`), found from the
    names (not by asking every call), in source order, with what it is."""
    key = f"collectives:sites:{dp}"
    got = m.cache.get(key)
    if got is None:
        calls = m.calls(COLLECTIVES) + m.calls(DDP | (DP | DP_FUNCTIONAL if dp else frozenset()))
        wrapped = wrapped_vars(m, dp)
        if wrapped:
            spelled = {k[2] for k in wrapped}  # "model", "self.model"
            calls += [
                c
                for c in m.nodes(ast.Call)
                if (
                    (isinstance(c.func, ast.Name) and c.func.id in spelled)  # type: ignore[attr-defined]
                    or (isinstance(c.func, ast.Attribute) and "self." + c.func.attr in spelled)  # type: ignore[attr-defined]
                )
                and var_key(m, c.func) in wrapped  # type: ignore[attr-defined]
            ]
        seen = set()
        got = []
        for c in sorted(calls, key=lambda c: (c.lineno, c.col_offset)):
            if id(c) not in seen:
                seen.add(id(c))
                what = collective_of(m, c, dp)
                if what is not None:
                    got.append((c, what))
        m.cache[key] = got
    return got  # type: ignore[return-value]


def unguarded_reaching_functions(m: SemanticModel, dp: bool = False) -> Dict[ast.AST, str]:
    """Like :func:`reaching_functions`, counting only what every rank that calls the
    function reaches: a collective (or a call of such a function) that the function itself
    runs under a rank test that can split the ranks (``if local_rank not in [-1, 0]:
    barrier()``, the paired-barrier idiom) does not count — whether it runs depends on the
    caller's rank, which a caller's own rank test may already rule out."""
    key = f"collectives:reach-unguarded:{dp}"
    got = m.cache.get(key)
    if got is not None:
        return got  # type: ignore[return-value]
    from dp2ddp.model.ranks import rank_split_conditionals

    def unguarded(call: ast.Call) -> bool:
        return next(rank_split_conditionals(m, call), None) is None

    out: Dict[ast.AST, str] = {}
    todo: List[ast.AST] = []
    for call, what in collective_sites(m, dp):
        f = m.enclosing_function(call)
        if f is not None and f not in out and unguarded(call):
            out[f] = what
            todo.append(f)
    while todo:  # up the call graph: the callers of a reaching function reach too
        t = todo.pop(0)
        for call in m.call_sites(t):
            f = m.enclosing_function(call)
            if f is not None and f not in out and unguarded(call):
                out[f] = f"{t.name}() -> {out[t]}"  # type: ignore[attr-defined]
                todo.append(f)
    m.cache[key] = out
    return out
