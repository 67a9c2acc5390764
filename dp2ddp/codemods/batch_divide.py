"""A mixed script's own distributed path reads its batch size per process: where the script
never divides it by the world size, it is divided once where the process group starts
(DDP172), or refused where that cannot be done on every path (DDP152)."""

from __future__ import annotations

import ast
import re
from typing import Dict, List, Optional

from dp2ddp.codemods.context import Context
from dp2ddp.codemods.mixed import MixedPlan
from dp2ddp.engine import Finding, Guard, InsertAfter
from dp2ddp.model.batch_division import Division, division_site
from dp2ddp.model.dp_idioms import GPU_COUNT, identifiers_in
from dp2ddp.model.syntax import is_main_test


def divide_once(ctx: Context, label: str, loader_call: ast.Call, grown: ast.AST, divided: Dict[str, ast.stmt],
                 out: List[Finding]) -> bool:
    """DDP172 for ``grown`` (the batch a mixed script's own-path loader made by
    ``loader_call`` reads per process), once per value; DDP152 where it cannot be divided
    (then True: the loader is refused)."""
    m = ctx.m
    division = division_site(m, loader_call, grown, lambda n: _conditional(m, n, switches(ctx)))
    if not isinstance(division, str) and divided.get(m.source(grown), division.init) is not division.init:
        division = f"it is divided after another start of a process group already (line {divided[m.source(grown)].lineno})"
    if isinstance(division, str):
        out.append(ctx.block(grown, "DDP152", f"{label} reads `batch_size={m.source(grown)}` per process on the "
                             "script's own distributed path, which does not divide it by the world size on every path that runs under torchrun, "
                             f"and dp2ddp cannot divide it there ({division}): under "
                             "torchrun the global batch would be world-size times the DataParallel run's; divide "
                             "it where the process group starts, or pass --keep-batch-size to accept it"))
        return True
    if m.source(grown) not in divided:
        divided[m.source(grown)] = division.init
        out.append(_divide(ctx, label, grown, division))
    return False


def batch_never_divided(m, value: Optional[ast.AST], on: Dict[int, str]) -> Optional[ast.AST]:
    """The batch size ``value`` of a mixed script's DistributedSampler loader (``args.batch_size``)
    when no statement of the script scales that value on every path of its function: HF's
    ``train_batch_size = per_gpu_train_batch_size * max(1, n_gpu)`` is the script's own
    answer; imagenet's ``args.batch_size = int(args.batch_size / ngpus_per_node)`` under
    ``if args.gpu is not None:`` is not (torchrun leaves ``--gpu`` unset); nor is a division
    by anything but a count of processes or GPUs (BERT-NER's ``args.train_batch_size //
    args.gradient_accumulation_steps`` is still the global batch of a micro-step)."""
    if value is None or not isinstance(value, (ast.Name, ast.Attribute)):
        return None
    text = m.source(value)
    for node in m.nodes(ast.Assign, ast.AugAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if not any(m.source(t) == text for t in targets):
            continue
        if _conditional(m, node, on):
            continue  # scaled on one path only (imagenet's `if args.gpu is not None:`): not proven
        if (isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mult))
                and _counts_processes(node.value)):
            return None
        if isinstance(node, ast.Assign) and any(isinstance(b, ast.BinOp) and isinstance(b.op, (ast.Div, ast.FloorDiv, ast.Mult))
                                                and _counts_processes(b) for b in ast.walk(node.value)):
            return None
    return value


# a count per machine, or the list of devices a count is taken of (``len(args.gpu_ids)``)
_PER_NODE = re.compile(r"gpus?_per_node$|nprocs?$|nproc_per_node$|gpu_?ids$", re.IGNORECASE)


def _counts_processes(e: ast.AST) -> bool:
    """``e`` reads a count of processes or GPUs (``n_gpu``, ``ngpus_per_node``,
    ``dist.get_world_size()``, ``len(args.gpu_ids)``; the GPU-count words of
    :data:`dp2ddp.model.dp_idioms.GPU_COUNT`): a scaling of the batch by them."""
    return any(GPU_COUNT.search(i) or _PER_NODE.search(i) for i in identifiers_in(e))


def _divide(ctx: Context, label: str, value: ast.AST, division: Division) -> Finding:
    """DDP172: ``value`` divided by the world size right after the process group starts,
    under torchrun only; the script's own scalings on paths of their own are kept off there."""
    m = ctx.m
    os_, dist = ctx.name("os"), ctx.name("dist")
    text = m.source(value)
    block = ctx.stmt(
        'if "LOCAL_RANK" in {os}.environ:  # dp2ddp: DataParallel split this batch across the GPUs; each process takes its share\n'
        "    if {t} % {d}.get_world_size():\n"
        '        raise SystemExit(f"dp2ddp: batch size {{{t}}} does not split evenly between {{{d}.get_world_size()}} processes; '
        'pass a multiple of the number of processes (DataParallel read it as the global batch)")\n'
        "    {t} //= {d}.get_world_size()\n", os=os_, t=text, d=dist)
    edits: list = [InsertAfter(ctx.bridge.statement(division.init), (block,))]
    for stmt in division.scalings:
        edits.append(Guard((ctx.bridge.statement(stmt),), ctx.expr('"LOCAL_RANK" not in {os}.environ', os=os_)))
    kept = "".join(f"; its own scaling at line {s.lineno} is kept off under torchrun (the value is divided once)" for s in division.scalings)
    return ctx.note(value, "DDP172", f"{label} reads `batch_size={text}` per process on the script's own distributed path: under "
                    f"torchrun it is divided by the world size where the process group starts (line {division.init.lineno}), so the "
                    f"global batch stays the DataParallel run's{kept}", edits)


def switches(ctx: Context) -> Dict[int, str]:
    """The tests that switch a mixed script's distributed path on (``if args.distributed:``,
    and tests spelled the same), by id, with the branch that runs under torchrun
    (:func:`dp2ddp.model.own_path.switch_tests` of mixed.detect_mode's plan)."""
    from dp2ddp.model.own_path import switch_tests

    try:
        plan = ctx.need(MixedPlan)
    except Exception:  # noqa: BLE001 - a plain script has no plan
        return {}
    return {id(t): b for t, b in switch_tests(ctx.m, plan.predicates + plan.env_switched)}


def _conditional(m, node: ast.AST, on: Dict[int, str]) -> bool:
    """``node`` sits under an ``if`` (or a ``try``, a conditional expression) of its
    function that is not the switch of the distributed path (on in its torchrun branch):
    it does not run on every path there."""
    for a, where in m.branches(node):
        if isinstance(a, ast.If):
            if is_main_test(a.test) and m.parent(a) is m.tree:
                continue  # the ``__main__`` guard: the script that runs
            if where != "test" and on.get(id(a.test)) != where:
                return True
        elif isinstance(a, ast.Try) or (isinstance(a, ast.IfExp) and where != "test"):
            return True
    return False
