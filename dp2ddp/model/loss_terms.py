"""The terms a loss expression adds up, and which of them are means over their batch.

:func:`loss_terms` reads a loss expression through ``+``/``-``, factors the same on every rank
(:func:`rank_constant`), local assignments and this module's functions' returns; a term
divided by its batch's size (:func:`batch_size_of`) or by a count of its batch is a mean, a
:class:`Division` (:func:`loss_divisions`).
"""

from __future__ import annotations

import ast
from typing import List, NamedTuple, Optional, Set

from dp2ddp.model.batch_counts import data_count
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.syntax import first_dim_of, summing_keyword


_SAME_VALUE = frozenset({"to", "cuda", "cpu", "float", "double", "half"})


def loss_terms(m: SemanticModel, e: ast.AST, out: List[ast.AST], seen: Set[int], depth: int,
           means: Optional[Set[int]] = None, divisions: Optional[List["Division"]] = None) -> None:
    """The terms a loss expression adds up (through ``+``/``-``, factors the same on every
    rank, ``.to(device)``, local names' assignments — the one just before where a name
    updates itself, ``loss = loss / x.size(0)`` — and the returns of this module's
    functions); anything else is a term of its own. A term divided by its batch's size, or
    by a count of its batch (:func:`dp2ddp.model.batch_counts.data_count`: the migration makes
    it every rank's, DDP169), is a mean: the terms inside it go to ``means``, and the division
    to ``divisions`` (``loss /= n`` too, where that is the name's last store)."""
    if depth > 8 or id(e) in seen:
        out.append(e)
        return
    seen.add(id(e))
    if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Div) and _normaliser(m, e.right):
        inner: List[ast.AST] = []
        loss_terms(m, e.left, inner, seen, depth + 1, means)
        if means is not None:
            means.update(id(x) for x in inner)
        if divisions is not None:
            divisions.append(Division(e, e.right, inner))
        out.append(e)
    elif (isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr in _SAME_VALUE
          and m.resolve_call(e) is None):
        loss_terms(m, e.func.value, out, seen, depth + 1, means, divisions)
    elif isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Add, ast.Sub)):
        loss_terms(m, e.left, out, seen, depth + 1, means, divisions)
        loss_terms(m, e.right, out, seen, depth + 1, means, divisions)
    elif isinstance(e, ast.BinOp) and isinstance(e.op, ast.Mult) and rank_constant(m, e.left):
        loss_terms(m, e.right, out, seen, depth + 1, means, divisions)
    elif isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Mult, ast.Div)) and rank_constant(m, e.right):
        loss_terms(m, e.left, out, seen, depth + 1, means, divisions)
    elif isinstance(e, ast.UnaryOp) and isinstance(e.op, (ast.USub, ast.UAdd)):
        loss_terms(m, e.operand, out, seen, depth + 1, means, divisions)
    elif isinstance(e, ast.Name):
        _, bindings = m.lookup(e.id, m.scope_of(e))
        before = [b for b in bindings if _line(b) < getattr(e, "lineno", 0)
                  and m.enclosing_function(b.node) is m.enclosing_function(e)]
        last = max(before, key=_line, default=None)
        if (last is not None and last.kind == "assign" and last.value is not None
                and any(isinstance(n, ast.Name) and n.id == e.id for n in ast.walk(last.value))):
            loss_terms(m, last.value, out, seen, depth + 1, means, divisions)  # ``loss = loss / n``: what it was, updated
            return
        if (last is not None and last.kind == "augassign" and isinstance(last.node.op, ast.Div)
                and _normaliser(m, last.node.value) and isinstance(last.node.target, ast.Name)):
            inner: List[ast.AST] = []  # ``loss /= n``: what the name held just before, divided
            prev = max((b for b in before if _line(b) < last.node.lineno), key=_line, default=None)
            if prev is not None and prev.kind == "assign" and prev.value is not None:
                loss_terms(m, prev.value, inner, seen, depth + 1, means, divisions)
            else:
                inner.append(last.node.target)
            if means is not None:
                means.update(id(x) for x in inner)
            if divisions is not None:
                divisions.append(Division(last.node, last.node.value, inner))
            out.append(e)
            return
        if not bindings or any(b.kind not in ("assign", "augassign") for b in bindings):
            out.append(e)
            return
        for b in bindings:
            value = b.value if b.kind == "assign" else getattr(b.node, "value", None)
            if value is None or (b.kind == "augassign" and not isinstance(b.node.op, (ast.Add, ast.Sub))):
                out.append(e)
                return
            if isinstance(value, ast.Constant) and value.value == 0:
                continue  # ``loss = 0`` before ``loss += ...``
            loss_terms(m, value, out, seen, depth + 1, means, divisions)
    elif isinstance(e, ast.Call) and m.resolve_call(e) is not None and not summing_keyword(e):
        from dp2ddp.model.steps import own_nodes

        func = m.resolve_call(e)
        returns = [n.value for n in own_nodes(m, func) if isinstance(n, ast.Return) and n.value is not None
                   and m.enclosing_function(n) is func]
        if not returns:
            out.append(e)
        for r in returns:
            loss_terms(m, r, out, seen, depth + 1, means, divisions)
    else:
        out.append(e)


class Division(NamedTuple):
    """A term of a loss divided by its batch's size or by a count of its batch."""

    node: ast.AST  # ``loss / n`` (a BinOp), or the ``loss /= n`` statement
    divisor: ast.AST
    inner: List[ast.AST]  # the terms of what is divided


def loss_divisions(m: SemanticModel, operand: ast.AST) -> List[Division]:
    """The terms of the loss expression ``operand`` that divide by their batch's size or by a
    count of it (:func:`loss_terms`), with the terms they divide."""
    out: List[Division] = []
    loss_terms(m, operand, [], set(), 0, None, out)
    return out


def _normaliser(m: SemanticModel, e: ast.AST) -> bool:
    return batch_size_of(m, e) or data_count(m, e) is not None


def _line(binding) -> int:
    """The line of a binding (``with amp.scale_loss(loss, opt) as scaled_loss``: a
    ``withitem`` has none of its own; its target has)."""
    for node in (binding.node, getattr(binding, "target", None)):
        line = getattr(node, "lineno", None)
        if line is not None:
            return line
    return 0


def rank_constant(m: SemanticModel, e: ast.AST) -> bool:
    """A factor the same on every rank: numbers, and arithmetic over names and attributes
    that no call in the same function computes (``self.T ** 2``, ``args.alpha``)."""
    func = m.enclosing_function(e)
    for n in ast.walk(e):
        if isinstance(n, ast.Call):
            return False
        if isinstance(n, ast.Name) and func is not None:
            _, bindings = m.lookup(n.id, m.scope_of(n))
            if any(b.kind in ("assign", "augassign") and m.enclosing_function(b.node) is func
                   and not (b.value is not None and isinstance(b.value, ast.Constant)) for b in bindings):
                return False
    return True


def batch_size_of(m: SemanticModel, e: ast.AST) -> bool:
    """``e`` is the size of a batch where it is computed (``x.size(0)``, ``len(x)``, a name
    bound once to one, or to the first of ``x.size()``'s unpacked; products of them)."""
    todo = [e]
    while todo:
        e = todo.pop()
        if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Mult):
            todo += [e.left, e.right]
        elif first_dim_of(e) is not None:
            return True
        elif isinstance(e, ast.Name):
            _, bindings = m.lookup(e.id, m.scope_of(e))
            if len(bindings) == 1 and bindings[0].kind == "assign" and bindings[0].value is not None:
                if first_dim_of(bindings[0].value) is not None:
                    return True
            if len(bindings) == 1 and bindings[0].kind == "unpack" and _first_of_shape(m, bindings[0]):
                return True
    return False


def _first_of_shape(m: SemanticModel, binding) -> bool:
    """``n`` of ``n, c, h, w = x.size()`` (or ``= x.shape``): the batch's size."""
    tup = binding.node
    stmt = m.parent(tup)
    if not (isinstance(tup, (ast.Tuple, ast.List)) and tup.elts and tup.elts[0] is binding.target
            and isinstance(stmt, ast.Assign) and stmt.targets == [tup]):
        return False
    v = stmt.value
    return ((isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr == "size" and not v.args
             and not v.keywords) or (isinstance(v, ast.Attribute) and v.attr == "shape"))
