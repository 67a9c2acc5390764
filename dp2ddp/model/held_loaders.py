"""Objects that hold one DataLoader and iterate it (``Batches(ds, bs, shuffle=True)``).

* :func:`class_holds`: the attribute a class sets once to a ``DataLoader(...)`` in its own
  ``__init__`` and is the only thing its ``__iter__`` iterates.
* :func:`held_loader`: the :class:`HeldLoader` a construction of such a class (the
  script's or a project module's) makes: the object whose attribute is sharded, so that
  other objects of the class (its evaluation sets) stay whole.

:func:`dp2ddp.model.loaders.loaders` asks :func:`class_holds` whether a DataLoader call is
the one a class holds (its training is then a question for each object).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Optional, Tuple

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.names import DATALOADER
from dp2ddp.model.project_defs import class_of_call


@dataclass
class HeldLoader:
    """An object of a class (the script's or a project module's) that holds one DataLoader
    and iterates it: ``train_batches = Batches(ds, bs, shuffle=True)`` where ``Batches``
    builds ``self.dataloader = DataLoader(...)`` in ``__init__`` and its ``__iter__`` goes
    over ``self.dataloader`` (moving each batch to the device, wrapping it in a dict). The
    loader it holds is read at each pass, so ``train_batches.dataloader =
    shard_loader(train_batches.dataloader)`` after the construction shards this object's
    batches and no other object's of the class (its evaluation sets stay whole)."""

    call: ast.Call  # the construction
    cls: ast.ClassDef
    attribute: str  # the attribute that holds the DataLoader
    where: str  # the class's file (``utils.py``), or "" for the script itself


def held_loader(m: SemanticModel, call: ast.AST) -> Optional[HeldLoader]:
    """The :class:`HeldLoader` that ``call`` constructs, or ``None`` when the class does
    not provably iterate one DataLoader attribute set once, in its own ``__init__``."""
    found = class_of_call(m, call)
    if found is None:
        return None
    cm, cls, where = found
    held = class_holds(cm, cls)
    return HeldLoader(call, cls, held[0], where) if held is not None else None


def class_holds(cm: SemanticModel, cls: ast.ClassDef) -> Optional[Tuple[str, ast.Call]]:
    """``(attribute, DataLoader call)`` where class ``cls`` iterates, in its own
    ``__iter__``, one attribute that only its own ``__init__`` sets, to a DataLoader."""
    from dp2ddp.model.training_feeds import iterated as iterated_values

    methods = cm.methods(cls)
    init, it = methods.get("__init__"), methods.get("__iter__")
    if init is None or it is None:
        return None
    iterated = set()
    for n in ast.walk(it):
        source = None
        if isinstance(n, (ast.For, ast.AsyncFor, ast.comprehension)):
            source = n.iter
        elif isinstance(n, ast.YieldFrom):
            source = n.value
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "iter" and len(n.args) == 1:
            source = n.args[0]
        for value in iterated_values(source) if source is not None else ():
            iterated.add(_self_attribute(value) or "")  # "": something else is iterated too
    if len(iterated) != 1 or "" in iterated:
        return None
    attribute = next(iter(iterated))
    made = []
    for method in methods.values():
        for n in ast.walk(method):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, (ast.AugAssign, ast.AnnAssign)) else []
            for t in targets:
                for leaf in ast.walk(t):
                    if _self_attribute(leaf) == attribute and isinstance(leaf.ctx, ast.Store):  # type: ignore[attr-defined]
                        made.append((method, n))
    if len(made) != 1:
        return None
    method, assign = made[0]
    if method is not init or not isinstance(assign, ast.Assign) or len(assign.targets) != 1:
        return None
    if not cm.call_is(assign.value, DATALOADER) or cm.enclosing_function(assign) is not init:
        return None
    return attribute, assign.value  # type: ignore[return-value]


def _self_attribute(node: Optional[ast.AST]) -> Optional[str]:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None
