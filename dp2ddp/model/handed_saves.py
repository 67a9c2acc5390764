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
from typing import List, Tuple

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.stores import constructor_argument
from dp2ddp.model.syntax import self_attribute_method

_SAVES = ("save", "copy", "open")


def handed_object_saves(m: SemanticModel, call: ast.Call, family, writers) -> List[Tuple[SemanticModel, ast.Call, str]]:
    """``call`` makes an object of a project class (``family``: its classes with their
    module models and paths, :func:`dp2ddp.model.writing_classes.class_family`). Per module, the
    first file write with no rank test (``torch.save``, a copy, ``open(path, "w")``, ``save_pretrained``)
    in a method the family calls on a ``self.`` attribute bound to a parameter of
    ``__init__``, where ``call`` hands that parameter an object of a project class made in
    the script: ``(that class's module model, the write, the module's path)``. ``writers``:
    :func:`dp2ddp.model.writers.writers` (passed in: that module reads this one)."""
    from dp2ddp.model.project_defs import class_of_call
    from dp2ddp.model.ranks import rank_guarded
    from dp2ddp.model.steps import binding_values

    out: List[Tuple[SemanticModel, ast.Call, str]] = []
    for cm, cls, _ in family:
        for node in ast.walk(cls):
            target = self_attribute_method(node)
            if target is None:
                continue
            attr, meth = target
            handed = constructor_argument(cm, cls, call, attr)
            if isinstance(handed, ast.Name):  # the one construction a name is bound to
                values = binding_values(m, handed)
                handed = values[0] if values and len(values) == 1 else None
            found = class_of_call(m, handed) if isinstance(handed, ast.Call) else None
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
