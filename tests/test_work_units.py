"""Units of the issue-20 work: the Enclose edit, the step condition read before the
forward, and the generated rank_share (its padding matches the loader sharding's)."""

from __future__ import annotations

import textwrap
import types

import libcst as cst
import pytest

from dp2ddp.engine import Enclose, Guard, apply_edits
from dp2ddp.migrate import migrate_source
from dp2ddp.model.core import build
from dp2ddp.model.accumulation import accumulations
from dp2ddp.templates import load


def test_enclose_takes_a_guarded_statement_inside_it():
    module = cst.parse_module("a = 1\nprint(a)\nb = 2\nc = 3\n")
    a, p, b, _ = module.body
    with_block = cst.parse_statement("with ctx():\n    pass\n")
    edits = [Enclose((a, p, b), with_block), Guard((p,), cst.parse_expression("rank == 0"))]
    out = apply_edits(module, edits).code
    assert out == "with ctx():\n    a = 1\n    if rank == 0:\n        print(a)\n    b = 2\nc = 3\n"


def _condition(src: str):
    accs = accumulations(build(textwrap.dedent(src)))
    assert len(accs) == 1
    return accs[0]


_LOOP = """\
import torch
model = torch.nn.DataParallel(torch.nn.Linear(2, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
n = 0
for i, x in enumerate(data):
    loss = model(x).sum()
    loss.backward()
{between}
    if {test}:
        opt.step()
"""


@pytest.mark.parametrize(
    "between, test, read",
    [
        ("    pass", "(i + 1) % 4 == 0", "(i + 1) % 4 == 0"),
        ("    n += 1", "n % 4 == 0", "(n + 1) % 4 == 0"),  # a counter set after the forward, read ahead
        ("    n += 2\n    n -= 1", "n % k == 0 and n > 0", "(n + 1) % k == 0 and n + 1 > 0"),
    ],
    ids=["loop-index", "counter", "counter-twice"],
)
def test_step_condition_read_before_the_forward(between, test, read):
    acc = _condition(_LOOP.format(between=between, test=test))
    assert acc.problem is None and acc.condition == read


@pytest.mark.parametrize(
    "between, test, why",
    [
        ("    m = i + 1", "m % 4 == 0", "`m` is set at line 8, after the forward"),
        ("    if i:\n        n += 1", "n % 4 == 0", "`n` is set at line 9, after the forward"),  # not every pass
        ("    pass", "ready(i) % 2", "it calls `ready()`"),
    ],
    ids=["name-set-after-forward", "counter-under-if", "call"],
)
def test_step_condition_that_cannot_be_read(between, test, why):
    acc = _condition(_LOOP.format(between=between, test=test))
    assert acc.condition is None and acc.problem.startswith(why)


def test_a_scheduler_stepped_every_pass_does_not_hide_the_accumulation():
    src = _LOOP.format(between="    sched.step()", test="(i + 1) % 4 == 0").replace(
        "n = 0\n", "n = 0\nsched = torch.optim.lr_scheduler.StepLR(opt, 2)\n"
    )
    assert _condition(src).condition == "(i + 1) % 4 == 0"


def _rank_share(rank: int, world: int):
    fake = types.SimpleNamespace(is_initialized=lambda: True, get_rank=lambda: rank, get_world_size=lambda: world)
    import torch

    scope = {"torch": torch, "dist": fake}
    exec(load("rank_share.py.tmpl").format(rank_share="rank_share", torch="torch", dist="dist"), scope)
    return scope["rank_share"]


def test_rank_share_splits_pads_and_follows_dim():
    import numpy as np
    import torch

    x = torch.arange(10)
    parts = [_rank_share(r, 4)(x) for r in range(4)]
    # ceil(10 / 4) = 3 each, the last one padded by repeating the batch's first items
    assert [p.tolist() for p in parts] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 0, 1]]
    cols = torch.arange(12).view(3, 4)
    assert _rank_share(1, 2)(cols, dim=1).tolist() == [[2, 3], [6, 7], [10, 11]]
    assert _rank_share(1, 2)(cols, dim=1).is_contiguous()
    h, c = _rank_share(0, 2)((torch.zeros(1, 4, 3), torch.ones(1, 4, 3)), dim=1)
    assert h.shape == c.shape == (1, 2, 3)
    assert _rank_share(1, 2)(np.arange(5)).tolist() == [3, 4, 0]
    assert _rank_share(1, 3)(["a", "b", "c", "d"]) == ["c", "d"]
    assert _rank_share(1, 2)(7) == 7 and _rank_share(1, 2)("text") == "text"


def test_rank_share_is_defined_once_and_reads_the_world_at_call_time():
    src = textwrap.dedent(
        """\
        import torch
        x = torch.randn(64, 2)
        model = torch.nn.DataParallel(torch.nn.Linear(2, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(0, 64, 16):
            model(x[i:i + 16]).sum().backward()
            opt.step()
        for i in range(0, 64, 8):
            model(x[i:i + 8]).sum().backward()
            opt.step()
        """
    )
    out = migrate_source(src.encode(), "t.py").output.decode()
    assert out.count("def rank_share(") == 1
    assert "model(rank_share(x[i:i + 16]))" in out and "model(rank_share(x[i:i + 8]))" in out
