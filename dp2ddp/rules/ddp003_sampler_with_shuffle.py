"""DDP003: a `DataLoader` given both a `sampler` and `shuffle=True`."""

from __future__ import annotations

from dp2ddp.findings import Fix
from dp2ddp.model.loaders import loaders
from dp2ddp.model.names import DATALOADER
from dp2ddp.model.syntax import is_const
from dp2ddp.rules.base import Hit, Invalid, Rule, Valid, tails


def _drop_kwarg(name: str):
    def apply(updated):  # a libcst.Call
        args = list(updated.args)
        for i, a in enumerate(args):
            if a.keyword is not None and a.keyword.value == name:
                if i == len(args) - 1 and i > 0:
                    # the last argument goes: its comma (trailing or none) moves to the new last one
                    args[i - 1] = args[i - 1].with_changes(comma=a.comma)
                del args[i]
                break
        return updated.with_changes(args=args)

    return apply


def _remove_shuffle(call):
    def build(bridge):
        from dp2ddp.engine import Replace

        return [Replace(bridge.cst(call), _drop_kwarg("shuffle"))]

    return build


def check(m):
    for ld in loaders(m):
        if ld.shuffle is None or not is_const(ld.shuffle.value, True):
            continue
        sampler = ld.sampler or ld.batch_sampler
        if sampler is None or is_const(sampler.value, None):
            continue
        fix = Fix(build=_remove_shuffle(ld.call), description="remove shuffle=True")
        yield Hit(ld.shuffle, fix=fix)


_IMPORTS = "from torch.utils.data import DataLoader\nfrom torch.utils.data.distributed import DistributedSampler\n\n"

RULE = Rule(
    code="DDP003",
    name="dataloader-sampler-with-shuffle",
    message="`DataLoader` is given both a `sampler` and `shuffle=True`; remove `shuffle=True`",
    what="Checks for a `DataLoader` that receives `sampler=` (or `batch_sampler=`) together with `shuffle=True`.",
    why=(
        "The two options are mutually exclusive: `DataLoader` raises `ValueError: sampler option is mutually "
        "exclusive with shuffle` when the script starts. Shuffling is the sampler's job "
        "(`DistributedSampler` shuffles by default and is reseeded by `set_epoch`)."
    ),
    fix="Remove `shuffle=True`; pass `shuffle=` to the sampler instead if needed.",
    fix_safety="Safe: the script raised `ValueError` at this line; without `shuffle=True` the sampler decides the order.",
    fixable=True,
    gate=(tails(DATALOADER), ("shuffle",), ("sampler", "batch_sampler"), ("True",)),
    check=check,
    examples=(
        Invalid(
            _IMPORTS + "loader = DataLoader(ds, batch_size=64, shuffle=True, sampler=DistributedSampler(ds))\n",
            4, 40, end=(4, 52),
            fixed=_IMPORTS + "loader = DataLoader(ds, batch_size=64, sampler=DistributedSampler(ds))\n",
        ),
        Valid(_IMPORTS + "loader = DataLoader(ds, batch_size=64, sampler=DistributedSampler(ds, shuffle=True))\n"),
        Valid("from torch.utils.data import DataLoader\n\nloader = DataLoader(ds, batch_size=64, shuffle=True)\n"),
        Valid("from torch.utils.data import DataLoader\n\nloader = DataLoader(ds, sampler=None, shuffle=True)\n"),
    ),
)
