"""The data partition: what each rank served, epoch by epoch, judged from the probe's
records (fast: records built here; the probe's own recording is tested at the end, in a
real process)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from dp2ddp.verify import analyze, options, partition
from dp2ddp.verify.runner import Rank, RunResult

PROBE_DIR = Path(__file__).resolve().parents[1] / "dp2ddp" / "verify" / "probe"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "verify"
N = 512


def _bits(indices) -> str:
    x = 0
    for i in indices:
        x |= 1 << i
    raw = x.to_bytes((N + 7) // 8, "little")
    return base64.b64encode(zlib.compress(raw)).decode()


def _pass(key, k, order, site, complete=True, batch=32, kind="DistributedSampler", n=N):
    served = list(order)
    return {"ev": "pass", "key": key, "k": k, "complete": complete, "n": n, "len": -(-len(served) // batch),
            "batches": -(-len(served) // batch), "served": len(served), "unique": len(set(served)),
            "dups": len(served) - len(set(served)), "head": served[:64], "crc": 0, "kind": kind, "site": site,
            "bits": _bits(served)}


def _run(role, per_rank_passes, root=None) -> RunResult:
    ranks = {}
    for r, passes in enumerate(per_rank_passes):
        rank = Rank(rank=r)
        rank.passes = passes
        rank.end = {"ev": "end", "why": "exit", "trained": [passes[0]["key"]] if passes else []}
        ranks[r] = rank
    run = RunResult(role=role, exit_code=0, wall_s=1.0, ranks=ranks, logs=[])
    run.root = root
    return run


@pytest.fixture
def site(tmp_path):
    script = tmp_path / "train_ddp.py"
    script.write_text("import torch\nds = make()\ntrain_loader = DataLoader(ds, batch_size=16,\n"
                      "                          sampler=DistributedSampler(ds))\n")
    return [str(script), 3]


def _perm(seed):
    import random

    order = list(range(N))
    random.Random(seed).shuffle(order)
    return order


def _original(site, epochs=2):
    return _run("original", [[_pass(1, e, _perm(e), site, kind="RandomSampler") for e in range(epochs)]])


def _sharded(epoch_seeds, site, cut=lambda order, r: order[r::2], **kw):
    return _run("migrated", [[_pass(100 + r, e, cut(_perm(s), r), site, **kw) for e, s in enumerate(epoch_seeds)]
                             for r in range(2)], root=Path(site[0]).parent)


def test_disjoint_shards_whose_union_is_the_epoch_pass(site):
    out = partition.analyze(_original(site), _sharded([0, 1], site), 2)
    assert out["problems"] == [] and out["notes"] == []
    (loader,) = out["loaders"]
    assert loader["loader"] == "`train_loader` (train_ddp.py:3)"
    assert loader["order"] == "new each epoch" and loader["original_reshuffles"] is True
    assert [(e["union"], e["extra_servings"], e["lost"], e["added"]) for e in loader["epochs"]] == [(N, 0, 0, 0)] * 2
    assert partition.summary(loader) == (
        "`train_loader` (train_ddp.py:3): epoch 0: 256+256 served, disjoint, the original's epoch exactly; "
        "epoch 1: 256+256 served, disjoint, the original's epoch exactly; a new order each epoch")


def test_an_unsharded_loader_is_named_with_its_line(site):
    out = partition.analyze(_original(site), _sharded([0, 1], site, cut=lambda order, r: order), 2)
    assert out["unsharded"] is True
    assert out["problems"][0] == (
        "rank 0 and rank 1 each served all 512 samples of `train_loader` (train_ddp.py:3) in epoch 0: the loader is "
        "not sharded, every rank does the whole epoch's work")
    assert "DistributedSampler" in out["problems"][1] and "shard_loader" in out["problems"][1]
    assert sum("not sharded" in p for p in out["problems"]) == 1  # said once, not per epoch


def test_ranks_reading_the_same_part_of_a_partial_epoch_are_not_sharded(site):
    mig = _sharded([0], site, cut=lambda order, r: order[:96], complete=False)
    out = partition.analyze(_original(site), mig, 2)
    assert out["problems"][0].startswith("rank 0 and rank 1 served the same 96 samples of `train_loader` (train_ddp.py:3) "
                                         "in epoch 0 (partial: the run stopped in it): the loader is not sharded")


def test_a_replayed_permutation_names_set_epoch(site):
    out = partition.analyze(_original(site), _sharded([0, 0], site), 2)
    assert out["problems"] == [
        "epoch 1 replays epoch 0 on every rank (the original reshuffles): `set_epoch` is not called for "
        "`train_loader` (train_ddp.py:3)",
        "  advice: call `loader.sampler.set_epoch(epoch)` at the start of every epoch"]


def test_one_rank_whose_first_samples_come_back_by_chance_is_no_replay(site):
    """SfmLearner on four scenes: one sample a rank a batch, and rank 0's first samples of
    epoch 1 happened to be those of epoch 0 while rank 1's changed. A missing reshuffle
    replays on every rank; this one is no finding."""
    def cut(order, r):
        return order[r::2] if r else sorted(order[0::2])  # rank 0: the same order in both epochs

    out = partition.analyze(_original(site), _sharded([0, 1], site, cut=cut), 2)
    assert out["problems"] == []
    assert out["loaders"][0]["order"] == "new each epoch"


def test_a_handful_of_samples_cannot_tell_a_replay(site):
    mig = _sharded([0, 0], site, cut=lambda order, r: order[r::2][:1])
    out = partition.analyze(_original(site), mig, 2)
    assert not any("replays" in p for p in out["problems"])
    assert out["loaders"][0]["order"] == "too few samples to tell"
    assert partition.summary(out["loaders"][0]).endswith("too few samples an epoch to tell whether the order changes")


def test_a_replay_is_no_finding_where_the_original_does_not_reshuffle(site):
    orig = _run("original", [[_pass(1, e, list(range(N)), site, kind="SequentialSampler") for e in range(2)]])
    mig = _sharded([0, 0], site, cut=lambda order, r: list(range(N))[r::2])
    out = partition.analyze(orig, mig, 2)
    assert out["problems"] == []
    assert partition.summary(out["loaders"][0]).endswith("epoch 1 replays epoch 0, as the original's does (it keeps one order)")


def test_lost_samples_are_counted_with_examples(site):
    def cut(order, r):
        return [i for i in order[r::2] if i not in (3, 17, 42)]

    out = partition.analyze(_original(site), _sharded([0, 1], site, cut=cut), 2)
    assert out["problems"][0] == ("`train_loader` (train_ddp.py:3): 3 of the original's 512 samples of epoch 0 were "
                                  "served by no rank (indices 3, 17, 42)")


def test_padding_is_reported_not_blamed_and_more_is_duplicated_work(site):
    small = 511

    def padded(order, r):  # DistributedSampler: pad to 512 by repeating the first index
        order = [i for i in order if i < small]
        order = order + order[:1]
        return order[r::2]

    orig = _run("original", [[_pass(1, e, [i for i in _perm(e) if i < small], site, n=small) for e in range(2)]])
    out = partition.analyze(orig, _sharded([0, 1], site, cut=padded, n=small), 2)
    assert out["problems"] == []
    assert out["notes"][0] == ("data: `train_loader` (train_ddp.py:3), epoch 0: 1 sample served twice as padding "
                               "(equal shares for 2 ranks), not duplicated work")

    def overlapping(order, r):  # a quarter of the epoch on both ranks
        return order[r::2] + (order[1::2][:64] if r == 0 else [])

    out = partition.analyze(_original(site), _sharded([0, 1], site, cut=overlapping), 2)
    assert out["problems"][0].startswith("`train_loader` (train_ddp.py:3): 64 samples were served more than once in "
                                         "epoch 0 (11% of the work is duplicated; equal shares need at most 1 repeats)")


def test_repeats_the_originals_own_sampler_makes_are_not_duplicated_work(site):
    """A class-balanced batch sampler draws with replacement: the original serves samples
    again by itself, and a sharding of its batches repeats them as it does (audioset's
    BalancedTrainSampler); more repeats than the original's are still duplicated work."""
    import random

    rng = random.Random(7)
    drawn = [[rng.randrange(300) for _ in range(N)] for _ in range(2)]  # with replacement
    orig = _run("original", [[_pass(1, e, drawn[e], site, kind="BatchSampler") for e in range(2)]])
    mig = _run("migrated", [[_pass(100 + r, e, drawn[e][r::2], site) for e in range(2)] for r in range(2)],
               root=Path(site[0]).parent)
    out = partition.analyze(orig, mig, 2)
    assert out["problems"] == []
    assert "as the original's own sampler serves them" in out["notes"][0]
    twice = _run("migrated", [[_pass(100 + r, e, drawn[e] if r == 0 else drawn[e][1::2], site) for e in range(2)]
                              for r in range(2)], root=Path(site[0]).parent)
    out = partition.analyze(orig, twice, 2)
    assert any("were served more than once" in p for p in out["problems"]), out["problems"]


def test_one_epoch_seen_is_said(site):
    out = partition.analyze(_original(site, 1), _sharded([0], site), 2)
    assert out["problems"] == []
    assert out["notes"][0].startswith("data: only one epoch of `train_loader` (train_ddp.py:3) was seen")


def test_the_loader_name_comes_from_the_statement_the_site_line_continues(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("loaders = {}\nself.train_loader = torch.utils.data.DataLoader(\n    ds,\n    batch_size=8)\n"
                      "make(DataLoader(ds))\nval_loader = shard_loader(\n    DataLoader(ds))\n")
    assert partition.loader_name([str(script), 2]) == "train_loader"  # a call's line is the line it starts on
    assert partition.loader_name([str(script), 7]) == "val_loader"
    assert partition.loader_name([str(script), 5]) is None
    assert partition.describe([str(script), 5], tmp_path) == "the loader built at s.py:5"


def test_the_partition_fails_the_pair(site):
    """The losses agree (every rank's batch is the global batch) and the replicas are in
    sync, but every rank read the whole dataset: the pair fails."""
    orig, mig = _original(site), _sharded([0, 1], site, cut=lambda order, r: order)
    for role, run in (("original", orig), ("migrated", mig)):
        for r in run.ranks.values():
            r.steps = [{"loss": 1.0 - 0.1 * i, "samples": 32 if role == "original" else 16, "t": float(i), "o": 0}
                       for i in range(4)]
            r.steps[0]["modules"] = ["ddp"] if role == "migrated" else ["dp"]
            r.end.update(hash="h", norm=1.0)
    opts = options.Options(steps=4, warmup=1, rtol=1e-5, stochastic_rtol=0.1, min_speedup=0, timeout=30,
                           user_dirs=[], nproc=2, nnodes=1)
    rep = analyze.compare(orig, mig, opts)
    assert rep["losses_agree"] and rep["replicas_in_sync"]
    assert rep["verdict"] == "fail" and rep["data"]["unsharded"] is True
    assert any("the loader is not sharded" in p for p in rep["problems"])


# --------------------------------------------------------------------------- the probe's records

RECORDED = r"""
import json, random, sys
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
sys.path.insert(0, sys.argv[1])
from shard_runtime import ShardedBatches

torch.manual_seed(0)
n = 103
ds = TensorDataset(torch.randn(n, 3), torch.arange(n))
w = torch.nn.Parameter(torch.zeros(3, 1))
opt = torch.optim.SGD([w], lr=0.01)
mode = sys.argv[2]
loader = DataLoader(ds, batch_size=10, shuffle=True)
if mode == "distributed":
    loader = DataLoader(ds, batch_size=5, sampler=DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True))
served = []
before = torch.get_rng_state()
for epoch in range(2):
    if mode == "distributed":
        loader.sampler.set_epoch(epoch)
    got = []
    for x, idx in loader:
        got += idx.tolist()
        (x @ w).sum().backward()
        opt.step()
    served.append(got)
print(json.dumps({"served": served}))
"""


def _probe_run(tmp_path, role, mode, plans=()):
    script = tmp_path / "train.py"
    script.write_text(RECORDED)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DP2DDP_VERIFY")}
    env.update(PYTHONPATH=str(PROBE_DIR), DP2DDP_VERIFY_ROLE=role, DP2DDP_VERIFY_OUT=str(tmp_path), LOCAL_RANK="0",
               DP2DDP_VERIFY_SAMPLERS=json.dumps(list(plans)))
    p = subprocess.run([sys.executable, str(script), str(FIXTURES), mode], cwd=str(tmp_path), env=env,
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    recs = [json.loads(x) for x in (tmp_path / f"{role}-rank0.jsonl").read_text().splitlines()]
    return json.loads(p.stdout.strip().splitlines()[-1])["served"], recs


@pytest.mark.slow  # a fresh Python that imports torch
def test_the_probe_records_what_each_pass_served_and_the_original_follows_sharded_batches(tmp_path):
    """A DistributedSampler's shard (rank 1 of 2, padded): the pass records decode to the
    indices served, with the padding counted. Then the original's side of a ShardedBatches
    migration: its loader draws each epoch's batches as ShardedBatches does (seed + epoch),
    i.e. ShardedBatches' batches with one rank."""
    torch = pytest.importorskip("torch")
    (tmp_path / "d").mkdir()
    served, recs = _probe_run(tmp_path / "d", "migrated", "distributed")
    passes = [r for r in recs if r["ev"] == "pass"]
    assert [p["k"] for p in passes] == [0, 1] and all(p["complete"] for p in passes)
    for p, got in zip(passes, served):
        assert p["served"] == len(got) == 52 and p["unique"] == len(set(got)) and p["dups"] == 0
        assert partition.examples(partition.bits(p), 200) == sorted(set(got))
        assert p["head"] == got[:64] and p["kind"] == "DistributedSampler" and p["site"][1] == 17
    (end,) = [r for r in recs if r["ev"] == "end"]
    assert len(end["trained"]) == 1 and end["trained"][0] == passes[0]["key"]
    assert end["optimizers"] == [{"index": 0, "kind": "SGD", "site": [str(tmp_path / "d" / "train.py"), 13], "steps": 22}]

    (tmp_path / "o").mkdir()
    plan = {"kind": "sharded", "n": 103, "batches": 11, "seed": 5, "epochs": [0, 1]}
    served, recs = _probe_run(tmp_path / "o", "original", "random", [plan])
    sys.path.insert(0, str(FIXTURES))
    try:
        from shard_runtime import ShardedBatches
    finally:
        sys.path.pop(0)
    from torch.utils.data import BatchSampler, RandomSampler

    sb = ShardedBatches(BatchSampler(RandomSampler(range(103)), 10, False), seed=5)
    for got in served:
        assert got == [i for b in sb for i in b]  # world of one: whole batches
    assert [r["epoch"] for r in recs if r["ev"] == "sampler" and r["kind"] == "aligned"] == [0, 1]
    assert torch is not None


FOLDS = r"""
import gc
import torch

w = torch.nn.Parameter(torch.ones(2))
for fold in range(3):  # a new optimizer per fold; the previous one is freed (its id may be reused)
    opt = torch.optim.SGD([w], lr=0.1 * (fold + 1))
    for _ in range(2):
        (w * w).sum().backward()
        opt.step()
    del opt
    gc.collect()
"""


@pytest.mark.slow  # a fresh Python that imports torch
def test_every_optimizer_gets_its_own_index_even_when_its_id_is_reused(tmp_path):
    from tests.verify_helpers import run_probe

    p, recs = run_probe(tmp_path, FOLDS, "folds.py")
    assert p.returncode == 0, p.stderr
    (end,) = [r for r in recs if r["ev"] == "end"]
    assert [(o["index"], o["steps"], o["site"][1]) for o in end["optimizers"]] == [(0, 2, 7), (1, 2, 7), (2, 2, 7)]
    steps = [r for r in recs if r["ev"] == "step"]
    # each fold's optimizer, created after the previous one stopped stepping, counts the run's steps
    assert [(r["o"], r["lr"]) for r in steps] == [(0, 0.1), (0, 0.1), (1, 0.2), (1, 0.2), (2, 0.1 * 3), (2, 0.1 * 3)]


STREAM = r"""
import torch
from torch.utils.data import DataLoader, IterableDataset


class Stream(IterableDataset):
    def __iter__(self):
        return iter(torch.arange(10.0).unsqueeze(1))


w = torch.nn.Parameter(torch.zeros(1))
opt = torch.optim.SGD([w], lr=0.1)
for batch in DataLoader(Stream(), batch_size=4):
    (batch * w).sum().backward()
    opt.step()
"""


def _with_prints(rec, prints):
    import array

    raw = array.array("q", prints).tobytes()
    return dict(rec, prints=base64.b64encode(zlib.compress(raw)).decode())


@pytest.mark.slow  # a fresh Python that imports torch
def test_a_streams_samples_are_told_apart_by_content_and_its_partition_judged(tmp_path):
    """A loader over an IterableDataset hands out ``[None] * 4`` per step: no sample is
    named, so the probe fingerprints each sample's bytes (the same bytes, the same print in
    every process) and the pass ends complete at the stream's end. Two ranks that each read
    the whole stream are an unsharded loader (verify passed that before: the losses agree);
    ranks that split it are the original's epoch, disjoint."""
    script = tmp_path / "stream.py"
    script.write_text(STREAM)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DP2DDP_VERIFY")}
    env.update(PYTHONPATH=str(PROBE_DIR), DP2DDP_VERIFY_ROLE="migrated", DP2DDP_VERIFY_OUT=str(tmp_path), LOCAL_RANK="0")
    p = subprocess.run([sys.executable, str(script)], cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    recs = [json.loads(x) for x in (tmp_path / "migrated-rank0.jsonl").read_text().splitlines()]
    (rec,) = [r for r in recs if r["ev"] == "pass"]
    assert rec["iterable"] is True and rec["complete"] is True and "unrecorded" not in rec and rec["batches"] >= 3, rec
    prints = partition._prints(rec)
    assert len(prints) == 10 and len(set(prints)) == 10  # torch.arange(10.0): ten different samples
    whole = partition.analyze(_run("original", [[rec]]), _run("migrated", [[rec], [dict(rec, key=rec["key"] + 1)]]), 2)
    assert whole["unsharded"] is True and whole["problems"][0].startswith("rank 0 and rank 1 each served all 10 samples"), whole
    halves = [_with_prints(rec, prints[:5]), _with_prints(dict(rec, key=rec["key"] + 1), prints[5:])]
    split = partition.analyze(_run("original", [[rec]]), _run("migrated", [[halves[0]], [halves[1]]]), 2)
    assert split["problems"] == [] and not split["unsharded"], split
    (loader,) = split["loaders"]
    assert loader["stream"] is True and loader["epochs"][0]["lost"] == 0 and loader["epochs"][0]["added"] == 0
    assert "epoch 0: 5+5 served, disjoint, the original's epoch exactly" in partition.summary(loader)
    lost = partition.analyze(_run("original", [[rec]]), _run("migrated", [[halves[0]], [_with_prints(halves[1], prints[5:9])]]), 2)
    assert "1 of the original's 10 samples of epoch 0 were served by no rank (told apart by their content)" in lost["problems"][0]


_FETCH_THEN_TRAIN = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self, model, opt):
        self.model, self.opt = model, opt

    def valid_epoch(self, data):
        total = 0.0
        for x, y in data:  # fetched while the model is still in train mode after the epoch
            self.model.eval()
            with torch.no_grad():
                total += nn.functional.cross_entropy(self.model(x), y, reduction="sum").item()
        return total

    def train_epoch(self, data):
        for x, y in data:  # fetched while the model is still in eval mode after the validation
            self.model.train()
            loss = nn.functional.cross_entropy(self.model(x), y)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()

    def train(self, train_data, valid_data, epochs):
        for epoch in range(epochs):
            self.train_epoch(train_data)
            print("valid", self.valid_epoch(valid_data))


def main():
    torch.manual_seed(3)
    data = TensorDataset(torch.randn(32, 6), torch.randint(0, 2, (32,)))
    valid = TensorDataset(torch.randn(16, 6), torch.randint(0, 2, (16,)))
    train_loader = DataLoader(data, batch_size=8, shuffle=True, drop_last=True)
    valid_loader = DataLoader(valid, batch_size=8)
    model = nn.DataParallel(nn.Linear(6, 2))
    Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1)).train(train_loader, valid_loader, 3)


if __name__ == "__main__":
    main()
"""


@pytest.mark.torchrun
def test_a_batch_fetched_before_model_train_is_the_steps_after_a_validation(tmp_path):
    """Bert-Multi-Label's trainer fetches each batch and only then switches the model's mode:
    the first validation batch came while the model was still training, and the next epoch's
    first training batch while it was still evaluating. verify took the validation loader
    (whole on every rank) for the loader of the next epoch's first step and failed a correct
    migration ("each served all 16 samples of `valid_loader`", "the global batch differs").
    A batch fetched in eval mode is judged by the wrapper's next forward."""
    from dp2ddp.cli import main as cli
    from tests.verify_helpers import verify

    (tmp_path / "train.py").write_text(_FETCH_THEN_TRAIN)
    assert cli(["rewrite", "-q", str(tmp_path / "train.py")]) in (0, 1)
    code, rep, text, _ = verify(tmp_path, str(tmp_path / "train.py"), "--migrated", str(tmp_path / "train_ddp.py"), "--steps", "0")
    assert code == 0, text
    assert "not sharded" not in text and "global batch differs" not in text, text
    assert "`train_loader`" in text and "valid_loader" not in text.split("data:")[1].split("\n")[0], text


_LIST_THEN_EVAL = """\
import random

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def evaluate(model, loader):
    model.eval()
    total = 0.0
    for x, y in loader:  # fetched outside no_grad, in eval mode
        with torch.no_grad():
            total += nn.functional.cross_entropy(model(x), y, reduction="sum").item()
    model.train()
    return total


def main():
    random.seed(3)
    torch.manual_seed(3)
    data = TensorDataset(torch.randn(32, 6), torch.randint(0, 2, (32,)))
    train_loader = DataLoader(data, batch_size=8, drop_last=True)
    train_batches = [b for b in train_loader]
    eval_loader = DataLoader(data, batch_size=16)
    model = nn.DataParallel(nn.Linear(6, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        random.shuffle(train_batches)
        for step, (x, y) in enumerate(train_batches):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step == 1:
                print("eval", evaluate(model, eval_loader))


if __name__ == "__main__":
    main()
"""


@pytest.mark.torchrun
def test_an_evaluation_between_steps_of_a_list_of_batches_is_not_the_training_loader(tmp_path):
    """SpanBERT reads its training batches into a list before the first step and evaluates
    mid-epoch: the evaluation loader (whole on every rank, as the migration keeps it) was the
    only loader fetched between two steps, so verify took it for the training loader and
    failed the migration ("not sharded", "the global batch differs"). Batches fetched while
    the wrapped model is in eval mode are an evaluation's, not a step's."""
    from dp2ddp.cli import main as cli
    from tests.verify_helpers import verify

    (tmp_path / "train.py").write_text(_LIST_THEN_EVAL)
    assert cli(["rewrite", "-q", str(tmp_path / "train.py")]) in (0, 1)
    assert "train_loader = shard_loader(DataLoader(data, batch_size=8" in (tmp_path / "train_ddp.py").read_text()
    code, rep, text, _ = verify(tmp_path, str(tmp_path / "train.py"), "--migrated", str(tmp_path / "train_ddp.py"), "--steps", "0")
    assert code == 0, text
    assert "not sharded" not in text and "global batch differs" not in text, text
