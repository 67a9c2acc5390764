"""Scopes and bindings, recorded in execution order by the one walk of the tree (ruff's
SemanticModel shape): the walk also records every node's parent and the nodes of each
type; name lookup over what it records is in :mod:`dp2ddp.model.qualnames`."""

from __future__ import annotations

import ast
from typing import Dict, List, Optional, Sequence, Set

from dp2ddp.model.syntax import COMPREHENSIONS, FUNCTIONS


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


class ScopeBuilder:
    """One walk of the tree: parents, nodes by type, scopes and bindings (of ``model``, the
    :class:`~dp2ddp.model.core.SemanticModel` being built, which imports this module)."""

    def __init__(self, model: "SemanticModel") -> None:
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
