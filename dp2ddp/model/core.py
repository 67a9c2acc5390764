"""The semantic model of one module, built once from Python's ``ast``.

Every rule of `dp2ddp check` and every transform of `dp2ddp rewrite` reads the module
through this model instead of walking a tree of its own (ruff's shape):

* one walk records every node's parent, the nodes of each type in source order, the
  scopes (module, class, function, lambda, comprehension) and every binding in them;
* names resolve to *qualified names* through imports, aliases and scopes:
  ``nn.DataParallel``, ``torch.nn.parallel.DataParallel`` and ``DP`` after
  ``from torch.nn import DataParallel as DP`` are all ``torch.nn.DataParallel``,
  while a parameter or local variable called ``DP`` is not;
* a name that nothing binds in a module with a star import is *unresolved*, a recorded
  state (``maybe_star``), not a silent miss.

Positions: ``ast`` columns are UTF-8 byte offsets; :meth:`SemanticModel.position` turns
them into character columns, as editors and LibCST count them.

The distributed facts (wraps, loaders, rank guards, writers, collectives, epoch loops)
live in :mod:`dp2ddp.model.facts` and are computed on first use.
"""

from __future__ import annotations

import ast
import builtins
import operator
import os
import re
from functools import cached_property
from typing import Dict, FrozenSet, Iterable, Iterator, List, Optional, Sequence, Set, Tuple, Type, Union

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
SCOPE_NODES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda) + COMPREHENSIONS
LOOPS = (ast.For, ast.AsyncFor, ast.While)
BUILTINS: FrozenSet[str] = frozenset(dir(builtins))
# statement fields that hold blocks of statements
BLOCK_FIELDS = ("body", "orelse", "finalbody", "handlers")


class Binding:
    """One place that binds ``name`` in ``scope``.

    ``kind``: ``import`` (``qualified`` is what it imports), ``assign`` (``value`` is the
    assigned expression when the target is the plain name), ``augassign``, ``annotation``
    (``x: T`` without a value), ``param``, ``def``, ``class``, ``for``, ``with``,
    ``except``, ``comprehension``, ``walrus``, ``del``, ``match``, ``global``/``nonlocal``
    are not bindings (they redirect), ``star`` is not recorded here (see
    :attr:`SemanticModel.star_imports`)."""

    __slots__ = ("name", "kind", "node", "scope", "qualified", "value", "target")

    def __init__(self, name: str, kind: str, node: ast.AST, scope: "Scope", qualified: Optional[str] = None,
                 value: Optional[ast.AST] = None, target: Optional[ast.AST] = None) -> None:
        self.name = name
        self.kind = kind
        self.node = node  # the statement / node that binds (Import, Assign, arg, FunctionDef ...)
        self.scope = scope
        self.qualified = qualified
        self.value = value
        self.target = target  # the Name node that is bound, where there is one

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"Binding({self.name!r}, {self.kind}, line {getattr(self.node, 'lineno', '?')})"


class Scope:
    __slots__ = ("kind", "node", "parent", "bindings", "globals", "nonlocals", "name")

    def __init__(self, kind: str, node: ast.AST, parent: Optional["Scope"]) -> None:
        self.kind = kind  # module | class | function | lambda | comprehension
        self.node = node
        self.parent = parent
        self.bindings: Dict[str, List[Binding]] = {}
        self.globals: Set[str] = set()
        self.nonlocals: Set[str] = set()
        if kind in ("class", "function"):
            self.name = node.name  # type: ignore[attr-defined]
        else:
            self.name = f"<{kind}>"

    def add(self, binding: Binding) -> None:
        self.bindings.setdefault(binding.name, []).append(binding)

    @property
    def prefix(self) -> str:
        """The qualified-name prefix of local names (``main.<locals>.``)."""
        parts = []
        s: Optional[Scope] = self
        while s is not None and s.kind != "module":
            parts.append(s.name + (".<locals>" if s.kind in ("function", "lambda", "comprehension") else ""))
            s = s.parent
        return ".".join(reversed(parts)) + "." if parts else ""

    def __repr__(self) -> str:  # pragma: no cover
        return f"Scope({self.kind} {self.name})"


class SemanticModel:
    """The model of one module. Build it with :func:`build` (or ``SemanticModel(tree, text)``)."""

    def __init__(self, tree: ast.Module, text: str, path: str = "<string>") -> None:
        self.tree = tree
        self.text = text
        self.path = path
        self._lines: Optional[List[str]] = None
        self.parents: Dict[ast.AST, ast.AST] = {}
        self.scopes: Dict[ast.AST, Scope] = {}  # scope node -> scope
        self._scope_of_node: Dict[ast.AST, Scope] = {}  # Name/arg/... -> the scope it is evaluated in
        self._by_type: Dict[type, List[ast.AST]] = {}
        self._sorted: Set[type] = set()
        self.star_imports: List[ast.ImportFrom] = []
        self.cache: Dict[str, object] = {}  # derived facts, see dp2ddp.model.facts
        _Builder(self).run()

    def release(self) -> None:
        """Drop what the model holds, for a caller that is done with it: its scopes and
        bindings refer to each other (a reference cycle that keeps the whole tree alive
        until the cyclic garbage collector runs); after this, reference counting frees it
        at once (`dp2ddp check` runs with the collector off). The model is unusable after."""
        for scope in self.scopes.values():
            scope.bindings.clear()
        self.scopes.clear()
        self._scope_of_node.clear()
        self.parents.clear()
        self._by_type.clear()
        self.cache.clear()
        for key in [k for k, v in vars(self).items() if isinstance(v, (dict, list, set, frozenset))]:
            if key not in ("scopes", "_scope_of_node", "parents", "_by_type", "cache"):
                self.__dict__.pop(key, None)

    # ------------------------------------------------------------------ structure
    def nodes(self, *types: Type[ast.AST]) -> List[ast.AST]:
        """Every node of these types, in source (pre-)order."""
        if len(types) == 1:
            t = types[0]
            if t not in self._sorted:
                self._sorted.add(t)
                if t in self._by_type:
                    _sort(self._by_type[t])
            return self._by_type.get(t, [])
        out: List[ast.AST] = []
        for t in types:
            out.extend(self._by_type.get(t, ()))
        _sort(out)
        return out

    def all_nodes(self, *types: Type[ast.AST]) -> Iterator[ast.AST]:
        """Every node of these types, in no particular order (no sort: for a question about
        the whole module, where :meth:`nodes` would sort for nothing)."""
        for t in types:
            yield from self._by_type.get(t, ())

    def parent(self, node: ast.AST) -> Optional[ast.AST]:
        return self.parents.get(node)

    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        p = self.parents.get(node)
        while p is not None:
            yield p
            p = self.parents.get(p)

    def contains(self, outer: ast.AST, inner: ast.AST) -> bool:
        if outer is inner:
            return True
        return any(a is outer for a in self.ancestors(inner))

    def statement_of(self, node: ast.AST) -> Optional[ast.stmt]:
        """The innermost statement that holds ``node`` (``node`` itself if it is one)."""
        cur: Optional[ast.AST] = node
        while cur is not None and not isinstance(cur, ast.stmt):
            cur = self.parents.get(cur)
        return cur  # type: ignore[return-value]

    def block_of(self, stmt: ast.stmt) -> Optional[Tuple[ast.AST, str, List[ast.stmt]]]:
        """``(owner, field, statements)``: the block that holds ``stmt``."""
        owner = self.parents.get(stmt)
        if owner is None:
            return None
        for field in BLOCK_FIELDS + ("cases",):
            block = getattr(owner, field, None)
            if isinstance(block, list) and any(s is stmt for s in block):
                return owner, field, block
        return None

    def _split_block(self, stmt: ast.stmt) -> Tuple[List[ast.stmt], List[ast.stmt]]:
        """The statements of ``stmt``'s block before it and after it."""
        b = self.block_of(stmt)
        if b is None:
            return [], []
        block = b[2]
        i = next(i for i, s in enumerate(block) if s is stmt)
        return block[:i], block[i + 1 :]

    def siblings_after(self, stmt: ast.stmt) -> List[ast.stmt]:
        return self._split_block(stmt)[1]

    def siblings_before(self, stmt: ast.stmt) -> List[ast.stmt]:
        return self._split_block(stmt)[0]

    def top_statement(self, node: ast.AST) -> Optional[ast.stmt]:
        """The module-level statement that holds ``node``."""
        cur: Optional[ast.AST] = node
        while cur is not None:
            parent = self.parents.get(cur)
            if parent is self.tree:
                return cur  # type: ignore[return-value]
            cur = parent
        return None

    def enclosing_function(self, node: ast.AST) -> Optional[ast.AST]:
        """The ``def`` whose body holds ``node`` (``None`` at module or class level, or in a lambda)."""
        for a in self.ancestors(node):
            if isinstance(a, FUNCTIONS):
                if _in_header(a, node, self):
                    continue
                return a
            if isinstance(a, ast.Lambda):
                return None
        return None

    def enclosing_class(self, node: ast.AST) -> Optional[ast.ClassDef]:
        for a in self.ancestors(node):
            if isinstance(a, ast.ClassDef):
                return a
        return None

    def is_method(self, func: ast.AST) -> bool:
        return isinstance(self.parents.get(func), ast.ClassDef)

    def enclosing_loops(self, node: ast.AST, stop_at_function: bool = True) -> List[ast.AST]:
        """Loops whose *body* holds ``node``, innermost first."""
        out = []
        child = node
        for a in self.ancestors(node):
            if stop_at_function and isinstance(a, FUNCTIONS + (ast.Lambda, ast.ClassDef)):
                break
            if isinstance(a, LOOPS) and any(child is s for s in a.body):
                out.append(a)
            child = a
        return out

    # ------------------------------------------------------------------ module facts
    @cached_property
    def module_functions(self) -> Dict[str, ast.AST]:
        return {s.name: s for s in self.tree.body if isinstance(s, FUNCTIONS)}

    @cached_property
    def classes(self) -> Dict[str, ast.ClassDef]:
        return {s.name: s for s in self.tree.body if isinstance(s, ast.ClassDef)}

    def methods(self, cls: ast.ClassDef) -> Dict[str, ast.AST]:
        return {s.name: s for s in cls.body if isinstance(s, FUNCTIONS)}

    @cached_property
    def main_guard(self) -> Optional[ast.If]:
        for stmt in self.tree.body:
            if isinstance(stmt, ast.If) and is_main_test(stmt.test):
                return stmt
        return None

    @cached_property
    def top_import_end(self) -> Optional[ast.stmt]:
        """The last statement of the import section at the top of the module."""
        last = None
        for i, stmt in enumerate(self.tree.body):
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                last = stmt
                continue
            if last is None and i == 0 and is_docstring(stmt):
                continue
            if isinstance(stmt, (ast.If, ast.Try)) and _only_imports(stmt):
                last = stmt
                continue
            break
        return last

    # ------------------------------------------------------------------ names
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
        found.sort(key=_first)  # source order (the order of nodes(ast.Call))
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
        candidates.sort(key=_order_key)
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
            exports = _module_exports(base, imp.module or "", imp.level)
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

    # ------------------------------------------------------------------ positions
    @property
    def lines(self) -> List[str]:
        """The source lines as Python counts them: ``\\n``, ``\\r\\n`` and ``\\r`` end a line;
        form feeds, vertical tabs, ``\\x1c``-``\\x1e``, ``\\x85`` and ``\\u2028``/``\\u2029``
        (which :meth:`str.splitlines` also splits on) do not."""
        if self._lines is None:
            self._lines = LINE_BREAK.split(self.text)
        return self._lines

    def line_text(self, line: int) -> str:
        lines = self.lines
        return lines[line - 1] if 0 < line <= len(lines) else ""

    def char_col(self, line: int, byte_col: int) -> int:
        text = self.line_text(line)
        if text.isascii():
            return byte_col
        return len(text.encode("utf-8")[:byte_col].decode("utf-8", "replace"))

    def position(self, node: ast.AST) -> Tuple[int, int]:
        """``(line, column)``: 1-based line, 0-based column in characters."""
        line = getattr(node, "lineno", 1)
        return line, self.char_col(line, getattr(node, "col_offset", 0))

    def end_position(self, node: ast.AST) -> Tuple[int, int]:
        line = getattr(node, "end_lineno", None) or getattr(node, "lineno", 1)
        return line, self.char_col(line, getattr(node, "end_col_offset", 0) or 0)

    def source(self, node: ast.AST) -> str:
        """The source text of ``node`` (as written): what ``ast.get_source_segment`` gives,
        from the cached lines (it splits the whole text again on every call)."""
        seg = self._segment(node)
        return seg if seg is not None else ast.unparse(node)

    def _segment(self, node: ast.AST) -> Optional[str]:
        try:
            if node.end_lineno is None or node.end_col_offset is None:  # type: ignore[attr-defined]
                return None
            first, last = node.lineno, node.end_lineno  # type: ignore[attr-defined]
            col, end_col = node.col_offset, node.end_col_offset  # type: ignore[attr-defined]
        except AttributeError:
            return None
        starts = self._line_starts
        if last > len(starts):
            return None
        return self.text[starts[first - 1] + self.char_col(first, col) : starts[last - 1] + self.char_col(last, end_col)]

    @cached_property
    def _line_starts(self) -> List[int]:
        """Offset in the text of each line's first character (lines as Python counts them)."""
        return [0] + [mt.end() for mt in LINE_BREAK.finditer(self.text)]

    # ------------------------------------------------------------------ calls between functions
    def resolve_call(self, call: ast.Call) -> Optional[ast.AST]:
        """The function of this module a call reaches: a module-level function by name
        (when the name really is that function), or a method through ``self.``/``cls.``
        in the same class (or a class of this module it derives from)."""
        f = call.func
        if isinstance(f, ast.Name):
            where, bindings = self.lookup(f.id, self.scope_of(f))
            if where is None or not bindings:
                return None
            defs = {id(b.node): b.node for b in bindings if b.kind in ("def", "class")}
            if len(defs) != 1 or len(bindings) != len([b for b in bindings if b.kind in ("def", "class")]):
                return None
            node = next(iter(defs.values()))
            if isinstance(node, ast.ClassDef):
                return self.methods(node).get("__init__")
            return node
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            if f.value.id in ("self", "cls"):
                cls = self.enclosing_class(call)
            else:
                cls = self.instance_class(f.value)
            start = cls
            while cls is not None:
                m = self.methods(cls).get(f.attr)
                if m is not None:
                    return m
                cls = self._base_class(cls)
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
            found = sorted((item for s in spellings for item in index.get(s, ())), key=_first)  # type: ignore[arg-type]
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
        out.sort(key=_order_key)
        return out

    def reach(self, func: ast.AST) -> Set[ast.AST]:
        """Functions of this module reachable from ``func`` by calls (``func`` included); a
        method reached through ``self.`` brings the overrides of its subclasses too (a base
        class's ``train()`` calls the ``_train_epoch`` a subclass defines)."""
        seen: Set[ast.AST] = set()
        todo = [func]
        while todo:
            f = todo.pop()
            if f in seen:
                continue
            seen.add(f)
            for call in self.calls_in(f):
                t = self.resolve_call(call)
                if t is not None and t not in seen:
                    todo.append(t)
                    todo.extend(self._overrides(t))
        return seen

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


# ---------------------------------------------------------------------------- helpers

LINE_BREAK = re.compile(r"\r\n?|\n")  # Python's line ends (str.splitlines also splits at \x0c, \x85, \u2028 ...)



_POSITION = operator.attrgetter("lineno", "col_offset")
_first = operator.itemgetter(0)


def _sort(nodes: List[ast.AST]) -> None:
    """In source order (a stable sort: nodes that start at one place keep their order)."""
    try:
        nodes.sort(key=_POSITION)
    except AttributeError:  # nodes without a position (comprehension, arguments ...)
        nodes.sort(key=_order_key)


def children(node: ast.AST) -> List[ast.AST]:
    """What ``ast.iter_child_nodes`` yields, in its order, as a list (several times faster)."""
    out = []
    for name in node._fields:
        v = getattr(node, name, None)
        if isinstance(v, ast.AST):
            out.append(v)
        elif isinstance(v, list):
            out.extend(x for x in v if isinstance(x, ast.AST))
    return out


def _order_key(node: ast.AST) -> Tuple[int, int]:
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))


def _in_header(func: ast.AST, node: ast.AST, model: SemanticModel) -> bool:
    """``node`` is in a decorator, default, annotation or return annotation of ``func``."""
    cur = node
    for a in model.ancestors(node):
        if a is func:
            return not any(cur is s for s in func.body)  # type: ignore[attr-defined]
        cur = a
    return False


def is_main_test(test: ast.AST) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) and any(
        isinstance(s, ast.Constant) and s.value == "__main__" for s in sides
    )


def is_docstring(stmt: ast.AST) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _only_imports(stmt: ast.AST) -> bool:
    found = False
    for n in ast.walk(stmt):
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            found = True
        elif isinstance(n, ast.stmt) and not isinstance(n, (ast.If, ast.Try, ast.Pass, ast.Expr) + ((ast.TryStar,) if hasattr(ast, "TryStar") else ())):
            return False
    return found


def dotted(node: ast.AST) -> Optional[str]:
    """``a.b.c`` for a Name/Attribute chain, else ``None``."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def kwarg(call: ast.Call, name: str) -> Optional[ast.keyword]:
    for k in call.keywords:
        if k.arg == name:
            return k
    return None


def is_const(node: Optional[ast.AST], value) -> bool:
    return isinstance(node, ast.Constant) and node.value is value if value in (True, False, None) else (
        isinstance(node, ast.Constant) and node.value == value
    )


def terminal(node: ast.AST) -> Optional[str]:
    """The identifier an expression ends with: ``f`` of ``a.b.f``, of ``f(...)`` and of
    ``os.environ["RANK"]`` its key."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call):
        return terminal(node.func)
    if isinstance(node, ast.Subscript):
        s = node.slice
        if isinstance(s, ast.Constant) and isinstance(s.value, str):
            return s.value
        return terminal(node.value)
    return None


# ---------------------------------------------------------------------------- the walk


class _Builder:
    """One walk of the tree: parents, nodes by type, scopes and bindings."""

    def __init__(self, model: SemanticModel) -> None:
        self.m = model
        self.by_type = model._by_type
        self.parents = model.parents
        self.scope_of_node = model._scope_of_node

    def run(self) -> None:
        tree = self.m.tree
        module_scope = Scope("module", tree, None)
        self.m.scopes[tree] = module_scope
        self.by_type.setdefault(ast.Module, []).append(tree)
        self._block(tree.body, tree, module_scope)
        for t in tree.type_ignores:
            self.parents[t] = tree

    # statements -------------------------------------------------------
    def _block(self, stmts: Sequence[ast.stmt], parent: ast.AST, scope: Scope) -> None:
        for s in stmts:
            self._stmt(s, parent, scope)

    def _record(self, node: ast.AST, parent: ast.AST) -> None:
        self.parents[node] = parent
        t = type(node)
        lst = self.by_type.get(t)
        if lst is None:
            self.by_type[t] = [node]
        else:
            lst.append(node)

    def _stmt(self, s: ast.stmt, parent: ast.AST, scope: Scope) -> None:
        self._record(s, parent)
        t = type(s)
        if t is ast.Expr:
            self._expr(s.value, s, scope)
        elif t is ast.Assign:
            self._expr(s.value, s, scope)
            for target in s.targets:
                self._target(target, s, scope, "assign", s.value if len(s.targets) >= 1 else None)
        elif t in FUNCTIONS:
            self._function(s, scope)
            scope.add(Binding(s.name, "def", s, scope))
        elif t is ast.ClassDef:
            self._class(s, scope)
            scope.add(Binding(s.name, "class", s, scope))
        elif t is ast.Import:
            for alias in s.names:
                self._record(alias, s)
                if alias.asname:
                    scope.add(Binding(alias.asname, "import", s, scope, qualified=alias.name))
                else:
                    top = alias.name.split(".", 1)[0]
                    scope.add(Binding(top, "import", s, scope, qualified=top))
        elif t is ast.ImportFrom:
            mod = ("." * s.level) + (s.module or "")
            for alias in s.names:
                self._record(alias, s)
                if alias.name == "*":
                    self.m.star_imports.append(s)
                    continue
                q = f"{mod}.{alias.name}" if mod and not mod.endswith(".") else f"{mod}{alias.name}"
                scope.add(Binding(alias.asname or alias.name, "import", s, scope, qualified=q))
        elif t is ast.If or t is ast.While:
            self._expr(s.test, s, scope)
            self._block(s.body, s, scope)
            self._block(s.orelse, s, scope)
        elif t is ast.For or t is ast.AsyncFor:
            self._expr(s.iter, s, scope)
            self._target(s.target, s, scope, "for", None)
            self._block(s.body, s, scope)
            self._block(s.orelse, s, scope)
        elif t is ast.Return:
            if s.value is not None:
                self._expr(s.value, s, scope)
        elif t is ast.AugAssign:
            self._expr(s.value, s, scope)
            self._expr(s.target, s, scope)  # read and written
            self._target(s.target, s, scope, "augassign", None, record=False)
        elif t is ast.AnnAssign:
            if s.value is not None:
                self._expr(s.value, s, scope)
            self._expr(s.annotation, s, scope)
            self._target(s.target, s, scope, "assign" if s.value is not None else "annotation", s.value)
        elif t is ast.With or t is ast.AsyncWith:
            for item in s.items:
                self._record(item, s)
                self._expr(item.context_expr, item, scope)
                if item.optional_vars is not None:
                    self._target(item.optional_vars, item, scope, "with", None)
            self._block(s.body, s, scope)
        elif t is ast.Try or (hasattr(ast, "TryStar") and t is ast.TryStar):
            self._block(s.body, s, scope)
            for h in s.handlers:
                self._record(h, s)
                if h.type is not None:
                    self._expr(h.type, h, scope)
                if h.name:
                    scope.add(Binding(h.name, "except", h, scope))
                self._block(h.body, h, scope)
            self._block(s.orelse, s, scope)
            self._block(s.finalbody, s, scope)
        elif t is ast.Global:
            scope.globals.update(s.names)
        elif t is ast.Nonlocal:
            scope.nonlocals.update(s.names)
        elif t is ast.Delete:
            for target in s.targets:
                self._expr(target, s, scope)
        elif t is ast.Raise:
            if s.exc is not None:
                self._expr(s.exc, s, scope)
            if s.cause is not None:
                self._expr(s.cause, s, scope)
        elif t is ast.Assert:
            self._expr(s.test, s, scope)
            if s.msg is not None:
                self._expr(s.msg, s, scope)
        elif hasattr(ast, "Match") and t is ast.Match:
            self._expr(s.subject, s, scope)
            for case in s.cases:
                self._record(case, s)
                self._generic(case.pattern, case, scope)
                if case.guard is not None:
                    self._expr(case.guard, case, scope)
                self._block(case.body, case, scope)
        else:  # Pass, Break, Continue, TypeAlias, ...
            self._generic_children(s, scope)

    def _function(self, f: ast.AST, scope: Scope) -> None:
        for d in f.decorator_list:  # type: ignore[attr-defined]
            self._expr(d, f, scope)
        args = f.args  # type: ignore[attr-defined]
        self._record(args, f)
        for d in args.defaults + [d for d in args.kw_defaults if d is not None]:
            self._expr(d, args, scope)
        for a in args.posonlyargs + args.args + args.kwonlyargs + [x for x in (args.vararg, args.kwarg) if x is not None]:
            if a.annotation is not None:
                self._expr(a.annotation, a, scope)
        if f.returns is not None:  # type: ignore[attr-defined]
            self._expr(f.returns, f, scope)  # type: ignore[attr-defined]
        inner = Scope("function", f, scope)
        self.m.scopes[f] = inner
        for a in args.posonlyargs + args.args + args.kwonlyargs + [x for x in (args.vararg, args.kwarg) if x is not None]:
            self._record(a, args)
            inner.add(Binding(a.arg, "param", a, inner))
        self._block(f.body, f, inner)  # type: ignore[attr-defined]

    def _class(self, c: ast.ClassDef, scope: Scope) -> None:
        for d in c.decorator_list:
            self._expr(d, c, scope)
        for b in c.bases:
            self._expr(b, c, scope)
        for k in c.keywords:
            self._record(k, c)
            self._expr(k.value, k, scope)
        inner = Scope("class", c, scope)
        self.m.scopes[c] = inner
        self._block(c.body, c, inner)

    # targets ------------------------------------------------------------
    def _target(self, target: ast.AST, parent: ast.AST, scope: Scope, kind: str, value: Optional[ast.AST], record: bool = True) -> None:
        t = type(target)
        if t is ast.Name:
            if record:
                self._record(target, parent)
                self.scope_of_node[target] = scope
            owner = scope
            if target.id in scope.globals:
                owner = self.m.scopes[self.m.tree]  # `global x` then `x = ...`: a module-level binding
            owner.add(Binding(target.id, kind, parent, owner, value=value if kind == "assign" else None, target=target))
        elif t is ast.Tuple or t is ast.List:
            if record:
                self._record(target, parent)
            for e in target.elts:
                self._target(e, target, scope, kind if kind != "assign" else "unpack", None, record)
        elif t is ast.Starred:
            if record:
                self._record(target, parent)
            self._target(target.value, target, scope, kind if kind != "assign" else "unpack", None, record)
        else:  # Attribute, Subscript: evaluated, binds nothing
            if record:
                self._expr(target, parent, scope)

    # expressions --------------------------------------------------------
    def _expr(self, e: ast.AST, parent: ast.AST, scope: Scope) -> None:
        # iterative for the common, deep expression trees; the hottest loop of the model
        # (every expression node passes here once), so _record is inlined and the generic
        # children come from a per-type field table instead of ast.iter_child_nodes
        stack = [(e, parent)]
        pop = stack.pop
        push = stack.append
        parents = self.parents
        by_type = self.by_type
        scope_of_node = self.scope_of_node
        record = self._record
        Name, Constant, Attribute, Call, keyword = ast.Name, ast.Constant, ast.Attribute, ast.Call, ast.keyword
        AST = ast.AST
        names = by_type.setdefault(Name, [])
        constants = by_type.setdefault(Constant, [])
        while stack:
            node, par = pop()
            parents[node] = par
            t = type(node)
            lst = by_type.get(t)
            if lst is None:
                by_type[t] = [node]
            else:
                lst.append(node)
            if t is Name:
                scope_of_node[node] = scope
                continue
            if t is Constant:
                continue
            if t is Attribute:
                v = node.value
                if type(v) is Name:  # a leaf, recorded here instead of through the stack
                    parents[v] = node
                    names.append(v)
                    scope_of_node[v] = scope
                else:
                    push((v, node))
                continue
            if t is Call:
                for k in reversed(node.keywords):
                    push((k, node))
                for a in reversed(node.args):
                    ta = type(a)
                    if ta is Name:
                        parents[a] = node
                        names.append(a)
                        scope_of_node[a] = scope
                    elif ta is Constant:
                        parents[a] = node
                        constants.append(a)
                    else:
                        push((a, node))
                push((node.func, node))
                continue
            if t is keyword:
                v = node.value
                if type(v) is Constant:
                    parents[v] = node
                    constants.append(v)
                else:
                    push((v, node))
                continue
            if t is ast.Lambda:
                self._lambda(node, scope)
                continue
            if t in COMPREHENSIONS:
                self._comprehension(node, scope)
                continue
            if t is ast.NamedExpr:
                push((node.value, node))
                target_scope = scope
                while target_scope.kind == "comprehension" and target_scope.parent is not None:
                    target_scope = target_scope.parent
                record(node.target, node)
                scope_of_node[node.target] = scope
                target_scope.add(Binding(node.target.id, "walrus", node, target_scope, target=node.target))
                continue
            # what ast.iter_child_nodes yields, in its order, pushed in reverse
            children = []
            for name in t._fields:
                v = getattr(node, name, None)
                if isinstance(v, AST):
                    children.append(v)
                elif isinstance(v, list):
                    for x in v:
                        if isinstance(x, AST):
                            children.append(x)
            for c in reversed(children):
                push((c, node))

    def _lambda(self, node: ast.Lambda, scope: Scope) -> None:
        args = node.args
        self._record(args, node)
        for d in args.defaults + [d for d in args.kw_defaults if d is not None]:
            self._expr(d, args, scope)
        inner = Scope("lambda", node, scope)
        self.m.scopes[node] = inner
        for a in args.posonlyargs + args.args + args.kwonlyargs + [x for x in (args.vararg, args.kwarg) if x is not None]:
            self._record(a, args)
            inner.add(Binding(a.arg, "param", a, inner))
        self._expr(node.body, node, inner)

    def _comprehension(self, node: ast.AST, scope: Scope) -> None:
        inner = Scope("comprehension", node, scope)
        self.m.scopes[node] = inner
        gens = node.generators  # type: ignore[attr-defined]
        for i, g in enumerate(gens):
            self._record(g, node)
            # the first iterable is evaluated in the enclosing scope
            self._expr(g.iter, g, scope if i == 0 else inner)
            self._target(g.target, g, inner, "comprehension", None)
            for cond in g.ifs:
                self._expr(cond, g, inner)
        if isinstance(node, ast.DictComp):
            self._expr(node.key, node, inner)
            self._expr(node.value, node, inner)
        else:
            self._expr(node.elt, node, inner)  # type: ignore[attr-defined]

    def _generic(self, node: ast.AST, parent: ast.AST, scope: Scope) -> None:
        """Match patterns and other rare nodes: capture names bind, the rest is walked."""
        self._record(node, parent)
        name = getattr(node, "name", None)
        if isinstance(name, str) and type(node).__name__ in ("MatchAs", "MatchStar"):
            scope.add(Binding(name, "match", node, scope))
        rest = getattr(node, "rest", None)
        if isinstance(rest, str):
            scope.add(Binding(rest, "match", node, scope))
        for c in ast.iter_child_nodes(node):
            if isinstance(c, ast.expr):
                self._expr(c, node, scope)
            else:
                self._generic(c, node, scope)

    def _generic_children(self, s: ast.AST, scope: Scope) -> None:
        for c in ast.iter_child_nodes(s):
            if isinstance(c, ast.expr):
                self._expr(c, s, scope)
            elif isinstance(c, ast.stmt):
                self._stmt(c, s, scope)
            else:
                self._generic(c, s, scope)


_EXPORTS: Dict[str, Optional[Dict[str, str]]] = {}


def _module_exports(base: str, module: str, level: int) -> Optional[Dict[str, str]]:
    """The names a star import of ``module`` binds, with their qualified names, read from
    its file found beside the importing script (or up to three folders above it for
    absolute names): its imports, its own top-level definitions (``utils.Batches``) and what
    its own star imports bind in turn (a package's ``from .vgg import *``)."""
    cand = module_file(base, module, level)
    if cand is None:
        return None
    return _file_exports(cand, module if not level else None)


def _file_exports(path: str, qual: Optional[str]) -> Optional[Dict[str, str]]:
    key = os.path.realpath(path)
    if key not in _EXPORTS:
        _EXPORTS[key] = {}  # a star-import cycle reads as nothing more
        _EXPORTS[key] = _read_exports(path, qual)
    return _EXPORTS[key]


_PROJECT_MODELS: Dict[str, Optional["SemanticModel"]] = {}
_NOT_PROJECT = frozenset({"torch", "os", "sys", "numpy", "torchvision", "logging", "pathlib", "shutil", "json", "builtins"})


def project_def(m: "SemanticModel", func: ast.AST) -> Optional[Tuple["SemanticModel", ast.AST, str]]:
    """What a call's function names in the project's own modules (a file beside the
    script, which the rewrite reads but never edits): the model of that module, its
    top-level ``def`` or ``class`` of that name, and the file's path relative to the
    script's folder. ``None`` for anything else."""
    if m.path in ("<string>", "<stdin>", "-"):
        return None
    base = os.path.dirname(os.path.abspath(m.path))
    for q in m.qualified_names(func):
        module, _, name = q.rpartition(".")
        if not module or module.split(".")[0] in _NOT_PROJECT:
            continue
        found = _project_module(m, base, module)
        if found is None:
            continue
        pm, rel = found
        for stmt in pm.tree.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and stmt.name == name:
                return pm, stmt, rel
    return None


def _project_module(m: "SemanticModel", base: str, module: str) -> Optional[Tuple["SemanticModel", str]]:
    """The model of project module ``module`` and its path relative to ``base``; looked up
    once per script model (files are found and read once per run, and read again when
    edited since)."""
    memo = m.cache.setdefault("_project_modules", {})
    if module in memo:
        return memo[module]  # type: ignore[index,return-value]
    memo[module] = None  # type: ignore[index]
    path = module_file(base, module)
    if path is None or os.path.realpath(path) == os.path.realpath(m.path):
        return None
    try:
        key = f"{os.path.realpath(path)}:{os.stat(path).st_mtime_ns}"  # a file edited since is read again
    except OSError:
        return None
    if key not in _PROJECT_MODELS:
        try:
            with open(path, "rb") as fh:
                _PROJECT_MODELS[key] = build(fh.read(), path)
        except (OSError, SyntaxError, ValueError, UnicodeDecodeError, LookupError):
            _PROJECT_MODELS[key] = None
    pm = _PROJECT_MODELS[key]
    if pm is not None:
        memo[module] = (pm, os.path.relpath(path, base))  # type: ignore[index]
    return memo[module]  # type: ignore[index,return-value]


def project_calls(m: "SemanticModel") -> List[Tuple[ast.Call, Tuple["SemanticModel", ast.AST, str]]]:
    """Every call of this script whose function is a top-level ``def`` or ``class`` of a
    project module, with :func:`project_def`'s answer; computed once per model."""
    got = m.cache.get("project_calls")
    if got is None:
        got = []
        for call in m.nodes(ast.Call):
            found = project_def(m, call.func)
            if found is not None:
                got.append((call, found))
        m.cache["project_calls"] = got
    return got  # type: ignore[return-value]


def module_file(base: str, module: str, level: int = 0) -> Optional[str]:
    """The file of a project module imported by a script in folder ``base``: beside it
    (or up to three folders above it for absolute names); ``None`` when not found."""
    parts = module.split(".") if module else []
    roots = []
    if level:
        d = base
        for _ in range(level - 1):
            d = os.path.dirname(d)
        roots = [d]
    else:
        d = base
        for _ in range(4):
            roots.append(d)
            d = os.path.dirname(d)
    for root in roots:
        for cand in (os.path.join(root, *parts) + ".py", os.path.join(root, *parts, "__init__.py")):
            if os.path.isfile(cand):
                return cand
    return None


def _read_exports(path: str, qual: Optional[str]) -> Optional[Dict[str, str]]:
    """What ``from <the module at path> import *`` binds: ``qual`` is the module's dotted
    name (``None`` when it cannot be told: its own definitions are then not exported)."""
    try:
        with open(path, "rb") as fh:
            tree = ast.parse(decode(fh.read()))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError, LookupError):
        return None
    package = None
    if qual is not None:
        package = qual if os.path.basename(path) == "__init__.py" else qual.rpartition(".")[0]
    out: Dict[str, str] = {}
    names_all = None
    for stmt in tree.body:
        if isinstance(stmt, ast.Import):
            for a in stmt.names:
                if a.asname:
                    out[a.asname] = a.name
                else:
                    top = a.name.split(".", 1)[0]
                    out[top] = top
        elif isinstance(stmt, ast.ImportFrom) and any(a.name == "*" for a in stmt.names):
            inner = _nested_star(path, package, stmt)
            if inner is not None:
                out.update(inner)
        elif isinstance(stmt, ast.ImportFrom) and not stmt.level and stmt.module:
            for a in stmt.names:
                out[a.asname or a.name] = f"{stmt.module}.{a.name}"
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and qual is not None:
            out[stmt.name] = f"{qual}.{stmt.name}"
        elif isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in stmt.targets):
            if isinstance(stmt.value, (ast.List, ast.Tuple)):
                names_all = {e.value for e in stmt.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    public = {k: v for k, v in out.items() if not k.startswith("_")}
    if names_all is not None:
        public = {k: v for k, v in public.items() if k in names_all}
    return public


def _nested_star(path: str, package: Optional[str], stmt: ast.ImportFrom) -> Optional[Dict[str, str]]:
    """What a project module's own ``from x import *`` binds (relative to its package, or
    absolute beside it)."""
    if stmt.level:
        if package is None:
            return None
        parts = package.split(".") if package else []
        if stmt.level - 1 > len(parts):
            return None
        base_parts = parts[: len(parts) - (stmt.level - 1)]
        target = ".".join(base_parts + ([stmt.module] if stmt.module else []))
        cand = module_file(os.path.dirname(path), stmt.module or "", stmt.level)
        return _file_exports(cand, target or None) if cand is not None else None
    if not stmt.module or stmt.module.split(".")[0] in _NOT_PROJECT:
        return None
    cand = module_file(os.path.dirname(path), stmt.module)
    return _file_exports(cand, stmt.module) if cand is not None else None


def build(source: Union[str, bytes], path: str = "<string>") -> SemanticModel:
    """Parse ``source`` and build its model (raises ``SyntaxError`` as ``ast.parse`` does)."""
    if isinstance(source, bytes):
        text = decode(source)
    else:
        text = source
    tree = ast.parse(text, filename=path, type_comments=False)
    return SemanticModel(tree, text, path)


def decode(data: bytes) -> str:
    """Bytes of a Python file to text, honouring a PEP 263 coding line and a BOM."""
    import io
    import tokenize

    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    text = data.decode(encoding)
    if text.startswith("\ufeff"):
        text = text[1:]
    return text
