"""Saves a training class makes through objects it is handed.

A trainer of the BERT fine-tuning era is given its callbacks when it is made::

    checkpoint = ModelCheckpoint(checkpoint_dir=..., monitor="valid_loss")
    trainer = Trainer(model=model, ..., model_checkpoint=checkpoint)
    trainer.train(train_loader, valid_loader)

and its epoch loop calls ``self.model_checkpoint.epoch_step(...)``, a method of a class of
another project module that saves the model. Every rank must run the trainer, so every
rank would make that save, in a module neither the trainer's class nor the script shows.
:func:`handed_object_save` follows the value from the script's construction call, through
the parameter of ``__init__`` it binds and the ``self.`` attribute that keeps it, to the
method the class calls on it and the save there.
"""

from __future__ import annotations

import ast
from typing import List, Optional, Tuple

from dp2ddp.model.core import SemanticModel

_SAVES = ("save", "copy", "open")


def handed_object_saves(m: SemanticModel, call: ast.Call, family, writers) -> List[Tuple[SemanticModel, ast.Call, str]]:
    """``call`` makes an object of a project class (``family``: its classes with their
    module models and paths, :func:`dp2ddp.model.writers._class_family`). Per module, the
    first file write with no rank test (``torch.save``, a copy, ``open(path, "w")``, ``save_pretrained``)
    in a method the family calls on a ``self.`` attribute bound to a parameter of
    ``__init__``, where ``call`` hands that parameter an object of a project class made in
    the script: ``(that class's module model, the write, the module's path)``. ``writers``:
    :func:`dp2ddp.model.writers.writers` (passed in: that module reads this one)."""
    from dp2ddp.model.stores import attribute_assignments
    from dp2ddp.model.project_defs import class_of_call
    from dp2ddp.model.ranks import rank_guarded

    out: List[Tuple[SemanticModel, ast.Call, str]] = []
    for cm, cls, _ in family:
        init = cm.methods(cls).get("__init__")
        if init is None:
            continue
        params = set(cm.params(init)) - {"self"}
        kept = {attr: v.id for attr, values in attribute_assignments(cm, cls).items() for v in values
                if isinstance(v, ast.Name) and v.id in params and len(values) == 1}
        for node in ast.walk(cls):
            target = _method_on_self_attribute(node)
            if target is None or target[0] not in kept:
                continue
            attr, meth = target
            handed = cm.argument_for(init, call, kept[attr])
            made = _made_by(m, handed)
            found = class_of_call(m, made) if made is not None else None
            if found is None or not found[2]:
                continue  # an object of no project class (the script's own are migrated with it)
            hm, hcls, where = found
            method = hm.methods(hcls).get(meth)
            if method is None:
                continue
            write = next((w.call for w in writers(hm) if w.kind in _SAVES and hm.contains(method, w.call)
                          and not rank_guarded(hm, w.call)), None)
            if write is not None and all(h is not hm for h, _, _ in out):
                out.append((hm, write, where))
    return out


def _method_on_self_attribute(node: ast.AST) -> Optional[Tuple[str, str]]:
    """``self.attr.meth(...)``: ``(attr, meth)``."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return None
    owner = node.func.value
    if isinstance(owner, ast.Attribute) and isinstance(owner.value, ast.Name) and owner.value.id == "self":
        return owner.attr, node.func.attr
    return None


def _made_by(m: SemanticModel, e: Optional[ast.AST]) -> Optional[ast.Call]:
    """The construction an argument is: the call itself, or the one call a name is bound to."""
    if isinstance(e, ast.Call):
        return e
    if isinstance(e, ast.Name):
        _, bindings = m.lookup(e.id, m.scope_of(e))
        if len(bindings) == 1 and bindings[0].kind == "assign" and isinstance(bindings[0].value, ast.Call):
            return bindings[0].value
    return None
