"""Where the migration defines its helpers (``Context.helper_anchor``): after the imports at
the top, or below a later top-level import of a module they name that nothing imported
before; never below module-level code that the migration makes call them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dp2ddp.migrate import Options, migrate_bytes

TRAIN = """\
{head}
from torch.utils.data import DataLoader, TensorDataset

loader = DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=4, shuffle=True)
{late}
model = torch.nn.DataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for (x,) in loader:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
print("done")
"""


def _migrated_runs(tmp_path: Path, source: str) -> str:
    result = migrate_bytes(source.encode(), "train.py", Options())
    assert result.changed and not result.migration.blocked, [f.message for f in result.migration.findings]
    out = result.output.decode()
    (tmp_path / "train_ddp.py").write_text(out)
    r = subprocess.run([sys.executable, "train_ddp.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "done" in r.stdout, r.stderr[-2000:]
    return out


def test_a_module_imported_again_below_module_level_code_keeps_the_helpers_at_the_top(tmp_path: Path) -> None:
    """``import os`` again below the module-level loader: the helpers stay above that loader,
    which the migration makes call ``shard_loader``."""
    out = _migrated_runs(tmp_path, TRAIN.format(head="import os\nimport torch", late="import os"))
    assert out.index("def shard_loader(") < out.index("loader = shard_loader(")


def test_a_module_first_imported_below_a_setting_call_moves_the_helpers_below_it(tmp_path: Path) -> None:
    """Autoformer's ``exp_main.py``: ``import torch`` first below ``logging.basicConfig(...)``, the
    loader made inside a function. The helpers, which name torch, go below that import (above
    it, the module raised NameError at import) and the migration runs."""
    src = ("import logging\nlogging.basicConfig(level=logging.INFO)\nimport torch\n"
           "from torch.utils.data import DataLoader, TensorDataset\n\n\ndef main():\n"
           "    loader = DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=4, shuffle=True)\n"
           "    model = torch.nn.DataParallel(torch.nn.Linear(4, 1))\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
           "    for (x,) in loader:\n        opt.zero_grad()\n        model(x).sum().backward()\n        opt.step()\n"
           "    print('done')\n\n\nif __name__ == '__main__':\n    main()\n")
    out = _migrated_runs(tmp_path, src)
    assert out.index("\nimport torch\n") < out.index("class ShardedBatches")
