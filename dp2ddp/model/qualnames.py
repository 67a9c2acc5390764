"""Names to qualified names: lookup of a name through the scopes, imports, aliases and
star imports (``DP`` after ``from torch.nn import DataParallel as DP`` is
``torch.nn.DataParallel``, a local called ``DP`` is not), and the searches built on it
(calls and references of qualified names, mentions). The names looked for are in
:mod:`dp2ddp.model.names`."""

from __future__ import annotations

import ast
import builtins
from functools import cached_property
from typing import Dict, FrozenSet, Iterable, List, Optional, Set, Tuple

from dp2ddp.model.module_files import module_exports
from dp2ddp.model.scopes import Binding, Scope
from dp2ddp.model.syntax import first_item, order_key

BUILTINS: FrozenSet[str] = frozenset(dir(builtins))


class QualifiedNames:
    """The part of :class:`~dp2ddp.model.core.SemanticModel` that resolves names over the
    scopes and bindings the walk records (``scopes``, ``_scope_of_node``, ``star_imports``)."""

    def scope_of(self, node: ast.AST) -> Scope:
        """The scope ``node`` is evaluated in."""
        s = self._scope_of_node.get(node)
        if s is not None:
            return s
        for a in self.ancestors(node):
            s = self._scope_of_node.get(a)
            if s is not None:
                return s
            if a in self.scopes and not isinstance(a, ast.Module):
                # inside a scope node but not in its header: the scope itself
                return self.scopes[a]
        return self.scopes[self.tree]

    def lookup(self, name: str, scope: Scope) -> Tuple[Optional[Scope], List[Binding]]:
        """The scope that binds ``name`` as seen from ``scope``, and its bindings there."""
        s: Optional[Scope] = scope
        if name in scope.globals:
            s = self.scopes[self.tree]
            return s, s.bindings.get(name, [])
        first = True
        while s is not None:
            if s.kind == "class" and not first:
                s = s.parent
                continue
            if name in s.nonlocals and not first:
                pass
            if name in s.bindings and name not in s.globals and name not in s.nonlocals:
                return s, s.bindings[name]
            if name in s.globals:
                g = self.scopes[self.tree]
                return g, g.bindings.get(name, [])
            s = s.parent
            first = False
        return None, []

    def bindings_of(self, name_node: ast.Name) -> List[Binding]:
        return self.lookup(name_node.id, self.scope_of(name_node))[1]

    def is_imported(self, name_node: ast.Name) -> bool:
        """Every binding of the name is an import (a module or a class of another module,
        not a local value)."""
        bindings = self.bindings_of(name_node)
        return bool(bindings) and all(b.kind == "import" for b in bindings)

    def qualified_names(self, node: ast.AST) -> FrozenSet[str]:
        """What ``node`` (a Name or an Attribute chain) may refer to, by qualified name:
        imports give the imported path, other bindings a local name
        (``main.<locals>.model``), unbound builtins ``builtins.x``."""
        memo = self.cache.setdefault("_qn", {})
        got = memo.get(node)  # type: ignore[union-attr]
        if got is not None:
            return got
        if isinstance(node, ast.Name):
            out = self._name_qnames(node.id, self.scope_of(node))
        elif isinstance(node, ast.Attribute):
            base = self.qualified_names(node.value)
            out = frozenset(f"{b}.{node.attr}" for b in base) if base else frozenset()
        else:
            out = frozenset()
        memo[node] = out  # type: ignore[index]
        return out

    def _name_qnames(self, name: str, scope: Scope) -> FrozenSet[str]:
        where, bindings = self.lookup(name, scope)
        if where is None:
            if self.star_imports:
                got = self.star_export(name)
                if got is not None:
                    return frozenset({got})
            if name in BUILTINS:
                return frozenset({f"builtins.{name}"})
            return frozenset()
        out = set()
        for b in bindings:
            if b.kind == "import":
                out.add(b.qualified)
            else:
                out.add(where.prefix + name)
        return frozenset(out)

    def resolve(self, node: ast.AST) -> Optional[str]:
        """The one qualified name ``node`` refers to, or ``None`` when it is unknown or ambiguous."""
        q = self.qualified_names(node)
        return next(iter(q)) if len(q) == 1 else None

    def is_name(self, node: ast.AST, names: Iterable[str]) -> bool:
        names = names if isinstance(names, (set, frozenset)) else frozenset(names)
        return bool(self.qualified_names(node) & names)  # type: ignore[operator]

    def call_is(self, node: ast.AST, names: Iterable[str]) -> bool:
        return isinstance(node, ast.Call) and self.is_name(node.func, names)

    def calls(self, names: Iterable[str]) -> List[ast.Call]:
        names = frozenset(names)
        tails = {n.rsplit(".", 1)[-1] for n in names}
        aliases = self._aliases_of(names)
        index = self._calls_by_tail
        found = [item for tail in tails for item in index.get(tail, ())]
        found += [item for a in aliases - tails for item in index.get(a, ()) if isinstance(item[1].func, ast.Name)]
        found.sort(key=first_item)  # source order (the order of nodes(ast.Call))
        return [c for _i, c in found if self.is_name(c.func, names)]

    def calls_spelled(self, name: str) -> List[ast.Call]:
        """Calls whose callee is spelled ``name`` or ``<anything>.name`` (``.cuda()``), in
        source order, whatever they resolve to."""
        return [c for _i, c in self._calls_by_tail.get(name, ())]

    @cached_property
    def _calls_by_tail(self) -> Dict[str, List[Tuple[int, ast.Call]]]:
        """The calls of ``f(...)``/``a.b.f(...)`` by ``f``, with their rank in source order:
        :meth:`calls` looks up the few candidates instead of scanning every call."""
        out: Dict[str, List[Tuple[int, ast.Call]]] = {}
        for i, c in enumerate(self.nodes(ast.Call)):
            f = c.func  # type: ignore[attr-defined]
            tail = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if tail is not None:
                out.setdefault(tail, []).append((i, c))  # type: ignore[arg-type]
        return out

    def _aliases_of(self, names: FrozenSet[str]) -> FrozenSet[str]:
        """Local names an import binds to one of ``names`` (``DP`` after ``from torch.nn
        import DataParallel as DP``), in any scope: the only names, besides the last
        components of ``names``, that can resolve to one of them."""
        memo = self.cache.setdefault("_aliases", {})
        got = memo.get(names)  # type: ignore[union-attr]
        if got is None:
            got = memo[names] = frozenset(  # type: ignore[index]
                b.name for s in self.scopes.values() for bs in s.bindings.values() for b in bs
                if b.kind == "import" and b.qualified in names
            )
        return got

    def refs(self, names: Iterable[str]) -> List[ast.AST]:
        """Outermost Name/Attribute nodes that resolve to one of ``names`` (loads only)."""
        names = frozenset(names)
        tails = {n.rsplit(".", 1)[-1] for n in names}
        out = []
        # (Attributes and Names apart, then in source order: one merged, sorted list of
        # every name of the module would cost more than the rest of the search)
        candidates = [n for n in self.nodes(ast.Attribute) if n.attr in tails and isinstance(n.ctx, ast.Load)]  # type: ignore[attr-defined]
        aliases = tails | self._aliases_of(names)
        candidates += [n for n in self.nodes(ast.Name) if n.id in aliases and isinstance(n.ctx, ast.Load)]  # type: ignore[attr-defined]
        candidates.sort(key=order_key)
        for n in candidates:
            if self.is_name(n, names):
                parent = self.parents.get(n)
                if isinstance(parent, ast.Attribute) and parent.value is n and self.is_name(parent, names):
                    continue  # only the outermost of a.b.DataParallel
                out.append(n)
        return out

    def star_export(self, name: str) -> Optional[str]:
        """What a star import of a module beside this file binds ``name`` to (its own
        imports: ``from modeling.deeplab import *`` gives ``torch`` when deeplab.py does
        ``import torch``); ``None`` when no such module is found or it does not bind it."""
        if self.path in ("<string>", "<stdin>", "-"):
            return None
        import os

        base = os.path.dirname(os.path.abspath(self.path))
        for imp in reversed(self.star_imports):
            exports = module_exports(base, imp.module or "", imp.level)
            if exports is not None and name in exports:
                return exports[name]
        return None

    def maybe_star(self, node: ast.AST) -> bool:
        """``node``'s root name is bound nowhere, and a star import may provide it."""
        root = node
        while isinstance(root, ast.Attribute):
            root = root.value
        if not isinstance(root, ast.Name) or not self.star_imports:
            return False
        where, _ = self.lookup(root.id, self.scope_of(root))
        return where is None and root.id not in BUILTINS and self.star_export(root.id) is None

    @cached_property
    def all_identifiers(self) -> Set[str]:
        """Every identifier bound or loaded (not attribute names, not keyword names)."""
        out = {n.id for n in self.nodes(ast.Name)}
        for s in self.scopes.values():
            out.update(s.bindings)
        return out

    @cached_property
    def import_names(self) -> FrozenSet[str]:
        """The dotted names the module's absolute import statements name: ``import a.b``
        gives ``a.b``; ``from m import x`` gives ``m`` and ``m.x`` (wherever they are)."""
        out: Set[str] = set()
        for imp in self.nodes(ast.Import):
            out.update(a.name for a in imp.names)
        for imp in self.nodes(ast.ImportFrom):
            if imp.level or not imp.module:
                continue
            out.add(imp.module)
            out.update(f"{imp.module}.{a.name}" for a in imp.names if a.name != "*")
        return frozenset(out)

    def mentions(self, names: Iterable[str]) -> bool:
        """The module refers to one of ``names`` anywhere: an import statement of it, or a
        Name/Attribute in any context (load, store, del) that resolves to it."""
        names = frozenset(names)
        if self.import_names & names:
            return True
        tails = {n.rsplit(".", 1)[-1] for n in names}
        for n in self.nodes(ast.Attribute):
            if n.attr in tails and self.qualified_names(n) & names:  # type: ignore[attr-defined]
                return True
        # a Name resolves to one of ``names`` only through an import binding of it
        bound = {
            b.name
            for s in self.scopes.values()
            for bs in s.bindings.values()
            for b in bs
            if b.kind == "import" and b.qualified in names
        }
        for n in self.nodes(ast.Name):
            if (n.id in tails or n.id in bound) and self.qualified_names(n) & names:  # type: ignore[attr-defined]
                return True
        return False
