"""What the names a loop binds hold across its iterations and after it.

For an evaluation loop (:mod:`dp2ddp.model.eval_loops`): the names it binds
(:func:`loop_stores`), the lists it collects into (:func:`collecting_calls`), how an
accumulator starts before it (:func:`start_problem`: a number or a zero tensor,
:func:`zero_tensor`; an empty list, :func:`empty_list`), a value carried from one batch to
the next (:func:`carried_read`), and the reads after the loop that may see its last value
(:class:`LaterReads`).
"""

from __future__ import annotations

import ast
from typing import Dict, List, Optional, Set, Tuple

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.iteration_effects import walk_statements
from dp2ddp.model.syntax import FUNCTIONS


_COLLECTING = ("append", "extend")


def collecting_calls(m: SemanticModel, loop: ast.For, scope, stored: Set[str]) -> List[ast.Call]:
    """The loop's statements ``name.append(...)``/``name.extend(...)`` on a name of its
    function the loop does not bind (a list it collects into, if it starts empty)."""
    out: List[ast.Call] = []
    for node in walk_statements(loop.body):
        if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
            continue
        call = node.value
        f = call.func
        if (isinstance(f, ast.Attribute) and f.attr in _COLLECTING and isinstance(f.value, ast.Name)
                and f.value.id not in stored and len(call.args) == 1 and not call.keywords
                and not isinstance(call.args[0], ast.Starred) and m.scope_of(call) is scope
                and m.lookup(f.value.id, scope)[0] is scope):
            out.append(call)
    return out


def zero_tensor(m: SemanticModel, value: ast.AST) -> bool:
    """A tensor made to hold zeros (an accumulator one element of which a loop adds to)."""
    return isinstance(value, ast.Call) and _zero_like(m, value)


def empty_list(m: SemanticModel, value: ast.AST) -> bool:
    """``[]`` or ``list()``."""
    if isinstance(value, ast.List):
        return not value.elts
    return isinstance(value, ast.Call) and not value.args and not value.keywords and m.is_name(value.func, {"builtins.list"})


def loop_stores(m: SemanticModel, loop: ast.For, scope) -> Tuple[Set[str], Set[str]]:
    """Names the loop binds in its scope: all of them, and those bound other than by an
    augmented assignment."""
    stored: Set[str] = set()
    plain: Set[str] = set()
    for n in walk_statements([loop.target] + list(loop.body)):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and m.scope_of(n) is scope:
            stored.add(n.id)
            if not isinstance(m.parent(n), ast.AugAssign):
                plain.add(n.id)
        elif isinstance(n, FUNCTIONS + (ast.ClassDef,)):
            stored.add(n.name)
            plain.add(n.name)
    return stored, plain


def carried_read(m: SemanticModel, loop: ast.For, local: Set[str], scope) -> Optional[ast.Name]:
    """A read in the loop of a name the loop binds that no binding of the same iteration
    comes before (``batch_time.update(time.time() - end); end = time.time()``)."""
    names = [n for n in walk_statements([loop.target] + list(loop.body)) if isinstance(n, ast.Name) and n.id in local
             and m.scope_of(n) is scope]
    stores: Dict[str, List[ast.Name]] = {}
    for n in names:
        if isinstance(n.ctx, ast.Store):
            stores.setdefault(n.id, []).append(n)
    for r in names:
        reads = isinstance(r.ctx, ast.Load) or isinstance(m.parent(r), ast.AugAssign)
        if reads and not any(_dominates(m, s, r, loop) for s in stores.get(r.id, ())):
            return r
    return None


def _dominates(m: SemanticModel, s: ast.Name, r: ast.Name, within: ast.AST) -> bool:
    """Binding ``s`` runs before read ``r`` on every path through ``within`` (a loop's body)
    that reaches ``r``: ``s`` is the target of a ``for`` whose body holds ``r``, or its
    statement comes before one that holds ``r`` in the same block."""
    if s is r:
        return False
    st = m.statement_of(s)
    if isinstance(st, (ast.For, ast.AsyncFor)) and m.contains(st.target, s):
        return any(m.contains(b, r) for b in st.body)
    while isinstance(m.parent(st), (ast.With, ast.AsyncWith)) and not m.contains(m.parent(st), r):
        st = m.parent(st)  # ``with torch.no_grad(): output = net(x)``: a with-block's body always runs
    a: Optional[ast.AST] = m.statement_of(r)
    while a is not None and a is not within:
        block = m.block_of(a)  # type: ignore[arg-type]
        if block is not None:
            i = next((k for k, x in enumerate(block[2]) if x is st), None)
            j = next(k for k, x in enumerate(block[2]) if x is a)
            if i is not None and i < j:
                return True
        a = m.parent(a)
        while a is not None and not isinstance(a, ast.stmt):
            a = m.parent(a)
    return False


def start_problem(m: SemanticModel, loop: ast.For, name: str, scope, ok=None) -> Optional[Tuple[ast.AST, str]]:
    """Why accumulator ``name`` is not a number or a zero tensor before the loop (else None);
    ``ok``: another test of its start (an empty list)."""
    ok = ok or _zero_like
    where, bindings = m.lookup(name, scope)
    if where is not scope:
        return loop, f"`{name}` is not a local of its function"
    before = [b for b in bindings if not m.contains(loop, b.node) and _pos(b.node) < _pos(loop)]
    if not before:
        return loop, f"`{name}` is not bound before the loop"
    for b in before:
        value = _bound_value(m, b)
        if value is None or not ok(m, value):
            shown = f"`{m.brief(value)}`" if value is not None else "something else"
            node = value if value is not None else b.node
            return node, f"`{name}` starts as {shown} (line {node.lineno}), not a number or a zero tensor"
    return None


def _pos(node: ast.AST) -> Tuple[int, int]:
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))


def _bound_value(m: SemanticModel, b) -> Optional[ast.AST]:
    if b.kind == "assign":
        return b.value
    if b.kind == "unpack" and b.target is not None:
        stmt = m.statement_of(b.target)
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, (ast.Tuple, ast.List)):
            for t in stmt.targets:
                if isinstance(t, (ast.Tuple, ast.List)) and len(t.elts) == len(stmt.value.elts):
                    for el, v in zip(t.elts, stmt.value.elts):
                        if el is b.target:
                            return v
    return None


def _zero_like(m: SemanticModel, value: ast.AST) -> bool:
    """A number, or a tensor made to hold zeros (``torch.zeros(...)``, ``torch.tensor(0.)``)."""
    if isinstance(value, ast.UnaryOp) and isinstance(value.op, (ast.USub, ast.UAdd)):
        value = value.operand
    if isinstance(value, ast.Constant):
        return isinstance(value.value, (int, float)) and not isinstance(value.value, bool)
    if isinstance(value, ast.Call):
        q = m.qualified_names(value.func)
        if q & {"torch.zeros", "torch.zeros_like"}:
            return True
        if q & {"torch.tensor"} and value.args:
            return _zero_like(m, value.args[0])
    return False


class LaterReads:
    """Reads of the names a loop binds that may see the loop's last value."""

    def __init__(self, m: SemanticModel, scope, loop: ast.For) -> None:
        self.m, self.scope, self.loop = m, scope, loop
        self.by_name: Dict[str, List[ast.Name]] = {}
        for n in m.nodes(ast.Name):
            if not m.contains(loop, n) and m.lookup(n.id, m.scope_of(n))[0] is scope:
                self.by_name.setdefault(n.id, []).append(n)  # type: ignore[attr-defined]

    def after(self, name: str) -> Optional[ast.Name]:
        m, loop = self.m, self.loop
        names = self.by_name.get(name, [])
        stores = [n for n in names if isinstance(n.ctx, ast.Store)]
        for r in names:
            reads = isinstance(r.ctx, ast.Load) or isinstance(m.parent(r), ast.AugAssign)
            if not reads:
                continue
            if _pos(r) < _pos(loop) and not self._loop_around_both(r):
                continue  # runs before the loop ever has
            if any(self._kills(s, r) for s in stores):
                continue
            return r
        return None

    def _loop_around_both(self, r: ast.AST) -> bool:
        return any(self.m.contains(a, self.loop) for a in self.m.enclosing_loops(r))

    def _kills(self, s: ast.Name, r: ast.Name) -> bool:
        """Store ``s`` is on every path from the loop to read ``r``."""
        m, loop = self.m, self.loop
        if s is r:
            return False
        st = m.statement_of(s)
        if isinstance(st, (ast.For, ast.AsyncFor)) and m.contains(st.target, s):
            return any(m.contains(b, r) for b in st.body) and not m.contains(st, loop)
        a: Optional[ast.AST] = m.statement_of(r)
        while a is not None and not isinstance(a, FUNCTIONS + (ast.Module,)):
            block = m.block_of(a)  # type: ignore[arg-type]
            if block is not None:
                stmts = block[2]
                i = next((k for k, x in enumerate(stmts) if x is st), None)
                j = next(k for k, x in enumerate(stmts) if x is a)
                if i is not None and i < j:
                    return not any(m.contains(x, loop) for x in stmts[i + 1 : j + 1])
            a = m.parent(a)
            while a is not None and not isinstance(a, ast.stmt):
                a = m.parent(a)
        return False
