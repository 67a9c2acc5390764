"""The migrated training loader's item draws (issue 18, found on real repositories: every
rank's crop, flip and jitter were the same draws, so a global batch held only
B/world distinct augmentations where DataParallel's one process drew B). The helper the
migration writes (templates/shard_loader.py.tmpl, rendered as a module here) gives each
rank a stream of its own for what the dataset draws while it makes an item — torch's CPU
generator, ``random`` and NumPy, with workers through the seeds the loader hands them —
and leaves the script's own stream as it would be without those draws (so what every rank
draws alike, the model's dropout or a decision in the step, stays alike). Each rank of a
simulated world of two runs the migrated loader from the same state of the script's stream."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from tests.test_shard_stream import _Dist, _helper  # noqa: E402


class Augmented(Dataset):
    """Each item draws from all three streams, as an augmentation pipeline does."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i):
        return torch.tensor([float(i), torch.rand(()).item(), random.random(), float(np.random.rand())])


class Plain(Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i):
        return torch.tensor([float(i), 0.0, 0.0, 0.0])


def _epoch(helper, rank: int, dataset, workers: int):
    """Rank ``rank``'s batches of one pass, and the script's stream (torch, random, numpy) after it."""
    helper.dist = _Dist(rank)
    helper.ShardedBatches.made = 0  # each rank's process makes this loader first
    torch.manual_seed(7)
    random.seed(7)
    np.random.seed(7)
    loader = helper.shard_loader(DataLoader(dataset, batch_size=8, shuffle=True, num_workers=workers))
    batches = [b.clone() for b in loader]
    after = (torch.get_rng_state(), random.random(), float(np.random.rand()))
    return batches, after


@pytest.mark.parametrize("workers", [0, 2])
def test_each_rank_draws_its_items_from_its_own_stream(tmp_path, workers: int) -> None:
    helper = _helper(tmp_path)
    ranks = [_epoch(helper, r, Augmented(), workers)[0] for r in (0, 1)]
    for b0, b1 in zip(*ranks):
        assert not set(b0[:, 0].tolist()) & set(b1[:, 0].tolist())  # each rank its own share of the batch
        for column in (1, 2, 3):  # torch, random, numpy: no draw of rank 0 repeats on rank 1
            assert not set(b0[:, column].tolist()) & set(b1[:, column].tolist()), (column, b0, b1)
    again = _epoch(helper, 0, Augmented(), workers)[0]
    assert all(torch.equal(a, b) for a, b in zip(ranks[0], again))  # from the same start, the same draws


def test_the_scripts_stream_is_left_as_the_draws_found_it(tmp_path) -> None:
    helper = _helper(tmp_path)
    drawing = _epoch(helper, 1, Augmented(), 0)[1]
    quiet = _epoch(helper, 1, Plain(), 0)[1]
    assert torch.equal(drawing[0], quiet[0]) and drawing[1:] == quiet[1:]


def test_a_dataset_that_fetches_whole_batches_keeps_its_own_fetch(tmp_path) -> None:
    helper = _helper(tmp_path)

    class Batched(Augmented):
        calls = 0

        def __getitems__(self, indices):
            Batched.calls += 1
            return [self[i] for i in indices]

    batches = _epoch(helper, 0, Batched(), 0)[0]
    assert Batched.calls == len(batches) == 2


def _seed_by_worker_id(worker_id: int) -> None:
    """The common worker_init_fn that seeds NumPy and ``random`` from the worker's id alone:
    alike on every rank."""
    np.random.seed(worker_id)
    random.seed(worker_id)


def test_a_worker_init_fn_that_seeds_by_the_worker_id_alone_still_draws_apart_per_rank(tmp_path) -> None:
    """With workers whose worker_init_fn seeds NumPy and ``random`` from the worker id, every
    rank's workers drew the same crops and flips (RAFT's datasets reseed by the worker id;
    verify's real run of it showed each global batch holding every augmentation twice).
    WorkersApart runs the user's function, then moves the streams apart by the rank on
    ranks other than 0: rank 0 draws as the original's workers did."""
    helper = _helper(tmp_path)

    def epoch(rank: int):
        helper.dist = _Dist(rank)
        helper.ShardedBatches.made = 0
        torch.manual_seed(7)
        loader = helper.shard_loader(DataLoader(Augmented(), batch_size=8, shuffle=True, num_workers=2,
                                                worker_init_fn=_seed_by_worker_id))
        return [b.clone() for b in loader]

    ranks = [epoch(0), epoch(1)]
    for b0, b1 in zip(*ranks):
        for column in (1, 2, 3):
            assert not set(b0[:, column].tolist()) & set(b1[:, column].tolist()), (column, b0, b1)
    plain = DataLoader(Augmented(), batch_size=8, shuffle=False, num_workers=2, worker_init_fn=_seed_by_worker_id)
    first = next(iter(plain))  # rank 0's workers: the user's seeding, untouched
    assert float(first[0, 3]) == pytest.approx(float(np.random.RandomState(0).rand()))
