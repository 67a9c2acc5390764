"""``dist.barrier()`` after a rank-0 write of a file the script reads again (part of
:mod:`rank_zero`, not a transform of its own).

A file that only rank 0 writes (a save :mod:`rank_zero` guarded, or a file a function of
the script opens for writing that :mod:`rank_writers` routes to rank 0) may not exist yet
when another rank reads it: :func:`barriers` puts a barrier after the write where a read
of the same path follows (directly, or through a function of the script or of a project
module that reads the path it is given); :func:`routed_write_sites` gives the calls of such writing functions.
"""

from __future__ import annotations

import ast
from typing import List, Optional, Set, Tuple

from dp2ddp.codemods.context import Context
from dp2ddp.model.clock_paths import clock_named_reads
from dp2ddp.engine import Finding, InsertAfter
from dp2ddp.model.call_args import (FROM_PRETRAINED_PARAMS, LOAD_PARAMS, NUMPY_LOAD_PARAMS, OPEN_PARAMS, READ_CSV_PARAMS,
                                    STREAM_PARAMS, argument)
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.names import LOAD, OPEN
from dp2ddp.model.ranks import rank_guarded
from dp2ddp.model.writers import SHELL_RUNS, open_mode, writer_of, writers, writes_mode


def routed_write_sites(ctx: Context) -> List[Tuple[ast.stmt, ast.stmt]]:
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


READS = LOAD | {"numpy.load", "json.load", "pickle.load", "yaml.safe_load", "yaml.load", "pandas.read_csv",
               "scipy.io.loadmat", "numpy.loadtxt", "numpy.genfromtxt"}  # (Face_Pytorch reads its features back with loadmat)
# a function that hands a path to another program reads that file too (RepBERT's
# ``eval_results(path)`` runs the MS MARCO scorer on the ranking it was given)
RUNS = SHELL_RUNS | {"subprocess.check_output"}


def _written_paths(m: SemanticModel, stmt: ast.stmt) -> List[str]:
    """The paths ``stmt`` writes, as ``ast.dump`` texts."""
    out = []
    for node in ast.walk(stmt):
        w = writer_of(m, node) if isinstance(node, ast.Call) else None
        if w is not None and w.kind in ("save", "copy", "open") and w.path is not None:
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
        out.extend(_path_args(m, node))
    return out


def _path_args(m: SemanticModel, call: ast.Call) -> List[str]:
    """The arguments of ``call`` that name a path, as ``ast.dump`` texts."""
    return [ast.dump(a) for a in list(call.args) + [k.value for k in call.keywords] if _path_like(m, a)]


def _companion_paths(m: SemanticModel, stmt: ast.stmt) -> List[str]:
    """What the call of a project function that writes files (``save_weights(model, path)``,
    a companion write :mod:`rank_writers` runs on rank 0) in ``stmt`` writes under: its
    arguments that name a path, as ``ast.dump`` texts."""
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    return _path_args(m, call) if isinstance(call, ast.Call) else []


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
        if q & READS or (q & OPEN and not _writes(call)) or (isinstance(call.func, ast.Attribute) and call.func.attr == "from_pretrained"):
            arg = _read_path(q, call)  # by the callee's signature: ``torch.load(f=path)`` too
            if arg is not None:
                out.append((call, ast.dump(arg)))
    return out


def _read_path(q, call: ast.Call) -> Optional[ast.AST]:
    """The path (or stream) a reading call is given."""
    if q & LOAD:
        return argument(call, LOAD_PARAMS, "f")
    if q & OPEN:
        return argument(call, OPEN_PARAMS, "file")
    if "numpy.load" in q:
        return argument(call, NUMPY_LOAD_PARAMS, "file")
    if "pandas.read_csv" in q:
        return argument(call, READ_CSV_PARAMS, "filepath_or_buffer")
    for name, params in STREAM_PARAMS.items():
        if name in q:
            return argument(call, params, params[0])
    return argument(call, FROM_PRETRAINED_PARAMS, FROM_PRETRAINED_PARAMS[0])


def _writes(call: ast.Call) -> bool:
    """``open(path, mode)`` that may write (a mode that is not a literal may)."""
    mode = open_mode(call)
    return mode is None or writes_mode(mode)


def _reads_files(m: SemanticModel, func) -> bool:
    """The function (or one it calls) reads a file: torch.load, open for reading, np.load ...,
    or runs another program (which reads what it is given)."""
    for call in m.reached_calls(func):
        q = m.qualified_names(call.func)
        if q & READS or q & RUNS or (q & OPEN and not _writes(call)):
            return True
    return False


def _callee_reads(m: SemanticModel, call: ast.Call) -> bool:
    """``call`` runs a function that reads a file: one of the script's, or of the project's
    own modules (``mrr = eval_results(rank_output)``, utils.py opening the path it is given)."""
    from dp2ddp.model.project_defs import project_def

    t = m.resolve_call(call)
    if t is not None:
        return _reads_files(m, t)
    found = project_def(m, call.func)
    if found is None or not isinstance(found[1], (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    return _reads_files(found[0], found[1])


def _reads_after(m: SemanticModel, stmt: ast.stmt) -> List[ast.Call]:
    """The calls after ``stmt``, in its function, that read a file on every rank: directly
    (``torch.load``, ``open`` to read) or through a function of the script or of a project
    module (open-reid's ``load_checkpoint(osp.join(logs, 'model_best.pth.tar'))`` after
    ``save_checkpoint(state, is_best, fpath=osp.join(logs, 'checkpoint.pth.tar'))``, whose
    copy makes the best file the load reads). What a project helper writes cannot be told
    by its arguments alone (a name it derives, a copy beside it): any read after it may be
    of its files."""
    func = m.enclosing_function(stmt)
    out = []
    for call in m.nodes(ast.Call):
        if (call.lineno, call.col_offset) <= (stmt.end_lineno or stmt.lineno, stmt.end_col_offset or 0):
            continue
        if m.enclosing_function(call) is not func or rank_guarded(m, call):
            continue
        q = m.qualified_names(call.func)
        if q & READS or (q & OPEN and not _writes(call)) or _callee_reads(m, call):
            out.append(call)
    return out


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


def barriers(ctx: Context, guarded: List[Tuple[ast.stmt, ast.stmt]], routed: bool = False,
             companion: bool = False, local: bool = False) -> List[Finding]:
    """``dist.barrier()`` after a rank-0 write of a file the script reads later (directly, or
    through a function of the script that reads the path it is given). ``routed``: the
    statements call a script function whose writes go to os.devnull on other ranks; its
    path arguments (a string, ``args.data``: not a whole options namespace) must reach a
    reading call after it in the same function. ``companion``: the statements call a
    project function that only writes, run on rank 0 (its path arguments are what it
    writes). ``local``: only reads in the function that writes count (a file opened for
    writing on rank 0 and read back a few lines below)."""
    m = ctx.m
    if not guarded:
        return []
    reads = _read_paths(m)
    out = []
    done: Set[int] = set()
    for stmt, last in guarded:
        paths = _call_paths(m, stmt) if routed else _companion_paths(m, stmt) if companion else _written_paths(m, stmt)
        if companion and not paths:
            paths = ["<the files the helper writes>"]  # (a path made by a call: ``osp.join(logs, name)``; see _reads_after)
        for path in paths:
            later = [] if routed else [c for c, p in reads if p == path and ((c.lineno, c.col_offset) > (stmt.lineno, stmt.col_offset) or m.enclosing_function(c) is not m.enclosing_function(stmt))]
            for call in m.nodes(ast.Call):
                if (call.lineno, call.col_offset) <= (stmt.lineno, stmt.col_offset):
                    continue
                if routed and m.enclosing_function(call) is not m.enclosing_function(stmt):
                    continue
                if any(ast.dump(a) == path for a in list(call.args) + [k.value for k in call.keywords]) and _callee_reads(m, call):
                    later.append(call)
            # a name read from the clock, handed on after the write (``args.eval_from = model_path``
            # then ``linear_eval(args)``): every rank reads rank 0's name (rank_writers), then the file
            later += [c.read for c in clock_named_reads(m) if ast.dump(c.name) == path
                      and m.enclosing_function(c.read) is m.enclosing_function(stmt) and c.read not in later]
            if local:
                later = [c for c in later if m.enclosing_function(c) is m.enclosing_function(stmt)]
            if companion and not later:
                later = _reads_after(m, stmt)
            if not later:
                continue
            anchor = _barrier_anchor(m, last, later)
            if id(anchor) in done or not ctx.bridge.alone_on_line(anchor):
                continue
            done.add(id(anchor))
            barrier = ctx.barrier()
            out.append(
                ctx.note(stmt, "DDP132", f"dist.barrier() after the rank-0 write: line {later[0].lineno} reads the file on every rank",
                         [InsertAfter(ctx.bridge.statement(anchor), (barrier,))])
            )
    return out


def _every_rank_passes(m: SemanticModel, stmt: ast.stmt) -> bool:
    """``stmt`` runs in the script's main flow: at module level (the main guard included), or
    in a function called only from there; not in a method or a helper a rank test may keep
    to rank 0 (timm's ``CheckpointSaver.save_checkpoint``, called on rank 0 alone)."""
    func = m.enclosing_function(stmt)
    seen = set()
    while func is not None:
        if id(func) in seen:
            return False
        seen.add(id(func))
        sites = m.call_sites(func)
        if not sites or len({id(m.enclosing_function(s)) for s in sites}) != 1 or any(rank_guarded(m, s) for s in sites):
            return False
        func = m.enclosing_function(sites[0])
    return True


def removal_barriers(ctx: Context, guarded: List[Tuple[ast.stmt, ast.stmt]]) -> List[Finding]:
    """``dist.barrier()`` after a rank-0 removal among the ``guarded`` writes
    (``shutil.rmtree(log_dir)``, ``os.system("rm -r ...")``): every rank goes on once the
    files are gone. Without it another rank makes the folder again, or opens a file in it,
    before rank 0 deletes it (the log rank 0 opened next lost, an ``exists()`` test passed on
    one rank and ``rmtree`` failing on the other)."""
    m = ctx.m
    out = []
    done: Set[int] = set()
    for stmt, last in guarded:
        if not any(isinstance(n, ast.Call) and getattr(writer_of(m, n), "kind", None) == "remove" for n in ast.walk(stmt)):
            continue
        if not _every_rank_passes(m, stmt):
            continue  # rank 0 deletes alone, and no rank waits (a method only rank 0 may call would hang the others)
        anchor = _barrier_anchor(m, last, [])
        if id(anchor) in done or not ctx.bridge.alone_on_line(anchor):
            continue
        done.add(id(anchor))
        barrier = ctx.barrier()
        out.append(ctx.note(stmt, "DDP132", "dist.barrier() after the rank-0 removal: every rank goes on once the files "
                            "are gone", [InsertAfter(ctx.bridge.statement(anchor), (barrier,))]))
    return out
