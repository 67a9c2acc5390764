"""``shard_loader`` over an ``IterableDataset`` (issue 20): the helper the migration writes
(templates/shard_loader.py.tmpl, rendered as a module here) shares out every batch of the
stream as DataParallel split it. Each rank of a simulated world of two runs the migrated
loader; per step, rank 0's slice followed by rank 1's is the original loader's batch (and
then the padding: the batch's own first samples), with 0 and 2 workers, for a dataset that
splits its stream by worker and for one that does not."""

from __future__ import annotations

import importlib.util
import math
import random
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, IterableDataset, get_worker_info  # noqa: E402

from dp2ddp.templates import load  # noqa: E402

WORLD = 2


def _helper(tmp_path: Path):
    """The template as the migration renders it, importable (its classes pickle by name)."""
    text = load("shard_loader.py.tmpl").format(
        torch="torch", dist="dist", os="os", random="random", sys="sys",
        shard_loader="shard_loader", ShardedBatches="ShardedBatches", ShardedStream="ShardedStream",
    )
    path = tmp_path / "shard_helper.py"
    path.write_text("import os\nimport random\nimport sys\nimport torch\nimport torch.distributed as dist\n\n" + text)
    spec = importlib.util.spec_from_file_location(f"shard_helper_{id(path)}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


class _Dist:
    """torch.distributed as rank ``rank`` of a world of two sees it. It has no collectives on
    purpose: shard_loader and its batches must call none (a broadcast inside shard_loader
    hung dgcnn's migration, whose loader is made under a rank-0-first guard)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def is_initialized(self) -> bool:
        return True

    def get_rank(self) -> int:
        return self.rank

    def get_world_size(self) -> int:
        return WORLD


class Lines(IterableDataset):
    """A text stream: each worker reads every num_workers-th line (get_worker_info in __iter__)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        first, step = (info.id, info.num_workers) if info else (0, 1)
        for i in range(first, self.n, step):
            yield torch.tensor([i, i * i])


class Whole(IterableDataset):
    """A stream that does not look at its worker: every worker yields all of it (as in the original)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


class Range(IterableDataset):
    """The worker_init_fn pattern of torch's docs: the worker sets get_worker_info().dataset's bounds."""

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end

    def __iter__(self):
        return iter(range(self.start, self.end))


def split_range(worker_id: int) -> None:
    info = get_worker_info()
    ds = info.dataset
    per = math.ceil((ds.end - ds.start) / info.num_workers)
    start = ds.start + worker_id * per
    ds.start, ds.end = start, min(start + per, ds.end)


class Shuffled(IterableDataset):
    """A shuffle buffer on the global random state, as streaming trainers have (the order depends on the seed)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        buf = []
        for i in range(info.id if info else 0, self.n, info.num_workers if info else 1):
            buf.append(i)
            if len(buf) == 4:
                yield buf.pop(random.randrange(len(buf)))
        random.shuffle(buf)
        yield from buf


def _as_list(batch):
    return batch.tolist()


def _passes(make, helper, workers, epochs=1, **kw):
    """The original's batches and each rank's, for ``epochs`` passes over one loader each."""
    orig = make(workers, **kw)
    original = [[_as_list(b) for b in orig] for _ in range(epochs)]
    ranks = []
    for rank in range(WORLD):
        helper.dist = _Dist(rank)
        helper.ShardedBatches.made = 0  # each process counts its own loaders
        torch.manual_seed(100 + rank)  # ranks seeded apart: the stream must not follow them
        random.seed(100 + rank)
        loader = helper.shard_loader(make(workers, **kw))
        ranks.append([[_as_list(b) for b in loader] for _ in range(epochs)])
    return original, ranks


def _loader(ds, bs, drop_last=False):
    def make(workers, **kw):
        return DataLoader(ds, batch_size=bs, drop_last=drop_last, num_workers=workers, **kw)
    return make


def _assert_split(original, shares):
    """Per step, rank 0's slice then rank 1's is the original batch, then its own first samples."""
    assert len(shares[0]) == len(shares[1]) == len(original), (len(original), [len(s) for s in shares])
    for whole, a, b in zip(original, *shares):
        assert len(a) == -(-len(whole) // WORLD) and len(b) == len(a)
        got = a + b
        assert got[: len(whole)] == whole
        assert got[len(whole):] == whole[: len(got) - len(whole)]  # padding: the batch's own first samples


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("case", ["lines-by-worker", "whole-per-worker", "worker_init_fn", "odd-batch", "drop_last"])
def test_every_step_is_the_originals_batch_split_between_the_ranks(tmp_path, case, workers):
    helper = _helper(tmp_path)
    kw = {}
    if case == "lines-by-worker":
        make = _loader(Lines(37), 8)
    elif case == "whole-per-worker":
        make = _loader(Whole(21), 6)
    elif case == "worker_init_fn":
        make, kw = _loader(Range(3, 40), 4), {"worker_init_fn": split_range}
    elif case == "odd-batch":
        make = _loader(Lines(23), 5)  # 5 = 3 + 3 with one sample of padding; the last batch of 3 (workers 0) pads 1
    else:
        make = _loader(Lines(37), 6, drop_last=True)
    original, ranks = _passes(make, helper, workers, epochs=2, **kw)
    for epoch in range(2):
        _assert_split(original[epoch], [r[epoch] for r in ranks])
    if case == "odd-batch":
        assert any(len(b) % WORLD for b in original[0])  # padding was exercised


@pytest.mark.parametrize("workers", [0, 2])
def test_a_random_stream_is_read_alike_on_every_rank_each_sample_once(tmp_path, workers):
    """The ranks' global random states differ; the stream's randomness does not follow them:
    the ranks cut the same batches, each sample once per pass, in a new order each pass; in
    this process the script's own random state is left as the original's pass leaves it."""
    helper = _helper(tmp_path)
    n, bs = 24, 6  # whole batches, with or without two workers of 12
    ranks = []
    for rank in range(WORLD):
        helper.dist = _Dist(rank)
        helper.ShardedBatches.made = 0
        torch.manual_seed(rank)
        random.seed(rank)
        loader = helper.shard_loader(DataLoader(Shuffled(n), batch_size=bs, num_workers=workers))
        before = random.getstate()
        first = [b.tolist() for b in loader]
        if workers == 0:
            assert random.getstate() == before  # the stream drew from its own state
        ranks.append([first, [b.tolist() for b in loader]])
    for epoch in range(2):
        steps = [a + b for a, b in zip(ranks[0][epoch], ranks[1][epoch])]
        assert len(ranks[0][epoch]) == len(ranks[1][epoch]) == n // bs
        assert sorted(i for s in steps for i in s) == list(range(n))
    assert ranks[0][0] != ranks[0][1], "every pass draws the stream the same way"


def test_the_loader_keeps_its_length_workers_and_the_datasets_attributes(tmp_path):
    helper = _helper(tmp_path)
    helper.dist = _Dist(1)

    class Sized(Lines):
        def __len__(self):
            return self.n

    loader = helper.shard_loader(DataLoader(Sized(37), batch_size=8, num_workers=2))
    assert len(loader) == 5 and loader.num_workers == 2 and loader.batch_size == 8
    assert isinstance(loader.dataset, IterableDataset) and loader.dataset.n == 37
    loader.dataset.n = 20  # set on the dataset itself
    assert loader.dataset._shard_of[0].n == 20
    assert helper.shard_loader(loader) is loader and isinstance(loader.dataset._shard_of[0], Sized)  # once only
    assert [len(b) for b in loader] == [4, 4, 1, 1]  # rank 1's slices of 8, 8, 2, 2 (two workers of 10 lines)


def test_what_cannot_be_split_is_one_line_that_says_what_to_do(tmp_path):
    helper = _helper(tmp_path)
    with pytest.raises(TypeError, match=r"batch_size=None .*give it a batch_size") as e:
        helper.shard_loader(DataLoader(Lines(8), batch_size=None))
    assert "\n" not in str(e.value)
    with pytest.raises(TypeError, match=r"--keep-batch-size .*migrate without it"):
        helper.shard_loader(DataLoader(Lines(8), batch_size=4), whole_batches=True)
