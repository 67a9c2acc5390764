"""Only rank 0 writes checkpoints and (by default) prints progress; every rank computes.

* Consecutive statements that save (``torch.save``, ``np.save``, copies), use a
  rank-0-only SummaryWriter (:mod:`rank_writers`) or print go under one
  ``if dist.get_rank() == 0:`` (the global rank, right on several nodes), as do ``if``
  and ``for`` statements made only of such statements.
* Nothing under the guard may reach a collective or compute what other ranks use: a
  print whose arguments call anything that is not plainly free of side effects
  (``evaluate(model, ds)``, ``model(x)``) is split — the calls run on every rank into
  locals, the print on rank 0 — and a save whose arguments reach a collective is left on
  every rank with a warning.
* Folders are created on every rank, with ``exist_ok=True`` (idempotent, no race):
  ``os.mkdir(d)`` -> ``os.makedirs(d, exist_ok=True)``.
* A file written on rank 0 that the script reads afterwards gets a ``dist.barrier()``
  after the write, so that no rank reads it before it exists.

Statements already under a rank test are left alone, and so is code that runs before
the process group exists.
"""

from __future__ import annotations

import ast
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from dp2ddp.codemods.context import Context
from dp2ddp.codemods.facts import GuardedWriters
from dp2ddp.codemods.rank_writers import is_writer_use
from dp2ddp.engine import Finding, Guard, Hoist, InsertAfter, InsertBefore, Replace
from dp2ddp.model.collectives import reaches_collective
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.names import DUMPS, LOAD, OPEN, PRINT
from dp2ddp.model.ranks import mentions_rank, rank_guarded
from dp2ddp.model.syntax import COMPREHENSIONS, kwarg
from dp2ddp.model.writers import open_mode, writer_of, writers, writes_mode

NEEDS = (GuardedWriters,)

PURE_BUILTINS = {
    "len", "str", "repr", "int", "float", "round", "abs", "min", "max", "sum", "sorted", "list", "tuple", "dict",
    "set", "format", "type", "isinstance", "hasattr", "getattr", "bool", "enumerate", "zip", "range", "any", "all",
    "id", "hex", "divmod", "pow", "reversed", "map", "filter", "vars", "chr", "ord", "ascii", "bin", "oct",
}
PURE_METHODS = {
    "item", "format", "join", "mean", "sum", "std", "var", "tolist", "cpu", "numpy", "detach", "size", "dim", "numel",
    "nelement", "float", "double", "int", "long", "keys", "values", "items", "get", "upper", "lower", "strip", "split",
    "replace", "ljust", "rjust", "center", "zfill", "startswith", "endswith", "isoformat", "strftime", "total_seconds",
    "argmax", "argmin", "max", "min", "norm", "get_last_lr", "get_lr", "parameters", "named_parameters", "count",
    "index", "copy", "clone", "tostring", "rstrip", "lstrip", "title", "capitalize", "avg", "squeeze", "view",
    "reshape", "abs", "sqrt", "exp", "log", "round", "eq", "sum", "prod", "all", "any", "nonzero", "t", "to_dict",
}
PURE_MODULES = ("math.", "os.path.", "time.", "datetime.", "numpy.", "json.dumps", "pprint.pformat", "builtins.")
PURE_FUNCTIONS = {"torch.cuda.max_memory_allocated", "torch.cuda.memory_allocated", "torch.cuda.memory_reserved",
                  "torch.cuda.get_device_name", "torch.cuda.is_available", "torch.cuda.device_count", "torch.__version__"}


def _is_pure_call(m: SemanticModel, call: ast.Call) -> bool:
    f = call.func
    if m.resolve_call(call) is not None:
        return False  # a function of this script: it may do anything
    q = m.qualified_names(f)
    if q:
        if any(x[len("builtins."):] in PURE_BUILTINS for x in q if x.startswith("builtins.")):
            return True
        if any(x.startswith(PURE_MODULES) and not x.startswith("builtins.") for x in q) or q & PURE_FUNCTIONS:
            return True
        if all(not x.startswith(("builtins.",)) for x in q) and not isinstance(f, ast.Attribute):
            return False  # an imported function
    if isinstance(f, ast.Attribute) and f.attr in PURE_METHODS:
        return True
    return False


def impure_calls(m: SemanticModel, expr: ast.AST) -> List[ast.Call]:
    """The outermost calls in ``expr`` that are not plainly free of side effects."""
    out: List[ast.Call] = []
    todo = [expr]
    while todo:
        n = todo.pop()
        if isinstance(n, ast.Call) and not _is_pure_call(m, n):
            out.append(n)
            continue
        todo.extend(ast.iter_child_nodes(n))
    out.sort(key=lambda c: (c.lineno, c.col_offset))
    return out


def _hoistable(m: SemanticModel, call: ast.Call, stmt: ast.stmt) -> bool:
    """``call`` is evaluated exactly once when ``stmt`` runs (not in a lambda, a
    comprehension, a conditional expression or a short-circuit operand)."""
    child: ast.AST = call
    for a in m.ancestors(call):
        if a is stmt:
            return True
        if isinstance(a, (ast.Lambda, ast.IfExp) + COMPREHENSIONS):
            return False
        if isinstance(a, ast.BoolOp) and child is not a.values[0]:
            return False
        child = a
    return False


class _Plan:
    """What rank_zero decided for one statement."""

    def __init__(self, kind: str, split: Optional[List[ast.Call]] = None) -> None:
        self.kind = kind  # print | save | writer | block
        self.split = split or []


def _path_open_for_write(expr: ast.AST) -> bool:
    """``fname.open("wt")`` (a pathlib path's open, for writing)."""
    if not (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "open"):
        return False
    return writes_mode(open_mode(expr, position=0))


def _writes_only_to(m: SemanticModel, stmt: ast.stmt, handle: str) -> bool:
    """``json.dump(obj, f)``, ``f.write(text)``, ``print(..., file=f)``: a statement that only
    writes into the open file ``handle``."""
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return False
    call = stmt.value
    f = call.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == handle and f.attr in ("write", "writelines"):
        return not impure_calls(m, call.args[0]) if call.args else True
    uses_handle = any(isinstance(a, ast.Name) and a.id == handle for a in list(call.args) + [k.value for k in call.keywords])
    return uses_handle and (m.is_name(f, DUMPS | PRINT)) and not any(impure_calls(m, a) for a in call.args if not (isinstance(a, ast.Name) and a.id == handle))


def _statement_plan(ctx: Context, stmt: ast.stmt, memo: Dict[ast.AST, Optional[_Plan]]) -> Optional[_Plan]:
    if stmt in memo:
        return memo[stmt]
    plan = _compute_plan(ctx, stmt, memo)
    memo[stmt] = plan
    return plan


def _compute_plan(ctx: Context, stmt: ast.stmt, memo) -> Optional[_Plan]:
    m = ctx.m
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        call = stmt.value
        q = m.qualified_names(call.func)
        if q & PRINT or (isinstance(call.func, ast.Attribute) and call.func.attr == "write" and m.is_name(call.func.value, {"tqdm.tqdm", "tqdm.auto.tqdm"})):
            if ctx.options.print_all_ranks:
                return None
            calls = [c for a in list(call.args) + [k.value for k in call.keywords] for c in impure_calls(m, a)]
            if calls and not all(_hoistable(m, c, stmt) for c in calls):
                return None
            return _Plan("print", calls)
        w = writer_of(m, call)
        if w is not None and w.kind in ("save", "copy", "logconfig"):
            if reaches_collective(m, call, dp=True):
                return None
            return _Plan("save")
        if is_writer_use(ctx, stmt):
            if reaches_collective(m, call, dp=True):
                return None
            return _Plan("writer")
        return None
    if isinstance(stmt, ast.With) and len(stmt.items) == 1 and _path_open_for_write(stmt.items[0].context_expr):
        # with path.open("w") as f: json.dump(obj, f) — a write by a pathlib object's open
        handle = stmt.items[0].optional_vars
        if isinstance(handle, ast.Name) and all(_writes_only_to(m, s, handle.id) for s in stmt.body):
            return _Plan("save")
        return None
    if isinstance(stmt, ast.If):
        if impure_calls(m, stmt.test) or mentions_rank(m, stmt.test):
            return None
        body = stmt.body + stmt.orelse
        if body and all(_statement_plan(ctx, s, memo) is not None and not _statement_plan(ctx, s, memo).split for s in body):  # type: ignore[union-attr]
            return _Plan("block")
        return None
    if isinstance(stmt, (ast.For,)) and not stmt.orelse:
        if impure_calls(m, stmt.iter):
            return None
        if stmt.body and all(_statement_plan(ctx, s, memo) is not None and not _statement_plan(ctx, s, memo).split for s in stmt.body):  # type: ignore[union-attr]
            if any(_statement_plan(ctx, s, memo).kind != "print" for s in stmt.body):  # type: ignore[union-attr]
                return None  # a loop of saves: keep it plain
            return _Plan("block")
    return None


def _blocks(m: SemanticModel) -> List[List[ast.stmt]]:
    out: List[List[ast.stmt]] = [m.tree.body]
    for node in m.parents:
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt) and not isinstance(node, ast.Module):
                out.append(block)
        if isinstance(node, ast.ExceptHandler):
            pass
    return out


def propose(ctx: Context) -> List[Finding]:
    m = ctx.m
    out: List[Finding] = []
    memo: Dict[ast.AST, Optional[_Plan]] = {}
    guarded_writes: List[Tuple[ast.stmt, ast.stmt]] = []  # (save statement, last statement of its guard run)
    for block in _blocks(m):
        owner = m.parent(block[0])
        if owner is not None and isinstance(owner, ast.stmt) and _statement_plan(ctx, owner, memo) is not None and _eligible(ctx, owner):
            continue  # the whole compound statement is guarded as one
        run: List[ast.stmt] = []
        for stmt in list(block) + [None]:  # type: ignore[list-item]
            plan = _statement_plan(ctx, stmt, memo) if stmt is not None else None
            if stmt is not None and plan is not None and _eligible(ctx, stmt) and ctx.bridge.alone_on_line(stmt):
                if plan.split and run:
                    out.extend(_guard(ctx, run, memo, guarded_writes))
                    run = []
                run.append(stmt)
                continue
            if run:
                out.extend(_guard(ctx, run, memo, guarded_writes))
            run = []
    out.extend(_mkdirs(ctx))
    out.extend(_barriers(ctx, guarded_writes))
    out.extend(_barriers(ctx, _routed_write_sites(ctx), routed=True))
    return out


def _routed_write_sites(ctx: Context) -> List[Tuple[ast.stmt, ast.stmt]]:
    """The statements that call a function of the script writing a file that
    :mod:`rank_writers` routes to rank 0 (``open(path, "w")``, os.devnull on the other
    ranks): once the call returns on rank 0 the file is there, on the other ranks maybe not
    yet (the word language model writes its corpus files, then reads them)."""
    m = ctx.m
    out: List[Tuple[ast.stmt, ast.stmt]] = []
    if ctx.mode != "plain":
        return out  # a mixed script may run without a process group: no barrier it did not write itself
    for w in writers(m):
        if w.kind != "open" or rank_guarded(m, w.call) or not ctx.in_setup_region(w.call):
            continue
        func = m.enclosing_function(w.call)
        if func is None:
            continue
        for site in m.call_sites(func):
            stmt = m.statement_of(site)
            if stmt is not None and m.enclosing_function(stmt) is not func:
                out.append((stmt, stmt))  # type: ignore[arg-type]
    return out


def _eligible(ctx: Context, stmt: ast.stmt) -> bool:
    if ctx.mode == "plain" and not ctx.in_setup_region(stmt):
        return False
    return not rank_guarded(ctx.m, stmt)


def _guard(ctx: Context, run: List[ast.stmt], memo, guarded_writes) -> List[Finding]:
    m = ctx.m
    out: List[Finding] = []
    edits = []
    kinds = set()
    for stmt in run:
        plan = memo[stmt]
        kinds.add(plan.kind)
        if plan.split:
            out.append(_split(ctx, stmt, plan.split))
        if plan.kind in ("save", "block"):
            guarded_writes.append((stmt, run[-1]))
    edits.append(Guard(tuple(ctx.bridge.statement(s) for s in run), ctx.expr(ctx.rank0())))
    if kinds & {"save", "block", "writer"} and kinds != {"block"} or any(_has_save(ctx, s, memo) for s in run):
        f = ctx.note(run[0], "DDP132", "checkpoint and file writing runs on rank 0 only", edits)
    else:
        f = ctx.note(run[0], "DDP133", "progress printing runs on rank 0 only (--print-all-ranks keeps it on every rank)", edits)
    return [f] + out


def _has_save(ctx: Context, stmt: ast.stmt, memo) -> bool:
    plan = memo.get(stmt)
    if plan is None:
        return False
    if plan.kind in ("save", "writer"):
        return True
    if plan.kind == "block":
        kids = stmt.body + getattr(stmt, "orelse", [])
        return any(_has_save(ctx, s, memo) for s in kids)
    return False


def _split(ctx: Context, stmt: ast.stmt, calls: List[ast.Call]) -> Finding:
    """``print(f"{evaluate(m):.4f}")`` -> ``evaluate_result = evaluate(m)`` before it, the
    print of the local on rank 0."""
    m = ctx.m
    edits = []
    line = ctx.bridge.statement(stmt)
    for call in calls:
        f = call.func
        base = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "value"
        name = ctx.fresh_name(f"{base.lstrip('_') or 'value'}_result")
        edits.append(Hoist(ctx.cst(call), line, name))  # the call as the other edits leave it (map_location=, .module)
    what = ", ".join(m.source(c.func) + "()" for c in calls)
    return ctx.note(stmt, "DDP113", f"{what} runs on every rank (it may be a collective); only the print runs on rank 0", edits)


def _mkdirs(ctx: Context) -> List[Finding]:
    """Folders are made on every rank, idempotently."""
    m = ctx.m
    edits = []
    first = None
    for w in writers(m):
        if w.kind != "mkdir" or w.idempotent or rank_guarded(m, w.call):
            continue
        call = w.call
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            continue
        if m.is_name(call.func, {"os.mkdir"}):
            if len(call.args) != 1 or call.keywords:
                continue
            edits.append(Replace(ctx.cst(call), ctx.expr("{os}.makedirs({p}, exist_ok=True)", os=ctx.name("os"), p=call.args[0])))
        else:
            ok = kwarg(call, "exist_ok")
            if ok is not None:
                edits.append(Replace(ctx.cst(ok.value), ctx.expr("True")))
            else:
                from dp2ddp.codemods.rank_writers import _add_kwarg

                edits.append(Replace(ctx.cst(call), lambda u: _add_kwarg(u, "exist_ok", "True")))
        first = first or call
    if not edits:
        return []
    return [ctx.note(first, "DDP132", "folders are created on every rank with exist_ok=True (no race between ranks)", edits)]


# --------------------------------------------------------------------------- barriers

READS = LOAD | {"numpy.load", "json.load", "pickle.load", "yaml.safe_load", "yaml.load", "pandas.read_csv"}


def _written_paths(m: SemanticModel, stmt: ast.stmt) -> List[str]:
    """The paths ``stmt`` writes, as ``ast.dump`` texts."""
    out = []
    for node in ast.walk(stmt):
        w = writer_of(m, node) if isinstance(node, ast.Call) else None
        if w is not None and w.kind in ("save", "copy") and w.path is not None:
            out.append(ast.dump(w.path))
    return out


def _call_paths(m: SemanticModel, stmt: ast.stmt) -> List[str]:
    """What a call of a file-writing function of the script in ``stmt`` writes under: its
    arguments that name a path (a string, an attribute such as ``args.data``, a name bound
    to a string), as ``ast.dump`` texts."""
    out = []
    for node in ast.walk(stmt):
        if not isinstance(node, ast.Call):
            continue
        t = m.resolve_call(node)
        if t is None or not _writes_files(m, t):
            continue
        for a in list(node.args) + [k.value for k in node.keywords]:
            if _path_like(m, a):
                out.append(ast.dump(a))
    return out


def _path_like(m: SemanticModel, expr: ast.AST) -> bool:
    if isinstance(expr, ast.Constant):
        return isinstance(expr.value, str)
    if isinstance(expr, ast.Attribute):
        return True
    if isinstance(expr, ast.Name):
        bindings = m.bindings_of(expr)
        return bool(bindings) and all(b.kind == "assign" and isinstance(b.value, (ast.Constant, ast.JoinedStr, ast.BinOp, ast.Call))
                                      and not (isinstance(b.value, ast.Call) and not m.qualified_names(b.value.func) & _PATH_MAKERS)
                                      for b in bindings)
    return False


_PATH_MAKERS = frozenset({"os.path.join", "pathlib.Path", "os.path.abspath", "os.path.expanduser", "str"})


def _writes_files(m: SemanticModel, func) -> bool:
    for call in m.reached_calls(func):
        w = writer_of(m, call)
        if w is not None and w.kind in ("save", "copy", "open"):
            return True
    return False


def _read_paths(m: SemanticModel) -> List[Tuple[ast.AST, str]]:
    out = []
    for call in m.nodes(ast.Call):
        q = m.qualified_names(call.func)
        arg = call.args[0] if call.args else None
        if arg is None:
            continue
        if q & READS or (q & OPEN and not _writes(call)) or (isinstance(call.func, ast.Attribute) and call.func.attr == "from_pretrained"):
            out.append((call, ast.dump(arg)))
    return out


def _writes(call: ast.Call) -> bool:
    """``open(path, mode)`` that may write (a mode that is not a literal may)."""
    mode = open_mode(call)
    return mode is None or writes_mode(mode)


def _reads_files(m: SemanticModel, func) -> bool:
    """The function (or one it calls) reads a file: torch.load, open for reading, np.load ..."""
    for call in m.reached_calls(func):
        q = m.qualified_names(call.func)
        if q & READS or (q & OPEN and not _writes(call)):
            return True
    return False


def _barrier_anchor(m: SemanticModel, stmt: ast.stmt, reads: List[ast.AST]) -> ast.stmt:
    """Where every rank passes after ``stmt`` and before the reads: out of the ``if``
    statements around it (their tests may differ between ranks: ``if not
    os.path.exists(path)``) and the ``with`` blocks (``with open(path, "wb") as f:`` closes
    the file at its end) that do not hold a read, not out of a loop."""
    cur = stmt
    while True:
        parent = m.parent(cur)
        if (
            isinstance(parent, (ast.If, ast.With))
            and m.block_of(parent) is not None
            and not any(m.contains(parent, r) for r in reads)
            and not (parent is m.main_guard)
        ):
            cur = parent
            continue
        return cur


def _barriers(ctx: Context, guarded: List[Tuple[ast.stmt, ast.stmt]], routed: bool = False) -> List[Finding]:
    """``dist.barrier()`` after a rank-0 write of a file the script reads later (directly, or
    through a function of the script that reads the path it is given). ``routed``: the
    statements call a script function whose writes go to os.devnull on other ranks; its
    path arguments (a string, ``args.data``: not a whole options namespace) must reach a
    reading call after it in the same function."""
    m = ctx.m
    if not guarded:
        return []
    reads = _read_paths(m)
    out = []
    done: Set[int] = set()
    for stmt, last in guarded:
        paths = _call_paths(m, stmt) if routed else _written_paths(m, stmt)
        for path in paths:
            later = [] if routed else [c for c, p in reads if p == path and ((c.lineno, c.col_offset) > (stmt.lineno, stmt.col_offset) or m.enclosing_function(c) is not m.enclosing_function(stmt))]
            for call in m.nodes(ast.Call):
                if (call.lineno, call.col_offset) <= (stmt.lineno, stmt.col_offset):
                    continue
                if routed and m.enclosing_function(call) is not m.enclosing_function(stmt):
                    continue
                t = m.resolve_call(call)
                if t is not None and any(ast.dump(a) == path for a in list(call.args) + [k.value for k in call.keywords]) and _reads_files(m, t):
                    later.append(call)
            if not later:
                continue
            anchor = _barrier_anchor(m, last, later)
            if id(anchor) in done or not ctx.bridge.alone_on_line(anchor):
                continue
            done.add(id(anchor))
            barrier = ctx.stmt("{dist}.barrier()", dist=ctx.name("dist"))
            out.append(
                ctx.note(stmt, "DDP132", f"dist.barrier() after the rank-0 write: line {later[0].lineno} reads the file on every rank",
                         [InsertAfter(ctx.bridge.statement(anchor), (barrier,))])
            )
    return out
