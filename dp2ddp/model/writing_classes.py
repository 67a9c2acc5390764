"""Project classes the script makes whose methods write files.

:func:`writing_class`: a plain class that writes (a home-made results logger), made on rank 0
only. :func:`training_class_saves`: a class that trains and also saves with no rank test (a
``Trainer`` whose base, in a project module, saves checkpoints): every rank must run it, so
every rank would write the same file.
"""

from __future__ import annotations

import ast
from typing import List, Optional, Set

from dp2ddp.model.companion_writes import CompanionRace
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.handed_saves import handed_object_saves
from dp2ddp.model.output_objects import trains_in
from dp2ddp.model.project_defs import class_of_call
from dp2ddp.model.writers import writers


def writing_class(m: SemanticModel, call: ast.AST) -> Optional[str]:
    """``call`` constructs a class (the script's or a project module's) whose methods write
    files — a home-made results logger (``Logger(path, title=...)`` with ``set_names``,
    ``append``, ``close``): where it writes (``utils/logger.py:45``), else ``None``. A
    subclass (a Dataset that caches, a Module) is not one, nor a class that trains (a
    Trainer whose methods also save checkpoints: every rank must run it)."""
    found = class_of_call(m, call)
    if found is None:
        return None
    cm, cls, where = found
    if any(isinstance(b, ast.Name) and b.id not in ("object",) or isinstance(b, ast.Attribute) for b in cls.bases):
        return None  # a subclass (a Dataset, a Module) is not a file logger
    if trains_in(cm, cls) is not None:
        return None
    written = None
    for w in writers(cm):
        if w.kind in ("open", "save", "logfile", "tensorboard") and cm.contains(cls, w.call):
            written = written or w.call.lineno
    if written is None:
        return None
    return f"{where or 'this script'}:{written}"


def _self_reads(cm: SemanticModel, cls: ast.ClassDef) -> Set[str]:
    """The ``self.x`` attributes the methods of ``cls`` read."""
    return {n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load)
            and isinstance(n.value, ast.Name) and n.value.id == "self"}


def _leaves_early(family) -> Optional[str]:
    """Where the epoch loop of a training class (a loop of a method of the family that calls
    ``self.m(...)``, ``m`` a method of the family that trains: ``for epoch in ...:
    result = self._train_epoch(epoch)``) leaves early (``break``, ``return``) under a test
    made of anything but constants, the loop's own targets and ``self.`` attributes the loop
    does not assign: early stopping on the epoch's results (``if not_improved_count >
    self.early_stop: break``). Under DDP those results may be each rank's own (the training
    loss of its shard): one rank would leave the loop while the others wait in the next
    epoch's collectives. ``path:line`` of the first such exit, else ``None``."""
    trainers = {f.name for fm, fc, _ in family for f in fc.body
                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and trains_in(fm, f) is not None}
    for fm, fc, p in family:
        for loop in ast.walk(fc):
            if not isinstance(loop, (ast.For, ast.While)):
                continue
            if not any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr in trainers
                       and isinstance(c.func.value, ast.Name) and c.func.value.id == "self" for c in ast.walk(loop)):
                continue
            targets = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)} if isinstance(loop, ast.For) else set()
            stored = {n.attr for n in ast.walk(loop) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)}
            for node in sorted(_exits(loop), key=lambda n: (n.lineno, n.col_offset)):
                tests = [a.test for a in fm.ancestors(node) if isinstance(a, (ast.If, ast.While)) and fm.contains(loop, a) and a is not loop]
                if isinstance(loop, ast.While):
                    tests.append(loop.test)
                if any(not _plain_test(t, targets, stored) for t in tests):
                    return f"{p}:{node.lineno}"
    return None


def _exits(loop: ast.AST):
    """The ``break``s of ``loop`` itself and every ``return`` in it (not in nested functions)."""
    todo = [(c, True) for c in ast.iter_child_nodes(loop)]
    while todo:
        node, own = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, ast.Return) or (isinstance(node, ast.Break) and own):
            yield node
        inner = own and not isinstance(node, (ast.For, ast.While, ast.AsyncFor))
        todo.extend((c, inner) for c in ast.iter_child_nodes(node))


def _plain_test(test: ast.AST, targets: Set[str], stored: Set[str]) -> bool:
    for n in ast.walk(test):
        if isinstance(n, ast.Name) and n.id not in targets and n.id != "self":
            return False
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self" and n.attr in stored:
            return False
        if isinstance(n, (ast.Call, ast.Subscript, ast.NamedExpr)):
            return False
    return True


def class_family(m: SemanticModel, cm: SemanticModel, cls: ast.ClassDef, where: str, depth: int = 0):
    """``cls`` (of module ``cm``, at ``where``) and its bases that are classes of the project,
    followed into the modules they are imported from (``class Trainer(BaseTrainer)`` with
    ``from base import BaseTrainer``): ``(module model, class, path)`` each."""
    import os

    from dp2ddp.model.project_defs import project_def

    out = [(cm, cls, where)]
    if depth > 3:
        return out
    for b in cls.bases:
        if not isinstance(b, (ast.Name, ast.Attribute)):
            continue
        local = next((s for s in cm.tree.body if isinstance(s, ast.ClassDef) and isinstance(b, ast.Name) and s.name == b.id), None)
        if local is not None:
            out += class_family(m, cm, local, where, depth + 1)
            continue
        found = project_def(cm, b)
        if found is not None and isinstance(found[1], ast.ClassDef):
            rel = os.path.normpath(os.path.join(os.path.dirname(where), found[2])) if where else found[2]
            out += class_family(m, found[0], found[1], rel, depth + 1)
    return out


def training_class_saves(m: SemanticModel) -> List[CompanionRace]:
    """Objects of a project class that trains (a ``Trainer`` whose methods, its bases' in
    other modules included, run backward passes) and also saves files (``torch.save`` of a
    checkpoint in ``_save_checkpoint``) with no rank test: every rank must run the training,
    so every rank would write the same file, and the rewrite does not edit that module.
    ``where``: the save; ``trains``: where it trains."""
    from dp2ddp.model.ranks import rank_guarded

    got = m.cache.get("training_class_saves")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[CompanionRace] = []
    for call in m.nodes(ast.Call):
        found = class_of_call(m, call)
        if found is None or not found[2]:
            continue  # not a class of a project module (the script's own are migrated with it)
        family = class_family(m, *found)
        trains = next((f"{p}:{line}" for cm, cls, p in family for line in [trains_in(cm, cls)] if line is not None), None)
        if trains is None:
            continue
        save = next((w for cm, cls, p in family for w in writers(cm)
                     if w.kind in ("save", "copy") and cm.contains(cls, w.call) and not rank_guarded(cm, w.call)), None)
        if save is None:
            # a save of an object it is handed (``Trainer(..., model_checkpoint=ModelCheckpoint(...))``)
            for hm, write, p in handed_object_saves(m, call, family, writers):
                out.append(CompanionRace(call, found[1].name, f"{p}:{write.lineno}", module=hm.path, trains=trains,
                                         leaves_early=_leaves_early(family), handed=True))
            continue
        cm, cls, p = next((cm, cls, p) for cm, cls, p in family if cm.contains(cls, save.call))
        shared = frozenset(a for fm, fc, _ in family if fm.path != cm.path for a in _self_reads(fm, fc))
        out.append(CompanionRace(call, found[1].name, f"{p}:{save.call.lineno}", module=cm.path, trains=trains,
                                 leaves_early=_leaves_early(family), shared_attrs=shared))
    m.cache["training_class_saves"] = out
    return out
