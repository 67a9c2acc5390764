"""Project helpers the script calls for its log and terminal output.

:func:`logging_setups`: a call that configures logging to a file and does nothing else;
:func:`logger_makers`: a function that gives a named logger a file handler and returns it;
:func:`stdout_tees`: ``sys.stdout = Logger(path)``, a project class that copies what is
printed into a file; :func:`console_helper`: a function that only writes to the terminal (a progress bar). Under
DDP every rank would run each; they run on rank 0.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import List, Optional, Tuple

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.names import LOGGING_BASIC, LOGGING_FILE
from dp2ddp.model.output_objects import every_rank_runs
from dp2ddp.model.project_defs import project_calls, reach_across
from dp2ddp.model.writers import writers


@dataclass
class LoggerMaker:
    """``logger = utils.get_logger(path)``: a project function that gives a named logger a
    file handler and returns the logger. Run on every rank, each would append the same
    lines to the one file (and print them)."""

    stmt: ast.Assign  # the script's statement
    name: str  # the name it binds
    where: str  # ``utils.py:49``: the file handler
    truncates: bool = False  # the handler opens its file with mode="w" at once: every rank would empty it
    rank_arg: Optional[ast.AST] = None  # what the call passes for the helper's own rank parameter (see _rank_gate)
    alone: bool = False  # what the call runs only sets up logging (:func:`only_logs`): rank 0 alone may make it
    module: bool = False  # the helper returns the logging module itself (``return logging``), not a Logger


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
        where = only_logs(pm, func, rel)
        if where is not None:
            out.append((call, where))
    m.cache["logging_setups"] = out
    return out


STD_STREAMS = frozenset({"sys.stdout", "sys.stderr"})


def stdout_tees(m: SemanticModel) -> List[Tuple[ast.Assign, str, str]]:
    """``sys.stdout = Logger(osp.join(args.logs_dir, 'log.txt'))`` (open-reid and the re-id
    repositories after it): a class of the project whose construction opens a file to write
    and that stands in for the console, copying what is printed into the file. ``(the
    statement, the class's name, "path:line" of the file it opens)``, where making it trains
    nothing and reaches no collective. On every rank each would open (and empty) the same
    file and copy its own prints into it."""
    got = m.cache.get("stdout_tees")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[Tuple[ast.Assign, str, str]] = []
    for call, (pm, node, rel) in project_calls(m):
        stmt = m.parent(call)
        if not (isinstance(node, ast.ClassDef) and isinstance(stmt, ast.Assign) and stmt.value is call
                and len(stmt.targets) == 1 and m.is_name(stmt.targets[0], STD_STREAMS)):
            continue
        reached = reach_across(pm, node, rel)
        if any(every_rank_runs(mod, f) for mod, f, _path in reached):
            continue
        where = next((f"{path}:{w.call.lineno}" for mod, f, path in reached for w in writers(mod)
                      if mod.contains(f, w.call) and w.kind in ("open", "logfile")), None)
        if where is not None:
            out.append((stmt, node.name, where))
    m.cache["stdout_tees"] = out
    return out


def only_logs(pm: SemanticModel, func: ast.AST, rel: str) -> Optional[str]:
    """``"path:line"`` of the log file a call of ``func`` (of the project module ``pm``, a
    function or a class) sets up, where what it runs writes nothing but log files and
    folders, trains nothing and reaches no collective: rank 0 alone may run it. ``None``
    otherwise, or where it sets up no log file."""
    logs = _log_writes(pm, func, rel)
    return logs[0] if logs else None


def _log_writes(pm: SemanticModel, func: ast.AST, rel: str) -> Optional[List[str]]:
    """``"path:line"`` of every log file what a call of ``func`` runs sets up (maybe none);
    ``None`` where it writes anything else than log files and folders, trains, or reaches a
    collective."""
    out: List[str] = []
    for mod, f, path in reach_across(pm, func, rel):
        if every_rank_runs(mod, f):
            return None
        kinds = [w for w in writers(mod) if mod.contains(f, w.call) and w.kind not in ("print", "tqdm")]
        if any(w.kind not in ("logconfig", "logfile", "mkdir") for w in kinds):
            return None
        out += [f"{path}:{w.call.lineno}" for w in kinds if w.kind in ("logconfig", "logfile")]
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
        # a method (``Log(path, name).get()``, CIFAR-ZOO's ``Logger(...).get_log()``): the handler
        # may be added anywhere in its class (its ``__init__``), the method returning the logger
        owner = pm.parent(func)
        scope = owner if isinstance(owner, ast.ClassDef) else func
        handler = next((w for w in writers(pm) if w.kind == "logfile" and pm.contains(scope, w.call)
                        and pm.is_name(w.call.func, LOGGING_FILE | LOGGING_BASIC)), None)
        if handler is not None and _returns_a_logger(pm, func):
            gate = _rank_gate(pm, func, handler.call)
            rank_arg = pm.argument_for(func, call, gate) if gate is not None else None
            # ``Logger(...).get_log()`` runs the class's __init__ too
            parts = [owner, func] if isinstance(owner, ast.ClassDef) else [func]
            alone = all(_log_writes(pm, part, rel) is not None for part in parts)
            module = any(isinstance(r, ast.Return) and _the_logging_module(pm, r.value) for r in ast.walk(func))
            out.append(LoggerMaker(stmt, stmt.targets[0].id, f"{rel}:{handler.call.lineno}", _truncates(pm, handler.call),
                                   rank_arg, alone, module))
    m.cache["logger_makers"] = out
    return out


def _rank_gate(pm: SemanticModel, func: ast.AST, handler: ast.Call) -> Optional[str]:
    """The parameter of ``func`` that keeps every process but rank 0 from its file handler:
    ``if distributed_rank > 0: return logger`` (also ``!= 0``, ``>= 1``, a bare truth test),
    a statement of the function's own body before the handler is made (maskrcnn-benchmark's
    ``setup_logger(name, save_dir, distributed_rank)``)."""
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    params = {a.arg for a in func.args.posonlyargs + func.args.args + func.args.kwonlyargs}
    for st in func.body:
        if st.lineno >= handler.lineno:
            return None
        if not (isinstance(st, ast.If) and not st.orelse and len(st.body) == 1 and isinstance(st.body[0], ast.Return)):
            continue
        t = st.test
        name = t.left if isinstance(t, ast.Compare) and len(t.ops) == 1 else t
        if not (isinstance(name, ast.Name) and name.id in params):
            continue
        if isinstance(t, ast.Name):
            return name.id
        op, right = t.ops[0], t.comparators[0]  # type: ignore[attr-defined]
        if isinstance(right, ast.Constant) and ((isinstance(op, (ast.Gt, ast.NotEq)) and right.value == 0)
                                                or (isinstance(op, ast.GtE) and right.value == 1)):
            return name.id
    return None


def _truncates(pm: SemanticModel, handler: ast.Call) -> bool:
    """``logging.FileHandler(path, mode='w')`` opens (and empties) its file when it is made,
    unless ``delay=True`` (then at its first record, which a disabled logger never writes).
    A mode that is not a constant starting with ``a`` may empty it."""
    from dp2ddp.model.call_args import argument
    from dp2ddp.model.dead_code import constant_truth

    params = ("filename", "mode", "encoding", "delay")
    mode = argument(handler, params, "mode")
    if mode is None or (isinstance(mode, ast.Constant) and isinstance(mode.value, str) and mode.value.startswith("a")):
        return False
    delay = argument(handler, params, "delay")
    return not (delay is not None and constant_truth(pm, delay) is True)


def _the_logging_module(pm: SemanticModel, value: Optional[ast.AST]) -> bool:
    """``value`` is the name of the ``logging`` module itself."""
    return isinstance(value, ast.Name) and pm.qualified_names(value) == {"logging"}


def _returns_a_logger(pm: SemanticModel, func: ast.AST) -> bool:
    """Every ``return`` of ``func`` gives a name bound only to ``logging.getLogger(...)``."""
    from dp2ddp.model.syntax import FUNCTIONS

    returns = [r for r in ast.walk(func) if isinstance(r, ast.Return) and pm.enclosing_function(r) is func]
    if not isinstance(func, FUNCTIONS) or not returns:
        return False
    owner = pm.parent(func)
    for r in returns:
        if (isinstance(owner, ast.ClassDef) and isinstance(r.value, ast.Attribute) and isinstance(r.value.value, ast.Name)
                and r.value.value.id == "self"):
            # ``return self._log``: every assignment of ``self._log`` in the class is a getLogger
            values = [a.value for a in ast.walk(owner) if isinstance(a, ast.Assign) and len(a.targets) == 1
                      and isinstance(a.targets[0], ast.Attribute) and isinstance(a.targets[0].value, ast.Name)
                      and a.targets[0].value.id == "self" and a.targets[0].attr == r.value.attr]
            if not values or not all(isinstance(v, ast.Call) and pm.is_name(v.func, {"logging.getLogger"}) for v in values):
                return False
            continue
        if _the_logging_module(pm, r.value):
            continue  # ``return logging``, the module (Face_Pytorch's init_log: the script logs with ``logging.info``)
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
