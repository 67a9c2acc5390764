"""Fast checks of verify's pieces (no torchrun): stack parsing, advice, throughput, usage errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dp2ddp.verify import advice, analyze, stacks

DUMP = """Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait

Current thread 0x00007f0000000002 (most recent call first):
  File "/x/site-packages/torch/autograd/graph.py", line 841 in _engine_run_backward
  File "/x/site-packages/torch/autograd/__init__.py", line 364 in backward
  File "/x/probe/_dp2ddp_verify_probe.py", line 160 in backward
  File "/x/site-packages/torch/_tensor.py", line 623 in backward
  File "{script}", line 3 in <module>
"""


def test_hang_location_names_the_user_line_and_the_wait(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch\nx = 1\nloss.backward()\n")
    loc = stacks.locate(0, DUMP.format(script=script), [str(tmp_path)])
    assert loc.describe() == "rank 0: train.py:3 in <module> (loss.backward → all-reduce of gradients)"
    plain = stacks.locate(0, DUMP.format(script=script), [str(tmp_path)], distributed=False)
    assert "autograd backward" in plain.describe()


def test_hang_location_without_a_stack():
    assert stacks.locate(3, "", []).describe().startswith("rank 3: no Python stack")


@pytest.mark.parametrize(
    "text, word",
    [
        ("RuntimeError: Expected to have finished reduction in the prior iteration", "find_unused_parameters"),
        ("RuntimeError: Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 0", "set_device"),
        ("ValueError: sampler option is mutually exclusive with shuffle", "shuffle"),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate", "batch_size"),
        ("RuntimeError: Detected mismatch between collectives on ranks", "TORCH_DISTRIBUTED_DEBUG=DETAIL"),
    ],
)
def test_known_errors_map_to_advice(text, word):
    assert any(word in a for a in advice.advise(text))


def test_unknown_error_gets_no_advice():
    assert advice.advise("ValueError: corrupt batch") == []


def test_a_file_missing_on_a_rank_gets_barrier_advice_in_distributed_runs_only():
    text = "FileNotFoundError: [Errno 2] No such file or directory: 'vocab.json'"
    assert any("dist.barrier()" in a for a in advice.advise(text))
    assert advice.advise(text, distributed=False) == []


def test_throughput_leaves_out_warmup():
    # 3 slow warm-up steps, then 10 steps of 0.1 s with 32 samples each
    per = [(1.0, 32, t) for t in (0.0, 1.0, 2.0)] + [(1.0, 32, 2.0 + 0.1 * i) for i in range(1, 11)]
    sps, rates = analyze.throughput(per, warmup=2)
    assert sps == pytest.approx(320.0)
    assert rates[0] is None and rates[-1] == pytest.approx(320.0)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "dp2ddp", "verify", *args], capture_output=True, text=True)


@pytest.mark.slow
def test_missing_script_is_a_usage_error(tmp_path):
    p = _cli(str(tmp_path / "nope.py"))
    assert p.returncode == 2 and "no such file" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.slow
def test_missing_migrated_is_a_usage_error(tmp_path):
    (tmp_path / "a.py").write_text("print(1)\n")
    p = _cli(str(tmp_path / "a.py"), "--migrated", str(tmp_path / "b.py"))
    assert p.returncode == 2 and "b.py: no such file" in p.stderr


@pytest.mark.parametrize(
    "option, message",
    [
        (["--threads", "0"], "'0' is not N or N,M with positive integers"),
        (["--threads", "2,x"], "'2,x' is not N or N,M"),
        (["--threads", "1,2,3"], "'1,2,3' is not N or N,M"),
        (["--repeat", "0"], "Invalid value for '--repeat'"),
    ],
)
def test_bad_repeat_or_threads_is_a_usage_error(tmp_path, option, message):
    (tmp_path / "a.py").write_text("print(1)\n")
    p = _cli(str(tmp_path / "a.py"), *option)
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["a.py"]


@pytest.mark.slow
def test_script_without_dataparallel_cannot_be_rewritten(tmp_path):
    (tmp_path / "a.py").write_text("print(1)\n")
    p = _cli(str(tmp_path / "a.py"))
    assert p.returncode == 2 and "nothing to migrate" in p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["a.py"]


def test_union_of_distributed_batches_is_the_single_replica_batch():
    """The premise of the loss alignment, checked on torch itself."""
    torch = pytest.importorskip("torch")
    from torch.utils.data.distributed import DistributedSampler

    ds, world, per_rank = list(range(96)), 2, 8
    for epoch in range(3):
        one = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=5)
        one.set_epoch(epoch)
        single = list(one)
        ranks = []
        for r in range(world):
            s = DistributedSampler(ds, num_replicas=world, rank=r, shuffle=True, seed=5)
            s.set_epoch(epoch)
            ranks.append(list(s))
        for k in range(len(ds) // (world * per_rank)):
            union = sorted(i for idx in ranks for i in idx[k * per_rank : (k + 1) * per_rank])
            assert union == sorted(single[k * world * per_rank : (k + 1) * world * per_rank])
    assert torch is not None


PROBE_DIR = Path(__file__).resolve().parents[1] / "dp2ddp" / "verify" / "probe"

PROBED = r"""
import os, sys
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
w = torch.nn.Parameter(torch.randn(4, 1))
opt = torch.optim.SGD([w], lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(24, 4)), batch_size=6)
expected = []
for k, (x,) in enumerate(loader):
    if k == 3:
        break
    opt.zero_grad()
    first = (x @ w).pow(2).mean()  # gradient accumulation: two backward calls a step
    first.backward()
    per_sample = (x @ w).abs().squeeze(1)  # a non-scalar loss
    per_sample.backward(torch.ones_like(per_sample))
    with torch.no_grad():
        next(iter(loader))  # an evaluation batch: not counted
        expected.append(float(torch.stack([first.detach(), per_sample.detach().float().mean()]).mean()))
    opt.step()
pid = os.fork()
if pid == 0:  # a forked child trains too: it must not record
    (x @ w).sum().backward()
    opt.step()
    os._exit(0)
os.waitpid(pid, 0)
nan = (w * float("nan")).sum()
nan.backward()
opt.step()
open(__file__).read()  # read: not a write
with open("log.txt", "a") as fh:
    fh.write("done")
torch.save(w, "w.pt")  # C++ writes it: seen through the torch.save wrapper
with open("tmp.json", "w") as fh:
    fh.write("{}")
os.replace("tmp.json", "results.json")  # an atomic write
fd = os.open("raw.bin", os.O_WRONLY | os.O_CREAT)
os.close(fd)
print(expected)
"""


def _probe_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("_probe_under_test", PROBE_DIR / "_dp2ddp_verify_probe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("loss", [0.1 + 0.2, 1e-30, -3.0, None, float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("lr", [0.1, None, 3e-4])
def test_step_lines_are_what_json_dumps_writes(loss, lr):
    """The flush thread formats step lines itself (json.dumps is ~3x slower): same text."""
    import json

    probe = _probe_module()
    for modules in (None, ["dp"]):
        for ev in ("step", "ostep"):
            rec = {"ev": ev, "i": 3, "t": 1795296000.123456, "samples": 64, "nbw": 2}
            if modules:
                rec["modules"] = modules
            rec.update(o=1, lr=lr, loss=loss)
            line = probe._step_line(3, 1795296000.123456, 64, 2, loss, modules, 1, lr, ev)
            assert json.loads(line) == json.loads(json.dumps(rec)) or loss != loss
            assert line == json.dumps(rec, separators=(",", ":"))


@pytest.mark.slow
def test_probe_records_accumulated_losses_samples_and_ignores_forked_children(tmp_path):
    import json
    import os

    pytest.importorskip("torch")
    from tests.verify_helpers import run_probe

    p, recs = run_probe(tmp_path, PROBED)
    assert p.returncode == 0 and "Warning" not in p.stderr, p.stderr
    expected = json.loads(p.stdout.strip().splitlines()[-1])
    steps = [r for r in recs if r["ev"] == "step"]
    assert [r["i"] for r in steps] == [1, 2, 3, 4]  # none from the forked child
    assert [r["loss"] for r in steps[:3]] == expected  # float32 mean, as before
    assert [(r["nbw"], r["samples"]) for r in steps] == [(2, 6)] * 3 + [(1, 6)]  # the 4th batch was fetched before the break
    assert steps[3]["loss"] != steps[3]["loss"]  # NaN survives the round trip
    assert steps[0]["modules"] == [] and "modules" not in steps[1]
    assert all(a["t"] <= b["t"] for a, b in zip(steps, steps[1:]))
    (end,) = [r for r in recs if r["ev"] == "end"]
    assert end["steps"] == 4 and end["params"] == 1 and end["hash"]
    (writes,) = [r for r in recs if r["ev"] == "writes"]  # reported once, at exit
    mine = {os.path.basename(p) for p in writes["paths"] if os.path.dirname(p) == str(tmp_path)}
    assert mine == {"log.txt", "w.pt", "tmp.json", "results.json", "raw.bin"}


# --------------------------------------------------------------------------- which samples a step counts, which order a sampler takes

FED = r"""
import json, os
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
w = torch.nn.Parameter(torch.randn(4, 1))
opt = torch.optim.SGD([w], lr=0.1)
train_set = TensorDataset(torch.randn(24, 4), torch.arange(24))
# shuffled, with a worker: the RandomSampler is iterated in this process all the same
train = DataLoader(train_set, batch_size=4, shuffle=True, num_workers=1)
val = DataLoader(TensorDataset(torch.randn(10, 4)), batch_size=5)  # evaluation: whole, not shuffled
orders = []
for epoch in range(2):
    seen, batches = [], 0
    for x, idx in train:  # gradient accumulation: a step every 2 batches
        seen += idx.tolist()
        (x @ w).pow(2).mean().backward()
        batches += 1
        if batches % 2:
            continue
        opt.step()
        opt.zero_grad()
        for (v,) in val:  # evaluation between steps, fetched with gradients enabled
            v.requires_grad_(True)
            (v @ w).sum().backward()  # an attack's backward on the input (PGD): no step follows
        opt.zero_grad()
    orders.append(seen)
print(json.dumps(orders))
"""


@pytest.mark.slow
def test_a_step_counts_the_loader_that_fed_it_and_the_sampler_follows_the_migrated_epochs(tmp_path):
    """Evaluation batches between steps (whole on every migrated rank) are not the step's:
    a step counts the samples of the loader whose batch its last backward used, over every
    batch that loader gave since the previous step (accumulation). The shuffled loader
    visits DistributedSampler(num_replicas=1)'s order at the epochs the migration set
    (1 and 2: a script counting epochs from 1), not at 0 and 1."""
    import json

    torch = pytest.importorskip("torch")
    from torch.utils.data.distributed import DistributedSampler

    from tests.verify_helpers import run_probe

    plans = [{"n": 10, "seed": 0, "epochs": [0, 1]}, {"n": 24, "seed": 3, "epochs": [1, 2]}]
    p, recs = run_probe(tmp_path, FED, DP2DDP_VERIFY_SAMPLERS=json.dumps(plans))
    assert p.returncode == 0, p.stderr
    steps = [r for r in recs if r["ev"] == "step"]
    assert [r["samples"] for r in steps] == [8] * 6  # not 8 + 10 after an evaluation
    orders = json.loads(p.stdout.strip().splitlines()[-1])
    ds = list(range(24))
    for epoch, order in zip((1, 2), orders):
        sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=3)
        sampler.set_epoch(epoch)
        assert order == list(sampler)
    assert [(r["seed"], r["epoch"]) for r in recs if r["ev"] == "sampler"] == [(3, 1), (3, 2)]


def _probe_state(probe, plans):
    from types import SimpleNamespace

    probe._S = SimpleNamespace(samplers=plans, claimed=set())
    return probe


@pytest.mark.parametrize(
    "planned, expect",
    [
        ([0, 1, 2], [0, 1, 2, 3]),  # set_epoch(epoch) from 0; a 4th iteration goes on counting
        ([1, 2], [1, 2, 3]),  # epochs counted from 1 (CycleGAN's --epoch_count)
        ([5, 6], [5, 6, 7]),  # resumed at epoch 5
        ([0, 0, 0], [0, 1, 2]),  # set_epoch forgotten: the original still reshuffles, and the losses show it
        ([], [0, 1, 2]),  # no migrated sampler to follow
    ],
)
def test_the_original_sampler_follows_the_migrated_epochs_while_they_increase(planned, expect):
    probe = _probe_state(_probe_module(), [{"n": 8, "seed": 0, "epochs": planned}])
    plan = probe._claim_plan(8)
    assert [probe._next_epoch(plan) for _ in expect] == expect


def test_a_random_sampler_claims_the_plan_of_its_dataset_length_once():
    probe = _probe_state(_probe_module(), [{"n": 10, "seed": 4, "epochs": [3]}, {"n": 24, "seed": 9, "epochs": [1]}])
    first = probe._claim_plan(24)
    assert (first["seed"], first["epochs"]) == (9, [1])
    again = probe._claim_plan(24)  # a second sampler of that length: no plan left, the first plan's seed
    assert (again["seed"], again["epochs"]) == (4, [])
    assert probe._claim_plan(10)["epochs"] == [3]
    empty = _probe_state(probe, [])._claim_plan(5)
    assert (empty["seed"], empty["epochs"]) == (0, [])


def test_sampler_plans_come_from_the_lowest_rank_in_order_of_first_iteration():
    from dp2ddp.verify import session
    from dp2ddp.verify.runner import Rank, RunResult

    def ev(sid, epoch, n, shuffle=True, seed=0):
        return {"ev": "sampler", "kind": "distributed", "id": sid, "seed": seed, "epoch": epoch, "shuffle": shuffle, "n": n}

    r0, r1 = Rank(rank=0), Rank(rank=1)
    r0.samplers = [ev(7, 1, 64, seed=2), ev(8, 0, 16, shuffle=False), ev(9, 0, 32), ev(7, 2, 64, seed=2), ev(9, 1, 32)]
    r1.samplers = [ev(70, 5, 64)]
    run = RunResult(role="migrated", exit_code=0, wall_s=1.0, ranks={1: r1, 0: r0}, logs=[])
    assert session.sampler_plans(run) == [{"n": 64, "seed": 2, "epochs": [1, 2]}, {"n": 32, "seed": 0, "epochs": [0, 1]}]
    assert session.sampler_plans(RunResult(role="migrated", exit_code=1, wall_s=1.0, ranks={}, logs=[])) == []


def test_project_root_reaches_the_folder_a_script_puts_on_sys_path(tmp_path):
    # outlier-exposure's CIFAR/baseline.py: sys.path.append(dirname(dirname(abspath(__file__))))
    # then `from utils... import`: the run's copy must hold the folder above the script's
    from dp2ddp.verify.scratch import project_root

    (tmp_path / "utils").mkdir()
    (tmp_path / "CIFAR").mkdir()
    script = tmp_path / "CIFAR" / "baseline.py"
    script.write_text("import sys\nfrom os import path\nsys.path.append(path.dirname(path.dirname(path.abspath(__file__))))\n")
    assert project_root(script) == tmp_path.resolve()
    plain = tmp_path / "CIFAR" / "plain.py"
    plain.write_text("import torch\n")
    assert project_root(plain) == (tmp_path / "CIFAR").resolve()


@pytest.mark.parametrize("edit", ['sys.path.insert(0, "..")', 'sys.path.append(os.path.join(os.path.dirname(__file__), ".."))',
                                  'if True:\n    sys.path.insert(0, os.path.abspath(".."))'])
def test_project_root_reaches_the_folder_above_by_each_spelling(tmp_path, edit):
    """The script's own sys.path edits are read once (module_files), whatever the spelling:
    a relative "..", read from the folder the run starts in, counts like ``dirname(__file__)``."""
    from dp2ddp.verify.scratch import project_root

    (tmp_path / "tools").mkdir()
    script = tmp_path / "tools" / "train.py"
    script.write_text(f"import os, sys\n{edit}\n")
    assert project_root(script) == tmp_path.resolve()


def test_progress_names_the_envelope_run_not_the_original_its_probe_reports_as():
    """The envelope run is the original script again, and its probe reports as "original";
    the progress lines still say which run they follow."""
    import io
    from types import SimpleNamespace

    from dp2ddp.verify.command import _Progress

    out = io.StringIO()
    p = _Progress(out, 8)
    p.begin("envelope", "python, the noise envelope", "pair 1")
    p.last = -10.0
    p.update("original", 3, {})
    p.end(SimpleNamespace(role="original", hung=False, exit_code=0, steps=8, wall_s=1.5))
    lines = out.getvalue().splitlines()
    assert lines == [
        "verify: pair 1: envelope run (python, the noise envelope) started",
        "verify: pair 1: envelope step 3/8",
        "verify: pair 1: envelope run: 8 steps in 1.5 s, exit code 0",
    ]


def test_items_seed_only_the_streams_their_dataset_draws_from():
    """The probe learns which random streams a dataset's items draw from (its first items,
    watched) and seeds only those afterwards: an item is the same whether it was fetched
    watched with every stream seeded or later with only its own; a dataset that draws
    nothing costs no seeding; the process's own streams are left as they were."""
    import random
    import types

    import numpy as np
    import torch

    probe = _probe_module()
    probe._S = types.SimpleNamespace(seed=7)

    class Jittered:
        def __getitem__(self, i):
            return i, float(np.random.rand()), random.random()

    class InMemory:
        def __getitem__(self, i):
            return i

    learnt = probe._Streams()
    late = dict((i, rest) for i, *rest in learnt.fetch(Jittered(), range(40), 0, torch))
    assert learnt.used == {"numpy", "random"}
    early = dict((i, rest) for i, *rest in probe._Streams().fetch(Jittered(), [39, 30, 3], 0, torch))
    assert all(early[i] == late[i] for i in (39, 30, 3))
    assert early[39] != late[38]

    def draws():
        return random.random(), float(np.random.rand()), torch.rand(1).item()

    for ds, streams in ((Jittered(), learnt), (InMemory(), probe._Streams())):
        random.seed(1), np.random.seed(1), torch.manual_seed(1)
        alone = draws()
        random.seed(1), np.random.seed(1), torch.manual_seed(1)
        streams.fetch(ds, range(300), 1, torch)
        assert draws() == alone
    plain = probe._Streams()
    plain.fetch(InMemory(), range(300), 0, torch)
    assert plain.used == set()


DETECTION = '''
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Images(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        return torch.randn(3, 8, 8), {"labels": torch.tensor([i % 2])}


def collate(batch):
    return tuple(zip(*batch))


net = nn.Sequential(nn.Flatten(0), nn.Linear(192, 2))
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for workers in (0, 2):
    for images, targets in DataLoader(Images(), batch_size=4, collate_fn=collate, num_workers=workers):
        loss = sum(nn.functional.cross_entropy(net(im)[None], t["labels"]) for im, t in zip(images, targets))
        opt.zero_grad()
        loss.backward()
        opt.step()
'''


@pytest.mark.slow
def test_a_step_counts_the_samples_its_indices_named_whatever_the_collate_makes(tmp_path):
    """A detection-style loader collates a batch into a tuple of per-image tensors
    (3 x 8 x 8 each): the step used the 4 samples its batch sampler named, not the first
    image's 3 channels (the size of the first tensor found), with or without workers (their
    batches come back in the order the indices went out)."""
    from tests.verify_helpers import run_probe

    pytest.importorskip("torch")
    p, recs = run_probe(tmp_path, DETECTION)
    assert p.returncode == 0, p.stderr
    assert [r["samples"] for r in recs if r["ev"] == "step"] == [4] * 6


# --------------------------------------------------------------------------- inference only


def _printing(role: str, *outputs: str) -> "RunResult":
    from dp2ddp.verify.runner import Rank, RunResult

    ranks = {}
    for i, text in enumerate(outputs):
        r = Rank(rank=i)
        r.end = {"ev": "end", "steps": 0, "stdout": text, "stdout_cut": False}
        ranks[i] = r
    return RunResult(role=role, exit_code=0, wall_s=1.0, ranks=ranks, logs=[])


def test_an_inference_pair_is_judged_by_what_rank_zero_prints() -> None:
    """No optimizer step in either run: the migration passes when its rank 0 prints the
    original's lines; a line that differs between two runs of the original (a time) is not
    compared; any other difference fails, naming the line."""
    from dp2ddp.verify import analyze
    from dp2ddp.verify.options import Options

    opts = Options(steps=0, warmup=1, rtol=1e-5, stochastic_rtol=0.1, min_speedup=0.0, timeout=60.0, user_dirs=[],
                    nproc=2, nnodes=1)
    orig = _printing("original", "loaded in 1.2 s\nacc 0.91 loss 0.3\n")
    again = _printing("envelope", "loaded in 1.4 s\nacc 0.91 loss 0.3\n")
    good = _printing("migrated", "loaded in 2.0 s\nacc 0.91 loss 0.3\n", "")
    rep = analyze.compare(orig, good, opts, again)
    assert rep["verdict"] == "pass" and rep["inference"] == {"agree": True, "lines": 2, "noise": 1}, rep["problems"]
    assert not any("no optimizer step was observed" in p for p in rep["problems"])

    half = _printing("migrated", "loaded in 2.0 s\nacc 0.93 loss 0.3\n", "loaded in 2.0 s\nacc 0.89 loss 0.3\n")
    rep = analyze.compare(orig, half, opts, again)
    assert rep["verdict"] == "fail", rep
    assert any("line 2: original `acc 0.91 loss 0.3`, migrated rank 0 `acc 0.93 loss 0.3`" in p for p in rep["problems"])

    silent = _printing("original", "")
    rep = analyze.compare(silent, _printing("migrated", "", ""), opts, None)
    assert rep["verdict"] == "fail" and any("printed nothing" in p for p in rep["problems"]), rep["problems"]


def test_peak_gpu_memory_per_rank_is_reported_where_the_probe_saw_cuda() -> None:
    """The probe's end record carries each CUDA device's peak; the report shows the largest
    per rank (MiB) in its table and the plot's caption, and nothing of the kind on CPU."""
    import io

    from dp2ddp.verify import analyze, report
    from dp2ddp.verify.options import Options

    opts = Options(steps=0, warmup=1, rtol=1e-5, stochastic_rtol=0.1, min_speedup=0.0, timeout=60.0, user_dirs=[],
                   nproc=2, nnodes=1)
    orig = _printing("original", "acc 0.91\n")
    mig = _printing("migrated", "acc 0.91\n", "")
    rep = analyze.compare(orig, mig, opts, None)
    assert "gpu_memory" not in rep["original"] and "gpu_memory" not in rep["migrated"]
    assert "GPU" not in report.caption(rep)

    orig.ranks[0].end["gpu"] = [{"device": 0, "name": "NVIDIA H100", "peak_allocated": 3 * 2**30,
                                 "peak_reserved": 4 * 2**30}]
    for rank, used in ((0, 1.5), (1, 1.25)):
        mig.ranks[rank].end["gpu"] = [{"device": rank, "name": "NVIDIA H100", "peak_allocated": int(used * 2**30),
                                       "peak_reserved": 2 * 2**30},
                                      {"device": 1 - rank, "name": "NVIDIA H100", "peak_allocated": 2**20,
                                       "peak_reserved": 2**21}]
    rep = analyze.compare(orig, mig, opts, None)
    assert rep["migrated"]["gpu_memory"] == {"device": "NVIDIA H100", "peak_allocated_mib": {"0": 1536.0, "1": 1280.0},
                                             "max_mib": 1536.0}
    out = io.StringIO()
    report.show(rep, out)
    row = next(line for line in out.getvalue().splitlines() if line.startswith("peak GPU memory"))
    assert row.split() == "peak GPU memory (MiB, per rank) 3072.0 1536.0 / 1280.0".split(), out.getvalue()
    assert "peak GPU memory (NVIDIA H100, MiB per rank): original 3072.0, migrated 1536.0 / 1280.0" in report.caption(rep)


def test_a_failed_torchrun_run_is_quoted_by_what_the_script_printed_not_by_the_launchers_box():
    """A migrated script that stops with SystemExit("dp2ddp: ...") under torchrun: the report
    quotes the script's message, which comes before torchrun's own account of the failure."""
    from dp2ddp.verify.failures import _script_tail

    log = "\n".join([
        "epoch 0",
        "dp2ddp: batch size 1 does not split evenly between 2 processes; pass a multiple of the number of processes",
        "E1127 09:59:01.123000 42 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: 1) local_rank: 0 (pid: 7) of binary: python",
        "Traceback (most recent call last):",
        '  File "torchrun", line 8, in <module>',
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
        "============================================================",
        "main_ddp.py FAILED",
    ])
    tail = _script_tail(log)
    assert tail[-1].startswith("dp2ddp: batch size 1 does not split evenly") and not any("ChildFailedError" in t for t in tail)
    plain = "Traceback (most recent call last):\nValueError: boom"
    assert _script_tail(plain) == plain.splitlines()


def test_project_root_reaches_a_folder_the_script_adds_relative_to_where_it_runs(tmp_path, monkeypatch):
    """``sys.path.append(os.path.dirname(os.path.abspath(os.path.dirname("optimizers"))))``:
    the folder above the working directory, which a run started in the script's folder makes
    the one above the script. It is read as from there, never from dp2ddp's own working
    directory."""
    from dp2ddp.model.module_files import path_roots
    from dp2ddp.verify.scratch import project_root

    (tmp_path / "optimizers").mkdir()
    (tmp_path / "image_classification").mkdir()
    script = tmp_path / "image_classification" / "train.py"
    script.write_text("import os\nimport sys\n"
                      "sys.path.append(os.path.dirname(os.path.abspath(os.path.dirname('optimizers'))))\n"
                      "from optimizers import get_optimizer\n")
    elsewhere = tmp_path / "elsewhere" / "deeper"
    elsewhere.mkdir(parents=True)
    monkeypatch.chdir(elsewhere)  # a relative path is not this process's
    assert project_root(script) == tmp_path.resolve()
    # a module beside a script that adds a path relative to the working directory: read as
    # from the script's folder, where such a script is usually run from (not from here)
    (tmp_path / "image_classification" / "_paths.py").write_text("import os, sys\nsys.path.insert(0, os.path.abspath('..'))\n")
    (tmp_path / "image_classification" / "other.py").write_text("import _paths\n")
    assert path_roots(str(tmp_path / "image_classification")) == (str(tmp_path),)


def test_a_file_above_the_projects_copy_is_named_with_the_project_root_advice_not_a_barrier(tmp_path):
    """TransUNet reads ``../model/vit_checkpoint/...`` above its folder: missing in every run's
    copy. The crash names the path and --project-root; the barrier advice (a file rank 0
    writes late) is not given for it. A file inside the copy that is missing keeps it."""
    from dp2ddp.verify.failures import describe_failure
    from dp2ddp.verify.options import Options
    from dp2ddp.verify.runner import Rank, RunResult

    root = tmp_path / "pair0" / "migrated"
    root.mkdir(parents=True)

    def crash(message):
        rank = Rank(0)
        rank.error = {"type": "FileNotFoundError", "message": message, "traceback": "FileNotFoundError: " + message, "t": 1.0}
        run = RunResult(role="migrated", exit_code=1, wall_s=1.0, ranks={0: rank}, logs=[], root=root)
        problems, details = [], {}
        describe_failure(run, Options(steps=0, warmup=1, rtol=1e-5, stochastic_rtol=0.1, min_speedup=0.0, timeout=60.0,
                                      user_dirs=[], nproc=2, nnodes=1), problems, details)
        return details["crashes"][0]["advice"]

    for missing in ("../model/vit_checkpoint/R50+ViT-B_16.npz", str(tmp_path / "pair0" / "data" / "train.txt")):
        advice = crash(f"[Errno 2] No such file or directory: '{missing}'")
        assert advice[0].startswith(f"The script reads `{missing}`, outside the project folder") and "--project-root" in advice[0]
        assert not any("dist.barrier()" in a for a in advice), advice
    inside = crash(f"[Errno 2] No such file or directory: '{root / 'vocab.txt'}'")
    assert not any("outside the project folder" in a for a in inside) and any("dist.barrier()" in a for a in inside)


@pytest.mark.parametrize("steps,agree,compared,in_sync,losses_line,replicas_line", [
    (0, False, False, False, "not compared (no step of both runs to compare)",
     "not compared (a rank of the migrated run reported no parameters: it did not finish)"),
    (5, True, True, True, "yes (within 1e-05)", "yes"),
    (5, False, True, False, "no (within 1e-05)", "no"),
], ids=["both_crashed_nothing_compared", "compared_and_agree", "compared_and_differ"])
def test_the_summary_says_not_compared_where_nothing_was(steps, agree, compared, in_sync, losses_line, replicas_line):
    """A run that crashed before its first step left nothing to compare: the summary said
    "losses agree: no" and "replicas in sync: no" (CutMix-PyTorch's own crash under current
    torch), which reads as a finding about the migration."""
    from dp2ddp.verify.report import summary

    report = {"migrated": {"nproc": 2}, "steps_compared": steps, "losses_agree": agree, "tolerance": {"rule": "within 1e-05"},
              "max_rel_loss_diff": None if not steps else 0.0, "replicas_in_sync": in_sync, "replicas_compared": compared,
              "speedup": None, "min_speedup": 1.0}
    lines = dict(summary(report))
    assert lines["losses agree"] == losses_line
    assert lines["replicas in sync"] == replicas_line


def _loss_run(role: str, losses, ranks=(0,)):
    from dp2ddp.verify.runner import Rank, RunResult

    out = {}
    for r in ranks:
        rank = Rank(rank=r, pid=100 + r)
        rank.steps = [{"loss": x, "samples": 8 // len(ranks), "t": float(i)} for i, x in enumerate(losses)]
        rank.end = {"ev": "end", "why": "limit", "steps": len(losses), "envelope": "chunks"}
        out[r] = rank
    return RunResult(role=role, exit_code=0, wall_s=1.0, ranks=out, logs=[])


@pytest.mark.parametrize("stochastic, agree", [(["dropout"], True), (["batchnorm", "dropout"], True),
                                                (["batchnorm"], False), ([], False)])
def test_dropout_masks_are_judged_by_the_stochastic_tolerance_not_the_chunked_envelope(stochastic, agree):
    """temporal-shift-module resumed: dropout 0.5 before its classifier, 2 steps. The chunked
    run of the original drew its masks from the one stream in turn, nearly the original's;
    each rank drew its own, 0.035 apart at step 2 against an envelope of 0.015: FAIL for a
    legitimate difference. Dropout's masks go to --stochastic-rtol, as random draws do;
    BatchNorm alone stays judged against the chunked envelope."""
    from dp2ddp.verify.losses import judge_losses
    from dp2ddp.verify.options import Options

    opts = Options(steps=2, warmup=0, rtol=1e-5, stochastic_rtol=0.1, min_speedup=0.0, timeout=30, user_dirs=[], nproc=2, nnodes=1)
    orig, env = _loss_run("original", [4.0, 3.8]), _loss_run("envelope", [4.0, 3.799])
    mig = _loss_run("migrated", [4.0, 3.66], ranks=(0, 1))
    problems, notes = [], []
    judged = judge_losses(orig, mig, env, opts, stochastic, 2, problems, notes)
    assert judged["agree"] is agree, (problems, notes)
    assert any("does not cover dropout's masks" in n for n in notes) is ("dropout" in stochastic)


def _redrawn(run):
    for r in run.ranks.values():
        r.end["redrawn"] = True
    return run


@pytest.mark.parametrize("migrated, agree", [
    ([0.5, 0.40, 0.36, 0.30, 0.28, 0.26, 0.25], True),   # 0.112 off at the end, inside 2x the redrawn run's swing
    ([0.5, 0.40, 0.36, 0.30, 0.42, 0.50, 0.60], False),  # far past it: a broken migration still fails
], ids=["gan_noise_within_what_redrawing_alone_moves", "beyond_it"])
def test_random_draws_in_the_step_are_judged_against_the_redrawn_envelope(migrated, agree):
    """pytorch/examples dcgan with --workers 2: the ranks draw their own noise, and the
    discriminator's loss drifted 0.112 from the original's (moving average) against the fixed
    0.1: FAIL for a correct migration. The envelope run drew other numbers from its first
    training forward on (DP2DDP_VERIFY_REDRAW): the original moved as far on that alone, so the migration may
    differ by REDRAW_FACTOR times it, never by less than --stochastic-rtol."""
    from dp2ddp.verify.losses import REDRAW_FACTOR, judge_losses
    from dp2ddp.verify.options import Options

    opts = Options(steps=7, warmup=0, rtol=1e-5, stochastic_rtol=0.1, min_speedup=0.0, timeout=30, user_dirs=[], nproc=2, nnodes=1)
    orig = _loss_run("original", [0.5, 0.40, 0.36, 0.34, 0.33, 0.31, 0.30])
    env = _redrawn(_loss_run("envelope", [0.5, 0.42, 0.33, 0.31, 0.30, 0.28, 0.27]))
    mig = _loss_run("migrated", migrated, ranks=(0, 1))
    problems, notes = [], []
    judged = judge_losses(orig, mig, env, opts, ["random"], 7, problems, notes)
    assert judged["agree"] is agree, (problems, notes)
    assert judged["tolerance"]["method"] == "redraw" and judged["tolerance"]["factor"] == REDRAW_FACTOR
    assert "redrawn envelope" in judged["rule"]
    if not agree:
        assert "the redrawn envelope's" in problems[0], problems
    # without the redrawn run, the same migration is judged by --stochastic-rtol alone (the fixed 0.1)
    plain = judge_losses(orig, mig, _loss_run("envelope", [0.5, 0.42, 0.33, 0.31, 0.30, 0.28, 0.27]), opts, ["random"], 7, [], [])
    assert plain["tolerance"]["method"] == "chunks" and plain["tolerance"]["factor"] is None
    assert plain["agree"] is False  # the false alarm this fixes (and the broken one fails either way)


def test_the_redrawn_envelope_never_allows_less_than_the_stochastic_tolerance():
    """An envelope run that happened to move less than --stochastic-rtol does not tighten it:
    the fixed tolerance stays the floor (what verify allowed before)."""
    from dp2ddp.verify.losses import judge_losses
    from dp2ddp.verify.options import Options

    opts = Options(steps=4, warmup=0, rtol=1e-5, stochastic_rtol=0.1, min_speedup=0.0, timeout=30, user_dirs=[], nproc=2, nnodes=1)
    orig = _loss_run("original", [1.0, 0.9, 0.8, 0.7])
    env = _redrawn(_loss_run("envelope", [1.0, 0.9, 0.8, 0.7]))
    mig = _loss_run("migrated", [1.0, 0.93, 0.83, 0.74], ranks=(0, 1))
    judged = judge_losses(orig, mig, env, opts, ["random"], 4, [], [])
    assert judged["agree"] is True
