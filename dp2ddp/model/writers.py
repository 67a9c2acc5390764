"""What a script writes: checkpoints, files, logs, progress bars, printed lines.

Under DDP every rank runs the script, so each of these happens once per rank unless
something says otherwise. :func:`writers` lists them with their kind:

``save``       ``torch.save(obj, path)`` and other writes of a whole file by name
               (``np.save``, ``plt.savefig``, ``save_image``, a pandas frame's ``to_csv`` ...)
``copy``       ``shutil.copyfile`` and friends
``remove``     ``shutil.rmtree``, ``os.remove`` and friends, ``rm`` run through a shell
``mkdir``      ``os.mkdir``/``os.makedirs``/``Path.mkdir`` (``idempotent`` when ``exist_ok``)
``open``       ``open(path, "w"|"a"|"x"...)``: a file opened for writing
``tensorboard`` a ``SummaryWriter`` (torch.utils.tensorboard, tensorboardX), tensorboard_logger's ``Logger``
``wandb``      ``wandb.init``
``tqdm``       a tqdm progress bar (``disable=`` given or not)
``logfile``    ``logging.FileHandler(...)``, ``logging.basicConfig(filename=...)``
``logconfig``  ``logging.config.dictConfig(...)``/``fileConfig(...)`` (file handlers in a config)
``print``      ``print(...)``
``h5``         ``h5py.File(path, mode)`` in a mode that may write (not ``"r"``): HDF5 locks it

What the project's own modules write when the script calls them is read from this list
elsewhere: :mod:`dp2ddp.model.companion_writes` (a project call that makes a folder or writes a
file), :mod:`dp2ddp.model.writing_classes` (a project class that writes: a results logger, a
trainer that saves), :mod:`dp2ddp.model.log_helpers` (a project function that sets up logging,
makes a logger or draws on the terminal).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import List, Optional, Tuple

from dp2ddp.model.call_args import COPY_PARAMS, OPEN_PARAMS, SAVE_PARAMS, SUMMARY_WRITER_PARAMS, TO_CSV_PARAMS, argument
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.dead_code import never_runs
from dp2ddp.model.flow import origins
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


def open_modes(m: SemanticModel, call: ast.Call, position: int = 1) -> Optional[Tuple[str, ...]]:
    """Every mode ``open(path, mode)`` may be given: :func:`open_mode`'s literal, or, for a
    mode held in a name or a conditional expression whose every value is a string literal
    (``open_type = 'a' if os.path.exists(log) else 'w'``), those literals; ``None`` when one
    of them cannot be read."""
    mode = open_mode(call, position)
    if mode is not None:
        return (mode,)
    expr = argument(call, OPEN_PARAMS[1 - position:], "mode")
    found = origins(m, expr) if expr is not None else []
    values = [n.value if isinstance(n, ast.Constant) and not p else None for n, p in found]
    if not values or any(not isinstance(v, str) for v in values):
        return None
    return tuple(dict.fromkeys(values))  # type: ignore[arg-type]


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


H5_FILES = frozenset({"h5py.File", "h5py._hl.files.File"})


def _h5_writes(call: ast.Call) -> bool:
    """``h5py.File(name, mode)`` opens to write: ``"r+"``, ``"a"``, ``"w"``, ``"w-"``, ``"x"``
    (``"r"`` and the default read-only; a mode dp2ddp cannot read may write)."""
    mode = argument(call, ("name", "mode"), "mode")
    if mode is None:
        return False
    return not (isinstance(mode, ast.Constant) and mode.value == "r")


def writers(m: SemanticModel) -> List[Writer]:
    got = m.cache.get("writers")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[Writer] = []
    for call in m.nodes(ast.Call):
        if never_runs(m, call):
            continue  # under ``if create_subset:`` with ``create_subset = False``: writes nothing
        q = m.qualified_names(call.func)
        if q & H5_FILES:
            if _h5_writes(call):
                out.append(Writer("h5", call, argument(call, ("name", "mode"), "name")))
            continue
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
            modes = open_modes(m, call)
            if (modes is None or any(writes_mode(x) for x in modes)) and not (first is not None and m.is_name(first, {"os.devnull"})):
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
    constant, ``if e.errno != errno.EEXIST: raise`` (re-raising the others), or its mirror
    ``if e.errno == errno.EEXIST and os.path.isdir(path): pass`` / ``else: raise``
    (the ``mkdir_p`` of many training repositories)."""
    if isinstance(st, ast.Pass) or (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant)):
        return True
    if isinstance(st, ast.If) and not st.orelse and all(isinstance(b, ast.Raise) for b in st.body):
        t = st.test
        return (isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], (ast.NotEq, ast.IsNot))
                and "EEXIST" in ast.unparse(t))
    if (isinstance(st, ast.If) and st.orelse and all(isinstance(b, ast.Pass) for b in st.body)
            and all(isinstance(b, ast.Raise) for b in st.orelse)):
        tests = st.test.values if isinstance(st.test, ast.BoolOp) and isinstance(st.test.op, ast.And) else [st.test]
        return any(isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], (ast.Eq, ast.Is))
                   and "EEXIST" in ast.unparse(t) for t in tests)
    return False


def _truthy(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and bool(node.value)


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


def h5_write_opens(m: SemanticModel) -> List[Tuple[ast.AST, str]]:
    """``h5py.File(path, "r+")`` (a mode that may write) in this module, or in project code a
    call of it runs (a dataset class's ``__init__`` in ``data.py``, three modules deep):
    ``(the call here, "file.py:line")``. HDF5 locks a file opened to write, and a second
    process opening it meanwhile fails (``BlockingIOError: unable to lock file``): on every
    rank at once, the migration would crash at random, whether or not anything is written."""
    from dp2ddp.model.project_defs import project_calls, reach_across

    out: List[Tuple[ast.AST, str]] = [(w.call, f"line {w.call.lineno}") for w in writers(m) if w.kind == "h5"]
    for call, (pm, func, rel) in project_calls(m):
        for mod, f, path in reach_across(pm, func, rel):
            hit = next((w.call for w in writers(mod) if w.kind == "h5" and mod.contains(f, w.call)), None)
            if hit is not None:
                out.append((call, f"{path}:{hit.lineno}"))
                break
    return out
