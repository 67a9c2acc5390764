from __future__ import annotations

from typing import Iterable, List, Set

import libcst as cst

from dp2ddp.analysis import DDP_NAMES, Analysis
from dp2ddp.engine import Finding
import ast

from dp2ddp.rules.base import (
    DDP_CODE,
    COLLECTIVES,
    GET_RANK,
    Nodes,
    RANK_WORD,
    Refs,
    Rule,
    Shape,
    ast_terminal,
    ast_walk_branch,
    ast_words,
    if_branches,
    is_ddp_forward,
    rank_conditionals,
)


class CollectiveInRankBranch(Rule):
    code = "DDP009"
    name = "collective-in-rank-conditional"
    message = "`{what}` inside a block only some ranks enter: the other ranks never join and the job hangs"
    what = (
        "Checks for collective calls (`dist.all_reduce`, `dist.barrier`, `dist.broadcast`, `all_gather`, "
        "`new_group`, ...) and forward passes of a `DistributedDataParallel` model inside an `if` whose test "
        "depends on the rank (`if rank == 0:`, `if dist.get_rank() == 0:`, `if is_main_process():`). A branch "
        "is fine when every other branch of the same `if` makes the same collective call."
    )
    why = (
        "A collective completes only when every rank of the group calls it. If only rank 0 enters the block, "
        "rank 0 waits forever for the others (until the NCCL timeout, 30 minutes by default). A DDP forward "
        "is a collective too: in training mode it synchronises buffers and prepares the gradient all-reduce, "
        "so evaluating the wrapped model on rank 0 only hangs or desynchronises the ranks."
    )
    fix_doc = (
        "Call the collective on every rank, outside the `if`; keep only the rank-specific work (printing, "
        "saving) inside. Evaluate with `model.module(...)` (the unwrapped model) when only one rank runs it."
    )
    needs = (
        DDP_CODE,
        Refs(COLLECTIVES | set(DDP_NAMES)),
        # RANK_WORD matches in any case (os.environ["RANK"], IS_MASTER)
        Shape(lambda ix: _shape(ix), "rank", "master", "main", "primary", "chief", "leader", ignore_case=True),
    )
    # every `if` on the rank with a collective or a call of a DDP-wrapped variable in a
    # branch, and the assignments of DDP-wrapped ``self.`` attributes (``ddp_wrapped``)
    keep = (
        Nodes((ast.If,), lambda n, names: _rank_if(n, names)),
        Nodes((ast.Assign, ast.AnnAssign, ast.AugAssign), lambda n, names: _wraps(n, names)),
    )
    invalid = (
        "import torch.distributed as dist\n\nif dist.get_rank() == 0:\n    save(model)\n    dist.barrier()\n",
        "import torch.distributed as dist\n\ndef log(loss, rank):\n    if rank == 0:\n        dist.all_reduce(loss)\n"
        "        print(loss.item())\n",
        "from torch.nn.parallel import DistributedDataParallel as DDP\n\nmodel = DDP(net, device_ids=[rank])\n"
        "if rank == 0:\n    out = model(batch)\n",
    )
    valid = (
        "import torch.distributed as dist\n\ndist.all_reduce(loss)\nif dist.get_rank() == 0:\n    print(loss.item())\n",
        "import torch.distributed as dist\n\nif rank == 0:\n    dist.broadcast(t, src=0)\nelse:\n    dist.broadcast(t, src=0)\n",
        "from torch.nn.parallel import DistributedDataParallel as DDP\n\nmodel = DDP(net, device_ids=[rank])\n"
        "if rank == 0:\n    out = model.module(batch)\n",
        "import torch.distributed as dist\n\nif world_size > 1:\n    dist.barrier()\n",
    )

    def check(self, an: Analysis) -> Iterable[Finding]:
        out: List[Finding] = []
        collectives = an.calls(COLLECTIVES)
        for call in collectives:
            ifs = list(rank_conditionals(an, call))
            if not ifs:
                continue
            names = an.qnames(call.func) & COLLECTIVES
            short = sorted(n.rsplit(".", 1)[1] for n in names)[0]
            if all(_other_branches_call(an, node, branch, names) for node, branch in ifs):
                continue
            out.append(self.finding(call, self.message.format(what=f"{short}()")))
        for call in an.nodes_of(cst.Call):
            if is_ddp_forward(an, call) and next(rank_conditionals(an, call), None) is not None:
                out.append(self.finding(call, self.message.format(what="DDP forward")))
        return out


_DDP = Refs(DDP_NAMES)


def _tests_rank(test, get_rank) -> bool:
    """The ``if`` test may depend on the rank (what ``mentions_rank`` can see): a word like
    the rank, or a call spelled like ``get_rank`` (one of ``get_rank``)."""
    return any(RANK_WORD.search(w) for w in ast_words(test)) or any(
        isinstance(c, ast.Call) and ast_terminal(c.func) in get_rank for c in ast.walk(test)
    )


def _shape(ix) -> bool:
    """Pre-filter: an ``if`` whose test may depend on the rank holds, in one of its
    branches (same function), a call that may be a collective — or any call of a name or
    ``self.x`` when the module refers to DistributedDataParallel (a DDP forward)."""
    collectives = ix.facts.spellings(COLLECTIVES)
    get_rank = ix.facts.spellings(GET_RANK)
    forwards = None
    for node in ix.of(ast.If):
        if not _tests_rank(node.test, get_rank):
            continue
        for n in ast_walk_branch(node.body + node.orelse):
            if not isinstance(n, ast.Call):
                continue
            if ast_terminal(n.func) in collectives:
                return True
            f = n.func
            if isinstance(f, ast.Name) or (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self"):
                if forwards is None:
                    forwards = ix.refers(_DDP)
                if forwards:
                    return True
    return False


def _rank_if(node: ast.If, names) -> bool:
    """For pruning: ``node`` tests something about the rank and a branch (same function)
    calls something spelled like a collective or a DDP-wrapped variable."""
    if not _tests_rank(node.test, names.spellings(GET_RANK)):
        return False
    collectives = names.spellings(COLLECTIVES)
    wrapped = names.assigned(DDP_NAMES)
    for n in ast_walk_branch(node.body + node.orelse):
        if isinstance(n, ast.Call):
            f = n.func
            if ast_terminal(f) in collectives:
                return True
            if isinstance(f, ast.Name) and f.id in wrapped:
                return True
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self" and f.attr in wrapped:
                return True
    return False


def _wraps(node, names) -> bool:
    """For pruning: ``self.x = <something spelled like DDP>(...)``, which a forward in
    another method can see (a plain variable wrapped in a function is only seen there,
    and that function is kept when it holds a forward)."""
    v = node.value
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return (
        isinstance(v, ast.Call)
        and ast_terminal(v.func) in names.spellings(DDP_NAMES)
        and any(isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self" for t in targets)
    )


def _other_branches_call(an: Analysis, node: cst.If, branch: cst.CSTNode, names: Set[str]) -> bool:
    """Every branch of the if chain (an implicit empty ``else`` included) calls ``names``."""
    branches = if_branches(node)
    chain_has_else = _has_else(node)
    if not chain_has_else:
        return False
    for b in branches:
        if not any(an.is_name(c.func, names) for c in an.calls_in(b)):
            return False
    return True


def _has_else(node: cst.If) -> bool:
    cur = node.orelse
    while isinstance(cur, cst.If):
        cur = cur.orelse
    return cur is not None
