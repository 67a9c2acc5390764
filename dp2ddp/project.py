"""A project, not a file: the script that runs and the project modules that hold its
DataParallel wraps, migrated as one plan (``dp2ddp rewrite train.py --with-helpers``).

* :func:`project_modules`: the modules of the project a script imports (beside it, or up
  to three folders above for absolute names, or in a folder a module beside it puts on
  ``sys.path``, as :func:`dp2ddp.model.module_files.module_file`
  finds them), transitively, each read once.
* :func:`helpers_with_dp`: those that use DataParallel, with the call of the script that
  reaches them — a script without DataParallel of its own is then not "nothing to
  migrate" but a project to migrate (DDP151).
* :func:`dp2ddp.migrate.migrate_project` plans them: the entry script in the ``entry`` role
  (process group, loaders, writers, checkpoints; the wrappers its helpers return are
  followed) and every helper in the ``helper`` role (the wrap, ``.module`` uses; no process
  group: the entry sets it up). One result per file; any refusal blocks all of them.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

from dp2ddp.model.module_files import module_file

_DEPTH = 3
_NOT_PROJECT = frozenset({"torch", "torchvision", "numpy", "os", "sys", "math", "time", "json", "argparse", "random",
                          "logging", "shutil", "pathlib", "collections", "typing", "tqdm", "PIL", "scipy", "sklearn",
                          "pandas", "matplotlib", "yaml", "transformers", "timm", "apex", "tensorboardX", "wandb"})


def _imported_modules(tree: ast.Module) -> List[Tuple[str, int]]:
    """``(module name, level)`` of every import in the module (functions included)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((a.name, 0) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level or base.split(".")[0] not in _NOT_PROJECT:
                out.append((base, node.level))
                # `from pkg import sub`: sub may be a module of the package
                out.extend((f"{base}.{a.name}" if base else a.name, node.level) for a in node.names if a.name != "*")
    return [(name, level) for name, level in out if level or name.split(".")[0] not in _NOT_PROJECT]


def project_modules(path: str, tree: Optional[ast.Module] = None, depth_limit: int = _DEPTH) -> Dict[str, Tuple[str, int]]:
    """Project module files reachable by imports from ``path``, up to ``depth_limit`` imports
    away: real path -> (path relative to ``path``'s folder, depth)."""
    base = os.path.dirname(os.path.abspath(path))
    me = os.path.realpath(path)
    out: Dict[str, Tuple[str, int]] = {}
    todo: List[Tuple[str, Optional[ast.Module], int]] = [(os.path.abspath(path), tree, 0)]
    while todo:
        file, t, depth = todo.pop()
        if depth >= depth_limit:
            continue
        if t is None:
            t = _parse(file)
            if t is None:
                continue
        here = os.path.dirname(file)
        for name, level in _imported_modules(t):
            found = module_file(here, name, level) or (module_file(base, name, level) if here != base else None)
            if found is None:
                continue
            real = os.path.realpath(found)
            if real == me or real in out:
                continue
            out[real] = (os.path.relpath(found, base), depth + 1)
            todo.append((found, None, depth + 1))
    return out


def reached_modules(path: str, tree: Optional[ast.Module] = None) -> Set[str]:
    """The real paths of the project module at ``path`` and of those it imports
    (:func:`project_modules`): where running it may lead."""
    return {os.path.realpath(path)} | set(project_modules(path, tree))


def importers_of(entry: str, modules: set) -> Dict[str, List[Tuple[str, int]]]:
    """The other scripts beside ``entry`` (its folder, not below) that import one of
    ``modules`` (real paths) directly: module -> [(script path, line of the import)]."""
    folder = os.path.dirname(os.path.abspath(entry))
    me = os.path.realpath(entry)
    # the entry's own modules (its trainer) run with it: not other scripts, unless they run alone
    # too (a main guard: `from test import evaluate` of a test.py that is also a script)
    run = {real for real in project_modules(entry) if not _has_main_guard(real)}
    out: Dict[str, List[Tuple[str, int]]] = {}
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return out
    for name in names:
        path = os.path.join(folder, name)
        if not name.endswith(".py") or os.path.realpath(path) in {me} | modules | run:
            continue
        tree = _parse(path)
        if tree is None:
            continue
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for mod, level in _imported_modules(ast.Module(body=[node], type_ignores=[])):
                found = module_file(folder, mod, level)
                real = os.path.realpath(found) if found else None
                if real in modules and path not in [p for p, _ in out.get(real, [])]:
                    out.setdefault(real, []).append((path, node.lineno))
    return out


def _has_main_guard(path: str) -> bool:
    from dp2ddp.model.project_defs import file_model

    pm = file_model(path)
    return pm is not None and pm.main_guard is not None


def wraps_without_a_device_count(path: str) -> bool:
    """A DataParallel wrap of the module at ``path`` runs without a count of the devices
    around it (unconditional, on both branches of ``if cuda:``, under a flag or a CUDA
    test): there, a process with one GPU or none got a wrapper from it too."""
    from dp2ddp.model.cuda_only import one_gpu_ran_bare
    from dp2ddp.model.project_defs import file_model
    from dp2ddp.model.wraps import dp_wraps

    pm = file_model(path)
    if pm is None:
        return False
    return any(not one_gpu_ran_bare(pm, [c.test for c in w.conditions]) for w in dp_wraps(pm))


# libraries that train a model handed to them without a backward pass in the user's code
_TRAINING_LIBRARIES = frozenset({"pytorch_lightning", "lightning", "ignite", "fastai", "accelerate", "deepspeed", "skorch",
                                 "catalyst", "poutyne", "torchbearer", "mmcv", "mmengine", "detectron2", "composer"})
# libraries known to train nothing they are given: data, input and output, logging, configuration
_TRAIN_NOTHING = _NOT_PROJECT | frozenset({
    "h5py", "cv2", "skimage", "imageio", "nibabel", "SimpleITK", "tensorboard", "torchaudio", "torchtext", "seaborn",
    "einops", "tokenizers", "sentencepiece", "nltk", "librosa", "soundfile", "albumentations", "pycocotools", "termcolor",
    "easydict", "omegaconf", "hydra", "munch", "addict", "ml_collections", "tabulate", "requests", "packaging", "visdom",
    "lmdb", "toml", "tomli", "prettytable", "colorama", "importlib", "glob", "re", "copy", "datetime", "shutil",
    "functools", "itertools", "warnings", "pickle", "csv", "io", "enum", "dataclasses", "abc", "concurrent", "subprocess",
    "multiprocessing", "threading", "queue", "heapq", "bisect", "string", "struct", "zipfile", "tarfile", "gzip",
    "hashlib", "uuid", "platform", "socket", "signal", "traceback", "inspect", "types", "contextlib", "operator",
    "numbers", "statistics", "fractions", "decimal", "textwrap", "pprint", "getpass", "tempfile", "fnmatch", "errno",
    "__future__", "builtins", "ast", "codecs", "locale", "gc", "weakref", "atexit", "unittest", "urllib", "http",
    "argparse", "configparser", "distutils", "setuptools", "pkg_resources", "importlib_metadata", "typing_extensions"})
_FOLLOWED = 64  # imports followed from a module at most (a whole project, not a chain of three)


def trains_nowhere(path: str, model=None) -> bool:
    """Nothing the module at ``path`` (its model, where the caller has one) can run trains a
    model: no backward pass in it or in any project module it reaches by imports (all of
    them, however deep: :func:`dp2ddp.model.steps.backward_calls`), and every import of
    theirs is a project module or a library known to train nothing it is given. False where
    that cannot be shown (a module that does not parse or is not found, a library dp2ddp
    does not know, Lightning or another library that trains what it is given)."""
    from dp2ddp.model.project_defs import file_model
    from dp2ddp.model.steps import backward_calls

    reached = project_modules(path, model.tree if model is not None else None, depth_limit=_FOLLOWED)
    if any(depth >= _FOLLOWED for _, depth in reached.values()):
        return False
    base = os.path.dirname(os.path.abspath(path))
    for file, pm in [(os.path.abspath(path), model)] + [(real, None) for real in reached]:
        pm = pm if pm is not None else file_model(file)
        if pm is None or backward_calls(pm) or not imports_train_nothing(file, pm.tree, base):
            return False
    return True


def imports_train_nothing(file: str, tree: ast.Module, base: Optional[str] = None) -> bool:
    """Every import of the module is a project module (found from its folder or ``base``)
    or a library known to train nothing it is given: no Lightning, no library dp2ddp does
    not know."""
    here = os.path.dirname(os.path.abspath(file))
    base = base or here
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported = [(a.name, 0) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] == "transformers" and any(a.name.endswith("Trainer") for a in node.names):
                return False
            imported = [(node.module or "", node.level)]
        else:
            continue
        for name, level in imported:
            if not level and name.split(".")[0] in _TRAIN_NOTHING:
                continue
            if module_file(here, name, level) is None and (level or module_file(base, name) is None):
                return False  # a training library, or code dp2ddp cannot read
    return True


def _parse(file: str) -> Optional[ast.Module]:
    try:
        with open(file, "rb") as fh:
            data = fh.read()
        from dp2ddp.model.positions import decode

        return ast.parse(decode(data), filename=file)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError, LookupError):
        return None


def uses_dp(file: str) -> bool:
    """The project module may wrap a model in DataParallel: it names DataParallel, and not
    only as the synchronized-BatchNorm package does (:func:`dp2ddp.model.sync_bn.dp_library`:
    its classes and patchers are understood where they are called)."""
    from dp2ddp.model.names import may_use_dp
    from dp2ddp.model.project_defs import file_model
    from dp2ddp.model.sync_bn import dp_library

    try:
        with open(file, "rb") as fh:
            if not may_use_dp(fh.read()):
                return False
    except OSError:
        return False
    pm = file_model(file)
    if pm is None:
        return True  # unparsable: the helper's own migration says so
    from dp2ddp.model.wraps import uses_dataparallel

    # named in code, not only in a docstring or comment; and not only as the sync-BN package;
    # and not only in its own ``if __name__ == "__main__":`` block, which an import never runs
    # (pytorch-semseg's icnet.py converts weights there)
    return uses_dataparallel(pm) and not dp_library(pm) and not _only_in_main_block(pm)


def _only_in_main_block(pm) -> bool:
    from dp2ddp.model.wraps import dp_nodes

    guard = pm.main_guard
    nodes = dp_nodes(pm)
    return guard is not None and bool(nodes) and all(pm.contains(guard, n) for n in nodes)


def only_checks_dp(file: str) -> bool:
    """The project module names DataParallel only to test for it (``isinstance(model,
    torch.nn.DataParallel)``, an import): it calls no DataParallel, ``data_parallel``, class
    of its own derived from one or the sync-BN package's DataParallelWithCallback, so it
    wraps nothing. KAIR's ``utils_model.py``."""
    from dp2ddp.model.names import DP, DP_FUNCTIONAL
    from dp2ddp.model.project_defs import file_model

    pm = file_model(file)
    if pm is None:
        return False
    for node in pm.nodes(ast.ClassDef):
        if any("DataParallel" in pm.source(b) for b in node.bases):
            return False
    from dp2ddp.model.sync_bn import callback_class

    for call in pm.nodes(ast.Call):
        if pm.is_name(call.func, DP | DP_FUNCTIONAL) or pm.source(call.func).endswith("DataParallel"):
            return False
        if callback_class(pm, call) is not None and not _rewraps_a_dataparallel(pm, call):
            return False  # SPADE's trainer: DataParallelWithCallback(model) of the vendored sync-BN package
    return True


def _rewraps_a_dataparallel(pm, call: ast.Call) -> bool:
    """``call`` runs only under ``if isinstance(module, DataParallel):`` (the sync-BN package's
    ``convert_model``: a DataParallel it is handed comes back as a DataParallelWithCallback):
    it wraps what was wrapped already, and nothing that a migrated script hands it."""
    from dp2ddp.model.call_args import argument
    from dp2ddp.model.names import DP

    for a in pm.ancestors(call):
        if not (isinstance(a, ast.If) and any(pm.contains(st, call) for st in a.body)):
            continue
        t = a.test
        if not (isinstance(t, ast.Call) and pm.is_name(t.func, {"builtins.isinstance"})):
            continue
        kind = argument(t, ("obj", "class_or_tuple"), "class_or_tuple")
        if kind is not None and pm.qualified_names(kind) & DP:
            return True
    return False


def helper_dp_message(m, call: ast.Call, rel: str, line: int, tested: Optional[int] = None) -> str:
    """DDP151's line for a script whose call reaches DataParallel in a project module
    (:func:`helpers_with_dp`'s ``call``, ``rel``, ``line``); ``tested``: the line where the
    script tests for DataParallel itself."""
    also = f", and this script tests for it (line {tested})" if tested is not None else ""
    what = (f"{m.source(call.func)}()" if isinstance(call, ast.Call)
            else f"`{m.source(call)}[...]`, a table of the project looked up by key," if isinstance(m.parent(call), ast.Subscript)
            else f"`{m.source(call)}`, handed on as a value,")
    return (f"{what} reaches DataParallel in the project module {rel}:{line}{also}: migrate the "
            f"script and its helpers together with `dp2ddp rewrite {os.path.basename(m.path)} --with-helpers`")


def helpers_with_dp(m) -> List[Tuple[ast.AST, str, int]]:
    """``(call in the script, helper path relative to it, line of its first DataParallel)``
    for the project modules with DataParallel that the script's calls reach: a function
    the call runs (in its module, or up to three project modules further) names
    DataParallel, or a class the script makes does (its methods are called later), or a
    module the call's module imports may run its DataParallel by a path no call graph
    follows (:func:`_reached_by_import_or_dispatch`)."""
    if m.path in ("<string>", "<stdin>", "-"):
        return []
    mods = project_modules(m.path, m.tree)
    dp_files = [real for real in mods if uses_dp(real) and not only_checks_dp(real)]
    if not dp_files:
        return []
    from dp2ddp.model.project_defs import project_calls

    base = os.path.dirname(os.path.abspath(m.path))
    opaque = {real: _reached_by_import_or_dispatch(real) for real in dp_files}
    out = []
    for call, (pm, node, rel) in project_calls(m):
        reach = reached_modules(pm.path, pm.tree)
        if not any(real in reach for real in dp_files):
            continue
        # what the call runs (a class: all of it, its methods are called later) holds a
        # DataParallel; a module that only has one elsewhere (``misc.make_empty_object()``
        # beside ``misc.wrap(model)``) is not reached by it
        hit = _dp_run_by(pm, node, rel)
        if hit is None and not any(opaque[real] for real in dp_files if real in reach):
            continue
        real = os.path.realpath(hit.path) if hit is not None else next(r for r in dp_files if r in reach)
        out.append(_dp_hit(call, real, mods, base))
    if not out:
        out = _handed_on_with_dp(m, dp_files, mods, base) or _looked_up_by_name(m, dp_files, mods, base)
    out.sort(key=lambda t: (t[0].lineno, t[0].col_offset))
    return out


def _dp_run_by(pm, node: ast.AST, rel: str):
    """The model of the module whose DataParallel what ``node`` (a function of the project
    module ``pm``, with what it calls; or a class: all of it, its methods are called later)
    runs names, or ``None``."""
    from dp2ddp.model.project_defs import reach_across
    from dp2ddp.model.wraps import dp_nodes

    from dp2ddp.model.syntax import FUNCTIONS

    starts = [f for f in node.body if isinstance(f, FUNCTIONS)] if isinstance(node, ast.ClassDef) else [node]
    # a class: its own body, and what each of its methods runs in other project modules
    # (adversarial_robustness' ``Trainer.__init__`` calls ``create_model``, which wraps)
    runs = [(pm, node)] if isinstance(node, ast.ClassDef) else []
    runs += [(mod, f) for start in starts for mod, f, _path in reach_across(pm, start, rel)]
    return next((mod for mod, f in runs for n in dp_nodes(mod) if mod.contains(f, n)), None)


def _handed_on_with_dp(m, dp_files, mods, base) -> List[Tuple[ast.AST, str, int]]:
    """A class or function of a project module that names DataParallel, which the script
    hands on as a value instead of calling it by its name (``Exp = Exp_Main`` then
    ``Exp(args)``, a table of trainers): ``(the name, helper path, line)``."""
    from dp2ddp.model.project_defs import project_def

    for name in m.nodes(ast.Name):
        parent = m.parent(name)
        if not isinstance(name.ctx, ast.Load) or (isinstance(parent, ast.Call) and parent.func is name):
            continue
        found = project_def(m, name)
        if found is None:
            table = _table_with_dp(m, name, dp_files, base)  # ``Trainer = train_factory[opt.task]`` (CenterNet)
            if table is not None:
                return [_dp_hit(name, table, mods, base)]
            continue
        pm, node, rel = found
        if os.path.realpath(pm.path) not in dp_files and not isinstance(node, ast.ClassDef):
            continue
        hit = _dp_run_by(pm, node, rel)
        if hit is not None:
            real = os.path.realpath(hit.path)
            return [_dp_hit(name, real, mods, base)]
    return []


def _table_with_dp(m, name: ast.Name, dp_files, base) -> Optional[str]:
    """``name`` is a table a project module defines (``train_factory = {'ctdet':
    CtdetTrainer, ...}``) that the script looks up by key (``train_factory[opt.task]``),
    and that module reaches a module that wraps in DataParallel: the one it reaches first."""
    if not isinstance(m.parent(name), ast.Subscript) or m.parent(name).value is not name:
        return None
    for q in sorted(m.qualified_names(name)):
        if "." not in q:
            continue
        hit = _dp_file_reached(module_file(base, q.rsplit(".", 1)[0], 0), dp_files)
        if hit is not None:
            return hit
    return None


def _dp_file_reached(found: Optional[str], dp_files) -> Optional[str]:
    """The first of ``dp_files`` that the module at ``found`` reaches by its imports."""
    if found is None:
        return None
    reach = reached_modules(found)
    return next((d for d in dp_files if d in reach), None)


def _dp_hit(node: ast.AST, real: str, mods, base: str) -> Tuple[ast.AST, str, int]:
    """:func:`helpers_with_dp`'s row: the script's node, the helper's path from the script's
    folder, the line of its first DataParallel."""
    return node, mods[real][0] if real in mods else os.path.relpath(real, base), _first_dp_line(real)


def _looked_up_by_name(m, dp_files, mods, base) -> List[Tuple[ast.AST, str, int]]:
    """A call of something the script looks up by name in a project module or package it
    imports (``agents.__dict__[args.agent_type].__dict__[args.agent_name](config)``,
    ``getattr(models, args.arch)(...)``, ``vars(trainers)[name]``), where that module or one
    it imports names DataParallel: no call graph says which class runs, so the wrap may be
    reached. ``(the call, helper path, line)`` of the first such call."""
    for call in m.nodes(ast.Call):
        for root in _looked_up_in(call.func):
            names = [q for q in m.qualified_names(root) if "." not in q] if isinstance(root, ast.Name) else []
            for name in names:
                hit = _dp_file_reached(module_file(base, name, 0), dp_files)
                if hit is not None:
                    return [_dp_hit(call, hit, mods, base)]
    return []


def _looked_up_in(func: ast.AST) -> List[ast.AST]:
    """The modules a callee is looked up in by name: ``X`` of ``X.__dict__[...]``,
    ``getattr(X, name)``, ``vars(X)[...]``, at any depth of the callee's chain."""
    out = []
    for n in ast.walk(func):
        if isinstance(n, ast.Attribute) and n.attr == "__dict__":
            out.append(n.value)
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "vars"):
            first = next(iter(n.args), None)  # the object looked in
            if first is not None and not isinstance(first, ast.Call):
                out.append(first)
    return out


def _reached_by_import_or_dispatch(real: str) -> bool:
    """The project module at ``real`` (which names DataParallel) may run its DataParallel by
    a path no call graph follows: it cannot be parsed; it names DataParallel at its top level
    (outside any function or class: importing it runs that); it hands a function that names
    DataParallel on as a value (``NETS = {"resnet": resnet}``, a callback); or it dispatches
    by name or by table (``getattr(...)(...)``, ``BUILDERS[name]()``)."""
    from dp2ddp.model.project_defs import file_model
    from dp2ddp.model.wraps import dp_nodes

    pm = file_model(real)
    if pm is None:
        return True
    outside = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)
    owners = set()
    for n in dp_nodes(pm):
        if not any(isinstance(a, outside) for a in (n, *pm.ancestors(n))):
            return True  # at the module's top level
        top = next((a for a in (n, *pm.ancestors(n)) if pm.parent(a) is pm.tree), None)
        if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            owners.add(top.name)
    for name in pm.nodes(ast.Name):
        if name.id in owners and isinstance(name.ctx, ast.Load):
            parent = pm.parent(name)
            if not (isinstance(parent, ast.Call) and parent.func is name):
                return True  # handed on as a value
    return any(isinstance(c.func, ast.Name) and c.func.id == "getattr" or isinstance(c.func, ast.Subscript) for c in pm.nodes(ast.Call))


def _first_dp_line(file: str) -> int:
    """The line of the module's first DataParallel wrap (a call), else of its first mention
    (an ``isinstance`` test, an import)."""
    from dp2ddp.model.names import DP_BYTES
    from dp2ddp.model.project_defs import file_model
    from dp2ddp.model.wraps import dp_wraps

    pm = file_model(file)
    wraps = dp_wraps(pm) if pm is not None else []
    if wraps:
        return min(w.call.lineno for w in wraps)
    try:
        with open(file, "rb") as fh:
            data = fh.read()
    except OSError:
        return 1
    hit = DP_BYTES.search(data)
    return data.count(b"\n", 0, hit.start()) + 1 if hit else 1


# --------------------------------------------------------------------------- the plan


@dataclass
class FileResult:
    path: str  # as given / found
    rel: str  # relative to the entry's folder
    role: str
    result: object  # dp2ddp.migrate.Result


@dataclass
class ProjectResult:
    entry: str
    files: List[FileResult] = field(default_factory=list)

    @property
    def blocked(self) -> bool:
        return any(f.result.migration.blocked for f in self.files)  # type: ignore[attr-defined]

    @property
    def changed(self) -> List[FileResult]:
        return [f for f in self.files if f.result.changed]  # type: ignore[attr-defined]


def project_root(project: ProjectResult) -> str:
    """The folder that holds the entry script, every helper, and the project modules the
    entry imports (also from a folder it puts on ``sys.path`` itself, ``../utils``), so that
    a copy of it runs as the original does."""
    folders = [os.path.dirname(os.path.abspath(f.path)) for f in project.files]
    folders += [os.path.dirname(real) for real in project_modules(project.entry)]
    return os.path.commonpath(folders)


_SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".mypy_cache", ".pytest_cache", ".tox"}
_BIG = 20 * 1024 * 1024


def copy_project(root: str, dest: str) -> None:
    """Copy the project at ``root`` to ``dest`` (a new or empty folder) so that the migration
    runs there as the original runs in ``root``: every file but version control and caches;
    a file over 20 MB (data, weights) is linked, not copied, and never written through. A
    symbolic link (``data -> /datasets/cifar``, a file linked from another folder) stays a
    link to what it points at: relative where that lies in the project, so the copy's link
    points into the copy; absolute otherwise. A dangling link is left out."""
    import shutil

    if os.path.exists(dest) and os.listdir(dest):
        from dp2ddp.source import InputError

        raise InputError(dest, None, "not empty; -o with --with-helpers needs a new or empty folder")
    real_root = os.path.realpath(root)

    def relink(src: str, at: str) -> None:
        target = os.path.realpath(src)
        if os.path.commonpath([target, real_root]) == real_root:
            rel = os.path.relpath(target, real_root)
            target = os.path.relpath(os.path.join(os.path.abspath(dest), rel), os.path.dirname(os.path.abspath(at)))
        os.symlink(target, at)

    for here, dirs, names in os.walk(root):
        kept = []
        out = os.path.join(dest, os.path.relpath(here, root))
        os.makedirs(out, exist_ok=True)
        for d in sorted(dirs):
            src = os.path.join(here, d)
            if d in _SKIP_DIRS or os.path.realpath(src) == os.path.realpath(dest):
                continue
            if os.path.islink(src):
                if os.path.exists(src):
                    relink(src, os.path.join(out, d))
                continue
            kept.append(d)
        dirs[:] = kept
        for name in names:
            src = os.path.join(here, name)
            if name.endswith(".pyc") or not os.path.isfile(src):
                continue
            if os.path.islink(src):
                relink(src, os.path.join(out, name))
                continue
            if os.path.getsize(src) > _BIG:
                os.symlink(os.path.abspath(src), os.path.join(out, name))
            else:
                shutil.copy2(src, os.path.join(out, name))
