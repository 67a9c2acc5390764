"""A loop over the training loader that trains nothing (loader_handoffs.read_outside_training):
a statistic the training uses (class weights summed over the labels) is refused, since each
rank would compute it over its own share; a peek at the first batch and an evaluation over
the training set (a metric each rank reports) are not."""

from __future__ import annotations

import pytest

from dp2ddp.migrate import migrate_source

_SCRIPT = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

data = TensorDataset(torch.randn(64, 4), (torch.rand(64, 3) > 0.5).float())
trainloader = DataLoader(data, batch_size=8, shuffle=True)
model = nn.DataParallel(nn.Linear(4, 3))
{before}
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in trainloader:
        opt.zero_grad()
        nn.functional.binary_cross_entropy_with_logits(model(x), y, pos_weight=weights).backward()
        opt.step()
"""

_WEIGHTS = """\
weights = torch.zeros(3)
for _, y in trainloader:
    weights += y.sum(0)
weights = weights / len(data)
"""


def _codes(before: str):
    result = migrate_source(_SCRIPT.format(before=before).encode(), "train.py")
    return result, {f.code: f.message for f in result.migration.findings if f.severity == "error"}


def test_a_statistic_the_training_uses_is_refused() -> None:
    result, errors = _codes(_WEIGHTS)
    assert "DDP105" in errors, errors
    assert "the loop at line 9 also reads it and trains nothing" in errors["DDP105"]
    assert not result.changed


@pytest.mark.parametrize("before", [
    "weights = torch.ones(3)\nfor x, _ in trainloader:\n    n_features = x.size(1)\n    break\n",  # a peek
    "weights = torch.ones(3)\ncorrect = 0\nwith torch.no_grad():\n    for x, y in trainloader:\n"
    "        correct += ((model(x) > 0).float() == y).sum().item()\nprint(correct)\n",  # an evaluation
])
def test_a_peek_or_an_evaluation_over_the_training_set_migrates(before: str) -> None:
    result, errors = _codes(before)
    assert not errors, errors
    assert b"shard_loader(DataLoader(" in result.output
