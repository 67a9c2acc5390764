"""Writes in the project's own modules (files beside the script) that a call of the script runs.

The rewrite does not edit those modules, so under DDP every rank runs what they do.
:func:`companion_folder_races` looks one step into the project's own modules: a call
of a class or function beside the script that creates a folder without ``exist_ok``.
:func:`companion_writes`: a call of a project function or method that writes a file. The
folder operations around such writes (``lists_in``, ``removes_in``, ``renames_in``,
``checked_mkdir``) and ``writes_only`` (a function that only produces output) are read by
:mod:`dp2ddp.model.writers_setup` too.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Iterator, List, Optional

from dp2ddp.model.cache_writes import writes_when_missing
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.dead_code import never_runs
from dp2ddp.model.output_objects import MUTATING, changed_params, keeps_to_itself, output_only_call, trains_in
from dp2ddp.model.project_defs import project_calls, reach_across
from dp2ddp.model.writers import REMOVES, writers


@dataclass
class CompanionRace:
    call: ast.Call  # the call in this script
    name: str  # what it calls (``Saver``)
    where: str  # ``utils/saver.py:20``, relative to the script's folder
    deletes: Optional[str] = None  # ``utils/saver.py:18`` where it also removes files or folders
    only_writes: bool = False  # it writes and does nothing else every rank needs (see writes_only)
    lists: Optional[str] = None  # ``utils/saver.py:8`` where it lists a folder (``run_{n}`` from what exists)
    checked: bool = True  # the mkdir runs only when the folder is missing (``if not os.path.exists(d)``)
    module: str = ""  # the path of the project module the call enters (``utils/saver.py``'s)
    trains: Optional[str] = None  # ``engine.py:10``: where it also trains (a loop of backward passes)
    deeper: bool = False  # companion writes: the write is in a function the call reaches, not its own
    written_in: str = ""  # companion writes: the path of the project module that holds the write
    cached: bool = False  # companion writes: it writes only files it finds missing (:mod:`dp2ddp.model.cache_writes`)
    torch_saves: bool = False  # companion writes: its every write is a ``torch.save`` (see torch_saves_only)
    # training classes (:func:`training_class_saves`) only:
    leaves_early: Optional[str] = None  # ``base/base_trainer.py:97``: its epoch loop breaks on a test not shown alike
    shared_attrs: frozenset = frozenset()  # ``self.`` attributes the family's classes in other modules read
    handed: bool = False  # the save is a method's of an object the class is handed (:mod:`dp2ddp.model.handed_saves`)


LISTS = frozenset({"glob.glob", "glob.iglob", "os.listdir", "os.scandir", "os.walk"})


def _live_calls(pm: SemanticModel, func: ast.AST) -> Iterator[ast.Call]:
    """The calls in ``func`` that may run (not under a test false on every run)."""
    return (c for c in ast.walk(func) if isinstance(c, ast.Call) and not never_runs(pm, c))


def lists_in(pm: SemanticModel, func: ast.AST, before: Optional[ast.AST] = None) -> Optional[int]:
    """A folder listed (``glob``, ``listdir``, ``Path.iterdir``): names picked from what
    already exists differ between ranks that run one after the other. With ``before`` (the
    mkdir), only a listing that comes before it, which can name the folder it makes
    (DeepLab's ``experiment_*`` count): a cache that lists its folder for a file after
    making it (``fnmatch.filter(os.listdir(cache_dir), ...)``) names no folder."""
    for call in _live_calls(pm, func):
        if pm.is_name(call.func, LISTS) or (isinstance(call.func, ast.Attribute) and call.func.attr in ("iterdir", "glob", "rglob")):
            if before is not None and (call.lineno, call.col_offset) > (before.lineno, before.col_offset):  # type: ignore[attr-defined]
                continue
            return call.lineno
    return None


def removes_in(pm: SemanticModel, func: ast.AST) -> Optional[int]:
    for call in _live_calls(pm, func):
        if pm.is_name(call.func, REMOVES) or (isinstance(call.func, ast.Attribute) and call.func.attr in ("unlink", "rmdir") and not pm.is_name(call.func, REMOVES)):
            return call.lineno
    return None


RENAMES = frozenset({"os.rename", "os.replace", "shutil.move"})


def renames_in(pm: SemanticModel, func: ast.AST) -> Optional[int]:
    """A file or folder moved away (``mkdir_and_rename``: the old run's folder renamed to an
    archive): a rank that runs it after another moves the other's new folder."""
    for call in _live_calls(pm, func):
        if pm.is_name(call.func, RENAMES):
            return call.lineno
    return None


def _base_is_self(e: ast.AST) -> bool:
    """``self.a[k].b``, ``self.log.setdefault(k, [])``: a value reached from ``self``."""
    while isinstance(e, (ast.Attribute, ast.Subscript, ast.Call)):
        e = e.func if isinstance(e, ast.Call) else e.value
    return isinstance(e, ast.Name) and e.id == "self"


def writes_only(pm: SemanticModel, func: ast.AST) -> bool:
    """``func`` (of a project module) only produces output: it returns nothing, reaches no
    collective and trains nothing (:func:`dp2ddp.model.output_objects.keeps_to_itself`),
    keeps no state on its object (``self.x = ...``, ``self.counter[key] = ...``) and changes
    no argument. Running it on rank 0 alone then changes nothing the other ranks read."""
    if not keeps_to_itself(pm, func):
        return False
    for n in ast.walk(func):
        if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                if isinstance(t, (ast.Attribute, ast.Subscript)) and _base_is_self(t):
                    return False  # self.x = ..., self.counter[key] = ...: state kept for later
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in MUTATING:
            recv = n.func.value
            if isinstance(recv, ast.Attribute) or (isinstance(recv, (ast.Call, ast.Subscript)) and _base_is_self(recv)):
                return False  # self.history.append(...), self.log.setdefault(k, []).append(v): state kept for later
    return not changed_params(pm, func)  # ``ordered_dict[key] = value.item()``: the caller's dict changed


def _trains_where(pm: SemanticModel, func: ast.AST, rel: str) -> Optional[str]:
    line = trains_in(pm, func)
    return f"{rel}:{line}" if line is not None else None


def checked_mkdir(pm: SemanticModel, call: ast.AST, body: ast.AST) -> bool:
    """The mkdir runs only when the folder is missing (under ``if not os.path.exists(d):`` /
    ``isdir``) or its ``FileExistsError`` is caught: a rank that runs it after another is safe."""
    for a in pm.ancestors(call):
        if a is body:
            return False
        if isinstance(a, ast.If) and any(k in pm.source(a.test) for k in ("exists", "isdir", "is_dir")):
            return True
        if isinstance(a, ast.Try) and any(h.type is None or any(k in pm.source(h.type) for k in ("FileExistsError", "OSError"))
                                          for h in a.handlers):
            return True
    return False


def companion_folder_races(m: SemanticModel) -> List[CompanionRace]:
    """Calls of a class or function of a project module (a file beside the script) that
    creates a folder without ``exist_ok`` when it runs (``Saver(args)`` whose ``__init__``
    does ``if not os.path.exists(d): os.makedirs(d)``). The rewrite cannot edit that file;
    under DDP every rank runs it, the ranks race, and one of them raises
    ``FileExistsError``."""
    got = m.cache.get("companion_races")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[CompanionRace] = []
    for call, (pm, node, rel) in project_calls(m):
        # ``ConfigParser.from_args(...)`` -> ``cls(...)`` -> ``__init__``; ``option.parse(...)``
        # -> ``util.mkdir_and_rename(...)`` in another module
        # every folder it makes; the one that races worst speaks for the call
        races = []
        for mod, owner, path in reach_across(pm, node, rel):
            w = next((w for w in writers(mod) if w.kind == "mkdir" and not w.idempotent and mod.contains(owner, w.call)), None)
            if w is not None:
                gone = removes_in(mod, owner) or renames_in(mod, owner)
                listed = lists_in(mod, owner, before=w.call)
                races.append(CompanionRace(call, node.name, f"{path}:{w.call.lineno}", f"{path}:{gone}" if gone else None,
                                           lists=f"{path}:{listed}" if listed else None,
                                           checked=checked_mkdir(mod, w.call, owner), module=pm.path))
        if races:
            out.append(max(races, key=lambda r: (r.deletes is not None, r.lists is not None, not r.checked)))
    m.cache["companion_races"] = out
    return out


def companion_writes(m: SemanticModel) -> List[CompanionRace]:
    """Calls of a project function, or of the method of an object of a project class
    (``self.saver.save_checkpoint(...)`` where ``self.saver = Saver(args)`` and ``Saver`` is a
    class beside the script: :func:`dp2ddp.model.project_defs.project_def`), that writes a file
    (``torch.save``, ``open(path, "w")``, a copy). The rewrite cannot see what else such a call
    does, so it does not guard it: every rank writes."""
    got = m.cache.get("companion_writes")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[CompanionRace] = []
    for call, (pm, func, rel) in project_calls(m):
        if isinstance(func, ast.ClassDef):
            continue
        # what it runs, in its module and up to three project modules further
        reached = reach_across(pm, func, rel)
        trains = next((t for mod, f, path in reached for t in [_trains_where(mod, f, path)] if t is not None), None)
        line = _writes_in(pm, func)
        where = f"{rel}:{line}" if line is not None else None
        deeper = False
        if where is None:
            # a write further down counts too: a call that trains writes what it computes from
            # this rank's own batches (``train()`` in core/function.py -> ``save_debug_images()``
            # in utils/vis.py, an image of the batch per rank, under one name); one that does not
            # writes the same file on every rank at once (``hungarian_evaluate(...,
            # confusion_matrix_file=...)`` -> ``plt.savefig`` in utils/utils.py)
            found = next(((f"{path}:{line}", mod.path) for mod, f, path in reached for line in [_writes_in(mod, f)]
                          if line is not None), None)
            where, written_in = found if found is not None else (None, pm.path)
            deeper = where is not None
        else:
            written_in = pm.path
        if where is None:
            continue
        owner = pm.parent(func)
        name = f"{owner.name}.{func.name}" if isinstance(owner, ast.ClassDef) else func.name  # type: ignore[attr-defined]
        gone = removes_in(pm, func)
        # only output: a function that only writes, its writes its own; or a method of an object
        # the script keeps for output (:mod:`dp2ddp.model.output_objects`), its writes further down too
        only = trains is None and ((writes_only(pm, func) and not deeper) or output_only_call(m, call, pm, func))
        out.append(CompanionRace(call, name, where, f"{rel}:{gone}" if gone else None, only, module=pm.path, trains=trains,
                                 deeper=deeper, written_in=written_in, torch_saves=_torch_saves_only(reached),
                                 cached=not deeper and writes_when_missing(pm, func, writers(pm))))
    m.cache["companion_writes"] = out
    return out


def _torch_saves_only(reached) -> bool:
    """Every file the functions a call runs (``reached``: ``(module model, function, path)``,
    :func:`reach_across`) write they write with ``torch.save``, looked up on the ``torch``
    module when called (``torch.save(model.state_dict(), path)``, not a ``save`` imported by
    name): on the ranks that must not write, that attribute can be made to write nothing
    while the call runs. Nothing else written, no folder made, nothing removed."""
    found = False
    for pm, func, _path in reached:
        for w in writers(pm):
            if not pm.contains(func, w.call) or w.kind in ("print", "tqdm"):
                continue
            f = w.call.func
            if (w.kind == "save" and isinstance(f, ast.Attribute) and f.attr == "save" and isinstance(f.value, ast.Name)
                    and pm.qualified_names(f.value) == {"torch"}):
                found = True
                continue
            return False
    return found


def _writes_in(pm: SemanticModel, func: ast.AST) -> Optional[int]:
    for w in writers(pm):
        if w.kind in ("save", "open", "copy") and pm.contains(func, w.call):
            return w.call.lineno
    return None
