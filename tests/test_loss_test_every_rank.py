"""An optimizer step under a test of the loss (issue 18, SiamMask's `if
is_valid_number(loss.item()): optimizer.step()`): migrated, every rank tests the ranks'
losses averaged (`loss_of_every_rank`, DDP181). Here one rank's share of a batch has an
infinite loss and the other's a finite one: the original (one process, the whole batch)
skips that step; so must every rank of the migration, and the replicas end alike and equal
to the original's parameters. Without the all-reduce, rank 0 would step and rank 1 skip."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dp2ddp.migrate import Options, migrate_bytes
from tests._scripts import retry_exit_abort, run_script

SCRIPT = '''\
import os
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
x = torch.randn(16, 3)
y = torch.randn(16, 1)
y[7] = float("inf")  # the first batch's last sample: rank 1's share under DDP
loader = DataLoader(TensorDataset(x, y), batch_size=8)
model = nn.DataParallel(nn.Linear(3, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
steps = 0
for xb, yb in loader:
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(xb), yb)
    loss.backward()
    if torch.isfinite(loss):
        optimizer.step()
        steps += 1
weights = [round(float(v), 6) for v in model.module.weight.flatten()]
import sys
sys.stdout.write("RESULT %s %d %s\\n" % (os.environ.get("RANK", "-"), steps, weights))  # one write: ranks do not interleave
'''


def _results(output: str):
    return {m.group(1): (int(m.group(2)), m.group(3)) for m in re.finditer(r"RESULT (\S+) (\d+) (\[[^\]]*\])", output)}


@pytest.mark.torchrun
def test_every_rank_skips_the_step_the_whole_batch_would_skip(tmp_path: Path) -> None:
    result = migrate_bytes(SCRIPT.encode(), "train.py", Options(print_all_ranks=True))
    assert "DDP181" in [f.code for f in result.migration.findings]
    (tmp_path / "orig").mkdir()
    (tmp_path / "orig" / "train.py").write_text(SCRIPT)
    (tmp_path / "ddp").mkdir()
    (tmp_path / "ddp" / "train.py").write_bytes(result.output)
    original = run_script(["train.py"], tmp_path / "orig")
    assert original.returncode == 0, original.stdout[-3000:]
    migrated = retry_exit_abort(lambda: run_script(["train.py"], tmp_path / "ddp", nproc=2), "loss test")
    assert migrated.returncode == 0, migrated.stdout[-3000:]
    want = _results(original.stdout)["-"]
    assert want[0] == 1  # the first batch (an infinite loss) skipped, the second stepped
    got = _results(migrated.stdout)
    assert set(got) == {"0", "1"}
    assert got["0"][0] == got["1"][0] == 1
    assert got["0"][1] == got["1"][1]
    orig_w = [float(v) for v in want[1].strip("[]").split(",")]
    ddp_w = [float(v) for v in got["0"][1].strip("[]").split(",")]
    assert all(abs(a - b) < 1e-5 for a, b in zip(orig_w, ddp_w)), (orig_w, ddp_w)
