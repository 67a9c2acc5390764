from __future__ import annotations

from typing import Iterable, List, Optional, Set

import libcst as cst

from dp2ddp.analysis import DATALOADER_NAMES, DISTRIBUTED_SAMPLER_NAMES, Analysis
from dp2ddp.engine import Finding
from dp2ddp.rules.base import Keep, Refs, Rule, Text, assigned_names, kwarg, scope_key, spelled


class SamplerSetEpochMissing(Rule):
    code = "DDP002"
    name = "distributed-sampler-without-set-epoch"
    message = "`DistributedSampler` loader is iterated in an epoch loop without `sampler.set_epoch(epoch)`"
    what = (
        "Checks for a `DataLoader` with a `DistributedSampler` that is iterated (or handed to a function) "
        "inside an epoch loop that never calls `set_epoch` (also looked for in the functions the loop calls)."
    )
    why = (
        "`DistributedSampler` seeds its shuffle with `seed + epoch`. Without `set_epoch`, the epoch stays 0, "
        "so every epoch visits the data in exactly the same order on every rank — shuffling silently stops, "
        "which usually costs accuracy."
    )
    fix_doc = "Call `sampler.set_epoch(epoch)` (or `loader.sampler.set_epoch(epoch)`) at the start of each epoch."
    needs = (Refs(DISTRIBUTED_SAMPLER_NAMES, called=True),)
    # loaders/samplers, `set_epoch`, functions using a module-level loader variable; the
    # epoch loop's callees are followed, so callers of kept functions stay too
    keep = (
        Keep(Text(refs=DATALOADER_NAMES | DISTRIBUTED_SAMPLER_NAMES, assigned=DATALOADER_NAMES)),
        Keep(Text(words=r"set_epoch")),
    )
    keep_callers = True
    invalid = (
        "from torch.utils.data import DataLoader, DistributedSampler\n\n"
        "sampler = DistributedSampler(dataset)\nloader = DataLoader(dataset, batch_size=32, sampler=sampler)\n"
        "for epoch in range(10):\n    for batch in loader:\n        step(batch)\n",
        "import torch.utils.data as tud\n\n"
        "loader = tud.DataLoader(ds, sampler=tud.distributed.DistributedSampler(ds))\n"
        "for epoch in range(epochs):\n    train_one_epoch(model, loader)\n",
    )
    valid = (
        "from torch.utils.data import DataLoader, DistributedSampler\n\n"
        "sampler = DistributedSampler(dataset)\nloader = DataLoader(dataset, batch_size=32, sampler=sampler)\n"
        "for epoch in range(10):\n    sampler.set_epoch(epoch)\n    for batch in loader:\n        step(batch)\n",
        "from torch.utils.data import DataLoader, DistributedSampler\n\n"
        "loader = DataLoader(ds, sampler=DistributedSampler(ds, shuffle=False))\n"
        "for epoch in range(10):\n    for batch in loader:\n        step(batch)\n",
        "from torch.utils.data import DataLoader, DistributedSampler\n\n"
        "loader = DataLoader(ds, sampler=DistributedSampler(ds))\n"
        "def run(epoch):\n    loader.sampler.set_epoch(epoch)\n    for b in loader:\n        step(b)\n"
        "for epoch in range(10):\n    run(epoch)\n",
    )

    def check(self, an: Analysis) -> Iterable[Finding]:
        samplers = [c for c in an.calls(DISTRIBUTED_SAMPLER_NAMES) if not _no_shuffle(c)]
        if not samplers:
            return []
        sampler_vars: Set[tuple] = set()
        for s in samplers:
            sampler_vars.update((scope_key(an, s), n) for n in assigned_names(an, s))
        loader_vars: Set[tuple] = set()
        inline_loaders: List[cst.Call] = []
        for call in an.calls(DATALOADER_NAMES):
            arg = kwarg(call, "sampler")
            if arg is None:
                continue
            v = arg.value
            if any(v is s for s in samplers) or _visible(an, v, spelled(v), sampler_vars):
                names = assigned_names(an, call)
                loader_vars.update((scope_key(an, call), n) for n in names)
                if not names:
                    inline_loaders.append(call)
        out: List[Finding] = []
        seen: Set[cst.CSTNode] = set()
        for node in an.nodes_of(cst.Name, cst.Attribute):
            name = spelled(node)
            if name is None or not _visible(an, node, name, loader_vars) or not _is_iterated(an, node):
                continue
            self._report(an, node, seen, out)
        for call in inline_loaders:
            if _is_iterated(an, call):
                self._report(an, call, seen, out)
        return out

    def _report(self, an: Analysis, node, seen, out) -> None:
        loop = _epoch_loop(an, node)
        if loop is None or loop in seen:
            return
        if _calls_set_epoch(an, loop):
            return
        seen.add(loop)
        out.append(self.finding(node))


def _visible(an: Analysis, node: cst.CSTNode, name: Optional[str], variables: Set[tuple]) -> bool:
    """``name`` at ``node`` is one of ``variables`` (same function, or module level)."""
    return name is not None and ((scope_key(an, node), name) in variables or (an.module, name) in variables)


def _no_shuffle(call: cst.Call) -> bool:
    arg = kwarg(call, "shuffle")
    return arg is not None and isinstance(arg.value, cst.Name) and arg.value.value == "False"


def _is_iterated(an: Analysis, node: cst.CSTNode) -> bool:
    """The loader is the iterable of a ``for`` (possibly through enumerate/tqdm/...) or is
    passed to a function call."""
    child = node
    for a in an.ancestors(node):
        if isinstance(a, cst.For):
            return child is a.iter
        if isinstance(a, (cst.CompFor,)):
            return child is a.iter
        if isinstance(a, cst.Arg):
            call = an.parent(a)
            if isinstance(call, cst.Call):
                ident = spelled(call.func) or ""
                if ident in {"iter", "next", "len"}:
                    return ident == "iter"
                # f(loader) / enumerate(loader) / tqdm(loader): iterated there or by the loop above
                return True
        if isinstance(a, cst.BaseStatement):
            return False
        child = a
    return False


def _epoch_loop(an: Analysis, node: cst.CSTNode) -> Optional[cst.CSTNode]:
    """The outer loop around the iteration (the epoch loop), if any."""
    loops = []
    for a in an.ancestors(node):
        if isinstance(a, (cst.For, cst.While)):
            loops.append(a)
        if isinstance(a, (cst.FunctionDef, cst.Lambda)):
            break
    # the innermost loop may be the batch loop itself: ``for batch in loader``
    if loops and isinstance(loops[0], cst.For) and an.contains(loops[0].iter, node):
        loops = loops[1:]
    return loops[0] if loops else None


def _calls_set_epoch(an: Analysis, loop: cst.CSTNode) -> bool:
    todo = [loop]
    seen = set()
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        for call in an.calls_in(n):
            if isinstance(call.func, cst.Attribute) and call.func.attr.value == "set_epoch":
                return True
            target = an.resolve_call_target(call, an.enclosing_class(call))
            if target is not None:
                todo.append(target)
    return False
