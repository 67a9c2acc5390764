"""DDP170: a load into the wrapped model after the wrap takes either key form. The migrated
script really runs (plain `python`, a world of one, and torchrun with 2 CPU ranks) on a
checkpoint saved from a DataParallel wrapper (`module.` keys) and on one saved from the bare
model, and loads the same weights from both."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dp2ddp.migrate import Options, migrate_bytes
from tests._scripts import run_python, run_torchrun

ORIGINAL = b'''import sys
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
if torch.cuda.is_available():
    model = nn.DataParallel(model)
model.load_state_dict(torch.load(sys.argv[1], map_location="cpu"))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
print("loaded", float(sum(p.detach().double().sum() for p in model.parameters())))
model(torch.randn(8, 4)).sum().backward()
opt.step()
'''


@pytest.mark.torchrun
def test_a_load_after_the_wrap_takes_module_prefixed_and_plain_checkpoints(tmp_path: Path) -> None:
    result = migrate_bytes(ORIGINAL, "train.py", Options())
    text = result.output.decode()
    assert "load_either_keys(model.module)(torch.load(sys.argv[1]" in text, text
    assert any(n.code == "DDP170" for n in result.migration.notes), [n.code for n in result.migration.notes]
    script = tmp_path / "train_ddp.py"
    script.write_bytes(result.output)
    torch.manual_seed(1)
    bare = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    torch.save(bare.state_dict(), tmp_path / "plain.pt")
    torch.save(torch.nn.DataParallel(bare).state_dict(), tmp_path / "prefixed.pt")
    assert all(k.startswith("module.") for k in torch.load(tmp_path / "prefixed.pt"))
    want = f"loaded {float(sum(p.detach().double().sum() for p in bare.parameters()))}"
    for ckpt in ("plain.pt", "prefixed.pt"):
        r = run_python(script, tmp_path, str(tmp_path / ckpt))
        assert r.returncode == 0 and want in r.stdout, r.stdout[-3000:]
        r = run_torchrun(script, tmp_path, str(tmp_path / ckpt))
        assert r.returncode == 0 and want in r.stdout, r.stdout[-3000:]
