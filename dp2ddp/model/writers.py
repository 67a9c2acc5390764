"""What a script writes: checkpoints, files, logs, progress bars, printed lines.

Under DDP every rank runs the script, so each of these happens once per rank unless
something says otherwise. :func:`writers` lists them with their kind:

``save``       ``torch.save(obj, path)`` and other writes of a whole file by name
               (``np.save``, ``plt.savefig``, ``save_image``, a pandas frame's ``to_csv`` ...)
``copy``       ``shutil.copyfile`` and friends
``mkdir``      ``os.mkdir``/``os.makedirs``/``Path.mkdir`` (``idempotent`` when ``exist_ok``)
``open``       ``open(path, "w"|"a"|"x"...)``: a file opened for writing
``tensorboard`` a ``SummaryWriter`` (torch.utils.tensorboard, tensorboardX), tensorboard_logger's ``Logger``
``wandb``      ``wandb.init``
``tqdm``       a tqdm progress bar (``disable=`` given or not)
``logfile``    ``logging.FileHandler(...)``, ``logging.basicConfig(filename=...)``
``logconfig``  ``logging.config.dictConfig(...)``/``fileConfig(...)`` (file handlers in a config)
``print``      ``print(...)``

:func:`companion_folder_races` looks one step into the project's own modules: a call
of a class or function beside the script that creates a folder without ``exist_ok``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Iterator, List, Optional, Set, Tuple

from dp2ddp.model.call_args import COPY_PARAMS, OPEN_PARAMS, SAVE_PARAMS, SUMMARY_WRITER_PARAMS, TO_CSV_PARAMS, argument
from dp2ddp.model.cache_writes import writes_when_missing
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.dead_code import never_runs
from dp2ddp.model.handed_saves import handed_object_saves
from dp2ddp.model.names import (
    COPY,
    FILE_WRITES,
    LOGGING_BASIC,
    LOGGING_FILE,
    MKDIR,
    OPEN,
    PRINT,
    SAVE,
    SUMMARY_WRITERS,
    TQDM,
    WANDB_INIT,
)
from dp2ddp.model.output_objects import MUTATING, changed_params, every_rank_runs, keeps_to_itself, output_only_call, trains_in
from dp2ddp.model.project_defs import class_of_call, project_calls, reach_across
from dp2ddp.model.syntax import kwarg

WRITE_MODES = ("w", "a", "x", "+")
LOGGING_CONFIG = frozenset({"logging.config.dictConfig", "logging.config.fileConfig"})
# pandas' writers of a frame to a file: methods of a value, so told by name
FRAME_WRITES = frozenset({"to_csv", "to_json", "to_pickle", "to_parquet", "to_excel", "to_hdf", "to_feather",
                          "to_json_file"})  # (a transformers config's to_json_file(path), as SpanBERT saves it)
# transformers' (and its older names') writers of a model, tokenizer or config to a folder
PRETRAINED_SAVES = frozenset({"save_pretrained", "save_vocabulary"})


@dataclass
class Writer:
    kind: str
    call: ast.Call
    path: Optional[ast.AST] = None  # the file or folder written, when it can be told
    idempotent: bool = False  # mkdir with exist_ok=True


def open_mode(call: ast.Call, position: int = 1) -> Optional[str]:
    """The mode of ``open(path, mode)`` (``position=0`` for ``path.open(mode)``): ``"r"``
    when absent, ``None`` when it is not a literal."""
    mode = argument(call, OPEN_PARAMS[1 - position:], "mode")
    if mode is None:
        return "r"
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
        return mode.value
    return None  # unknown


def _path_mkdir(m: SemanticModel, call: ast.Call) -> bool:
    """``Path(...).mkdir(...)``, ``self.save_dir.mkdir(...)``: a method of a path object, not
    ``os.mkdir`` nor the ``mkdir`` function of an imported module."""
    f = call.func
    if not (isinstance(f, ast.Attribute) and f.attr == "mkdir") or m.is_name(f, MKDIR):
        return False
    root = f.value
    while isinstance(root, ast.Attribute):
        root = root.value
    return not (isinstance(root, ast.Name) and any(b.kind == "import" for b in m.bindings_of(root)) and isinstance(f.value, (ast.Name, ast.Attribute)))


def writers(m: SemanticModel) -> List[Writer]:
    got = m.cache.get("writers")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[Writer] = []
    for call in m.nodes(ast.Call):
        if never_runs(m, call):
            continue  # under ``if create_subset:`` with ``create_subset = False``: writes nothing
        q = m.qualified_names(call.func)
        if not q and isinstance(call.func, ast.Attribute) and call.func.attr == "SummaryWriter":
            # __import__(module, fromlist=['SummaryWriter']).SummaryWriter(log_dir) (pytorch-template)
            out.append(Writer("tensorboard", call, argument(call, SUMMARY_WRITER_PARAMS, "log_dir")))
            continue
        if isinstance(call.func, ast.Attribute) and call.func.attr in FRAME_WRITES and not q & (SAVE | FILE_WRITES):
            # ``data_frame.to_csv(path)``: a pandas frame written to a file by name
            out.append(Writer("save", call, argument(call, TO_CSV_PARAMS, "path_or_buf")))
            continue
        if isinstance(call.func, ast.Attribute) and call.func.attr in PRETRAINED_SAVES and not q & (SAVE | FILE_WRITES):
            # ``model_to_save.save_pretrained(args.output_dir)``: a transformers model, tokenizer
            # or config writes its files into the folder it is given
            out.append(Writer("save", call, call.args[0] if call.args else None))
            continue
        if q & LOGGING_CONFIG:
            out.append(Writer("logconfig", call))
            continue
        if not q or (isinstance(call.func, ast.Attribute) and call.func.attr == "mkdir" and not q & MKDIR):
            if _path_mkdir(m, call):
                ok = kwarg(call, "exist_ok")
                idem = (ok is not None and _truthy(ok.value)) or exists_dropped(m, call)
                out.append(Writer("mkdir", call, call.func.value, idempotent=idem))  # type: ignore[attr-defined]
            continue
        first = call.args[0] if call.args else None
        if q & SAVE:
            out.append(Writer("save", call, argument(call, SAVE_PARAMS, "f")))
        elif q & FILE_WRITES:
            out.append(Writer("save", call, first))
        elif q & COPY:
            out.append(Writer("copy", call, argument(call, COPY_PARAMS, "dst")))
        elif q & REMOVES or shell_removal(m, call):
            out.append(Writer("remove", call, first))
        elif q & MKDIR:
            ok = kwarg(call, "exist_ok")
            idem = (ok is not None and _truthy(ok.value)) or exists_dropped(m, call)
            out.append(Writer("mkdir", call, first, idempotent=idem))
        elif q & OPEN:
            mode = open_mode(call)
            if (mode is None or writes_mode(mode)) and not (first is not None and m.is_name(first, {"os.devnull"})):
                out.append(Writer("open", call, first))  # (``open(os.devnull, "w")`` writes nothing)
        elif q & SUMMARY_WRITERS:
            out.append(Writer("tensorboard", call, argument(call, SUMMARY_WRITER_PARAMS, "log_dir")))
        elif q & WANDB_INIT:
            out.append(Writer("wandb", call))
        elif q & TQDM:
            out.append(Writer("tqdm", call))
        elif q & LOGGING_FILE:
            out.append(Writer("logfile", call, first))
        elif q & LOGGING_BASIC:
            fn = kwarg(call, "filename")
            if fn is not None:
                out.append(Writer("logfile", call, fn.value))
        elif q & PRINT:
            out.append(Writer("print", call))
    m.cache["writers"] = out
    return out


def writer_of(m: SemanticModel, call: ast.AST) -> Optional[Writer]:
    """The :class:`Writer` a call is, if it is one."""
    got = m.cache.get("writer_of")
    if got is None:
        got = m.cache["writer_of"] = {id(w.call): w for w in writers(m)}
    return got.get(id(call))  # type: ignore[union-attr]


def writes_mode(mode: Optional[str]) -> bool:
    """An :func:`open_mode` that writes (``w``, ``a``, ``x``, ``+``)."""
    return mode is not None and any(c in mode for c in WRITE_MODES)


_EXISTS_ERRORS = frozenset({"builtins.FileExistsError", "builtins.OSError", "builtins.IOError", "builtins.EnvironmentError",
                            "builtins.Exception", "os.error"})


def exists_dropped(m: SemanticModel, call: ast.Call) -> bool:
    """The mkdir's ``FileExistsError`` is caught and dropped, as idempotent as
    ``exist_ok=True``: in the body of a ``try`` whose handler for it does nothing but
    re-raise other errors (``except OSError as e: if e.errno != errno.EEXIST: raise``,
    ``except FileExistsError: pass``). A handler that does anything else (prints and exits,
    picks another folder) is not dropping it."""
    child: ast.AST = call
    for a in m.ancestors(call):
        if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            return False
        if isinstance(a, ast.Try) and any(child is st for st in a.body):
            for h in a.handlers:
                types = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type] if h.type is not None else []
                if (h.type is None or any(m.qualified_names(t) & _EXISTS_ERRORS for t in types)) and all(
                        _drops_exists(st) for st in h.body):
                    return True
            return False
        child = a
    return False


def _drops_exists(st: ast.stmt) -> bool:
    """A handler's statement that drops a ``FileExistsError``: ``pass``, a docstring-like
    constant, or ``if e.errno != errno.EEXIST: raise`` (re-raising the others)."""
    if isinstance(st, ast.Pass) or (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant)):
        return True
    if isinstance(st, ast.If) and not st.orelse and all(isinstance(b, ast.Raise) for b in st.body):
        t = st.test
        return (isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], (ast.NotEq, ast.IsNot))
                and "EEXIST" in ast.unparse(t))
    return False


def _truthy(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and bool(node.value)


# --------------------------------------------------------------------------- project modules


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


REMOVES = frozenset({"shutil.rmtree", "os.remove", "os.unlink", "os.rmdir", "os.removedirs"})
SHELL_RUNS = frozenset({"os.system", "subprocess.run", "subprocess.call", "subprocess.check_call", "subprocess.Popen"})


def shell_removal(m: SemanticModel, call: ast.Call) -> bool:
    """``os.system("rm -r %s" % folder)``, ``subprocess.call(f"rm -rf {d}", shell=True)``:
    another program that deletes files, told by the command's literal start."""
    if not call.args or not m.is_name(call.func, SHELL_RUNS):
        return False
    cmd = call.args[0]
    if isinstance(cmd, ast.BinOp):  # "rm -r %s" % path, "rm -r " + path
        cmd = cmd.left
    elif isinstance(cmd, ast.Call) and isinstance(cmd.func, ast.Attribute) and cmd.func.attr == "format":
        cmd = cmd.func.value
    elif isinstance(cmd, ast.JoinedStr):
        cmd = cmd.values[0] if cmd.values else cmd
    elif isinstance(cmd, (ast.List, ast.Tuple)) and cmd.elts:  # ["rm", "-rf", path]
        cmd = cmd.elts[0]
        return isinstance(cmd, ast.Constant) and cmd.value == "rm"
    return isinstance(cmd, ast.Constant) and isinstance(cmd.value, str) and cmd.value.lstrip().startswith("rm ")


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
            where = next((f"{path}:{line}" for mod, f, path in reached for line in [_writes_in(mod, f)] if line is not None), None)
            deeper = where is not None
        if where is None:
            continue
        owner = pm.parent(func)
        name = f"{owner.name}.{func.name}" if isinstance(owner, ast.ClassDef) else func.name  # type: ignore[attr-defined]
        gone = removes_in(pm, func)
        # only output: a function that only writes, its writes its own; or a method of an object
        # the script keeps for output (:mod:`dp2ddp.model.output_objects`), its writes further down too
        only = trains is None and ((writes_only(pm, func) and not deeper) or output_only_call(m, call, pm, func))
        out.append(CompanionRace(call, name, where, f"{rel}:{gone}" if gone else None, only, module=pm.path, trains=trains,
                                 deeper=deeper, torch_saves=_torch_saves_only(reached),
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


def _class_family(m: SemanticModel, cm: SemanticModel, cls: ast.ClassDef, where: str, depth: int = 0):
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
            out += _class_family(m, cm, local, where, depth + 1)
            continue
        found = project_def(cm, b)
        if found is not None and isinstance(found[1], ast.ClassDef):
            rel = os.path.normpath(os.path.join(os.path.dirname(where), found[2])) if where else found[2]
            out += _class_family(m, found[0], found[1], rel, depth + 1)
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
        family = _class_family(m, *found)
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


@dataclass
class LoggerMaker:
    """``logger = utils.get_logger(path)``: a project function that gives a named logger a
    file handler and returns the logger. Run on every rank, each would append the same
    lines to the one file (and print them)."""

    stmt: ast.Assign  # the script's statement
    name: str  # the name it binds
    where: str  # ``utils.py:49``: the file handler


def logging_setups(m: SemanticModel) -> List[Tuple[ast.Call, str]]:
    """Calls, as statements, of a project function that configures logging to a file
    (``create_logging(logs_dir, filemode='w')``: ``logging.basicConfig(filename=...)`` or a
    ``FileHandler``, in a folder it makes, under a name it picks from what the folder holds)
    and writes nothing else, trains nothing, reaches no collective. On every rank they would
    pick the same file and write it at once; the script's own ``logging.basicConfig`` runs
    on rank 0, and so do these. ``(call, "path:line")`` of the log file."""
    got = m.cache.get("logging_setups")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[Tuple[ast.Call, str]] = []
    for call, (pm, func, rel) in project_calls(m):
        stmt = m.parent(call)
        if isinstance(func, ast.ClassDef) or not (isinstance(stmt, ast.Expr) and stmt.value is call):
            continue
        where = None
        for mod, f, path in reach_across(pm, func, rel):
            if every_rank_runs(mod, f):
                where = None
                break
            kinds = [w for w in writers(mod) if mod.contains(f, w.call) and w.kind not in ("print", "tqdm")]
            if any(w.kind not in ("logconfig", "logfile", "mkdir") for w in kinds):
                where = None
                break
            log = next((w for w in kinds if w.kind in ("logconfig", "logfile")), None)
            if log is not None and where is None:
                where = f"{path}:{log.call.lineno}"
        if where is not None:
            out.append((call, where))
    m.cache["logging_setups"] = out
    return out


def logger_makers(m: SemanticModel) -> List[LoggerMaker]:
    got = m.cache.get("logger_makers")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[LoggerMaker] = []
    for call, (pm, func, rel) in project_calls(m):
        stmt = m.parent(call)
        if (isinstance(func, ast.ClassDef) or not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1
                or not isinstance(stmt.targets[0], ast.Name)):
            continue
        handler = next((w for w in writers(pm) if w.kind == "logfile" and pm.contains(func, w.call)
                        and pm.is_name(w.call.func, LOGGING_FILE)), None)
        if handler is not None and _returns_a_logger(pm, func):
            out.append(LoggerMaker(stmt, stmt.targets[0].id, f"{rel}:{handler.call.lineno}"))
    m.cache["logger_makers"] = out
    return out


def _returns_a_logger(pm: SemanticModel, func: ast.AST) -> bool:
    """Every ``return`` of ``func`` gives a name bound only to ``logging.getLogger(...)``."""
    from dp2ddp.model.syntax import FUNCTIONS

    returns = [r for r in ast.walk(func) if isinstance(r, ast.Return) and pm.enclosing_function(r) is func]
    if not isinstance(func, FUNCTIONS) or not returns:
        return False
    for r in returns:
        if not isinstance(r.value, ast.Name):
            return False
        bindings = pm.bindings_of(r.value)
        if not bindings or not all(b.kind == "assign" and isinstance(b.value, ast.Call)
                                   and pm.is_name(b.value.func, {"logging.getLogger"}) for b in bindings):
            return False
    return True


# what a console helper may call: output to the terminal, clocks, arithmetic and strings
_CONSOLE_SAFE = frozenset({
    "builtins.print", "builtins.int", "builtins.float", "builtins.str", "builtins.len", "builtins.range",
    "builtins.round", "builtins.abs", "builtins.min", "builtins.max", "builtins.divmod", "builtins.format",
    "builtins.isinstance", "builtins.sum", "sys.stdout.write", "sys.stdout.flush", "sys.stderr.write",
    "sys.stderr.flush", "time.time", "time.perf_counter", "time.monotonic", "time.strftime", "time.localtime",
    "math.floor", "math.ceil",
})
_CONSOLE_OUT = frozenset({"builtins.print", "sys.stdout.write", "sys.stderr.write"})
# methods of the strings and lists such a helper builds
_STRING_METHODS = frozenset({"append", "join", "format", "strip", "ljust", "rjust", "center", "split", "replace",
                             "extend", "upper", "lower", "zfill"})


def console_helper(m: SemanticModel, call: ast.Call) -> Optional[str]:
    """``progress_bar(batch_idx, len(loader), msg)`` (kuangliu's utils): a call of a function
    of this module or the project that only writes to the terminal: everything it runs (in
    its module and the project modules it calls) is a print, ``sys.stdout.write``/``flush``,
    a clock, arithmetic or string building, and it returns no value. Its name, or ``None``.
    Under DDP every rank would draw it; like a print it runs on rank 0 (the display state it
    keeps in module globals is its own)."""
    from dp2ddp.model.project_defs import project_def

    found = project_def(m, call.func) if isinstance(call.func, (ast.Name, ast.Attribute)) else None
    if found is not None:
        pm, func, rel = found
    else:
        func = m.resolve_call(call)
        pm, rel = m, m.path
    if not isinstance(func, ast.FunctionDef) or any(
            isinstance(n, ast.Return) and n.value is not None or isinstance(n, (ast.Yield, ast.YieldFrom))
            for n in ast.walk(func)):
        return None
    reached = reach_across(pm, func, rel)
    if not reached:
        return None
    defs = {(id(mod), id(f)) for mod, f, _ in reached}
    out = False
    for mod, f, _ in reached:
        for n in ast.walk(f):
            if not isinstance(n, ast.Call):
                continue
            names = mod.qualified_names(n.func)
            if names and names <= _CONSOLE_SAFE:
                out = out or bool(names & _CONSOLE_OUT)
                continue
            target = mod.resolve_call(n)
            if target is not None and (id(mod), id(target)) in defs:
                continue
            there = project_def(mod, n.func) if isinstance(n.func, (ast.Name, ast.Attribute)) else None
            if there is not None and any(there[0].path == md.path and there[1] is fd for md, fd, _ in reached):
                continue
            if isinstance(n.func, ast.Attribute) and n.func.attr in _STRING_METHODS and all("<locals>" in q for q in names):
                continue  # ``L.append(...)``, ``''.join(L)`` on what it builds
            return None
    return func.name if out else None

