"""What a migration code's entry holds (:class:`MigrationCode`), and the pieces its
examples are made of (:func:`script`: a whole tiny training script around the lines that
matter; :data:`EVAL`: one with an evaluation loader)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MigrationCode:
    code: str
    name: str
    severity: str  # info | warning | error
    summary: str
    why: str
    fix: str  # what the migration does, or what a human should do
    fix_safety: str
    example: str = ""  # a DataParallel script that draws this code
    example_after: str = ""  # what the migration makes of it ("" for warnings and errors)


IMPORTS = "import torch\nimport torch.nn as nn\n\n"
STEP = (
    "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "loss = model(torch.randn(8, 4)).sum()\nloss.backward()\nopt.step()\n"
)


def script(body: str) -> str:
    """An example as a whole (tiny) training script: the imports, the lines that matter,
    one training step."""
    return IMPORTS + "model = nn.Linear(4, 1)\n" + body + STEP


EVAL = (
    IMPORTS + "from torch.utils.data import DataLoader, TensorDataset\n\n"
    "model = nn.DataParallel(nn.Linear(4, 3))\n"
    "test_loader = DataLoader(TensorDataset(torch.randn(40, 4), torch.randint(0, 3, (40,))), batch_size=8)\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "model(torch.randn(8, 4)).sum().backward()\nopt.step()\n"
)
