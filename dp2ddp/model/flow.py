"""Value flow: where the value of an expression was made.

:func:`origins` follows a value backwards from where it is used to the expressions that
made it, through

* names: assignments, tuple unpacking (by position), ``for`` targets (the elements of what
  the loop iterates), ``with ... as``, walrus; a parameter to what every caller passes
  (bound by the callee's signature: positional, keyword, defaults);
* ``self.x`` (and ``obj.x`` where ``obj`` holds an instance of a class of this module): every
  ``self.x = ...`` of the class and the classes it derives from or that derive from it;
* calls of this module's functions: what they return (a tuple item by position when the
  caller unpacks it); iterator wrappers (``tqdm(x)``, ``enumerate(x)``, ``iter(x)``) are the
  value they wrap;
* containers: the items of list, tuple, set and dict literals, ``.append``/``.extend``/
  ``d[k] = v`` into a named container, ``zip``/``enumerate``/``.items()``/``.values()``;
  ``d["k"]`` selects the item of that key (what is stored where: :mod:`dp2ddp.model.stores`);
* both branches of ``a if c else b`` and ``a or b``.

An origin is ``(node, path)``: the expression that made the value and, when the value is a
part of what that expression returns and the expression cannot be looked into here (a call
into another module), the positions or keys taken out of it (``a, b = helper()`` gives
``(call, (1,))`` for ``b``). Flow stops at anything else: that expression is the origin.
Results are computed once per expression and cached in the model.
"""

from __future__ import annotations

import ast
from typing import Dict, FrozenSet, List, NamedTuple, Optional, Set, Tuple

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.stores import attribute_assignments, container_mutations, keyed_stores, store_just_before
from dp2ddp.model.syntax import FUNCTIONS, terminal


Origin = Tuple[ast.AST, Tuple[object, ...]]

# iterator wrappers: the value they return iterates like their first argument (not
# ``trange(a, b)``: that is ``tqdm(range(a, b))``, numbers, whatever its arguments are)
WRAPPERS = {"enumerate", "tqdm", "iter", "progress_bar", "track", "cycle", "islice", "prefetch", "Bar",
            "ProgressBar", "IncrementalBar", "list", "tuple", "sorted", "reversed"}
# iterator wrappers whose elements come from every argument
ALL_ARGS = frozenset({"zip", "chain", "product", "zip_longest", "izip", "izip_longest"})
MAX_DEPTH = 12


def origins(m: SemanticModel, expr: ast.AST) -> List[Origin]:
    """The expressions that may have made ``expr``'s value (see the module docstring), in
    source order: the same on every run (a set of nodes iterates in an order that depends
    on their addresses, and a reader that stops at the first match would decide by it)."""
    return in_source_order(ValueFlow.of(m).value(expr, 0))


def in_source_order(found) -> List[Origin]:
    return sorted(found, key=_position)


def _position(origin: Origin) -> Tuple:
    node, path = origin
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0), getattr(node, "end_lineno", 0),
            getattr(node, "end_col_offset", 0), type(node).__name__, repr(path))


class ValueFlow:
    def __init__(self, m: SemanticModel) -> None:
        self.m = m
        self.memo: Dict[Tuple[str, int], FrozenSet[Origin]] = {}
        self.active: Set[Tuple[str, int]] = set()

    @classmethod
    def of(cls, m: SemanticModel) -> "ValueFlow":
        got = m.cache.get("flow")
        if got is None:
            got = m.cache["flow"] = cls(m)
        return got  # type: ignore[return-value]

    # ------------------------------------------------------------------ values
    def value(self, e: ast.AST, depth: int) -> FrozenSet[Origin]:
        return self._cached("v", e, depth, self._value)

    def elements(self, e: ast.AST, depth: int) -> FrozenSet[Origin]:
        return self._cached("e", e, depth, self._elements)

    def _cached(self, kind: str, e: ast.AST, depth: int, fn) -> FrozenSet[Origin]:
        key = (kind, id(e))
        got = self.memo.get(key)
        if got is not None:
            return got
        if key in self.active or depth > MAX_DEPTH:
            return frozenset()
        self.active.add(key)
        try:
            got = frozenset(fn(e, depth + 1))
        finally:
            self.active.discard(key)
        self.memo[key] = got
        return got

    def _value(self, e: ast.AST, d: int) -> Set[Origin]:
        m = self.m
        if isinstance(e, ast.Name):
            return self._name(e, d)
        if isinstance(e, ast.Attribute):
            assigned = self._attribute_values(e)
            if assigned is None:
                out = {(e, ())}  # what the object held (a parser's option), and what was stored since:
                for v in self._namespace_stores(e):  # ``args.checkpoint = "checkpoints/" + message``
                    out |= self.value(v, d)
                return out
            out: Set[Origin] = set()
            for v in assigned:
                out |= self.value(v, d)
            return out or {(e, ())}
        if isinstance(e, ast.Subscript):
            key = e.slice.value if isinstance(e.slice, ast.Constant) else None
            keys = key_values(m, e.slice) if key is None else None
            if keys is not None:
                # ``loaders[phase]`` under ``for phase in ["train", "val"]``: the item of each key
                return set(self.keyed(e.value, keys, d)) or {(e, ())}
            out = set()
            for node, path in self.value(e.value, d):
                if isinstance(node, ast.DictComp) and not path and key is not None:
                    out |= self._comp_item(node, key, d)
                elif isinstance(node, ast.Dict) and not path and key is not None:
                    out |= self._dict_item(node, key, d)
                elif isinstance(node, (ast.List, ast.Tuple)) and not path and isinstance(key, int) and -len(node.elts) <= key < len(node.elts):
                    out |= self.value(node.elts[key], d)
                elif isinstance(node, ast.Call) and key is not None and not self._looks_into(node):
                    out.add((node, path + (key,)))
                else:
                    out |= self._items(node, path, d)
            return out or {(e, ())}
        if isinstance(e, ast.IfExp):
            return set(self.value(e.body, d) | self.value(e.orelse, d))
        if isinstance(e, ast.BoolOp):
            out = set()
            for v in e.values:
                out |= self.value(v, d)
            return out
        if isinstance(e, ast.NamedExpr):
            return set(self.value(e.value, d))
        if isinstance(e, ast.Call):
            name = terminal(e.func)
            if name in WRAPPERS and e.args and not isinstance(e.args[0], ast.Starred) and not self._is_local_def(e):
                return set(self.value(e.args[0], d))
            target = m.resolve_call(e)
            if target is not None and isinstance(target, FUNCTIONS) and target.name != "__init__":
                out = set()
                for r in _returns(m, target):
                    out |= self.value(r, d)
                if out:
                    return out
        return {(e, ())}

    def keyed(self, container: ast.AST, keys: Tuple[object, ...], d: int) -> Set[Origin]:
        """The items of ``container`` (a dict) under each of ``keys``: a dict literal's values,
        a keyed comprehension's element per key (``(comp, (key,))``), the values put in with
        that key (``d["k"] = v``); an origin of unknown make carries the key as its path."""
        out: Set[Origin] = set()
        for node, path in self.value(container, d):
            for key in keys:
                if path:
                    out.add((node, path + (key,)))
                elif isinstance(node, ast.Dict):
                    out |= self._dict_item(node, key, d)
                elif isinstance(node, ast.DictComp):
                    out |= self._comp_item(node, key, d)
                elif isinstance(node, ast.Call) and not self._looks_into(node):
                    out.add((node, (key,)))
                else:
                    out |= self._items(node, path, d)
        if isinstance(container, (ast.Name, ast.Attribute)):
            stored = keyed_stores(self.m, container)
            for key in keys:
                for v in stored.get(key, []) + stored.get(None, []):
                    out |= self.value(v, d)
        return out

    def _comp_item(self, comp: ast.DictComp, key: object, d: int) -> Set[Origin]:
        """Item ``key`` of ``{x: make(x) for x in KEYS}``: ``(comp, (key,))`` — one value of
        the element per key; the element itself where the keys are unknown."""
        keys = comp_keys(self.m, comp)
        if keys is None:
            return set(self.value(comp.value, d))
        return {(comp, (key,))} if key in keys else set()

    def _looks_into(self, call: ast.Call) -> bool:
        t = self.m.resolve_call(call)
        return t is not None and isinstance(t, FUNCTIONS) and t.name != "__init__"

    def _is_local_def(self, call: ast.Call) -> bool:
        return self.m.resolve_call(call) is not None

    def _name(self, e: ast.Name, d: int) -> Set[Origin]:
        m = self.m
        where, bindings = m.lookup(e.id, m.scope_of(e))
        if where is None or not bindings:
            return {(e, ())}
        out: Set[Origin] = set()
        for b in bindings:
            if b.kind == "assign" and b.value is not None:
                out |= self.value(b.value, d)
            elif b.kind == "walrus" and isinstance(b.node, ast.NamedExpr):
                out |= self.value(b.node.value, d)
            elif b.kind in ("unpack", "for", "with") and b.target is not None:
                out |= self._bound(b.target, d)
            elif b.kind == "param" and where.kind == "function":
                # no caller in this module passes it: the parameter itself (a caller in
                # another module binds it: training_feeds.trained_origins, project_load_sites)
                out |= self._param(where.node, e.id, d) or {(e, ())}
            else:
                out.add((e, ()))
        return out

    def _bound(self, target: ast.Name, d: int) -> Set[Origin]:
        """A name bound inside a target (``a, b = v``, ``for i, x in v``, ``with v as x``)."""
        m = self.m
        path: List[int] = []
        node: ast.AST = target
        parent = m.parent(node)
        while isinstance(parent, (ast.Tuple, ast.List, ast.Starred)):
            if isinstance(parent, ast.Starred):
                return {(target, ())}
            path.insert(0, next(i for i, x in enumerate(parent.elts) if x is node))
            node, parent = parent, m.parent(parent)
        if isinstance(parent, ast.Assign):
            return self._take(self.value(parent.value, d), tuple(path), d)
        if isinstance(parent, ast.withitem):
            return set(self.value(parent.context_expr, d))
        if isinstance(parent, (ast.For, ast.AsyncFor, ast.comprehension)):
            it = parent.iter
            # `for i, x in enumerate(v)`: x is an element of v
            if isinstance(it, ast.Call) and terminal(it.func) == "enumerate" and it.args and path[:1] == [1]:
                return self._take(self.elements(it.args[0], d), tuple(path[1:]), d)
            if isinstance(it, ast.Call) and terminal(it.func) in ALL_ARGS and path and path[0] < len(it.args):
                return self._take(self.elements(it.args[path[0]], d), tuple(path[1:]), d)
            if isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and it.func.attr == "items" and path[:1] == [1]:
                return self._take(self._dict_values(it.func.value, d), tuple(path[1:]), d)
            return self._take(self.elements(it, d), tuple(path), d)
        return {(target, ())}

    def _take(self, found: FrozenSet[Origin], path: Tuple[int, ...], d: int) -> Set[Origin]:
        """Item ``path`` of each origin: into tuple/list literals, else carried as the path."""
        out: Set[Origin] = set()
        for node, p in found:
            if not path:
                out.add((node, p))
            elif isinstance(node, (ast.Tuple, ast.List)) and not p and not any(isinstance(x, ast.Starred) for x in node.elts):
                i = path[0]
                if i < len(node.elts):
                    out |= self._take(self.value(node.elts[i], d), path[1:], d)
            else:
                out.add((node, p + path))
        return out

    def _param(self, func: ast.AST, name: str, d: int) -> Set[Origin]:
        m = self.m
        out: Set[Origin] = set()
        for call in m.call_sites(func):
            arg = m.argument_for(func, call, name)
            if arg is not None:
                out |= self.value(arg, d)
        default = m.default_of(func, name)
        if default is not None:
            out |= self.value(default, d)
        return out

    def _namespace_stores(self, e: ast.Attribute) -> List[ast.AST]:
        """What the module stores into ``name.attr`` for the same variable ``name`` (an
        argparse namespace, a config object of unknown class): ``args.checkpoint = ...``."""
        m = self.m
        if not isinstance(e.value, ast.Name):
            return []
        stores = m.cache.get("flow:namespace_stores")
        if stores is None:
            stores = {}
            for n in m.nodes(ast.Assign):
                for t in n.targets:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id != "self":
                        stores.setdefault((t.value.id, t.attr), []).append((t.value, n.value))
            m.cache["flow:namespace_stores"] = stores
        bindings = m.bindings_of(e.value)
        if not bindings:
            return []
        return [v for owner, v in stores.get((e.value.id, e.attr), ()) if m.bindings_of(owner) == bindings]  # type: ignore[union-attr]

    def _attribute_values(self, e: ast.Attribute) -> Optional[List[ast.AST]]:
        """What is assigned to ``self.x`` / ``obj.x`` in the class it belongs to."""
        m = self.m
        owner = e.value
        cls = None
        if isinstance(owner, ast.Name) and owner.id == "self":
            cls = m.enclosing_class(e)
        elif isinstance(owner, ast.Name):
            cls = m.instance_class(owner)
        if cls is None:
            return None
        just = store_just_before(m, e) if isinstance(e.ctx, ast.Load) else None
        return [just] if just is not None else attribute_assignments(m, cls).get(e.attr)

    # ------------------------------------------------------------------ containers
    def _elements(self, e: ast.AST, d: int) -> Set[Origin]:
        m = self.m
        if isinstance(e, ast.Call):
            name = terminal(e.func)
            if name in ALL_ARGS:
                out: Set[Origin] = set()
                for a in e.args:
                    if not isinstance(a, ast.Starred):
                        out |= self.elements(a, d)
                return out
            if name in WRAPPERS and e.args and not isinstance(e.args[0], ast.Starred) and not self._is_local_def(e):
                return set(self.elements(e.args[0], d))
            if isinstance(e.func, ast.Attribute) and e.func.attr in ("values", "items"):
                return set(self._dict_values(e.func.value, d))
        out = set()
        for node, path in self.value(e, d):
            out |= self._items(node, path, d)
        for v in self._mutations(e):
            out |= self.value(v, d)
        return out

    def _items(self, node: ast.AST, path: Tuple[object, ...], d: int) -> Set[Origin]:
        """The items of a container origin (a tuple item stays a tuple: ``for name, x in [("a", v)]``
        takes its item 1 through the loop's target)."""
        if path:
            return {(node, path + ("*",))}
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            out: Set[Origin] = set()
            for x in node.elts:
                if isinstance(x, ast.Starred):
                    out |= self.elements(x.value, d)
                else:
                    out |= self.value(x, d)
            return out
        if isinstance(node, ast.Dict):
            return set(self._dict_values_of(node, d))
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            return set(self.value(node.elt, d))
        if isinstance(node, ast.DictComp):
            return self._comp_values(node, d)
        if isinstance(node, ast.Call):
            name = terminal(node.func)
            if name in ALL_ARGS or name in WRAPPERS:
                return set(self.elements(node, d))
            return {(node, ("*",))}
        return set()

    def _dict_values(self, e: ast.AST, d: int) -> FrozenSet[Origin]:
        out: Set[Origin] = set()
        for node, path in self.value(e, d):
            if isinstance(node, ast.Dict) and not path:
                out |= self._dict_values_of(node, d)
            elif isinstance(node, ast.DictComp) and not path:
                out |= self._comp_values(node, d)
            elif not isinstance(node, ast.Dict):
                out.add((node, path + ("*",)))
        for v in self._mutations(e):
            out |= self.value(v, d)
        return frozenset(out)

    def _comp_values(self, comp: ast.DictComp, d: int) -> Set[Origin]:
        keys = comp_keys(self.m, comp)
        if keys is None:
            return set(self.value(comp.value, d))
        return {(comp, (k,)) for k in keys}

    def _dict_values_of(self, node: ast.Dict, d: int) -> Set[Origin]:
        out: Set[Origin] = set()
        for k, v in zip(node.keys, node.values):
            out |= self.value(v, d) if k is not None else self._dict_values(v, d)
        return out

    def _dict_item(self, node: ast.Dict, key: object, d: int) -> Set[Origin]:
        out: Set[Origin] = set()
        for k, v in zip(node.keys, node.values):
            if isinstance(k, ast.Constant) and k.value == key:
                out |= self.value(v, d)
        return out

    def _mutations(self, e: ast.AST) -> List[ast.AST]:
        """Values put into the container ``e`` names: ``e.append(v)``, ``e.extend([...])``,
        ``e[k] = v``, ``e.update(k=v)``."""
        m = self.m
        from dp2ddp.model.handles import expr_handle

        h = expr_handle(m, e) if isinstance(e, (ast.Name, ast.Attribute)) else None
        if h is None:
            return []
        index = container_mutations(m)
        return index.get(h, [])


def _returns(m: SemanticModel, func: ast.AST) -> List[ast.AST]:
    out = []
    for r in ast.walk(func):
        if isinstance(r, ast.Return) and r.value is not None and m.enclosing_function(r) is func:
            out.append(r.value)
    return out


# ---------------------------------------------------------------------- keyed containers
# ``loaders = {x: DataLoader(sets[x], ...) for x in ["train", "val"]}`` and
# ``loaders = {"train": DataLoader(...), "val": DataLoader(...)}``, walked by phase
# (``for phase in ["train", "val"]: ... loaders[phase]``, ``for phase, loader in
# loaders.items()``): one value per key, each followed on its own.


class KeyLoop(NamedTuple):
    """A loop over the keys of a dict, or over a literal of constants: ``for phase in
    ["train", "val"]``, ``for k in d`` / ``d.keys()``, ``for k, v in d.items()``."""

    loop: ast.AST
    key: str  # the name bound to each key
    keys: Tuple[object, ...]  # the values it takes, in order
    container: Optional[ast.AST]  # the dict walked (``d``), where there is one
    value: Optional[str]  # ``v`` of ``for k, v in d.items()``


def _constants(node: ast.AST) -> Optional[Tuple[object, ...]]:
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)) and node.elts and all(isinstance(x, ast.Constant) for x in node.elts):
        return tuple(x.value for x in node.elts)  # type: ignore[attr-defined]
    return None


def constant_items(m: SemanticModel, expr: ast.AST) -> Optional[Tuple[object, ...]]:
    """``["train", "val"]``, or a name whose every value is such a literal."""
    got = _constants(expr)
    if got is not None:
        return got
    if not isinstance(expr, (ast.Name, ast.Attribute)):
        return None
    found = origins(m, expr)
    lits = [_constants(n) if not p else None for n, p in found]
    if not lits or any(x is None for x in lits) or _container_changed(m, expr):
        return None
    return tuple(dict.fromkeys(k for x in lits for k in x))  # type: ignore[union-attr]


def _container_changed(m: SemanticModel, expr: ast.AST) -> bool:
    from dp2ddp.model.handles import expr_handle

    h = expr_handle(m, expr)
    return h is not None and bool(container_mutations(m).get(h))


def comp_keys(m: SemanticModel, comp: ast.DictComp) -> Optional[Tuple[object, ...]]:
    """The keys of ``{x: make(x) for x in KEYS}`` (one generator, no condition, the key the
    loop's name, KEYS a literal of constants or a name holding one), else ``None``."""
    if len(comp.generators) != 1:
        return None
    gen = comp.generators[0]
    if gen.ifs or gen.is_async or not isinstance(gen.target, ast.Name):
        return None
    if not (isinstance(comp.key, ast.Name) and comp.key.id == gen.target.id):
        return None
    return constant_items(m, gen.iter)


def dict_keys(m: SemanticModel, expr: ast.AST) -> Optional[Tuple[object, ...]]:
    """Every key the dict ``expr`` may hold, when all are constants: its literals' and
    keyed comprehensions' keys and the constant keys stored into it by name
    (``d["DG"] = ...``); ``None`` where one is unknown."""
    keys: List[object] = []
    found = origins(m, expr)
    if not found:
        return None
    for node, path in found:
        if path:
            return None
        if isinstance(node, ast.Dict):
            if any(not isinstance(k, ast.Constant) for k in node.keys):
                return None
            keys.extend(k.value for k in node.keys)  # type: ignore[union-attr]
        elif isinstance(node, ast.DictComp):
            got = comp_keys(m, node)
            if got is None:
                return None
            keys.extend(got)
        else:
            return None
    if isinstance(expr, (ast.Name, ast.Attribute)):
        stored = keyed_stores(m, expr)
        if None in stored:
            return None
        keys.extend(stored)
    return tuple(dict.fromkeys(keys))


def key_loop(m: SemanticModel, loop: ast.AST) -> Optional[KeyLoop]:
    """``loop`` as a :class:`KeyLoop`, or ``None``."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return None
    memo = m.cache.setdefault("flow:keyloop", {})
    if id(loop) in memo:  # type: ignore[operator]
        return memo[id(loop)]  # type: ignore[index]
    memo[id(loop)] = None  # type: ignore[index]
    got = _key_loop(m, loop)
    memo[id(loop)] = got  # type: ignore[index]
    return got


def _key_loop(m: SemanticModel, loop: ast.AST) -> Optional[KeyLoop]:
    target, it = loop.target, loop.iter  # type: ignore[attr-defined]
    method = it.func.attr if isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and not it.args else None
    if isinstance(target, ast.Name):
        if method == "keys":
            keys = dict_keys(m, it.func.value)  # type: ignore[union-attr]
            return KeyLoop(loop, target.id, keys, it.func.value, None) if keys else None  # type: ignore[union-attr]
        keys = constant_items(m, it)
        if keys is not None:
            return KeyLoop(loop, target.id, keys, None, None)
        if isinstance(it, (ast.Name, ast.Attribute)):
            keys = dict_keys(m, it)
            return KeyLoop(loop, target.id, keys, it, None) if keys else None
        return None
    if (isinstance(target, ast.Tuple) and len(target.elts) == 2 and all(isinstance(x, ast.Name) for x in target.elts)
            and method == "items"):
        keys = dict_keys(m, it.func.value)  # type: ignore[union-attr]
        if keys:
            return KeyLoop(loop, target.elts[0].id, keys, it.func.value, target.elts[1].id)  # type: ignore[union-attr, attr-defined]
    return None


def binding_loop(m: SemanticModel, name: ast.Name) -> Optional[KeyLoop]:
    """The key loop that binds ``name`` (its key or, of ``.items()``, its value), when that
    loop is the name's only binding."""
    _, bindings = m.lookup(name.id, m.scope_of(name))
    loops = []
    for b in bindings:
        node: Optional[ast.AST] = b.target
        while node is not None and not isinstance(node, (ast.For, ast.AsyncFor)):
            node = m.parent(node)
        loops.append(node if b.kind == "for" else None)
    # the innermost loop around ``name`` that binds it, and nothing else binds it in there
    around = [lp for lp in loops if lp is not None and any(s is name or m.contains(s, name) for s in lp.body)]  # type: ignore[attr-defined]
    if not around:
        return None
    loop = max(around, key=lambda lp: len(list(m.ancestors(lp))))
    if any(lp is not loop and (lp is None and m.contains(loop, b.node) or lp is not None and m.contains(loop, lp))
           for b, lp in zip(bindings, loops)):
        return None
    return key_loop(m, loop)


def key_values(m: SemanticModel, key: ast.AST) -> Optional[Tuple[object, ...]]:
    """The constant values a subscript's key takes: a constant, or the name a key loop
    binds to each key."""
    if isinstance(key, ast.Constant):
        return (key.value,)
    if isinstance(key, ast.Name):
        kl = binding_loop(m, key)
        if kl is not None and kl.key == key.id:
            return kl.keys
    return None


def item_origins(m: SemanticModel, container: ast.AST, keys: Tuple[object, ...]) -> List[Origin]:
    """The origins of ``container[key]`` for each of ``keys``."""
    return in_source_order(ValueFlow.of(m).keyed(container, keys, 0))
