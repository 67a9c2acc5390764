"""DDP009: a collective (or a DDP forward) that only some ranks reach."""

from __future__ import annotations

import ast
from typing import List, Optional

from dp2ddp.model.collectives import call_reaches, collective_sites, is_ddp_code
from dp2ddp.model.names import BARRIER, COLLECTIVES, DDP
from dp2ddp.model.ranks import rank_split_conditionals, runs_undistributed_only, splits_ranks
from dp2ddp.model.dp_idioms import is_elif
from dp2ddp.rules.base import DDP_CODE, Hit, Invalid, Rule, Text, Valid, literal, tails

MESSAGE = "`{what}` inside a block only some ranks enter: the other ranks never join and the job hangs"


def _branches(m, node: ast.AST) -> Optional[List[ast.AST]]:
    """The branches of the ``if`` chain that starts at ``node`` (each ``elif`` and the
    ``else``); ``None`` when the chain has no ``else`` (some ranks run none of them)."""
    if isinstance(node, ast.IfExp):
        return [node.body, node.orelse]
    out: List[ast.AST] = []
    cur = node
    while True:
        out.append(ast.Module(body=cur.body, type_ignores=[]))
        if len(cur.orelse) == 1 and isinstance(cur.orelse[0], ast.If) and is_elif(m, cur.orelse[0]):
            cur = cur.orelse[0]
            continue
        if not cur.orelse:
            return None
        out.append(ast.Module(body=cur.orelse, type_ignores=[]))
        return out


def _every_branch_calls(m, node: ast.AST, call: ast.Call) -> bool:
    """Every branch of the ``if`` (an implicit empty ``else`` included) makes the same
    call as ``call``: the same collective, or the same function of the module."""
    branches = _branches(m, node)
    if branches is None:
        return False
    names = m.qualified_names(call.func) & COLLECTIVES
    target = m.resolve_call(call) if not names else None
    if not names and target is None:
        return False

    def same(c: ast.Call) -> bool:
        return m.is_name(c.func, names) if names else m.resolve_call(c) is target

    return all(any(same(c) for c in m.calls_in(b)) for b in branches)


def _rank_blocks(m) -> List[ast.AST]:
    """Calls in a branch of an ``if`` (or conditional expression) on the rank, in the
    same function, in source order."""
    seen = {}
    for node in m.nodes(ast.If) + m.nodes(ast.IfExp):
        if not splits_ranks(m, node.test):
            continue
        parts = [node.body, node.orelse] if isinstance(node, ast.IfExp) else node.body + node.orelse
        for part in parts:
            for call in m.calls_in(part):
                seen[id(call)] = call
    return sorted(seen.values(), key=lambda c: (c.lineno, c.col_offset))


def _paired_barrier(m, call: ast.Call, ifs) -> bool:
    """HF's idiom: ``if local_rank not in [-1, 0]: barrier()`` (the others wait) ... later
    ``if local_rank == 0: barrier()`` (rank 0 releases them): a barrier under a rank test
    is matched by another barrier under a different rank test in the same function."""
    if not m.is_name(call.func, BARRIER):
        return False
    func = m.enclosing_function(call)
    test = m.source(ifs[0][0].test)
    for other in m.calls(BARRIER):
        if other is call or m.enclosing_function(other) is not func:
            continue
        around = list(rank_split_conditionals(m, other))
        if around and around[0][0] is not ifs[0][0] and m.source(around[0][0].test) != test:
            return True
    return False


def check(m):
    if not is_ddp_code(m) or not collective_sites(m):
        return
    for call in _rank_blocks(m):
        what = call_reaches(m, call, unguarded=True)
        if what is None or runs_undistributed_only(m, call):
            continue
        ifs = list(rank_split_conditionals(m, call))
        if not ifs:
            continue
        if all(_every_branch_calls(m, node, call) for node, _branch in ifs):
            continue
        if _paired_barrier(m, call, ifs):
            continue
        yield Hit(call, MESSAGE.format(what=what))


RULE = Rule(
    code="DDP009",
    name="collective-in-rank-conditional",
    message=MESSAGE,
    what=(
        "Checks for collective calls (`dist.all_reduce`, `dist.barrier`, `dist.broadcast`, `all_gather`, "
        "`new_group`, ...), the construction and the forward pass of a `DistributedDataParallel` model, and calls "
        "of the script's own functions that reach one of them (on every rank that calls them), inside an `if` (or a "
        "conditional expression) whose "
        "test depends on the rank (`if rank == 0:`, `if dist.get_rank() == 0:`, `if is_main_process():`; not "
        "`if args.local_rank != -1:`, which asks whether the script runs distributed and holds on every rank). A branch "
        "is fine when every other branch of the same `if` makes the same collective call, and a barrier is fine "
        "when the same function has another barrier under a different rank test (the paired-barrier idiom of "
        "Hugging Face scripts: the other ranks wait at the first, rank 0 releases them at the second)."
    ),
    why=(
        "A collective completes only when every rank of the group calls it. If only rank 0 enters the block, "
        "rank 0 waits forever for the others (until the NCCL timeout, 30 minutes by default). A DDP forward "
        "is a collective too: in training mode it synchronises buffers and prepares the gradient all-reduce, "
        "so evaluating the wrapped model on rank 0 only hangs or desynchronises the ranks."
    ),
    fix=(
        "Call the collective on every rank, outside the `if`; keep only the rank-specific work (printing, "
        "saving) inside. Evaluate with `model.module(...)` (the unwrapped model) when only one rank runs it, its "
        "inputs on the model's device: the DDP wrapper (like DataParallel) moved them there, the module does not "
        "(`rewrite` hands `fed_like_the_wrapper(model.module)`, which moves them as the wrapper did)."
    ),
    fix_safety="",
    gate=(
        DDP_CODE,
        # what mentions_rank reads, in any case (os.environ["RANK"], IS_MASTER, is_main_process())
        tuple(Text(w, ignore_case=True) for w in ("rank", "master", "main", "primary", "chief", "leader"))
        + literal("RANK", "LOCAL_RANK", ignore_case=True)[1:],
        tails(COLLECTIVES, DDP),
    ),
    check=check,
    examples=(
        Invalid("import torch.distributed as dist\n\nif dist.get_rank() == 0:\n    save(model)\n    dist.barrier()\n", 5, 5, end=(5, 19)),
        Invalid(  # a rank helper that calls itself
            "import torch.distributed as dist\n\ndef is_main(rank=None):\n    if rank is None:\n"
            "        return is_main(dist.get_rank())\n    return rank == 0\n\nif is_main():\n    dist.barrier()\n",
            9, 5, end=(9, 19),
        ),
        Invalid(
            "import torch.distributed as dist\n\ndef log(loss, rank):\n    if rank == 0:\n        dist.all_reduce(loss)\n"
            "        print(loss.item())\n",
            5, 9, end=(5, 30),
        ),
        Invalid(
            "from torch.nn.parallel import DistributedDataParallel as DDP\n\nmodel = DDP(net, device_ids=[rank])\n"
            "if rank == 0:\n    out = model(batch)\n",
            5, 11, end=(5, 23),
        ),
        Invalid(
            "import torch.distributed as dist\n\ndef evaluate(model, data):\n    loss = model(data)\n    dist.all_reduce(loss)\n"
            "    return loss\n\nif dist.get_rank() == 0:\n    print(evaluate(model, data))\n",
            9, 11, end=(9, 32),
        ),
        Valid("import torch.distributed as dist\n\ndist.all_reduce(loss)\nif dist.get_rank() == 0:\n    print(loss.item())\n"),
        Valid("import torch.distributed as dist\n\nif rank == 0:\n    dist.broadcast(t, src=0)\nelse:\n    dist.broadcast(t, src=0)\n"),
        Valid(
            "from torch.nn.parallel import DistributedDataParallel as DDP\n\nmodel = DDP(net, device_ids=[rank])\n"
            "if rank == 0:\n    out = model.module(batch)\n"
        ),
        Valid("import torch.distributed as dist\n\nif world_size > 1:\n    dist.barrier()\n"),
        Valid(
            "import torch\n\ndef main(args):\n    if args.local_rank not in [-1, 0]:\n        torch.distributed.barrier()\n"
            "    model = load_pretrained(args.model)\n    if args.local_rank == 0:\n        torch.distributed.barrier()\n"
        ),
    ),
)
