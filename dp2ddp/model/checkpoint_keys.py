"""The ``state_dict`` keys of a checkpoint: ``module.`` or not, and who reads them.

* :func:`key_policy`: the one policy for ``state_dict`` keys (``module.`` or not) that
  ``rewrite`` writes and ``verify`` judges by: as the project's own loaders outside the
  script read them (:func:`project_load_sites`), else as the original wrote them;
* :func:`checkpoint_readers`: the load sites of a script's project, for ``verify``;
* :func:`load_sites`: ``model.load_state_dict(<something torch.load read>)`` in a module,
  with the keys it wants (:class:`LoadSite`).
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field
from typing import List, Optional

from dp2ddp.model.call_args import LOAD_PARAMS, LOAD_STATE_DICT_PARAMS, SAVE_PARAMS, argument
from dp2ddp.model.checkpoints import loaded_values, saves
from dp2ddp.model.collectives import var_key
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.kinds import SAME_MODULE
from dp2ddp.model.names import DDP, DP, LOAD

PLAIN, PREFIXED, EITHER = "plain", "module.", "either"
# a loader that wraps the model it loads into under a test of its own (``if config["n_gpu"] > 1:
# model = DataParallel(model)``, pytorch-template's test.py): it takes what the original wrote
# with the same settings, plain keys on one GPU and ``module.`` ones on several
LIKE_ORIGINAL = "like the original"


@dataclass
class LoadSite:
    """A ``model.load_state_dict(<something torch.load read>)`` outside the script."""

    path: str  # relative to the script's folder
    line: int
    wants: str  # PLAIN (a bare model), PREFIXED (a DataParallel/DDP wrapper), EITHER (strips or adds the prefix), LIKE_ORIGINAL
    files: frozenset = frozenset()  # file names the load's path is built from ("model_best.pth")
    imports: frozenset = frozenset()  # project modules its file imports


_CKPT_EXT = (".pth", ".pt", ".tar", ".ckpt", ".bin", ".pkl", ".pth.tar")


def file_names(m: SemanticModel, expr: ast.AST) -> frozenset:
    """Checkpoint file names a path expression is built from: string constants in it or in
    what its names hold, that end like a checkpoint (``"model_best.pth"``, ``f"{d}/last.pt"``)."""
    from dp2ddp.model.flow import origins

    out = set()
    todo = [expr]
    seen = set()
    while todo:
        e = todo.pop()
        if id(e) in seen or len(seen) > 50:
            continue
        seen.add(id(e))
        for n in ast.walk(e):
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.lower().endswith(_CKPT_EXT):
                out.add(os.path.basename(n.value))
            elif isinstance(n, ast.Name):
                todo.extend(o for o, _ in origins(m, n) if o is not n)
    return frozenset(out)


def _load_path(m: SemanticModel, expr: ast.AST) -> frozenset:
    """File names of the ``torch.load`` calls behind ``expr``."""
    from dp2ddp.model.flow import origins

    out: set = set()
    for n, _ in origins(m, expr):
        if isinstance(n, ast.Call) and m.call_is(n, LOAD):
            path = argument(n, LOAD_PARAMS, "f")
            if path is not None:
                out |= file_names(m, path)
    return frozenset(out)


def _project_imports(m: SemanticModel) -> frozenset:
    from dp2ddp.model.project_defs import project_calls

    return frozenset(rel for _c, (_pm, _d, rel) in project_calls(m))


def saved_file_names(m: SemanticModel) -> frozenset:
    out: set = set()
    for call in saves(m):
        path = argument(call, SAVE_PARAMS, "f")
        if path is not None:
            out |= file_names(m, path)
    return frozenset(out)


def reads_our_files(m: SemanticModel, site: LoadSite) -> bool:
    """A load site outside the script reads the script's checkpoints: their file names
    meet, or, where either side builds its path without a file name, its file imports
    the same project modules as the script (the same model)."""
    ours = saved_file_names(m)
    if ours and site.files:
        return bool(ours & site.files)
    return bool(site.imports & _project_imports(m))


@dataclass
class KeyPolicy:
    """How the migration writes the ``state_dict`` keys of a wrapped model: ``default`` is
    PLAIN (through ``.module``, as one device wrote them) or PREFIXED (``module.``, as a
    DataParallel wrapper wrote them); ``reason`` says why; ``sites`` are the loaders found."""

    default: str
    reason: str
    sites: List[LoadSite] = field(default_factory=list)


_STRIP = ("module.",)


def _strips_prefix(m: SemanticModel, node: ast.AST) -> bool:
    """The function (or module) around a load handles the ``module.`` prefix itself:
    ``k.replace("module.", "")``, ``k[7:]``, ``strict=False``, ``"module." + k``."""
    if handles_prefix(m.enclosing_function(node) or m.tree):
        return True
    if isinstance(node, ast.Call):
        strict = argument(node, LOAD_STATE_DICT_PARAMS, "strict")
        if isinstance(strict, ast.Constant) and strict.value is False:
            return True
    return False


def _from_load(m: SemanticModel, expr: ast.AST) -> bool:
    from dp2ddp.model.flow import origins

    loads = loaded_values(m)
    return any(id(n) in loads for n, _ in origins(m, expr))


def _wrapped_in_file(m: SemanticModel, subject: ast.AST) -> Optional[str]:
    """``subject`` holds a DataParallel/DDP wrapper in its own file: PREFIXED, or
    LIKE_ORIGINAL where every such wrap runs under a test; ``None`` where it holds none."""
    from dp2ddp.model.flow import origins
    from dp2ddp.model.wraps import dp_wraps

    found = []
    for n, _ in origins(m, subject):
        while isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in SAME_MODULE:
            n = n.func.value  # ``nn.DataParallel(model).cuda()``: the wrapper itself
        if isinstance(n, ast.Call) and m.call_is(n, DP | DDP) and not m.runs_before(subject, n):  # a load before the wrap sees the bare model
            found.append(n)
    if not found:
        return None
    guarded = {id(w.call) for w in dp_wraps(m) if w.conditions}
    return LIKE_ORIGINAL if all(id(n) in guarded for n in found) else PREFIXED


_NOT_MODEL_WORDS = ("optim", "sched", "scaler", "ema_state")


def _not_a_model(m: SemanticModel, subject: ast.AST) -> bool:
    """An optimizer, scheduler or grad scaler (their state dicts hold no module keys)."""
    from dp2ddp.model.syntax import terminal
    from dp2ddp.model.flow import origins

    name = (terminal(subject) or "").lower()
    if any(w in name for w in _NOT_MODEL_WORDS):
        return True
    for n, _ in origins(m, subject):
        if isinstance(n, ast.Call) and any(q.startswith(("torch.optim.", "torch.cuda.amp.", "torch.amp.")) for q in m.qualified_names(n.func)):
            return True
    return False


def load_sites(pm: SemanticModel, rel: str) -> List[LoadSite]:
    """The state_dict loads of a module (its ``load_state_dict`` calls fed by ``torch.load``)."""
    out = []
    for call in pm.nodes(ast.Call):
        f = call.func
        if not (isinstance(f, ast.Attribute) and f.attr == "load_state_dict"):
            continue
        state = argument(call, LOAD_STATE_DICT_PARAMS, "state_dict")
        if state is None or not _from_load(pm, state):
            continue
        subject = f.value
        if _not_a_model(pm, subject):
            continue
        if isinstance(subject, ast.Attribute) and subject.attr == "module":
            wants = PLAIN  # loads into the bare module of a wrapper
        elif _strips_prefix(pm, call):
            wants = EITHER
        else:
            wants = _wrapped_in_file(pm, subject) or PLAIN
        out.append(LoadSite(rel, call.lineno, wants, _load_path(pm, state), _project_imports(pm)))
    return out


_MAX_FILES = 200


_NOT_PROJECT_FILES = ("_ddp.py", ".out.py", ".in.py")


_MAX_BYTES = 400_000


def project_load_sites(m: SemanticModel) -> List[LoadSite]:
    """Load sites in the other Python files of the script's folder and of the project
    modules it imports (an evaluation or test script beside it, a ``utils.load_checkpoint``)."""
    got = m.cache.get("checkpoints:project_sites")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[LoadSite] = []
    if m.path not in ("<string>", "<stdin>", "-") and os.path.isfile(m.path):
        base = os.path.dirname(os.path.abspath(m.path))
        me = os.path.realpath(m.path)
        files = []
        try:
            names = sorted(os.listdir(base))
        except OSError:
            names = []
        for name in names:
            p = os.path.join(base, name)
            # not a migration's output (train_ddp.py) nor dp2ddp's own golden files (.in.py/.out.py)
            if name.endswith(_NOT_PROJECT_FILES) or not name.endswith(".py"):
                continue
            if os.path.realpath(p) != me and os.path.isfile(p):
                files.append(p)
        for _call, (pm, _def, rel) in _project_modules_called(m):
            p = os.path.join(base, rel)
            if p not in files:
                files.append(p)
        # read only files that may read our checkpoints: they name one of its files, or
        # (where the script's saves name none) a project module the script imports
        names = saved_file_names(m)
        words = [n.encode() for n in names] if names else [os.path.splitext(os.path.basename(r))[0].encode() for r in _project_imports(m)]
        if words:
            for p in files[:_MAX_FILES]:
                out.extend(_file_load_sites(p, os.path.relpath(p, base), words))
    m.cache["checkpoints:project_sites"] = out
    return out


_SITES: dict = {}  # (real path, mtime, rel) -> load sites: each file read once per run


def _file_load_sites(p: str, rel: str, words: List[bytes]) -> List[LoadSite]:
    from dp2ddp.model.core import build

    try:
        st = os.stat(p)
    except OSError:
        return []
    key = (os.path.realpath(p), st.st_mtime_ns, rel, tuple(words))
    got = _SITES.get(key)
    if got is not None:
        return got
    got = []
    if st.st_size <= _MAX_BYTES:
        try:
            with open(p, "rb") as fh:
                data = fh.read()
            if b"load_state_dict" in data and any(w in data for w in words):
                got = load_sites(build(data, p), rel)
        except (OSError, SyntaxError, ValueError, UnicodeDecodeError, LookupError):
            got = []
    _SITES[key] = got
    return got


def _project_modules_called(m: SemanticModel):
    from dp2ddp.model.project_defs import project_calls

    seen = set()
    for call, found in project_calls(m):
        if found[2] not in seen:
            seen.add(found[2])
            yield call, found


def _own_bare_loads(m: SemanticModel) -> List[LoadSite]:
    """The script's own loads of its checkpoints into a bare model (``net.load_state_dict``
    before the wrap, or into ``.module``): matched by file name only (a load from a path
    without one is as likely pretrained weights)."""
    from dp2ddp.model.collectives import wrapped_vars

    ours = saved_file_names(m)
    if not ours:
        return []
    wrapped = wrapped_vars(m, dp=True)
    out = []
    for site in load_sites(m, os.path.basename(m.path)):
        if not (site.files & ours) or site.wants == PREFIXED:
            continue  # a load into the wrapper: routed with the saves, whatever the keys
        call = next((c for c in m.nodes(ast.Call) if c.lineno == site.line and isinstance(c.func, ast.Attribute)
                     and c.func.attr == "load_state_dict"), None)
        if call is None or var_key(m, call.func.value) in wrapped:  # type: ignore[union-attr]
            continue
        out.append(site)
    return out


def key_policy(m: SemanticModel, guarded: bool, flagged: bool = False, bare: bool = False, cuda: bool = False) -> KeyPolicy:
    """The keys the migration writes for a wrapper whose DataParallel wrap was ``guarded``
    (only with several devices) or not: as the project's own loaders outside the script
    accept them (into a bare model: plain keys; into a wrapper: ``module.``; a loader that
    handles the prefix: either); with none (or loaders that disagree), as the original
    wrote them: ``module.`` where its wrap ran on every GPU machine (unconditional, or
    ``cuda``: under a test that holds with CUDA, ``if device == "cuda":``) or with the user's
    switch on (``flagged``); plain where one GPU ran without a wrapper (``guarded`` by a
    device count) or the original made none at all (``bare``: a functional ``data_parallel``
    call inside the model)."""
    sites = [s for s in project_load_sites(m) if reads_our_files(m, s)] + _own_bare_loads(m)
    # a wrap under a CUDA test ran on every GPU machine: its keys are ``module.`` ones there (an
    # H100 showed the bundled example's migration changing them when this took the CPU run's)
    original = PLAIN if bare or (guarded and not cuda) else PREFIXED
    if not (bare or guarded or cuda or flagged):
        # an unconditional wrap wrote `module.` keys on every run, CPU included: a strict load
        # into a bare model elsewhere never read them (AWP's train_cifar100.py resumes its own
        # model_{epoch}.pth, named like train_cifar10.py's): it reads other files
        sites = [s for s in sites if s.wants != PLAIN]
    wants = {s.wants for s in sites} - {EITHER, LIKE_ORIGINAL}
    if len(wants) == 1:
        want = wants.pop()
        first = next(s for s in sites if s.wants == want)
        where = f"{first.path}:{first.line}"
        what = "into the bare model" if want == PLAIN else "into a wrapped model"
        return KeyPolicy(want, f"{where} loads them {what}", sites)
    if sites and not wants:
        s = sites[0]
        how = "accepts either" if s.wants == EITHER else "wraps the model it loads into under a test of its own, as the original did"
        return KeyPolicy(original, f"as the original wrote them ({s.path}:{s.line} {how})", sites)
    if wants:
        return KeyPolicy(original, "as the original wrote them (the project's loaders disagree: "
                         + ", ".join(f"{s.path}:{s.line} wants {s.wants}" for s in sites[:3]) + ")", sites)
    how = ("(its data_parallel calls make no wrapper: the keys never had `module.`)" if bare
           else "where its DataParallel wrap ran (with CUDA: on every GPU machine)" if cuda
           else "where its DataParallel wrap did not run (one GPU: it ran only with several)" if guarded
           else "with its DataParallel switched on (the run being migrated)" if flagged
           else "(its DataParallel wrap was unconditional)")
    return KeyPolicy(original, f"as the original wrote them {how}; no loader of them found in the project", sites)


def checkpoint_readers(path: str) -> List[LoadSite]:
    """The project's own loaders of the checkpoints the script at ``path`` writes (what
    :func:`key_policy` chose the keys by): ``verify`` judges a ``module.`` difference by them."""
    from dp2ddp.model.core import build

    try:
        with open(path, "rb") as f:
            m = build(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return []
    return [s for s in project_load_sites(m) if reads_our_files(m, s)]


@dataclass
class LooseLoad:
    """``load_checkpoint(path, model, optimizer)`` of a project module whose body loads into
    the parameter it binds the wrapper to with ``strict=False`` (``model.load_state_dict(sd,
    strict=False)``): keys that do not match are skipped, silently."""

    call: ast.Call  # the script's call that hands the wrapper
    name: str  # the function's name
    where: str  # ``ckpt.py:11``: the load
    module: str  # the project module's path


def handed_loose_loads(m: SemanticModel) -> List[LooseLoad]:
    """Calls that hand the DataParallel wrapper to a project function that loads a state dict
    into it with ``strict=False``. The original fed it ``module.`` keys where its wrap ran and
    plain keys where it did not (on the CPU, on one GPU); a DDP wrapper, there on every run,
    would take only ``module.`` keys, and a checkpoint of the other kind would load nothing,
    with no error (training starts over from random weights: CIFAR-ZOO's resume)."""
    from dp2ddp.model.collectives import wrapped_vars
    from dp2ddp.model.dp_idioms import handed
    from dp2ddp.model.project_defs import project_calls
    from dp2ddp.model.syntax import FUNCTIONS
    from dp2ddp.model.wraps import dp_wraps

    out: List[LooseLoad] = []
    keys = wrapped_vars(m, dp=True)
    if not keys or not any(w.conditions for w in dp_wraps(m)):
        return out  # wrapped on every run: the original's checkpoints all have the `module.` keys DDP takes
    for call, (pm, func, rel) in project_calls(m):
        if not isinstance(func, FUNCTIONS):
            continue
        _arg, param = handed(m, pm, func, call, keys)
        if param is None or handles_prefix(func):
            continue
        for node in ast.walk(func):
            f = node.func if isinstance(node, ast.Call) else None
            if not (isinstance(f, ast.Attribute) and f.attr == "load_state_dict" and isinstance(f.value, ast.Name)
                    and f.value.id == param):
                continue
            strict = _passed_value(pm, func, call, argument(node, LOAD_STATE_DICT_PARAMS, "strict"))
            if isinstance(strict, ast.Constant) and strict.value is False:
                out.append(LooseLoad(call, func.name, f"{rel}:{node.lineno}", pm.path or ""))  # type: ignore[attr-defined]
                break
    return out


def _passed_value(pm: SemanticModel, func: ast.AST, call: ast.Call, expr: Optional[ast.AST]) -> Optional[ast.AST]:
    """``expr`` inside ``func``, where it is a parameter of ``func``: what ``call`` passes for it,
    or its default where the call passes nothing (lsq-net's ``load_checkpoint(model, path, ...,
    strict=False)`` loading with ``model.load_state_dict(sd, strict)``)."""
    if not isinstance(expr, ast.Name) or expr.id not in pm.params(func):
        return expr
    passed = pm.argument_for(func, call, expr.id)
    return passed if passed is not None else pm.default_of(func, expr.id)


def handles_prefix(func: ast.AST) -> bool:
    """The function (or module) deals with the ``module.`` prefix itself: a string starting
    with ``module`` (``k.replace("module.", "")``, ``"module." + k``, ``hasattr(model,
    "module")``) or a ``[7:]`` slice."""
    for n in ast.walk(func):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith("module"):
            return True
        if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Slice) and isinstance(n.slice.lower, ast.Constant) and n.slice.lower.value == 7:
            return True
    return False
