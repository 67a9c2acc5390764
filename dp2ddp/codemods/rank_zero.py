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
  after the write, so that no rank reads it before it exists (:mod:`write_barriers`).

Statements already under a rank test are left alone, and so is code that runs before
the process group exists.
"""

from __future__ import annotations

import ast
from typing import Dict, List, Optional, Tuple

from dp2ddp.codemods.context import Context
from dp2ddp.codemods.facts import GuardedWriters
from dp2ddp.codemods.writer_guards import is_writer_use
from dp2ddp.codemods.write_barriers import barriers, removal_barriers, routed_write_sites
from dp2ddp.engine import Finding, Guard, Hoist, InsertAfter, Replace
from dp2ddp.model.batch_shapes import written_batch_shares
from dp2ddp.model.collectives import reaches_collective
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.dp_idioms import is_elif
from dp2ddp.model.names import DUMPS, PRINT
from dp2ddp.model.rank_alike import per_process_path
from dp2ddp.model.ranks import mentions_rank, rank_guarded
from dp2ddp.model.syntax import COMPREHENSIONS, kwarg
from dp2ddp.model.log_helpers import console_helper
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


def _runs_code_of_the_script(m: SemanticModel, call: ast.Call) -> bool:
    """``evaluate(model, loader)``, ``trainer.eval(...)``: a function or method of this
    module or of the project's own modules, which may run the model (a DDP forward every
    rank must join) or a collective; a library call (``torch.randn``, ``make_grid``) does not."""
    from dp2ddp.model.project_defs import project_calls

    return m.resolve_call(call) is not None or any(c is call for c, _ in project_calls(m))


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
        if (q & PRINT or (isinstance(call.func, ast.Attribute) and call.func.attr == "write" and m.is_name(call.func.value, {"tqdm.tqdm", "tqdm.auto.tqdm"}))
                or console_helper(m, call) is not None):
            if ctx.options.print_all_ranks:
                return None
            calls = [c for a in list(call.args) + [k.value for k in call.keywords] for c in impure_calls(m, a)]
            if calls and not all(_hoistable(m, c, stmt) for c in calls):
                return None
            return _Plan("print", calls)
        w = writer_of(m, call)
        if w is not None and w.kind in ("save", "copy", "logconfig", "remove"):
            if per_process_path(m, w.path) is not None:
                return None  # a temporary file of this process's own: every rank writes (and reads) its own
            if reaches_collective(m, call, dp=True):
                # ``torch.save(netG(fixed_noise), path)``: the forward every rank must join runs
                # on every rank, before the statement; only the write runs on rank 0
                # (not a function of the script's own: what that runs is more than its arguments)
                calls = [c for a in list(call.args) + [k.value for k in call.keywords] for c in impure_calls(m, a)
                         if reaches_collective(m, c, dp=True)]
                if not calls or m.resolve_call(call) is not None or not all(_hoistable(m, c, stmt) for c in calls):
                    return None
                return _Plan("save", calls)
            return _Plan("save")
        if is_writer_use(ctx, stmt):
            if reaches_collective(m, call, dp=True):
                return None
            # ``logger.log('...'.format(evaluate(model, test_loader)))``: the evaluation runs the
            # model (a DDP forward every rank must join), so it runs on every rank, as for print
            calls = [c for a in list(call.args) + [k.value for k in call.keywords] for c in impure_calls(m, a)
                     if _runs_code_of_the_script(m, c)]
            if calls and not all(_hoistable(m, c, stmt) for c in calls):
                return None
            return _Plan("writer", calls)
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
        while isinstance(owner, ast.If) and is_elif(m, owner):
            owner = m.parent(owner)  # an ``elif`` is guarded with its ``if``, where that is
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
    out.extend(barriers(ctx, guarded_writes))
    out.extend(removal_barriers(ctx, guarded_writes))
    out.extend(barriers(ctx, routed_write_sites(ctx), routed=True))
    return out


def _eligible(ctx: Context, stmt: ast.stmt) -> bool:
    if ctx.mode == "plain" and not ctx.in_setup_region(stmt):
        return False
    if isinstance(stmt, ast.If) and is_elif(ctx.m, stmt):
        return False  # an ``elif`` cannot go under a guard of its own: its body is guarded instead
    return not rank_guarded(ctx.m, stmt)


def _guard(ctx: Context, run: List[ast.stmt], memo, guarded_writes) -> List[Finding]:
    out: List[Finding] = []
    edits = []
    kinds = set()
    for stmt in run:
        plan = memo[stmt]
        kinds.add(plan.kind)
        if plan.split:
            out.append(_split(ctx, stmt, plan.split, plan.kind))
        if plan.kind in ("save", "block"):
            guarded_writes.append((stmt, run[-1]))
    edits.append(Guard(tuple(ctx.bridge.statement(s) for s in run), ctx.expr(ctx.rank0())))
    if kinds & {"save", "block", "writer"} and kinds != {"block"} or any(_has_save(ctx, s, memo) for s in run):
        f = ctx.note(run[0], "DDP132", "checkpoint and file writing runs on rank 0 only", edits)
        out.extend(_shares_written(ctx, run))
    else:
        f = ctx.note(run[0], "DDP133", "progress printing runs on rank 0 only (--print-all-ranks keeps it on every rank)", edits)
    return [f] + out


def _shares_written(ctx: Context, run: List[ast.stmt]) -> List[Finding]:
    """DDP190 for a write, now on rank 0 only, of (part of) the training batch: under DDP each
    rank holds its share of the batch, so the file holds rank 0's, not the whole batch."""
    out = []
    for stmt in run:
        for call, arg in written_batch_shares(ctx.m, stmt):
            out.append(ctx.note(call, "DDP190", (
                f"{ctx.m.source(call.func)}(...) writes `{ctx.m.brief(arg)}`, part of the training batch: under DDP each rank "
                "holds its share of it, so the file rank 0 writes holds rank 0's share (1/world of the samples the "
                "original's held); gather it first (`dist.all_gather`, on every rank) where the whole batch matters")))
    return out


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


def _split(ctx: Context, stmt: ast.stmt, calls: List[ast.Call], kind: str) -> Finding:
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
    only = "print" if kind == "print" else "write"
    return ctx.note(stmt, "DDP113", f"{what} runs on every rank (it may be a collective); only the {only} runs on rank 0", edits)


def _mkdirs(ctx: Context) -> List[Finding]:
    """Folders are made on every rank, idempotently; one named by the clock under rank 0's
    name (:func:`_clock_made_alike`)."""
    m = ctx.m
    edits = []
    first = None
    blocked = []
    clocked: List[Finding] = []

    def named_alike(call: ast.Call, path: Optional[ast.AST]) -> bool:
        """A folder named by the clock takes rank 0's name (else refused: False)."""
        clock = _clock_named(m, path)
        if clock is None:
            return True
        wrap, why = _clock_made_alike(ctx, clock)
        if wrap is None:
            blocked.append(ctx.block(call, "DDP110", (
                f"the folder `{m.source(path)}` is named by the clock (`{m.source(clock)}`, line {clock.lineno}): each "
                "rank would read its own time and make a folder of its own, or find another rank's under the same name; "
                f"dp2ddp cannot give every rank rank 0's name: {why}; make the name on rank 0 and send it to the others "
                "(dist.broadcast_object_list), then migrate")))
            return False
        if wrap is not True and not any(f.node is clock for f in clocked):
            guards = _raise_guards(m, clock)
            edits = [wrap]
            for g in guards:  # asked on rank 0, and no rank makes the folder before it has been
                edits.append(Replace(ctx.cst(g.test), ctx.expr("{r} and {t}", r=ctx.rank0(), t=g.test)))
                edits.append(InsertAfter(ctx.bridge.statement(g), (ctx.barrier(comment="rank 0 has found the folder new"),)))
            asked = (f"; line {guards[0].lineno}'s test that the folder is new is asked on rank 0 alone, as another rank "
                     "would find rank 0's, and a barrier follows it so that no rank makes the folder first") if guards else ""
            clocked.append(ctx.note(clock, "DDP132", (
                f"the folder `{m.source(path)}` is named by the clock (line {clock.lineno}): every rank takes rank 0's "
                f"name ({ctx.rank_zero_value()}), so the ranks make and use one folder{asked}"), edits))
        return True

    for call, path in _project_mkdirs(m):  # a project function's folder: rank_writers orders the ranks around its call
        if not rank_guarded(m, call):
            named_alike(call, path)
    for w in writers(m):
        if w.kind != "mkdir" or rank_guarded(m, w.call) or not named_alike(w.call, w.path) or w.idempotent:
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
                from dp2ddp.codemods.context import add_kwarg

                edits.append(Replace(ctx.cst(call), lambda u: add_kwarg(u, "exist_ok", "True")))
        first = first or call
    if blocked:
        return blocked
    if not edits:
        return clocked
    return clocked + [ctx.note(first, "DDP132", "folders are created on every rank with exist_ok=True (no race between ranks)", edits)]


def _project_mkdirs(m: SemanticModel) -> List[Tuple[ast.Call, ast.AST]]:
    """The script's calls of project functions that make a folder (in what they run, three
    modules deep: ``mkdir_p(args.checkpoint)``), once per argument that may name it: a folder
    named by the clock in the script (``time_str`` in ``args.checkpoint``) is one every rank
    names by its own clock."""
    from dp2ddp.model.project_defs import project_calls, reach_across

    out = []
    for call, (pm, node, rel) in project_calls(m):
        if any(w.kind == "mkdir" and mod.contains(owner, w.call) for mod, owner, _ in reach_across(pm, node, rel)
               for w in writers(mod)):
            out.extend((call, a) for a in [*call.args, *(k.value for k in call.keywords)] if not isinstance(a, ast.Starred))
    return out


_EXISTS = frozenset({"os.path.exists", "os.path.isdir", "os.path.isfile", "os.path.lexists", "os.listdir", "os.scandir",
                     "glob.glob"})


def _looked_for(m: SemanticModel, clock: ast.Call) -> Optional[ast.Call]:
    """A path named from ``clock`` is looked for (``if os.path.exists(save_dir): raise``,
    ``Path(d).exists()``, a listing) other than as the test of an ``if`` that only makes the
    folder (``if not os.path.isdir(d): os.makedirs(d)``): with one name for every rank, a
    rank would find the folder another rank made, and take the other branch."""
    mkdirs = {id(w.call) for w in writers(m) if w.kind == "mkdir"} | {id(call) for call, _ in _project_mkdirs(m)}
    guards = {id(g) for g in _raise_guards(m, clock)}  # asked on rank 0 alone by the migration
    for call in m.nodes(ast.Call):
        f = call.func
        looks = m.is_name(f, _EXISTS) or (isinstance(f, ast.Attribute) and f.attr in ("exists", "is_dir", "iterdir", "glob"))
        what = call.args[0] if m.is_name(f, _EXISTS) and call.args else f.value if isinstance(f, ast.Attribute) else None
        if not looks or what is None or _clock_named(m, what) is not clock:
            continue
        test = next((a for a in m.ancestors(call) if isinstance(a, ast.If)), None)
        only_makes = (test is not None and m.contains(test.test, call) and not test.orelse
                      and all(isinstance(s, ast.Expr) and id(s.value) in mkdirs for s in test.body))
        if not only_makes and not (test is not None and id(test) in guards):
            return call
    return None


def _raise_guards(m: SemanticModel, clock: ast.Call) -> List[ast.If]:
    """``if os.path.exists(save_dir): raise NameError('model dir exists!')`` for a folder named
    from ``clock`` (Face_Pytorch's train scripts): a test that only stops the run, which every
    rank passes alike. With one name for every rank it is asked on rank 0 alone (which alone
    could find a folder left by an earlier run); another rank would find the folder rank 0 just made."""
    from dp2ddp.model.passes import same_passes

    out = []
    for node in m.nodes(ast.If):
        t = node.test
        looked = next(iter(t.args), None) if isinstance(t, ast.Call) else None  # the path looked for
        if (isinstance(t, ast.Call) and m.is_name(t.func, _EXISTS) and looked is not None and _clock_named(m, looked) is clock
                and not node.orelse and len(node.body) == 1 and isinstance(node.body[0], ast.Raise)
                and same_passes(m, node) and not rank_guarded(m, node)):
            out.append(node)
    return out


def _bound_only_here(m: SemanticModel, target: ast.AST) -> bool:
    """``target`` (an assignment's) is a name bound nowhere else, or an attribute of a
    namespace (``args.save = ...``, not ``self``) that the module stores nowhere else."""
    if isinstance(target, ast.Name):
        return len(m.bindings_of(target)) == 1
    if not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id != "self"):
        return False
    owner = m.bindings_of(target.value)
    stores = [t for n in m.nodes(ast.Assign, ast.AugAssign) for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
              if isinstance(t, ast.Attribute) and t.attr == target.attr and isinstance(t.value, ast.Name)
              and t.value.id == target.value.id and m.bindings_of(t.value) == owner]
    return bool(owner) and len(stores) == 1


def _clock_made_alike(ctx: Context, clock: ast.Call):
    """The edit that makes the clock read a folder is named from rank 0's on every rank:
    ``stamp = rank_zero_value(datetime.now().strftime(...))``, one broadcast, where the read
    is one assignment to a name bound nowhere else that every rank runs alike
    (:func:`dp2ddp.model.passes.same_passes`) after the process group is set up; ``True``
    where the file-name migration wraps that assignment already
    (:func:`dp2ddp.codemods.rank_writers.propose`); ``None`` where it cannot be, with why."""
    from dp2ddp.model.clock_paths import clock_named_reads
    from dp2ddp.model.passes import same_passes

    m = ctx.m
    stmt = m.statement_of(clock)
    line = stmt.lineno if stmt is not None else clock.lineno
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and _bound_only_here(m, stmt.targets[0])
            and ctx.bridge.alone_on_line(stmt)):
        return None, f"the clock is read at line {line} in no assignment of one name bound only there"
    if not ctx.in_setup_region(stmt) or rank_guarded(m, stmt) or not same_passes(m, stmt):
        return None, (f"line {line} does not run alike on every rank after the process group is set up (a broadcast "
                      "there would not pair up)")
    looked = _looked_for(m, clock)
    if looked is not None:
        return None, (f"line {looked.lineno} looks for it (`{m.source(looked)}`): with one name, a rank could find what "
                      "another rank made there and take the other branch")
    if any(m.statement_of(b.node) is stmt for c in clock_named_reads(m) for b in m.bindings_of(c.name)):
        return True, None
    helper = ctx.rank_zero_value()
    return Replace(ctx.cst(stmt.value), lambda u: ctx.expr(f"{helper}({{v}})", v=u)), None


def _clock_named(m: SemanticModel, path: Optional[ast.AST]) -> Optional[ast.Call]:
    """The clock read (``datetime.now()``, ``time.strftime(...)``) a folder's name is made
    from, in the script: in the path expression or in what made the names it reads."""
    from dp2ddp.model.flow import origins
    from dp2ddp.model.writers_setup import CLOCK

    if path is None:
        return None
    made, seen, todo = [], set(), [(path, 0)]
    while todo:  # what made the path, and what made the names and attributes it reads, four steps back
        e, depth = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        made.append(e)
        if depth < 4:
            todo.extend((node, depth + 1) for node, _ in origins(m, e) if node is not e)
            todo.extend((x, depth + 1) for x in ast.walk(e) if x is not e and isinstance(x, (ast.Name, ast.Attribute))
                        and isinstance(x.ctx, ast.Load))
    for e in made:
        for c in ast.walk(e):
            if isinstance(c, ast.Call) and m.is_name(c.func, CLOCK):
                return c
    return None
