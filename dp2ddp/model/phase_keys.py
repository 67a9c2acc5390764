"""The keys a loop over a dict of loaders trains on (a phase loop).

``for phase in ["train", "val"]: ... for batch in loaders[phase]: ... if phase == "train":
loss.backward()``: one loop trains on some keys of a dict of loaders and evaluates on the
others. :func:`trained_keys`: the keys under which a backward pass and an optimizer step
can run; :func:`fed_origins`: the origins of a value a training loop feeds on, followed
only for those keys.
"""

from __future__ import annotations

import ast
from typing import List, Optional, Tuple

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.training import is_backward, is_update, project_trains, reaches_update, trains


# ---------------------------------------------------------------------- loaders by phase
# ``for phase in ["train", "val"]: ... for batch in loaders[phase]: ... if phase == "train":
# loss.backward()``: one loop trains on some keys of a dict of loaders and evaluates on the
# others. The keys it trains on are those under which a backward pass can run.


def keyed_feed(m: SemanticModel, value: ast.AST, loop: ast.AST):
    """``(container, key loop)`` where ``value`` (fed to training ``loop``) is one item of a
    dict chosen by a key loop: ``loaders[phase]``, ``loader`` of ``for phase, loader in
    loaders.items()``, or the ``loaders.items()`` / ``loaders.values()`` the key loop
    walks itself; else ``None``."""
    from dp2ddp.model.flow import binding_loop, key_loop

    if isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Name):
        kl = binding_loop(m, value.slice)
        if kl is not None and kl.key == value.slice.id:
            return value.value, kl
    if isinstance(value, ast.Name):
        kl = binding_loop(m, value)
        if kl is not None and kl.value == value.id and kl.container is not None:
            return kl.container, kl
    kl = key_loop(m, loop)
    if kl is not None and kl.container is not None and getattr(loop, "iter", None) is value:
        return kl.container, kl
    return None


def _key_test(m: SemanticModel, test: ast.AST, name: str, key: object, depth: int = 0) -> Optional[bool]:
    """``test`` evaluated with ``name`` bound to ``key``: ``True``/``False``, or ``None``
    where it depends on anything else."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        got = _key_test(m, test.operand, name, key, depth)
        return None if got is None else not got
    if isinstance(test, ast.BoolOp):
        parts = [_key_test(m, v, name, key, depth) for v in test.values]
        if isinstance(test.op, ast.And):
            return False if False in parts else True if all(p is True for p in parts) else None
        return True if True in parts else False if all(p is False for p in parts) else None
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, op, right = test.left, test.ops[0], test.comparators[0]
        if isinstance(right, ast.Name) and right.id == name and isinstance(left, ast.Constant):
            left, right = right, left
        if not (isinstance(left, ast.Name) and left.id == name):
            return None
        if isinstance(right, ast.Constant):
            if isinstance(op, (ast.Eq, ast.Is)):
                return key == right.value
            if isinstance(op, (ast.NotEq, ast.IsNot)):
                return key != right.value
        if isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.List, ast.Tuple, ast.Set)) and all(
            isinstance(x, ast.Constant) for x in right.elts
        ):
            inside = key in [x.value for x in right.elts]  # type: ignore[attr-defined]
            return inside if isinstance(op, ast.In) else not inside
        return None
    if isinstance(test, ast.Name) and depth < 2:
        # ``train = phase == "train"`` then ``if train:``
        _, bindings = m.lookup(test.id, m.scope_of(test))
        if len(bindings) == 1 and bindings[0].kind == "assign" and bindings[0].value is not None:
            return _key_test(m, bindings[0].value, name, key, depth + 1)
    return None


def _training_calls(m: SemanticModel, node: ast.AST) -> List[ast.Call]:
    """The calls in ``node`` that run a backward pass: ``.backward()``, or a function of the
    script or the project that reaches one."""
    out = []
    for n in ast.walk(node):
        if not isinstance(n, ast.Call):
            continue
        if is_backward(n):
            out.append(n)
            continue
        t = m.resolve_call(n)
        if (t is not None and trains(m, t)) or (t is None and project_trains(m, n)):
            out.append(n)
    return out


def _update_calls(m: SemanticModel, node: ast.AST) -> List[ast.Call]:
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            t = m.resolve_call(n)
            if is_update(n) or (t is not None and reaches_update(m, t)):
                out.append(n)
    return out


def trained_keys(m: SemanticModel, kl) -> Tuple[object, ...]:
    """The keys of key loop ``kl`` under which its body trains: a backward pass and an
    optimizer step can run (no ``if`` around them, between the key loop and the call, is
    false for that key). A backward pass alone (an attack on the inputs, evaluated on every
    phase) does not train; where the loop holds no step at all (it follows the loop), the
    backward passes decide."""
    backward = _reachable_keys(m, kl, _training_calls(m, kl.loop))
    updates = _update_calls(m, kl.loop)
    if not updates:
        return backward
    both = tuple(k for k in _reachable_keys(m, kl, updates) if k in backward)
    return both or backward


def _reachable_keys(m: SemanticModel, kl, calls: List[ast.Call]) -> Tuple[object, ...]:
    """The keys of ``kl`` under which one of ``calls`` can run."""
    out = []
    for key in kl.keys:
        for call in calls:
            reachable = True
            child: ast.AST = call
            for a in m.ancestors(call):
                if a is kl.loop:
                    break
                if isinstance(a, (ast.If, ast.IfExp)):
                    got = _key_test(m, a.test, kl.key, key)
                    in_body = any(child is s for s in a.body) if isinstance(a, ast.If) else child is a.body
                    in_else = any(child is s for s in a.orelse) if isinstance(a, ast.If) else child is a.orelse
                    if (in_body and got is False) or (in_else and got is True):
                        reachable = False
                        break
                child = a
            if reachable:
                out.append(key)
                break
    return tuple(out)


def fed_origins(m: SemanticModel, value: ast.AST, loop: ast.AST) -> List[Tuple[ast.AST, tuple]]:
    """:func:`dp2ddp.model.flow.origins` of ``value`` as training ``loop`` feeds on it: an item
    of a dict chosen by a key loop (:func:`keyed_feed`) is followed only for the keys that
    train (:func:`trained_keys`): ``loaders["val"]`` of a phase loop that steps only when
    ``phase == "train"`` is evaluation, whole on every rank."""
    from dp2ddp.model.flow import item_origins, origins

    got = keyed_feed(m, value, loop)
    if got is None:
        return origins(m, value)
    container, kl = got
    return item_origins(m, container, trained_keys(m, kl))
