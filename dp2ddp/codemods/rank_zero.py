"""Only rank 0 writes checkpoints and (by default) prints progress; every rank computes.

Consecutive statements that save (``torch.save``), make checkpoint folders
(``os.mkdir``/``os.makedirs``, ``if not os.path.isdir(d): os.mkdir(d)``), copy checkpoint
files (``shutil.copyfile``/``copy``/``copy2``) or print go under one
``if dist.get_rank() == 0:``. ``dist.get_rank()`` is the global rank, so this stays right
on several nodes. Statements already under a rank test are left alone, and so is code
that runs before the process group exists or after it is destroyed.
"""

from __future__ import annotations

from typing import List

import libcst as cst

from dp2ddp.analysis import code
from dp2ddp.codemods.context import MigrationContext
from dp2ddp.engine import Finding, Fix, Guard

CODE_SAVE = "DDP132"
CODE_PRINT = "DDP133"

SAVE_CALLS = {
    "torch.save",
    "os.mkdir",
    "os.makedirs",
    "shutil.copyfile",
    "shutil.copy",
    "shutil.copy2",
}
RANK_WORDS = ("rank", "is_main", "main_process", "master")


def _call_of(stmt) -> cst.Call | None:
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr):
        value = stmt.body[0].value
        if isinstance(value, cst.Call):
            return value
    return None


def _kind(ctx: MigrationContext, stmt) -> str | None:
    call = _call_of(stmt)
    if call is not None:
        if ctx.an.is_name(call.func, SAVE_CALLS):
            return "save"
        if not ctx.options.print_all_ranks and ctx.an.is_name(call.func, {"builtins.print"}):
            return "print"
        return None
    if (
        isinstance(stmt, cst.If)
        and stmt.orelse is None
        and isinstance(stmt.body, cst.IndentedBlock)
        and stmt.body.body
        and all(_kind(ctx, s) == "save" for s in stmt.body.body)
    ):
        return "save"
    return None


def _under_rank_test(ctx: MigrationContext, stmt) -> bool:
    for a in ctx.an.ancestors(stmt):
        if isinstance(a, cst.If) and any(w in code(a.test).lower() for w in RANK_WORDS):
            return True
        if isinstance(a, cst.FunctionDef) and any(w in a.name.value.lower() for w in ("main_process", "rank0", "rank_zero")):
            return True
    return False


def propose(ctx: MigrationContext) -> List[Finding]:
    an = ctx.an
    findings: List[Finding] = []
    blocks = [an.module] + an.nodes_of(cst.IndentedBlock)
    for block in blocks:
        owner = an.parent(block) if isinstance(block, cst.IndentedBlock) else None
        if owner is not None and _kind(ctx, owner) is not None:
            continue  # the whole compound statement is guarded as one
        run: List[cst.CSTNode] = []
        kinds: set = set()
        for stmt in list(block.body) + [None]:
            kind = _kind(ctx, stmt) if stmt is not None else None
            if kind is not None and ctx.in_setup_region(stmt) and not _under_rank_test(ctx, stmt):
                run.append(stmt)
                kinds.add(kind)
                continue
            if run:
                findings.append(_guard(ctx, run, kinds))
            run, kinds = [], set()
    return findings


def _guard(ctx: MigrationContext, run, kinds) -> Finding:
    if "save" in kinds:
        f = ctx.note(run[0], CODE_SAVE, "checkpoint writing runs on rank 0 only")
    else:
        f = ctx.note(run[0], CODE_PRINT, "progress printing runs on rank 0 only (--print-all-ranks keeps it on every rank)")
    f.fix = Fix([Guard(tuple(run), ctx.rank0_test())])
    return f
