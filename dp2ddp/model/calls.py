"""Calls between the functions of one module: the function a call reaches (by name, or a
method through ``self.``/``cls.`` and the class family), the call graph, the functions a
function reaches, and the argument a call passes for a parameter."""

from __future__ import annotations

import ast
from functools import cached_property
from typing import AbstractSet, Dict, Iterator, List, Optional, Set

from dp2ddp.model.syntax import FUNCTIONS, first_item, order_key, children


class Calls:
    """The part of :class:`~dp2ddp.model.core.SemanticModel` that follows calls between
    the module's functions."""

    def resolve_call(self, call: ast.Call) -> Optional[ast.AST]:
        """The function of this module a call reaches: a module-level function by name
        (when the name really is that function), or a method through ``self.``/``cls.``
        in the same class (or a class of this module it derives from); ``cls(...)`` in a
        classmethod reaches the class's ``__init__``; ``Cls(...).m(...)`` reaches ``m`` of a class of this module."""
        f = call.func
        if isinstance(f, ast.Name) and f.id == "cls":  # ``cls(...)`` in a classmethod: the class's __init__
            func = self.enclosing_function(call)
            cls = self.enclosing_class(call)
            if (cls is not None and isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) and func.args.args
                    and func.args.args[0].arg == "cls"
                    and any(isinstance(d, ast.Name) and d.id == "classmethod" for d in func.decorator_list)):
                return self.methods(cls).get("__init__")
            return None
        if isinstance(f, ast.Name):
            where, bindings = self.lookup(f.id, self.scope_of(f))
            if where is None or not bindings:
                return None
            defs = {id(b.node): b.node for b in bindings if b.kind in ("def", "class")}
            if len(defs) != 1 or len(bindings) != len([b for b in bindings if b.kind in ("def", "class")]):
                return None
            node = next(iter(defs.values()))
            if isinstance(node, ast.ClassDef):
                return self.method_of(node, "__init__")  # its own, or the one it inherits
            return node
        if (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Call) and isinstance(f.value.func, ast.Name)
                and f.value.func.id == "super"):  # ``super().__init__(...)``: the base class's method
            cls = self.enclosing_class(call)
            base = self._base_class(cls) if cls is not None else None
            return self.method_of(base, f.attr) if base is not None else None
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Call) and isinstance(f.value.func, ast.Name):
            # ``Trainer(model, opt).train(loader)``: a method of a fresh instance
            cls = self._named_class(f.value.func)
            return self.method_of(cls, f.attr) if cls is not None else None
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            if f.value.id in ("self", "cls"):
                cls = self.enclosing_class(call)
            else:
                cls = self.instance_class(f.value) or self._named_class(f.value)  # ``Base.__init__(self, ...)``
            start = cls
            m = self.method_of(cls, f.attr) if cls is not None else None
            if m is not None:
                return m
            if start is not None and f.value.id in ("self", "cls"):
                # defined by the one subclass of this module that has it (a template method)
                found = [
                    self.methods(c)[f.attr] for c in self.classes.values()
                    if f.attr in self.methods(c) and self._derives(c, start)
                ]
                if len(found) == 1:
                    return found[0]
        return None

    def root_class(self, cls: ast.ClassDef) -> ast.ClassDef:
        """The topmost class of this module that ``cls`` derives from (itself if none):
        ``self.x`` means the same attribute in the methods of a class and its subclasses."""
        seen = set()
        cur = cls
        while id(cur) not in seen:
            seen.add(id(cur))
            base = self._base_class(cur)
            if base is None:
                return cur
            cur = base
        return cur

    def family(self, cls: ast.ClassDef) -> List[ast.ClassDef]:
        """The classes of this module that share ``self`` with ``cls`` (the same root class:
        those it derives from and those deriving from them), in source order."""
        root = self.root_class(cls)
        return [c for c in self.nodes(ast.ClassDef) if self.root_class(c) is root]

    def _derives(self, cls: ast.ClassDef, base: ast.ClassDef) -> bool:
        seen = set()
        cur = self._base_class(cls)
        while cur is not None and id(cur) not in seen:
            if cur is base:
                return True
            seen.add(id(cur))
            cur = self._base_class(cur)
        return False

    def instance_class(self, name: ast.Name) -> Optional[ast.ClassDef]:
        """The class of this module that ``name`` holds an instance of, when every binding
        of the name is ``name = ThatClass(...)``."""
        _, bindings = self.lookup(name.id, self.scope_of(name))
        classes = set()
        for b in bindings:
            v = b.value
            if b.kind != "assign" or not isinstance(v, ast.Call) or not isinstance(v.func, ast.Name):
                return None
            cls = self.classes.get(v.func.id)
            if cls is None:
                return None
            classes.add(cls)
        return classes.pop() if len(classes) == 1 else None

    def method_of(self, cls: ast.ClassDef, name: str) -> Optional[ast.AST]:
        """Method ``name`` of ``cls``: its own, or the one it inherits from a class of this module."""
        seen = set()
        cur: Optional[ast.ClassDef] = cls
        while cur is not None and id(cur) not in seen:
            seen.add(id(cur))
            m = self.methods(cur).get(name)
            if m is not None:
                return m
            cur = self._base_class(cur)
        return None

    def _named_class(self, name: ast.Name) -> Optional[ast.ClassDef]:
        """The class of this module that ``name`` is (every binding of it a ``class``)."""
        _, bindings = self.lookup(name.id, self.scope_of(name))
        nodes = {id(b.node): b.node for b in bindings}
        if len(nodes) == 1 and all(b.kind == "class" for b in bindings):
            node = next(iter(nodes.values()))
            return node if isinstance(node, ast.ClassDef) else None
        return None

    def _base_class(self, cls: ast.ClassDef) -> Optional[ast.ClassDef]:
        for b in cls.bases:
            if isinstance(b, ast.Name) and b.id in self.classes and self.classes[b.id] is not cls:
                return self.classes[b.id]
        return None

    @cached_property
    def call_graph(self) -> Dict[ast.AST, List[ast.Call]]:
        """function -> the calls in this module that reach it (see :meth:`resolve_call`)."""
        out: Dict[ast.AST, List[ast.Call]] = {}
        for call in self.nodes(ast.Call):
            target = self.resolve_call(call)
            if target is not None:
                out.setdefault(target, []).append(call)
        return out

    def call_sites(self, func: ast.AST) -> List[ast.Call]:
        """The calls in this module that reach ``func`` (``call_graph[func]``), found among
        the calls spelled like it (a call reaches a function of its own name, or a class's
        ``__init__`` through the class name) instead of resolving every call of the module."""
        if "call_graph" in self.__dict__:
            return self.call_graph.get(func, [])
        memo = self.cache.setdefault("_call_sites", {})
        got = memo.get(func)  # type: ignore[union-attr]
        if got is None:
            name = getattr(func, "name", None)
            spellings = {name}
            if name == "__init__":
                cls = self.parents.get(func)
                if isinstance(cls, ast.ClassDef):
                    spellings.add(cls.name)
            index = self._calls_by_tail
            found = sorted((item for s in spellings for item in index.get(s, ())), key=first_item)  # type: ignore[arg-type]
            got = memo[func] = [c for _i, c in found if self.resolve_call(c) is func]  # type: ignore[index]
        return got  # type: ignore[return-value]

    def calls_in(self, node: ast.AST) -> List[ast.Call]:
        """Calls inside ``node``, not entering nested functions, classes or lambdas."""
        out = []
        todo = [node]
        while todo:
            n = todo.pop()
            if isinstance(n, ast.Call):
                out.append(n)
            for c in children(n):
                if isinstance(c, FUNCTIONS + (ast.ClassDef, ast.Lambda)):
                    continue
                todo.append(c)
        out.sort(key=order_key)
        return out

    def reach(self, func: ast.AST) -> AbstractSet[ast.AST]:
        """Functions of this module reachable from ``func`` by calls (``func`` included); a
        method reached through ``self.`` brings the overrides of its subclasses too (a base
        class's ``train()`` calls the ``_train_epoch`` a subclass defines). A set that
        iterates in source order: a reader that takes the first match gets the same one on
        every run (a plain set of nodes iterates by their addresses)."""
        from dp2ddp.model.dead_code import never_runs

        seen: Set[ast.AST] = set()
        todo = [func]
        while todo:
            f = todo.pop()
            if f in seen:
                continue
            seen.add(f)
            for call in self.calls_in(f):
                if never_runs(self, call):  # type: ignore[arg-type]
                    continue  # under ``if create_subset:`` with ``create_subset = False``
                t = self.resolve_call(call)
                if t is not None and t not in seen:
                    todo.append(t)
                    if getattr(t, "name", "") != "__init__":  # ``cls(...)`` makes the class it names
                        todo.extend(self._overrides(t))
        return dict.fromkeys(sorted(seen, key=lambda f: (getattr(f, "lineno", 0), getattr(f, "col_offset", 0)))).keys()

    def reached_calls(self, root: ast.AST) -> Iterator[ast.Call]:
        """The calls in ``root`` (a function, a loop) and in every function it reaches."""
        for f in self.reach(root):
            yield from self.calls_in(f)

    def _overrides(self, method: ast.AST) -> List[ast.AST]:
        cls = self.parents.get(method)
        if not isinstance(cls, ast.ClassDef):
            return []
        name = method.name  # type: ignore[attr-defined]
        return [
            self.methods(c)[name] for c in self.classes.values()
            if c is not cls and name in self.methods(c) and self._derives(c, cls)
        ]

    def params(self, func: ast.AST) -> List[str]:
        a = func.args  # type: ignore[attr-defined]
        return [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]

    def default_of(self, func: ast.AST, param: str) -> Optional[ast.AST]:
        """The default value of ``param`` of ``func`` (positional or keyword-only), if it has one."""
        a = func.args  # type: ignore[attr-defined]
        positional = a.posonlyargs + a.args
        for p, d in zip(positional[len(positional) - len(a.defaults):], a.defaults):
            if p.arg == param:
                return d
        for p, d in zip(a.kwonlyargs, a.kw_defaults):
            if p.arg == param:
                return d
        return None

    def argument_for(self, func: ast.AST, call: ast.Call, param: str) -> Optional[ast.AST]:
        """The expression ``call`` passes for ``param`` of ``func``, if it can be told."""
        for k in call.keywords:
            if k.arg == param:
                return k.value
        a = func.args  # type: ignore[attr-defined]
        positional = [p.arg for p in a.posonlyargs + a.args]
        if self.is_method(func) and positional and (isinstance(call.func, ast.Attribute) or getattr(func, "name", "") == "__init__"):
            positional = positional[1:]  # self: bound by `obj.method(...)`, or made by `Class(...)`
        if any(isinstance(x, ast.Starred) for x in call.args):
            return None
        if param in positional:
            i = positional.index(param)
            if i < len(call.args):
                return call.args[i]
        return None
