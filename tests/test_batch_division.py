"""A mixed script's per-process batch divided where its process group starts (DDP172), or
refused with the reason (DDP152): model/batch_division.py through the rewrite."""

from __future__ import annotations

import pytest

from dp2ddp.migrate import migrate_source

# pytorch/examples imagenet's shape: main_worker starts the group under `if args.distributed:`
# and divides -b itself only under `if args.gpu is not None:`, which torchrun leaves unset
_WORKER = '''\
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("-b", "--batch-size", default=16, type=int)
parser.add_argument("--world-size", default=-1, type=int)
parser.add_argument("--rank", default=-1, type=int)
parser.add_argument("--dist-url", default="tcp://127.0.0.1:23456", type=str)
parser.add_argument("--gpu", default=None, type=int)


def main_worker(gpu, args):
    args.gpu = gpu
    args.distributed = args.world_size > 1
    if args.distributed:
        dist.init_process_group(backend="gloo", init_method=args.dist_url, world_size=args.world_size, rank=args.rank)
    model = nn.Linear(4, 1)
    if args.distributed:
        if args.gpu is not None:
            args.batch_size = int(args.batch_size / 2)
        model = nn.parallel.DistributedDataParallel(model)
    else:
        model = nn.DataParallel(model)
    ds = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    sampler = DistributedSampler(ds) if args.distributed else None
    loader = DataLoader(ds, batch_size=args.batch_size, shuffle=(sampler is None), sampler=sampler)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()


if __name__ == "__main__":
    args = parser.parse_args()
    main_worker(args.gpu, args)
'''


def _line(source: str, text: str) -> int:
    return source[: source.index(text)].count("\n") + 1


def _codes(source: str):
    result = migrate_source(source.encode(), "main.py")
    return result, {f.code: f.message for f in result.migration.findings}


def test_divided_after_the_start_and_the_own_scaling_kept_off_under_torchrun() -> None:
    result, codes = _codes(_WORKER)
    assert "DDP172" in codes and "DDP152" not in codes, codes
    scaling = _line(_WORKER, "            args.batch_size = int(")
    assert f"its own scaling at line {scaling} is kept off under torchrun" in codes["DDP172"]
    out = result.output.decode()
    start = out.index("dist.init_process_group(")
    assert out.index("args.batch_size //= dist.get_world_size()") > start
    assert 'if "LOCAL_RANK" not in os.environ:\n                args.batch_size = int(args.batch_size / 2)' in out


@pytest.mark.parametrize("change,why", [
    (("    model = nn.Linear(4, 1)\n", "    model = nn.Linear(4, 1)\n    args.batch_size = 32\n"),
     "`args.batch_size` is set again at line {line}, where dp2ddp cannot show it runs before the division"),
    (("    if args.distributed:\n        dist.init", "    for _ in range(1):\n        dist.init"),
     "the process group is started on some paths only (line {line})"),
])
def test_refused_with_where_the_division_cannot_go(change, why) -> None:
    source = _WORKER.replace(*change)
    assert source != _WORKER
    why = why.format(line=_line(source, change[1].strip().splitlines()[-1]))
    result, codes = _codes(source)
    assert "DDP152" in codes, codes
    assert why in codes["DDP152"], codes["DDP152"]
    assert not result.changed


def test_a_second_training_loader_made_where_its_batch_cannot_be_read_is_refused() -> None:
    """A loader the migration shards by its name after a statement (a dict of loaders per phase)
    may read the batch that DDP172 divides: its global batch cannot be shown, so DDP152."""
    source = _WORKER.replace(
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n",
        "    phases = {p: DataLoader(ds, batch_size=args.batch_size, shuffle=True) for p in ['train', 'val']}\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for x, y in phases['train']:\n"
        "        opt.zero_grad()\n"
        "        nn.functional.mse_loss(model(x), y).backward()\n"
        "        opt.step()\n")
    result, codes = _codes(source)
    assert "DDP152" in codes, codes
    assert "per process (divided where the process group starts, DDP172)" in codes["DDP152"]
    assert not result.changed
