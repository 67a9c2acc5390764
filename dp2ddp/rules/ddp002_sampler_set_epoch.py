"""DDP002: a `DistributedSampler` loader iterated per epoch without `set_epoch`."""

from __future__ import annotations

import ast
from typing import Optional

from dp2ddp.model.collectives import assigned_keys, var_key
from dp2ddp.model.epochs import calls_set_epoch, epoch_loops
from dp2ddp.model.loaders import is_false, loaders
from dp2ddp.model.names import DATALOADER, DISTRIBUTED_SAMPLER
from dp2ddp.model.syntax import FUNCTIONS
from dp2ddp.model.syntax import kwarg
from dp2ddp.rules.base import Hit, Invalid, Rule, Valid, tails


def _shuffles(m, call: ast.Call) -> bool:
    k = kwarg(call, "shuffle")
    return k is None or not is_false(k.value)


def _is_iterated(m, node: ast.AST) -> bool:
    """``node`` is the iterable of a ``for`` or a comprehension, or an argument of a call
    (``enumerate(loader)``, ``train(model, loader)``; not ``len``/``next``)."""
    child = node
    for a in m.ancestors(node):
        if isinstance(a, (ast.For, ast.AsyncFor, ast.comprehension)):
            return child is a.iter
        if isinstance(a, ast.Call) and child is not a.func:
            f = a.func
            name = f.id if isinstance(f, ast.Name) else None
            if name in ("iter", "next", "len"):
                return name == "iter"
            return True
        if isinstance(a, ast.stmt):
            return False
        child = a
    return False


def _epoch_loop(m, node: ast.AST) -> Optional[ast.AST]:
    """The loop around the iteration that is not the batch loop itself."""
    loops = []
    for a in m.ancestors(node):
        if isinstance(a, (ast.For, ast.AsyncFor, ast.While)):
            loops.append(a)
        if isinstance(a, FUNCTIONS + (ast.Lambda,)):
            break
    if loops and isinstance(loops[0], (ast.For, ast.AsyncFor)) and m.contains(loops[0].iter, node):
        loops = loops[1:]
    return loops[0] if loops else None


def check(m):
    samplers = [c for c in m.calls(DISTRIBUTED_SAMPLER) if _shuffles(m, c)]
    if not samplers:
        return
    sampler_calls = {id(s) for s in samplers}
    sampler_vars = {k for s in samplers for k in assigned_keys(m, s)}
    loader_vars = set()
    inline = []
    epoch_of = set()  # the epoch loops of those loaders, as the migration reads them (one definition)
    made = []  # the DataLoader calls of those loaders: a loop that builds one is not its epoch loop
    for ld in loaders(m):
        if ld.sampler is None:
            continue
        v = ld.sampler.value
        if id(v) in sampler_calls or id(ld.sampler_value) in sampler_calls or var_key(m, v) in sampler_vars:
            keys = assigned_keys(m, ld.call)
            loader_vars.update(keys)
            made.append(ld.call)
            epoch_of.update(id(lp) for lp, _ in epoch_loops(m, ld))
            if not keys:
                inline.append(ld.call)
    seen = set()
    spelled = {k[2] for k in loader_vars}  # "loader", "self.loader"
    names = [n for n in m.nodes(ast.Name) if n.id in spelled]
    attrs = [n for n in m.nodes(ast.Attribute) if "self." + n.attr in spelled]
    candidates = sorted(
        (n for n in names + attrs if isinstance(n.ctx, ast.Load) and var_key(m, n) in loader_vars and _is_iterated(m, n)),
        key=lambda n: (n.lineno, n.col_offset),
    )
    for node in candidates + [c for c in inline if _is_iterated(m, c)]:
        loop = _epoch_loop(m, node)
        if loop is None or id(loop) not in epoch_of or id(loop) in seen or calls_set_epoch(m, loop):
            continue
        seen.add(id(loop))
        yield Hit(node)


RULE = Rule(
    code="DDP002",
    name="distributed-sampler-without-set-epoch",
    message="`DistributedSampler` loader is iterated in an epoch loop without `sampler.set_epoch(epoch)`",
    what=(
        "Checks for a `DataLoader` with a `DistributedSampler` that is iterated (or handed to a function) "
        "inside an epoch loop that never calls `set_epoch` (also looked for in the functions the loop calls)."
    ),
    why=(
        "`DistributedSampler` seeds its shuffle with `seed + epoch`. Without `set_epoch`, the epoch stays 0, "
        "so every epoch visits the data in exactly the same order on every rank — shuffling silently stops, "
        "which usually costs accuracy."
    ),
    fix="Call `sampler.set_epoch(epoch)` (or `loader.sampler.set_epoch(epoch)`) at the start of each epoch.",
    fix_safety="",
    gate=(tails(DISTRIBUTED_SAMPLER), tails(DATALOADER)),
    check=check,
    examples=(
        Invalid(
            "from torch.utils.data import DataLoader, DistributedSampler\n\n"
            "sampler = DistributedSampler(dataset)\nloader = DataLoader(dataset, batch_size=32, sampler=sampler)\n"
            "for epoch in range(10):\n    for batch in loader:\n        step(batch)\n",
            6, 18, end=(6, 24),
        ),
        Invalid(
            "import torch.utils.data as tud\n\n"
            "loader = tud.DataLoader(ds, sampler=tud.distributed.DistributedSampler(ds))\n"
            "for epoch in range(epochs):\n    train_one_epoch(model, loader)\n",
            5, 28, end=(5, 34),
        ),
        Valid(
            "from torch.utils.data import DataLoader, DistributedSampler\n\n"
            "sampler = DistributedSampler(dataset)\nloader = DataLoader(dataset, batch_size=32, sampler=sampler)\n"
            "for epoch in range(10):\n    sampler.set_epoch(epoch)\n    for batch in loader:\n        step(batch)\n"
        ),
        Valid(
            "from torch.utils.data import DataLoader, DistributedSampler\n\n"
            "loader = DataLoader(ds, sampler=DistributedSampler(ds, shuffle=False))\n"
            "for epoch in range(10):\n    for batch in loader:\n        step(batch)\n"
        ),
        Valid(
            "from torch.utils.data import DataLoader, DistributedSampler\n\n"
            "loader = DataLoader(ds, sampler=DistributedSampler(ds))\n"
            "def run(epoch):\n    loader.sampler.set_epoch(epoch)\n    for b in loader:\n        step(b)\n"
            "for epoch in range(10):\n    run(epoch)\n"
        ),
        Valid(  # set_epoch in a subclass's override of a hook the base loop calls
            "from torch.utils.data import DataLoader, DistributedSampler\n\n"
            "class Base:\n    def fit(self):\n        for epoch in range(10):\n            self.before_epoch(epoch)\n"
            "            for b in self.loader:\n                self.step(b)\n\n    def before_epoch(self, epoch):\n        pass\n\n"
            "class Trainer(Base):\n    def __init__(self, ds):\n        self.loader = DataLoader(ds, sampler=DistributedSampler(ds))\n\n"
            "    def before_epoch(self, epoch):\n        self.loader.sampler.set_epoch(epoch)\n"
        ),
    ),
)
