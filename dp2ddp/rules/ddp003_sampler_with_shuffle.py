from __future__ import annotations

from typing import Iterable

import libcst as cst

from dp2ddp.analysis import DATALOADER_NAMES, Analysis
from dp2ddp.engine import Finding, Fix, Replace
import ast

from dp2ddp.rules.base import GAP, Refs, Rule, calls_to, Shape, Tokens, ast_kwarg, is_true, kwarg


class SamplerWithShuffle(Rule):
    code = "DDP003"
    name = "dataloader-sampler-with-shuffle"
    message = "`DataLoader` is given both a `sampler` and `shuffle=True`; remove `shuffle=True`"
    what = "Checks for a `DataLoader` that receives `sampler=` (or `batch_sampler=`) together with `shuffle=True`."
    why = (
        "The two options are mutually exclusive: `DataLoader` raises `ValueError: sampler option is mutually "
        "exclusive with shuffle` when the script starts. Shuffling is the sampler's job "
        "(`DistributedSampler` shuffles by default and is reseeded by `set_epoch`)."
    )
    fix_doc = "Remove `shuffle=True`; pass `shuffle=` to the sampler instead if needed."
    fixable = True
    needs = (
        Refs(DATALOADER_NAMES, called=True),
        Tokens("sampler"),
        Shape(lambda ix: _shape(ix), "shuffle", pattern=rb"\bshuffle" + GAP + rb"=" + rb"(?:[ \t\r\n\f\\(]|#[^\r\n]*)*" + rb"True\b"),
    )
    keep = (calls_to(DATALOADER_NAMES, lambda c: ast_kwarg(c, "shuffle") is not None),)
    invalid = (
        "from torch.utils.data import DataLoader\nfrom torch.utils.data.distributed import DistributedSampler\n\n"
        "loader = DataLoader(ds, batch_size=64, shuffle=True, sampler=DistributedSampler(ds))\n",
    )
    valid = (
        "from torch.utils.data import DataLoader\nfrom torch.utils.data.distributed import DistributedSampler\n\n"
        "loader = DataLoader(ds, batch_size=64, sampler=DistributedSampler(ds, shuffle=True))\n",
        "from torch.utils.data import DataLoader\n\nloader = DataLoader(ds, batch_size=64, shuffle=True)\n",
        "from torch.utils.data import DataLoader\n\nloader = DataLoader(ds, sampler=None, shuffle=True)\n",
    )

    def check(self, an: Analysis) -> Iterable[Finding]:
        out = []
        for call in an.calls(DATALOADER_NAMES):
            shuffle = kwarg(call, "shuffle")
            if shuffle is None or not is_true(shuffle.value):
                continue
            sampler = kwarg(call, "sampler") or kwarg(call, "batch_sampler")
            if sampler is None or (isinstance(sampler.value, cst.Name) and sampler.value.value == "None"):
                continue
            fix = Fix([Replace(call, _drop_kwarg("shuffle"))], description="remove shuffle=True")
            out.append(self.finding(shuffle, fix=fix))
        return out


def _shape(ix) -> bool:
    """Pre-filter: some call has ``shuffle=True`` and a ``sampler=``/``batch_sampler=`` other than ``None``."""
    for call in ix.of(ast.Call):
        shuffle = ast_kwarg(call, "shuffle")
        if shuffle is None or not (isinstance(shuffle.value, ast.Constant) and shuffle.value.value is True):
            continue
        sampler = ast_kwarg(call, "sampler") or ast_kwarg(call, "batch_sampler")
        if sampler is not None and not (isinstance(sampler.value, ast.Constant) and sampler.value.value is None):
            return True
    return False


def _drop_kwarg(name: str):
    def apply(updated: cst.Call) -> cst.Call:
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
