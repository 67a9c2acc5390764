"""Set-up calls that make the run's folder: run on rank 0 alone, or refused (DDP110).

A project function or class the script calls once to set a run up (``args = get_args()``,
``config = ConfigParser.from_args(parser)``, ``opt = option.parse(path)``) often makes the
run's folder in a way every rank cannot repeat: named by the clock (each rank its own
folder), without ``exist_ok`` (rank 1 raises ``FileExistsError``), picked from what exists
(``run_{n}``), or after moving an earlier run's folder away (rank 1 moves rank 0's). Such a
call can run on rank 0 alone, every rank taking rank 0's result (pickled through the process
group), when nothing else it does is needed by the other ranks. :func:`setup_calls` finds
them and, for each, either ``None`` (rank 0 alone is sound) or the first effect that the
other ranks would miss, with its place. What the other ranks would miss and how each is
judged is in ``docs/design-setup-calls.md``:

* files and folders written, printed lines, logging configured: rank 0's alone, as the
  migration does for the script's own writers;
* random seeds and states, cudnn's flags, ``torch.use_deterministic_algorithms``,
  ``os.environ``: set alike on the other ranks by the generated code (it copies what
  changed on rank 0);
* a folder picked from a listing (``experiment_{n}``) is left to the older refusal: the
  one repository of that shape we have (pytorch-deeplab-xception, fixtures/corpus) would then
  migrate with a loss scaled by the per-rank batch in a module the migration does not read;
* anything else kept in the process (a module global, ``sys.path``, ``sys.stdout``, the
  working directory, a default dtype, threads), a training loop, a collective, an argument
  object the call changes and the script reads afterwards, a result that holds an open
  file: refused, naming the place.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import List, Optional, Tuple

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.names import LOGGING_FILE, OPEN, SUMMARY_WRITERS
from dp2ddp.model.project_defs import project_calls, reach_across
from dp2ddp.model.clock_paths import CLOCK
from dp2ddp.model.output_objects import trains_in
from dp2ddp.model.companion_writes import checked_mkdir, lists_in, removes_in, renames_in
from dp2ddp.model.writers import writers

# process state the generated code copies from rank 0 to the other ranks
REPLAYED_CALLS = frozenset({
    "random.seed", "numpy.random.seed", "torch.manual_seed", "torch.random.manual_seed", "torch.cuda.manual_seed",
    "torch.cuda.manual_seed_all", "torch.use_deterministic_algorithms", "torch.backends.cudnn.deterministic",
})
REPLAYED_STORES = frozenset({"os.environ", "torch.backends.cudnn.deterministic", "torch.backends.cudnn.benchmark",
                             "torch.backends.cudnn.enabled"})
# process state a rank keeps that the generated code does not copy: the other ranks would miss it
PROCESS_STATE = frozenset({
    "os.chdir", "os.putenv", "os.unsetenv", "os.umask", "sys.path.insert", "sys.path.append", "sys.path.extend",
    "sys.setrecursionlimit", "torch.set_default_dtype", "torch.set_default_tensor_type", "torch.set_default_device",
    "torch.set_num_threads", "torch.set_num_interop_threads", "torch.set_flush_denormal", "torch.set_float32_matmul_precision",
    "torch.set_grad_enabled", "torch.autograd.set_detect_anomaly", "torch.multiprocessing.set_start_method",
    "torch.multiprocessing.set_sharing_strategy", "multiprocessing.set_start_method", "signal.signal", "atexit.register",
    "threading.Thread", "importlib.reload", "builtins.exec", "builtins.setattr", "builtins.globals",
    "torch.distributed.init_process_group",
})
# what a result cannot carry to the other ranks (pickle refuses it)
UNPICKLABLE = frozenset(OPEN) | frozenset(SUMMARY_WRITERS) | frozenset(LOGGING_FILE) | frozenset({
    "logging.StreamHandler", "threading.Thread", "threading.Lock", "socket.socket", "subprocess.Popen",
})
MUTATORS = frozenset({"append", "extend", "insert", "update", "pop", "popitem", "clear", "remove", "add", "discard",
                      "setdefault", "sort", "reverse", "add_argument", "add_argument_group", "set_defaults", "__setitem__"})


PROMPTS = frozenset({"builtins.input", "getpass.getpass"})


@dataclass
class SetupCall:
    call: ast.Call  # the call in the script
    name: str  # what it calls (``from_args``)
    why: str  # why every rank cannot run it: ``names its folder by the clock (parse_config.py:28) ...``
    refusal: Optional[str] = None  # why rank 0 cannot run it alone (``None``: it can), with the place
    module: str = ""  # the project module the call enters
    advice: str = "make the folder on rank 0 yourself"  # what to do by hand where it is refused


def setup_calls(m: SemanticModel) -> List[SetupCall]:
    """The script's calls of project functions and classes that make a folder every rank
    cannot make for itself (see the module's docstring), judged once per model."""
    got = m.cache.get("setup_calls")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[SetupCall] = []
    for call, (pm, node, rel) in project_calls(m):
        reach = reach_across(pm, node, rel)
        why = _why_rank_zero(reach)
        if why is None:
            continue
        out.append(SetupCall(call, getattr(node, "name", "?"), why, _refusal(m, call, node, pm, reach), pm.path))
    for call in m.nodes(ast.Call):
        if m.is_name(call.func, PROMPTS):
            # torchrun hands its stdin to every rank: each would wait for a line of its own
            out.append(SetupCall(call, m.source(call.func), "asks at the terminal (every rank would wait for an answer "
                                 "of its own)", advice="ask on rank 0 and send the answer to the others "
                                 "(dist.broadcast_object_list)"))
    m.cache["setup_calls"] = out
    return out


def _why_rank_zero(reach) -> Optional[str]:
    """Why every rank cannot run a call that reaches ``reach``: the worst of its folders."""
    found: List[Tuple[int, str]] = []
    for mod, fn, path in reach:
        for w in writers(mod):
            if w.kind != "mkdir" or not mod.contains(fn, w.call):
                continue
            at = f"{path}:{w.call.lineno}"
            gone = removes_in(mod, fn) or renames_in(mod, fn)
            listed = lists_in(mod, fn, before=w.call)
            clock = _clock_in(mod, fn, path)
            if gone:
                found.append((4, f"moves or removes a folder and makes one ({path}:{gone}, {at}): every rank would move "
                                 "away or delete what another made"))
            elif listed:
                return None  # kept refused (companion_folder_races): see docs/design-setup-calls.md
            elif clock is not None:
                found.append((2, f"names the folder it makes by the clock ({clock}, {at}): every rank would make its own"))
            elif not w.idempotent and not checked_mkdir(mod, w.call, fn):
                found.append((1, f"makes a folder without exist_ok ({at}): every rank after the first would raise "
                                 "FileExistsError"))
    return max(found)[1] if found else None


def _clock_in(mod: SemanticModel, fn: ast.AST, path: str) -> Optional[str]:
    """A clock read in the function that makes the folder (``datetime.now()``, a helper of
    the same module that reads it, ``get_timestamp()``)."""
    for call in ast.walk(fn):
        if not isinstance(call, ast.Call):
            continue
        if mod.is_name(call.func, CLOCK):
            return f"{path}:{call.lineno}"
        target = mod.resolve_call(call)
        if target is not None and any(isinstance(c, ast.Call) and mod.is_name(c.func, CLOCK) for c in ast.walk(target)):
            return f"{path}:{call.lineno}"
    return None


def _refusal(m: SemanticModel, call: ast.Call, entry: ast.AST, pm: SemanticModel, reach) -> Optional[str]:
    """The first thing the call does that the other ranks need and would miss if it ran on
    rank 0 alone; ``None`` when there is none."""
    together = _runs_with_the_others(reach)
    if together is not None:
        return together
    for mod, fn, path in reach:
        why = _kept_state(mod, fn, path)
        if why is not None:
            return why
    changed = _changed_params(pm, entry)
    if changed is not None:
        late = _read_after(m, call)
        if late is not None:
            return (f"it changes its argument `{late[0]}` ({changed}), which the script reads after the call "
                    f"(line {late[1]}): the other ranks would read it unchanged")
    return None


def _runs_with_the_others(reach) -> Optional[str]:
    """What in ``reach`` (the functions a call runs) every rank must run at the same time:
    training, a collective, a DataParallel model; ``None`` where nothing is."""
    from dp2ddp.model.collectives import reaching_functions

    for mod, fn, path in reach:
        line = trains_in(mod, fn)
        if line is not None:
            return f"it also trains ({path}:{line}), which every rank must do"
        if fn in reaching_functions(mod) or fn in reaching_functions(mod, dp=True):
            return f"it reaches a collective or a DataParallel model ({path}:{fn.lineno}), which every rank must join"  # type: ignore[attr-defined]
    return None


def _reach_of(m: SemanticModel, call: ast.Call):
    """What a call of a project function or class runs (:func:`reach_across`), once per call;
    ``None`` where the call is not one dp2ddp can follow into the project."""
    from dp2ddp.model.project_defs import project_def

    memo = m.cache.setdefault("writers_setup:reach", {})
    if id(call) not in memo:  # type: ignore[operator]
        found = project_def(m, call.func) if isinstance(call.func, (ast.Name, ast.Attribute)) else None
        memo[id(call)] = reach_across(*found) if found is not None else None  # type: ignore[index]
    return memo[id(call)]  # type: ignore[index]


def joins_the_others(m: SemanticModel, call: ast.Call) -> Optional[str]:
    """Why rank 0 cannot run ``call`` while the other ranks wait at a barrier for it (it
    runs on rank 0 first, then on the others: a folder or a file it writes): what it runs
    trains, or reaches a collective or a DataParallel model (which becomes DDP, whose
    construction and forwards wait for every rank), or it is handed an object that may hold
    the model (``self``), or the model, and runs it (:func:`runs_a_handed_model`); ``None``
    where none of these holds."""
    reach = _reach_of(m, call)
    if reach is None:
        return "what it runs is not project code dp2ddp can read"
    together = _runs_with_the_others(reach)
    if together is not None:
        return together
    receiver = [call.func.value] if isinstance(call.func, ast.Attribute) else []
    for a in [*call.args, *(k.value for k in call.keywords), *receiver]:
        a = a.value if isinstance(a, ast.Starred) else a
        if isinstance(a, ast.Name) and a.id == "self":
            return f"it is handed `{m.source(a)}`, which may hold the model (a DDP forward waits for every rank)"
    handed = handed_models(m, call)
    if handed and runs_a_handed_model(m, call):
        return f"it is handed `{m.source(handed[0])}`, the model, and runs it (a DDP forward waits for every rank)"
    return None  # handed the model only to read it (``torch.save(model.state_dict(), path)``): no collective


def handed_models(m: SemanticModel, call: ast.Call) -> List[ast.AST]:
    """The arguments of ``call`` that hold the DataParallel wrapper (``evaluate(..., net)``),
    which the migration makes a DDP wrapper."""
    from dp2ddp.model.collectives import var_key
    from dp2ddp.model.uses import dp_wrapper_keys

    keys = dp_wrapper_keys(m)
    return [a for a in [*call.args, *(k.value for k in call.keywords)]
            if isinstance(a, (ast.Name, ast.Attribute)) and var_key(m, a) in keys]


def runs_a_handed_model(m: SemanticModel, call: ast.Call) -> bool:
    """What ``call`` runs calls a model it is handed (``net(x)`` where ``net`` is a parameter
    of that function, or a name bound from one: ``net = net.cuda().eval()``): a forward. A
    helper that only reads ``model.state_dict()`` runs no forward."""
    reach = _reach_of(m, call)
    if reach is None:
        return True  # not readable: assume it runs it
    for _mod, fn, _path in reach:
        args = getattr(fn, "args", None)
        if args is None:
            continue
        held = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
        for n in ast.walk(fn):
            if isinstance(n, ast.Assign) and any(isinstance(x, ast.Name) and x.id in held for x in ast.walk(n.value)):
                held |= {t.id for tgt in n.targets for t in ast.walk(tgt) if isinstance(t, ast.Name)}
        if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in held for n in ast.walk(fn)):
            return True
    return False


def reads_the_wrapper(m: SemanticModel, call: ast.Call) -> Optional[str]:
    """Where what ``call`` runs (in its module and the project modules it calls) reads a
    wrapper's own API: a ``.module`` attribute, or a type test against DataParallel or
    DistributedDataParallel. Handed the bare module instead of the wrapper, such code
    would fail; ``None`` where it reads neither."""
    from dp2ddp.model.names import DDP, DP

    reach = _reach_of(m, call)
    if reach is None:
        return "what it runs is not project code dp2ddp can read"
    for mod, fn, path in reach:
        for n in ast.walk(fn):
            if isinstance(n, ast.Attribute) and n.attr == "module" and isinstance(n.ctx, ast.Load):
                return f"{path}:{n.lineno}"
            if isinstance(n, (ast.Name, ast.Attribute)) and mod.qualified_names(n) & (DP | DDP):
                return f"{path}:{n.lineno}"
    return None


def _kept_state(mod: SemanticModel, fn: ast.AST, path: str) -> Optional[str]:
    """State ``fn`` leaves in the process that the generated code does not copy."""
    for n in ast.walk(fn):
        if isinstance(n, (ast.Global, ast.Nonlocal)):
            return (f"it keeps state in the module global `{n.names[0]}` ({path}:{n.lineno}), which the other "
                    "ranks would not have")
        if isinstance(n, ast.Call):
            q = mod.qualified_names(n.func)
            if q & PROCESS_STATE:
                return f"it changes the process ({sorted(q & PROCESS_STATE)[0]}, {path}:{n.lineno}), which the other ranks would not"
            f = n.func
            if (isinstance(f, ast.Attribute) and f.attr in MUTATORS and _module_level(mod, f.value)
                    and not mod.qualified_names(f.value) & REPLAYED_STORES and not _logging_state(mod, f.value)):
                return f"it changes the module-level `{mod.source(f.value)}` ({path}:{n.lineno}), which the other ranks would not"
        targets: List[ast.AST] = []
        if isinstance(n, ast.Assign):
            targets = list(n.targets)
        elif isinstance(n, (ast.AugAssign, ast.AnnAssign)):
            targets = [n.target]
        elif isinstance(n, ast.Delete):
            targets = list(n.targets)
        for t in targets:
            for s in ast.walk(t):
                if isinstance(s, (ast.Attribute, ast.Subscript)) and isinstance(s.ctx, (ast.Store, ast.Del)):
                    if mod.qualified_names(s.value) & REPLAYED_STORES or mod.qualified_names(s) & REPLAYED_STORES:
                        continue
                    if _logging_state(mod, s.value):
                        continue  # ``logging.root = logger``: output set up on rank 0, the others log nothing below WARNING
                    if _module_level(mod, s.value):
                        return f"it changes the module-level `{mod.source(s)}` ({path}:{n.lineno}), which the other ranks would not"
        value = n.value if isinstance(n, (ast.Return, ast.Assign)) else None
        if value is not None and (isinstance(n, ast.Return) or any(_on_self(t) for t in n.targets)):  # type: ignore[attr-defined]
            what = "a lambda" if isinstance(value, ast.Lambda) else _unpicklable(mod, value)
            if what is not None:
                held = "returns it" if isinstance(n, ast.Return) else f"keeps it in `{mod.source(n.targets[0])}`"  # type: ignore[attr-defined]
                return (f"it makes {what} and {held} ({path}:{n.lineno}), which cannot be sent to the other ranks "
                        "(pickle refuses it)")
    return None


def _unpicklable(mod: SemanticModel, value: ast.AST) -> Optional[str]:
    if not isinstance(value, ast.Call):
        return None
    q = mod.qualified_names(value.func) & UNPICKLABLE
    if not q:
        return None
    if q & frozenset(OPEN):
        return "an open file"
    return f"a {sorted(q)[0].rsplit('.', 1)[-1]}"


def _on_self(t: ast.AST) -> bool:
    """``self.x``, or a place reached from it (``self.args.writer``, ``self.state[k]``): what
    the object sent to the other ranks holds."""
    if not isinstance(t, (ast.Attribute, ast.Subscript)):
        return False
    while isinstance(t, (ast.Attribute, ast.Subscript)):
        t = t.value
    return isinstance(t, ast.Name) and t.id == "self"


def _logging_state(mod: SemanticModel, expr: ast.AST) -> bool:
    """``expr`` is the ``logging`` module or an object reached from it (``logging.root``):
    its configuration decides only where messages go. Set up on rank 0 alone, the other
    ranks log nothing below WARNING, as a hand migration that logs once wants."""
    root = expr
    while isinstance(root, (ast.Attribute, ast.Subscript)):
        root = root.value
    return isinstance(root, ast.Name) and "logging" in mod.qualified_names(root)


def _module_level(mod: SemanticModel, expr: ast.AST) -> bool:
    """``expr`` (the object a store or a method call changes) is rooted at a name bound at
    module level (an imported module, a module global), not at a local or a parameter."""
    root = expr
    while isinstance(root, (ast.Attribute, ast.Subscript)):
        root = root.value  # a call's result (``lookup(tree)[k] = v``) is no module-level name
    if not isinstance(root, ast.Name):
        return False
    where, bindings = mod.lookup(root.id, mod.scope_of(root))
    return where is not None and where.kind == "module" and bool(bindings)


def _changed_params(pm: SemanticModel, entry: ast.AST) -> Optional[str]:
    """Where the function a call enters (a class: its ``__init__``) may change an object the
    caller passed in: a store into a parameter or into ``vars(parameter)``, a changing method
    of it (``append``, ``add_argument`` ...). ``None`` where it only reads them (a parameter
    handed on to another call is not followed)."""
    fn = entry
    if isinstance(fn, ast.ClassDef):
        fn = next((s for s in fn.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)  # type: ignore[assignment]
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    a = fn.args
    params = {p.arg for p in a.posonlyargs + a.args + a.kwonlyargs} - {"self", "cls"}
    params |= {p.arg for p in (a.vararg, a.kwarg) if p is not None}
    for n in ast.walk(fn):
        if isinstance(n, ast.Name) and n.id in params and isinstance(n.ctx, ast.Load):
            parent = pm.parent(n)
            if isinstance(parent, (ast.Attribute, ast.Subscript)) and isinstance(parent.ctx, (ast.Store, ast.Del)):
                return f"{pm.path.rsplit('/', 1)[-1]}:{n.lineno}"
            if isinstance(parent, ast.Attribute) and isinstance(pm.parent(parent), ast.Call) and pm.parent(parent).func is parent and parent.attr in MUTATORS:  # type: ignore[attr-defined]
                return f"{pm.path.rsplit('/', 1)[-1]}:{n.lineno}"
            if isinstance(parent, ast.Call) and n in parent.args and not pm.is_name(parent.func, {"builtins.len", "builtins.str", "builtins.isinstance", "builtins.getattr", "builtins.hasattr", "builtins.print"}):
                if isinstance(parent.func, ast.Name) and parent.func.id == "vars":
                    return f"{pm.path.rsplit('/', 1)[-1]}:{n.lineno}"
    return None


def _read_after(m: SemanticModel, call: ast.Call) -> Optional[Tuple[str, int]]:
    """An argument of ``call`` that is a name the script reads after the call's statement
    (in the same function): its name and the line."""
    stmt = m.statement_of(call)
    func = m.enclosing_function(call)
    names = {s.id for a in list(call.args) + [k.value for k in call.keywords] for s in [_root(a)] if isinstance(s, ast.Name)}
    if not names or stmt is None:
        return None
    end = getattr(stmt, "end_lineno", stmt.lineno)
    for n in m.nodes(ast.Name):
        if n.id in names and isinstance(n.ctx, ast.Load) and n.lineno > end and m.enclosing_function(n) is func:
            return n.id, n.lineno
    return None


def _root(expr: ast.AST) -> ast.AST:
    while isinstance(expr, (ast.Attribute, ast.Starred)):
        expr = expr.value
    return expr




