"""What a module stores where: ``self`` attributes and named containers.

:func:`attribute_assignments`: every ``self.attr = value`` of a class's family;
:func:`container_mutations`: the values put into a named container (``c.append(v)``,
``c[k] = v``, ``c.update(...)``); :func:`keyed_stores`: the values stored into a named
dict under each constant key. Indexes read off the syntax once per model, with no value
followed; :mod:`dp2ddp.model.flow` follows values through them.
"""

from __future__ import annotations

import ast
from typing import Dict, List, Optional

from dp2ddp.model.core import SemanticModel


def constructor_argument(cm: SemanticModel, cls: ast.ClassDef, made: ast.Call, attr: str) -> Optional[ast.AST]:
    """The argument ``made`` (a construction of ``cls``, of module ``cm``) passes for the
    parameter of ``__init__`` that ``self.<attr>`` keeps (assigned once, from the parameter
    itself): a trainer's ``self.model_checkpoint``, a baseline's ``self.critic``."""
    init = cm.method_of(cls, "__init__")  # its own, or the base class's it inherits (open-reid's Trainer(BaseTrainer))
    values = attribute_assignments(cm, cls).get(attr, []) if init is not None else []
    if len(values) != 1 or not isinstance(values[0], ast.Name) or values[0].id not in cm.params(init):
        return None
    return cm.argument_for(init, made, values[0].id)


def attribute_assignments(m: SemanticModel, cls: ast.ClassDef) -> Dict[str, List[ast.AST]]:
    """``attr -> values`` of every ``self.attr = value`` in ``cls``'s family (the classes of
    this module it derives from and those deriving from it: they share ``self``)."""
    memo = m.cache.setdefault("flow:attrs", {})
    root = m.root_class(cls)
    got = memo.get(id(root))  # type: ignore[union-attr]
    if got is not None:
        return got  # type: ignore[return-value]
    out: Dict[str, List[ast.AST]] = {}
    for c in m.family(cls):
        for node in ast.walk(c):
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            for t in targets:
                for attr, v in _self_stores(t, value):
                    out.setdefault(attr, []).append(v)
    memo[id(root)] = out  # type: ignore[index]
    return out


_BODIES = ("body", "orelse", "finalbody")  # (not a try's handlers: the one before did not run)
_REPEATS = (ast.For, ast.AsyncFor, ast.While, ast.Try) + ((ast.TryStar,) if hasattr(ast, "TryStar") else ())


def store_just_before(m: SemanticModel, read: ast.Attribute) -> Optional[ast.AST]:
    """The value ``read`` (``self.attr`` in a method) holds where one assignment
    ``self.attr = value`` runs on the way to it in straight line (an earlier statement of the
    same block, or of a block around it, in the same function) and nothing between could
    store another: no statement between assigns ``self.attr`` or calls anything that is
    handed ``self``. ``None`` where there is no such store: then every store of the class
    may be what it holds. (EDSR's ``self.dir = join(..., args.load)`` just above
    ``if os.path.exists(self.dir):`` is not the other branch's clock-named folder.)"""
    if not (isinstance(read.value, ast.Name) and read.value.id == "self"):
        return None
    func = m.enclosing_function(read)
    if func is None:
        return None  # (in a lambda, called who knows when)
    stmt: Optional[ast.AST] = m.statement_of(read)
    while stmt is not None and stmt is not func:
        holder = m.parent(stmt)
        if holder is None:
            return None
        # a loop runs its body again after a store later in it; a try's handlers and finally
        # run after part of its body; an if's test and a with's items run before the block
        ahead = [holder] if isinstance(holder, _REPEATS) else [getattr(holder, "test", None)] if isinstance(holder, ast.If) \
            else [i.context_expr for i in holder.items] if isinstance(holder, (ast.With, ast.AsyncWith)) else []
        if any(part is not None and _may_store(part, read.attr) for part in ahead):
            return None
        block = next((getattr(holder, f) for f in _BODIES if isinstance(getattr(holder, f, None), list)
                      and any(x is stmt for x in getattr(holder, f))), None)
        if block is not None:
            before = block[:next(i for i, x in enumerate(block) if x is stmt)]
            for prior in reversed(before):
                if (isinstance(prior, ast.Assign) and len(prior.targets) == 1 and isinstance(prior.targets[0], ast.Attribute)
                        and isinstance(prior.targets[0].value, ast.Name) and prior.targets[0].value.id == "self"
                        and prior.targets[0].attr == read.attr):
                    return prior.value
                if _may_store(prior, read.attr):
                    return None
        stmt = holder
    return None


def _may_store(stmt: ast.AST, attr: str) -> bool:
    """``stmt`` assigns ``self.<attr>``, or calls something with ``self`` (a method, a
    helper handed ``self``, ``setattr``) that could."""
    for node in ast.walk(stmt):
        if isinstance(node, ast.Attribute) and node.attr == attr and isinstance(node.ctx, (ast.Store, ast.Del)):
            return True
        if isinstance(node, ast.Call):
            f = node.func
            owner = f.value if isinstance(f, ast.Attribute) else None
            if (isinstance(owner, ast.Name) and owner.id == "self") or (
                    isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super") or (
                    isinstance(f, ast.Name) and f.id in ("setattr", "vars")):
                return True  # a method of the object (or of its base: super().f()), setattr(self, ...)
            if any(isinstance(a, ast.Name) and a.id == "self" for a in [*node.args, *(k.value for k in node.keywords)]):
                return True  # ``helper(self)``
    return False


def _self_stores(target: ast.AST, value: ast.AST):
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
        yield target.attr, value
    elif isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) and len(target.elts) == len(value.elts):
        for t, v in zip(target.elts, value.elts):
            yield from _self_stores(t, v)
    elif isinstance(target, (ast.Tuple, ast.List)):
        for i, t in enumerate(target.elts):
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                yield t.attr, ast.Subscript(value=value, slice=ast.Constant(i), ctx=ast.Load())


def container_mutations(m: SemanticModel) -> Dict[object, List[ast.AST]]:
    """handle of a named container -> the values put into it (append/extend/insert/add,
    ``c[k] = v``, ``c.update(...)``, ``c.setdefault(k, v)``)."""
    got = m.cache.get("flow:mutations")
    if got is not None:
        return got  # type: ignore[return-value]
    from dp2ddp.model.handles import expr_handle

    out: Dict[object, List[ast.AST]] = {}
    for call in m.nodes(ast.Call):
        f = call.func
        if not isinstance(f, ast.Attribute) or f.attr not in ("append", "extend", "insert", "add", "update", "setdefault"):
            continue
        h = expr_handle(m, f.value) if isinstance(f.value, (ast.Name, ast.Attribute)) else None
        if h is None:
            continue
        vals: List[ast.AST] = []
        if f.attr in ("append", "add") and call.args:
            vals.append(call.args[0])
        elif f.attr == "insert" and len(call.args) > 1:
            vals.append(call.args[1])
        elif f.attr == "setdefault" and len(call.args) > 1:
            vals.append(call.args[1])
        elif f.attr == "extend" and call.args:
            a = call.args[0]
            vals.extend(a.elts if isinstance(a, (ast.List, ast.Tuple)) else [])
        elif f.attr == "update":
            vals.extend(k.value for k in call.keywords if k.arg is not None)
            for a in call.args:
                if isinstance(a, ast.Dict):
                    vals.extend(a.values)
        out.setdefault(h, []).extend(vals)
    for node in m.nodes(ast.Assign):
        for t in node.targets:
            if isinstance(t, ast.Subscript) and isinstance(t.value, (ast.Name, ast.Attribute)):
                h = expr_handle(m, t.value)
                if h is not None:
                    out.setdefault(h, []).append(node.value)
    m.cache["flow:mutations"] = out
    return out


def keyed_stores(m: SemanticModel, container: ast.AST) -> Dict[object, List[ast.AST]]:
    """``key -> values`` stored into the named dict ``container`` by ``d[key] = value``
    (``None`` for a key that is not a constant)."""
    from dp2ddp.model.handles import expr_handle

    h = expr_handle(m, container)
    if h is None:
        return {}
    index = m.cache.get("flow:keyed")
    if index is None:
        index = {}
        for node in m.nodes(ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Subscript) and isinstance(t.value, (ast.Name, ast.Attribute)):
                    th = expr_handle(m, t.value)
                    if th is not None:
                        k = t.slice.value if isinstance(t.slice, ast.Constant) else None
                        index.setdefault(th, {}).setdefault(k, []).append(node.value)  # type: ignore[union-attr]
        m.cache["flow:keyed"] = index
    return index.get(h, {})  # type: ignore[union-attr]
