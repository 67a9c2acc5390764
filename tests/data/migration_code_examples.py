"""DataParallel scripts that draw each migration code (DDP1xx), for tests/test_registry.py.

``EXAMPLES[code]`` is a script on which the migration (``dp2ddp rewrite``, and ``dp2ddp
check --fix`` through DDP001) reports ``code``; a code whose ``MigrationCode.example`` in
``dp2ddp/migration_codes/`` draws it needs no entry here. ``NOT_EMITTED`` lists the codes
no script draws yet, with why (their tests are expected failures until that changes).
"""

from __future__ import annotations

_HEAD = """\
import argparse
import os

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
"""

# one training script that draws most of the notes: 100 108 113 120 130-136
TRAIN = _HEAD + '''from torch.utils.tensorboard import SummaryWriter


def evaluate(model, loader):
    model.eval()
    total = 0.0
    with torch.no_grad():
        for x, y in loader:
            total += nn.functional.mse_loss(model(x.cuda(0)), y.cuda(0)).item()
    return total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    device = torch.device("cuda:0")
    train_set = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    val_set = TensorDataset(torch.randn(16, 8), torch.randn(16, 1))
    train_loader = DataLoader(train_set, batch_size=16, shuffle=True, num_workers=2)
    val_loader = DataLoader(val_set, batch_size=16)
    model = nn.Sequential(nn.Linear(8, 1)).to(device)
    if os.path.exists("ckpt.pt"):
        model.load_state_dict(torch.load("ckpt.pt"))
    model = nn.DataParallel(model)
    writer = SummaryWriter("runs")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
        writer.add_scalar("loss", loss.item(), epoch)
        print("epoch", epoch, evaluate(model, val_loader))
        os.makedirs("ckpt", exist_ok=True)
        torch.save(model.module.state_dict(), "ckpt.pt")


if __name__ == "__main__":
    main()
'''


def _script(setup: str, loop: str = "", after: str = "") -> str:
    """A small training script: ``setup`` builds ``model`` (and may wrap it), ``loop`` runs
    inside the epoch loop after the optimizer step, ``after`` after training."""
    indent = lambda text, n: "".join(" " * n + line + "\n" if line else "\n" for line in text.splitlines())  # noqa: E731
    return (
        _HEAD
        + "\n\ndef main():\n"
        + "    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))\n"
        + "    loader = DataLoader(data, batch_size=16, shuffle=True)\n"
        + indent(setup, 4)
        + "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        + "    for epoch in range(2):\n"
        + "        for x, y in loader:\n"
        + "            optimizer.zero_grad()\n"
        + "            loss = nn.functional.mse_loss(model(x), y)\n"
        + "            loss.backward()\n"
        + "            optimizer.step()\n"
        + indent(loop, 8)
        + indent(after, 4)
        + "\n\nif __name__ == \"__main__\":\n    main()\n"
    )


EXAMPLES = {code: TRAIN for code in ("DDP100", "DDP108", "DDP113", "DDP120", "DDP130", "DDP132", "DDP133", "DDP134", "DDP135", "DDP136")}

# a script with its own distributed path (HF `--local_rank` style): its DistributedSampler
# needs set_epoch in the epoch loop (DDP131) or, with no epoch loop to find, a human (DDP106)
_MIXED = _HEAD + '''from torch.utils.data import RandomSampler
from torch.utils.data.distributed import DistributedSampler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    args = parser.parse_args()
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    sampler = RandomSampler(data) if args.local_rank == -1 else DistributedSampler(data)
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    model = nn.Linear(8, 1)
    if args.local_rank != -1:
        torch.distributed.init_process_group(backend="nccl")
        model = nn.parallel.DistributedDataParallel(model, device_ids=[args.local_rank])
    else:
        model = nn.DataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    LOOP


if __name__ == "__main__":
    main()
'''
EXAMPLES["DDP131"] = _MIXED.replace("    LOOP\n", """    for epoch in range(2):
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
""")
EXAMPLES["DDP106"] = _MIXED.replace("    LOOP\n", """    batches = iter(loader)
    x, y = next(batches)
    nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
""")
EXAMPLES.update(
    {
        "DDP102": _script("model = Net()\nmodel.features = nn.DataParallel(model.features)\nmodel.cuda()\n").replace(
            "\n\ndef main():",
            "\n\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.features = nn.Linear(8, 8)\n"
            "        self.head = nn.Linear(8, 1)\n\n    def forward(self, x):\n        return self.head(self.features(x))\n\n\ndef main():",
        ),
        "DDP103": _script("model = nn.Linear(8, 1)\nif torch.cuda.device_count() > 1:\n    model = nn.DataParallel(model)\n"),
        "DDP104": _HEAD
        + "import torch.multiprocessing as mp\n\n\ndef worker(rank):\n    pass\n"
        + _script("model = nn.DataParallel(nn.Linear(8, 1))\nif os.environ.get(\"SPAWN\"):\n    mp.spawn(worker, nprocs=2)\n")[len(_HEAD):],
        "DDP105": _script("model = nn.DataParallel(nn.Linear(8, 1))\n").replace(
            "loader = DataLoader(data, batch_size=16, shuffle=True)", "loader = DataLoader(Stream(), batch_size=None)"
        ).replace("\n\ndef main():", "\n\nclass Stream(torch.utils.data.IterableDataset):\n    def __iter__(self):\n"
                  "        return iter([(torch.randn(8), torch.randn(1))] * 64)\n\n\ndef main():"),
        "DDP109": _script("model = nn.DataParallel(nn.Linear(8, 1).to(\"cuda:1\"))\n"),
        # a project helper that removes and recreates its folder on every rank (PROJECT_MODULES)
        "DDP110": _HEAD + "from saver import Saver\n" + _script("model = nn.DataParallel(nn.Linear(8, 1))\nsaver = Saver(\"runs\")\n")[len(_HEAD):],
        "DDP114": _HEAD + "from saver import Saver\n" + _script("model = nn.DataParallel(nn.Linear(8, 1))\nsaver = Saver(\"runs\")\n")[len(_HEAD):],
        "DDP112": _script(
            "model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 1))\nfor p in model[0].parameters():\n    p.requires_grad = False\n"
            "model = nn.DataParallel(model)\n",
            "if epoch == 1:\n    for p in model.module[0].parameters():\n        p.requires_grad = True\n",
        ),
        "DDP115": _HEAD + "\n\nmodel = nn.DataParallel(nn.Linear(8, 1))\nmodel.eval()\nwith torch.no_grad():\n    print(model(torch.randn(4, 8)))\n",
        "DDP121": _script(
            "parser = argparse.ArgumentParser()\nparser.add_argument(\"--local_rank\", type=int, default=-1)\nargs = parser.parse_args()\n"
            "model = nn.Linear(8, 1)\nif args.local_rank != -1:\n    torch.distributed.init_process_group(backend=\"nccl\")\n"
            "    model = nn.parallel.DistributedDataParallel(model, device_ids=[args.local_rank])\nelse:\n    model = nn.DataParallel(model)\n"
        ),
        "DDP122": _script("model = nn.DataParallel(nn.Linear(8, 1))\nn_gpu = torch.cuda.device_count()\n").replace(
            "            loss.backward()\n", "            if n_gpu > 1:\n                loss = loss.mean()\n            loss.backward()\n"
        ),
        "DDP123": _HEAD.replace("import torch.nn as nn\n", "import torch.nn as nn\nimport torch.nn.parallel\n")
        + '''

class Net(nn.Module):
    def __init__(self, ngpu):
        super().__init__()
        self.ngpu = ngpu
        self.main = nn.Linear(8, 1)

    def forward(self, x):
        if x.is_cuda and self.ngpu > 1:
            return nn.parallel.data_parallel(self.main, x, range(self.ngpu))
        return self.main(x)
'''
        + _script("model = Net(2)\n")[len(_HEAD):],
        "DDP124": _script("model = nn.DataParallel(Net())\nprint(model.num_classes)\n").replace(
            "\n\ndef main():", "\n\nclass Net(nn.Linear):\n    num_classes = 1\n\n    def __init__(self):\n        super().__init__(8, 1)\n\n\ndef main():"
        ),
        "DDP125": _script(
            "model = nn.DataParallel(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 1)))\n",
            "if epoch == 1:\n    for p in model.module[0].parameters():\n        p.requires_grad = False\n",
        ),
    }
)



def example(code: str, fallback: str = "") -> str:
    """The script that draws ``code``: ours, or ``MigrationCode.example`` (given the usual
    imports when it has none)."""
    if code in EXAMPLES:
        return EXAMPLES[code]
    if fallback and "import" not in fallback:
        return _HEAD + "\n" + fallback
    return fallback


# a checkpoint helper of the project (PROJECT_MODULES) handed a wrapper that ran only with several GPUs
EXAMPLES["DDP189"] = _HEAD + "from ckpt import save\n" + _script(
    "model = nn.Linear(8, 1)\nif torch.cuda.device_count() > 1:\n    model = nn.DataParallel(model)\n",
    after="save(model, \"model.pt\")\n")[len(_HEAD):]
EXAMPLES["DDP111"] = EXAMPLES["DDP123"].replace("model = Net(2)\n", "model = build_model()\n")  # no instance of Net here

# codes no DataParallel script draws yet (code -> why), for the lead's migration to settle
NOT_EMITTED: dict = {
    "DDP175": "drawn by the project migration (rewrite --with-helpers) on a helper other scripts import, not by one "
              "file's migration: tests/test_project.py tests it",
}

# codes drawn only under a rewrite option (code -> dp2ddp.migrate.Options keywords); `check
# --fix` runs the migration with the default options, so only the rewrite is asked for them
OPTIONS: dict = {"DDP160": {"shard_eval": True}, "DDP161": {"shard_eval": True}}

# codes drawn only with a project module beside the script (file name -> text), written
# next to the example before it is migrated
PROJECT_MODULES: dict = {
    "DDP189": {  # a checkpoint helper handed the wrapper: this file's migration does not edit it
        "ckpt.py": "import torch\n\n\ndef save(model, path):\n    torch.save(model.state_dict(), path)\n",
    },
    "DDP185": {  # a trainer class that keeps the step it is handed and calls it where it trains
        "trainer.py": (
            "class Trainer:\n    def __init__(self, model, step_fn, optimizer):\n"
            "        self.model, self.step_fn, self.optimizer = model, step_fn, optimizer\n\n"
            "    def fit(self, batches):\n        for batch in batches:\n            loss = self.step_fn(self.model, batch)\n"
            "            self.optimizer.zero_grad()\n            loss.backward()\n            self.optimizer.step()\n"
        ),
    },
    "DDP110": {  # it also keeps the folder in a module global: rank 0 cannot run it alone
        "saver.py": (
            "import os\nimport shutil\n\nLAST = None\n\n\nclass Saver:\n    def __init__(self, folder):\n"
            "        global LAST\n        if os.path.exists(folder):\n            shutil.rmtree(folder)\n        os.makedirs(folder)\n"
            "        LAST = folder\n"
        ),
    },
    "DDP114": {
        "saver.py": (
            "import os\nimport shutil\n\n\nclass Saver:\n    def __init__(self, folder):\n"
            "        if os.path.exists(folder):\n            shutil.rmtree(folder)\n        os.makedirs(folder)\n"
        ),
    },
    "DDP151": {
        "models.py": (
            "import torch.nn as nn\n\n\n"
            "def build_model():\n    return nn.DataParallel(nn.Linear(8, 1))\n"
        ),
    },
    "DDP126": {
        "replicate.py": (
            "from torch.nn.parallel import DataParallel\n\n\n"
            "def patch_replication_callback(data_parallel):\n"
            "    assert isinstance(data_parallel, DataParallel)\n"
        ),
    },
}
EXAMPLES["DDP126"] = _HEAD + '''from replicate import patch_replication_callback

model = nn.DataParallel(nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1)))
patch_replication_callback(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss = model(torch.randn(8, 4)).sum()
loss.backward()
opt.step()
'''
EXAMPLES["DDP127"] = _HEAD + '''

def build(parallel=False):
    model = nn.Linear(8, 1)
    if parallel:
        model = nn.DataParallel(model)
    return model


def fit(model):
    model = nn.DataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.randn(8, 8)).sum()
    loss.backward()
    opt.step()


fit(build())
'''

EXAMPLES["DDP151"] = _HEAD + '''from models import build_model

model = build_model()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.randn(4, 8)).sum().backward()
opt.step()
'''

PROJECT_MODULES["DDP165"] = {
    "snapshot.py": (
        "import torch\nimport torch.nn as nn\n\n\n"
        "def save_model(model, path):\n"
        "    if isinstance(model, nn.DataParallel):\n        model = model.module\n"
        "    torch.save(model.state_dict(), path)\n"
    ),
}
EXAMPLES["DDP165"] = _HEAD + '''from snapshot import save_model

model = nn.DataParallel(nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.randn(4, 8)).sum().backward()
opt.step()
save_model(model, "model.pth")
'''
PROJECT_MODULES["DDP166"] = {
    "snapshot.py": (
        "import torch\nimport torch.nn as nn\n\n\n"
        "def save_model(model, path):\n"
        "    print('saving', type(model).__name__)\n"
        "    if isinstance(model, nn.DataParallel):\n        model = model.module\n"
        "    torch.save(model.state_dict(), path)\n"
    ),
}
EXAMPLES["DDP166"] = EXAMPLES["DDP165"]

PROJECT_MODULES["DDP187"] = {
    "ckpt.py": (
        "import torch\n\n\ndef load_checkpoint(path, model):\n    state = torch.load(path)\n"
        "    model.load_state_dict(state[\"state_dict\"], strict=False)\n    return state[\"epoch\"]\n"
    ),
}
EXAMPLES["DDP187"] = _HEAD + "from ckpt import load_checkpoint\n" + _script(
    "model = nn.Linear(8, 1)\nif torch.cuda.is_available():\n    model = nn.DataParallel(model).cuda()\n"
    "start = load_checkpoint(\"ckpt.pth\", model)\n")[len(_HEAD):]
