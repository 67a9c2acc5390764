"""`rewrite --shard-eval`: evaluation shared out by whole batches, with the original's metrics.

Each sharded fixture of ``fixtures/shard_eval/`` reports, after every evaluation, the
metrics its loop computed (``CHECK metrics-<tag> <rank> <repr>``) and how many samples the
network evaluated on that process (``CHECK seen-<tag> <rank> <n>``, counted by a forward
hook, outside the loop). The test runs

* the original (plain python),
* the default migration (every rank evaluates the whole set) under torchrun, 2 ranks,
* the ``--shard-eval`` migration under torchrun, 2 ranks, and as plain python,

and asserts

* the evaluation of the initial model (before any training step: the same weights in every
  run) prints exactly the original's metrics (``repr``: to the last bit) on every rank of
  every run;
* after training, the sharded evaluation prints exactly what the whole evaluation prints
  on the same weights (the two migrations train alike), on both ranks;
* each rank of the sharded run evaluated only its own batches (rank r: the original's
  batches r, r + 2, ...; together the dataset once, no padding and no duplicate), and a
  loader with fewer batches than ranks was evaluated whole on both.

The static side (which loops are sharded, which stay whole and why) is in the fixture
pairs (``tests/test_rewrite_fixtures.py``, ``fixtures/shard_eval/``) and below.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Dict, List

import pytest

from dp2ddp.migrate import Options, migrate_bytes
from tests._scripts import retry_exit_abort, run_script

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "shard_eval"
CHECK = re.compile(r"CHECK (\S+) (\S+) (.*)$", re.MULTILINE)

# fixture -> (tag of the evaluation before training, {seen tag: (dataset size, batch size)})
SHARDED = {
    "collected_predictions": ("init", {"init": (103, 10), "0": (103, 10), "1": (103, 10)}),
    "element_sums": ("init", {"init": (77, 8), "0": (77, 8), "1": (77, 8)}),
    "kuangliu_test_epoch": ("-1", {"-1": (100, 16), "0": (100, 16), "1": (100, 16)}),
    "mnist_test_function": ("init", {"init": (250, 50), "1": (250, 50), "2": (250, 50)}),
    "trainer_uneven_batches": ("init", {"init": (103, 10), "0": (103, 10), "1": (103, 10), "calib": (7, 16)}),
}


def _checks(output: str) -> Dict[str, Dict[str, str]]:
    out: Dict[str, Dict[str, str]] = defaultdict(dict)
    for name, rank, value in CHECK.findall(output):
        out[name][rank] = value.strip()
    return out


def _migrate(name: str, options: Options) -> bytes:
    src = FIXTURES / f"{name}.in.py"
    result = migrate_bytes(src.read_bytes(), str(src), options)
    assert not result.migration.blocked and not result.migration.warnings, [
        f"{f.line}: {f.code} {f.message}" for f in result.migration.warnings
    ]
    return result.output


def _run(tmp_path: Path, tag: str, name: str, script: bytes, torchrun: bool) -> Dict[str, Dict[str, str]]:
    folder = tmp_path / tag
    folder.mkdir()
    (folder / f"{name}.py").write_bytes(script)
    proc = retry_exit_abort(lambda: run_script([f"{name}.py"], folder, nproc=2 if torchrun else None), f"{name} {tag}")
    assert proc.returncode == 0, f"{tag} failed:\n{proc.stdout[-4000:]}"
    return _checks(proc.stdout)


def _shares(size: int, batch: int, world: int = 2) -> List[int]:
    """Samples each rank evaluates when rank r takes batches r, r + world, ...; every rank
    takes all of them when there are fewer batches than ranks."""
    sizes = [min(batch, size - i) for i in range(0, size, batch)]
    if len(sizes) < world:
        return [size] * world
    return [sum(sizes[r::world]) for r in range(world)]


@pytest.mark.torchrun
@pytest.mark.parametrize("name", sorted(SHARDED))
def test_sharded_evaluation_prints_the_original_metrics(name: str, tmp_path: Path) -> None:
    first, seen = SHARDED[name]
    sharded = _migrate(name, Options(shard_eval=True))
    assert b"EvalPass(" in sharded
    original = _run(tmp_path, "original", name, (FIXTURES / f"{name}.in.py").read_bytes(), torchrun=False)
    whole = _run(tmp_path, "whole", name, _migrate(name, Options()), torchrun=True)
    shard = _run(tmp_path, "shard", name, sharded, torchrun=True)
    python = _run(tmp_path, "python", name, sharded, torchrun=False)

    key = f"metrics-{first}"
    expected = original[key]["-"]
    assert shard[key] == {"0": expected, "1": expected}, (shard[key], expected)
    assert whole[key] == {"0": expected, "1": expected}
    assert python[key] == {"-": expected}
    for tag in seen:
        key = f"metrics-{tag}"
        assert set(original[key]) == {"-"}, key
        value = whole[key]["0"]
        assert whole[key] == {"0": value, "1": value}, key
        assert shard[key] == {"0": value, "1": value}, (key, shard[key], value)

    for tag, (size, batch) in seen.items():
        key = f"seen-{tag}"
        assert original[key] == {"-": str(size)}
        assert whole[key] == {"0": str(size), "1": str(size)}
        assert python[key] == {"-": str(size)}
        assert [int(shard[key][r]) for r in ("0", "1")] == _shares(size, batch), (key, shard[key])


INFERENCE = ("inference_test_script", "inference_dataparallel_checkpoint", "inference_no_grad_around_the_forward",
             "inference_no_grad_at_the_caller")


def _same_metrics(tmp_path: Path, name: str, source: bytes, migrated: bytes):
    """The original (python), the migration under torchrun and under python: every rank of
    each prints the original's `metrics-test`; the three runs' checks."""
    original = _run(tmp_path, "original", name, source, torchrun=False)
    shard = _run(tmp_path, "shard", name, migrated, torchrun=True)
    python = _run(tmp_path, "python", name, migrated, torchrun=False)
    expected = original["metrics-test"]["-"]
    assert shard["metrics-test"] == {"0": expected, "1": expected}, (shard["metrics-test"], expected)
    assert python["metrics-test"] == {"-": expected}
    return original, shard, python


@pytest.mark.torchrun
@pytest.mark.parametrize("name", INFERENCE)
def test_an_inference_only_script_migrates_with_its_evaluation_shared_out(name: str, tmp_path: Path) -> None:
    """No training step anywhere: the default migration shares out the evaluation (DDP168),
    each rank evaluates only its own batches, and every rank prints the original's metrics
    (a summed loss, a count, a list of confidences in the original's order). A checkpoint
    with DataParallel's `module.` keys, loaded into the wrapper, still loads."""
    src = FIXTURES / f"{name}.in.py"
    result = migrate_bytes(src.read_bytes(), str(src), Options())
    codes = [f.code for f in result.migration.findings]
    assert not result.migration.blocked and "DDP168" in codes and "DDP160" in codes, codes
    _, shard, python = _same_metrics(tmp_path, name, src.read_bytes(), result.output)
    assert [int(shard["seen-test"][r]) for r in ("0", "1")] == _shares(85, 9)
    assert python["seen-test"] == {"-": "85"}


def test_shares_of_an_uneven_loader() -> None:
    assert _shares(103, 10) == [53, 50] and sum(_shares(103, 10)) == 103
    assert _shares(100, 16) == [52, 48]
    assert _shares(7, 16) == [7, 7]


# --------------------------------------------------------------------------- what stays whole


def _findings(source: str, shard_eval: bool = True):
    result = migrate_bytes(source.encode(), "train.py", Options(shard_eval=shard_eval))
    return result, [(f.code, f.message) for f in result.migration.findings if f.code in ("DDP108", "DDP160", "DDP161")]


_HEAD = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

model = nn.DataParallel(nn.Linear(4, 3))
data = TensorDataset(torch.randn(40, 4), torch.randint(0, 3, (40,)))
train_loader = DataLoader(data, batch_size=8, shuffle=True)
test_loader = DataLoader(data, batch_size=8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
"""


def _script(evaluate: str, loop: str = "") -> str:
    return _HEAD + evaluate + "\n\nfor epoch in range(2):\n" + (loop or """\
    for x, y in train_loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    evaluate(model, test_loader)
""")


_SUMS = """
def evaluate(model, loader):
    correct = total = 0
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
            total += y.size(0)
    return correct / total
"""


def test_without_the_option_every_evaluation_loader_stays_whole() -> None:
    result, found = _findings(_script(_SUMS), shard_eval=False)
    assert [c for c, _ in found] == ["DDP108"]
    assert b"EvalPass" not in result.output


def test_a_loop_of_sums_is_sharded_and_its_sums_taken_back_after_it() -> None:
    result, found = _findings(_script(_SUMS))
    assert [c for c, _ in found] == ["DDP160"], found
    out = result.output.decode()
    assert "correct, total = loader_pass.track(correct, total)" in out
    assert "for x, y in loader_pass:" in out
    assert "correct, total = loader_pass.total(correct, total)" in out
    assert out.count("class EvalPass:") == 1


@pytest.mark.parametrize("evaluate,why", [
    (_SUMS.replace("        for x, y in loader:", "        for x, y in loader:\n            print(correct)"), "prints"),
    (_SUMS.replace("    with torch.no_grad():\n        for", "    if True:\n        for"), "gradients on"),
    (_SUMS.replace("            total += y.size(0)", "            total += y.size(0)\n            return total"), "returns"),
    (_SUMS.replace("            total += y.size(0)", "            total -= y.size(0)"), "-="),
    (_SUMS.replace("correct = total = 0", "correct = total = []"), "not a number"),
    (_SUMS.replace("            total += y.size(0)", "            total += y.size(0)\n            last = y"), "read after"),
    (_SUMS.replace("    return correct / total", "    return correct / total + float(x.sum())"), "`x`, set in the loop"),
    (_SUMS.replace("            total += y.size(0)", "            total += y.size(0)\n            y.normal_()"), "random"),
    (_SUMS.replace("        for x, y in loader:", "        prev = y0 = None\n        for x, y in loader:\n"
                   "            y0 = prev if prev is not None else y\n            prev = y"), "carries `prev`"),
    ("\n\nclass Meter:\n    def __init__(self):\n        self.sum = 0\n\n    def update(self, v):\n        self.sum += v\n"
     + _SUMS.replace("    correct = total = 0", "    correct = total = 0\n    meter = Meter()").replace(
         "            total += y.size(0)", "            total += y.size(0)\n            meter.update(y.size(0))"),
     "calls `update` (line 26), which changes `self.sum` in place"),
])
def test_what_keeps_a_loop_whole(evaluate: str, why: str) -> None:
    if "last = y" in evaluate:
        evaluate = evaluate.replace("    return correct / total", "    return last")
    result, found = _findings(_script(evaluate))
    codes = [c for c, _ in found]
    assert codes == ["DDP161"], found
    assert why in found[0][1], found
    assert b"EvalPass" not in result.output


_COLLECTS = """
def evaluate(model, loader):
    preds, seen = [], list()
    loss = 0.0
    with torch.no_grad():
        for x, y in loader:
            out = model(x)
            loss += nn.functional.cross_entropy(out, y).item()
            preds.append(out.argmax(1))
            seen.extend(y.tolist())
    return loss, torch.cat(preds), seen
"""


def test_a_loop_that_collects_into_empty_lists_is_sharded_and_its_lists_taken_back_in_order() -> None:
    result, found = _findings(_script(_COLLECTS))
    assert [c for c, _ in found] == ["DDP160"], found
    assert "`loss` added up and `preds`, `seen` collected" in found[0][1], found
    out = result.output.decode()
    assert "loss, preds, seen = loader_pass.track(loss, preds, seen)" in out
    assert "loss, preds, seen = loader_pass.total(loss, preds, seen)  # dp2ddp: every rank's sums and items" in out


@pytest.mark.parametrize("evaluate,why", [
    (_COLLECTS.replace("            preds.append(out.argmax(1))", "            preds.append(out.argmax(1))\n"
                       "            n = len(preds)"), "reads `preds`"),
    (_COLLECTS.replace("preds, seen = [], list()", "preds, seen = [torch.zeros(0)], list()"), "not an empty list"),
    (_COLLECTS.replace("            seen.extend(y.tolist())", "            seen.extend(y.tolist())\n            seen = seen[-8:]"),
     "carries `seen`"),
    (_COLLECTS.replace("            preds.append(out.argmax(1))", "            preds.insert(0, out.argmax(1))"), "preds.insert"),
])
def test_what_keeps_a_collecting_loop_whole(evaluate: str, why: str) -> None:
    result, found = _findings(_script(evaluate))
    assert [c for c, _ in found] == ["DDP161"], found
    assert why in found[0][1], found
    assert b"EvalPass" not in result.output


def test_a_condition_that_may_differ_between_ranks_keeps_the_loop_whole() -> None:
    loop = """\
    for x, y in train_loader:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    if loss.item() < 1.0:
        evaluate(model, test_loader)
"""
    _, found = _findings(_script(_SUMS, loop))
    assert [c for c, _ in found] == ["DDP161"] and "loss.item() < 1.0" in found[0][1], found


def test_a_condition_of_the_epoch_keeps_sharding() -> None:
    loop = """\
    for x, y in train_loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    if epoch % 2 == 1:
        evaluate(model, test_loader)
"""
    _, found = _findings(_script(_SUMS, loop))
    assert [c for c, _ in found] == ["DDP160"], found


def test_a_function_the_loop_calls_is_read_with_the_same_rules() -> None:
    helper = """
def log_batch(n):
    print('batch of', n)


def hits(out, y):
    return (out.argmax(1) == y).sum().item()
"""
    clean = _SUMS.replace("correct += (model(x).argmax(1) == y).sum().item()", "correct += hits(model(x), y)")
    _, found = _findings(_script(helper + clean))
    assert [c for c, _ in found] == ["DDP160"], found
    noisy = clean.replace("            total += y.size(0)", "            total += y.size(0)\n            log_batch(len(y))")
    _, found = _findings(_script(helper + noisy))
    assert [c for c, _ in found] == ["DDP161"] and "calls `log_batch`" in found[0][1] and "prints" in found[0][1], found


def test_an_enumerate_index_read_after_the_loop_gets_the_original_last_value() -> None:
    evaluate = """
def evaluate(model, loader):
    loss = 0.0
    with torch.no_grad():
        for i, (x, y) in enumerate(loader):
            loss += nn.functional.cross_entropy(model(x), y).item()
    return loss / (i + 1)
"""
    result, found = _findings(_script(evaluate))
    assert [c for c, _ in found] == ["DDP160"], found
    assert "i = loader_pass.last_index(i)" in result.output.decode()


@pytest.mark.torchrun
def test_an_inference_loop_that_stops_at_a_batch_number_evaluates_the_original_batches(tmp_path: Path) -> None:
    """outlier-exposure's OOD test shape: `if batch_idx >= n // bs and in_dist is False: break`
    first in an `enumerate(loader)` loop. Each rank numbers its batches as the original did
    (`loader_pass.numbered()`) and stops there: the sequential passes are shared out (the
    capped one too: 16 + 8 of the 24 samples the original scored), the shuffled ones are read
    whole on every rank up to the cap, and every rank prints the original's scores."""
    name = "inference_ood_capped"
    src = FIXTURES / f"{name}.in.py"
    result = migrate_bytes(src.read_bytes(), str(src), Options())
    codes = [f.code for f in result.migration.findings]
    assert not result.migration.blocked and "DDP168" in codes, codes
    assert "for batch_idx, (data, target) in loader_pass.numbered():" in result.output.decode()
    original, shard, python = _same_metrics(tmp_path, name, src.read_bytes(), result.output)
    assert [int(shard["seen-test"][r]) for r in ("0", "1")] == _shares(90, 8)
    assert [int(shard["seen-uniform"][r]) for r in ("0", "1")] == _shares(24, 8)
    for shuffled in ("gaussian", "rademacher"):
        assert shard[f"seen-{shuffled}"] == {"0": "24", "1": "24"}, shard
        assert original[f"seen-{shuffled}"] == {"-": "24"}


_CAPPED = """
import argparse
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from torchvision import datasets

p = argparse.ArgumentParser()
p.add_argument("--bs", type=int, default=8)
args = p.parse_args()
model = nn.DataParallel(nn.Linear(4, 3))
test_data = datasets.CIFAR10("data", train=False, transform=None)
n = len(test_data) // 5
loader = DataLoader(TensorDataset(torch.randn(40, 4)), batch_size=args.bs)
scores = []
with torch.no_grad():
    for i, (x,) in enumerate(loader):
        if i >= n // args.bs:
            break
        scores.append(model(x))
print(torch.cat(scores).sum())
"""


def _inference(source: str):
    result = migrate_bytes(source.encode(), "test.py", Options())
    return result, [(f.code, f.message) for f in result.migration.findings if f.severity == "error"]


@pytest.mark.parametrize("size", ["len(test_data)", "test_data.data.size(0)", "test_data.data.shape[0]"])
def test_a_cap_on_a_torchvision_datasets_size_is_the_same_on_every_rank(size: str) -> None:
    result, errors = _inference(_CAPPED.replace("len(test_data)", size))
    assert not errors, errors
    assert "for i, (x,) in loader_pass.numbered():" in result.output.decode()


@pytest.mark.parametrize("change,why", [
    (("if i >= n // args.bs:", "if i == n // args.bs:"), "may stop early"),  # stops once: a rank may pass it
    (("        if i >= n // args.bs:\n            break\n        scores.append(model(x))",
      "        scores.append(model(x))\n        if i >= n // args.bs:\n            break"), "may stop early"),  # after the work
    (("n = len(test_data) // 5", "n = int(torch.randint(8, 40, ()))"), "may stop early"),  # drawn on each rank
    (("print(torch.cat(scores).sum())", "print(torch.cat(scores).sum(), i)"), "is read after it"),
    (("test_data = datasets.CIFAR10(\"data\", train=False, transform=None)",
      "test_data = datasets.CIFAR10(\"data\", train=int(os.environ[\"RANK\"]) == 0)"), "may stop early"),
])
def test_what_keeps_a_capped_inference_loop_refused(change, why) -> None:
    source = _CAPPED.replace(*change)
    assert source != _CAPPED
    if "os.environ" in source:
        source = "import os\n" + source
    result, errors = _inference(source)
    assert [c for c, _ in errors] == ["DDP115"], errors
    assert why in errors[0][1], errors
    assert not result.changed


def test_a_capped_loop_of_a_training_script_stays_whole() -> None:
    """With training in the script its wrap syncs buffers on the first forward after it, and a
    cap can leave a rank no batch: --shard-eval keeps the loop whole (DDP161)."""
    capped = _SUMS.replace("        for x, y in loader:", "        for i, (x, y) in enumerate(loader):\n            if i >= 2:\n                break")
    result, found = _findings(_script(capped))
    assert [c for c, _ in found] == ["DDP161"], found
    assert "may stop early" in found[0][1]


def test_every_sharded_fixture_is_run() -> None:
    """A fixture whose migration shards a loop is run by the torchrun test above."""
    for case in FIXTURES.glob("*.in.py"):
        name = case.name[: -len(".in.py")]
        result = migrate_bytes(case.read_bytes(), str(case), Options(shard_eval=True))
        if any(f.code == "DDP160" for f in result.migration.findings):
            assert name in SHARDED or name in INFERENCE or name == "inference_ood_capped", name


def test_what_a_pass_sends_to_the_other_ranks_travels_on_the_cpu_and_comes_back_as_it_was() -> None:
    """Values and the keys of the elements a loop adds into (`conf[t, p] += 1`, the
    indices 0-d tensors of the batch): tensors travel on the CPU (a CUDA tensor pickled as
    it is would come back on the sending rank's device) and come back on their device's
    kind, tuples as tuples, lists as lists."""
    torch = pytest.importorskip("torch")
    from dp2ddp.templates import load

    scope: dict = {"torch": torch, "dist": torch.distributed}
    exec(load("shard_eval.py.tmpl").format(torch="torch", dist="dist", EvalPass="EvalPass", EvalBatches="EvalBatches",
                                           EvalSum="EvalSum", EvalElement="EvalElement", EvalList="EvalList"), scope)
    send, receive = scope["EvalPass"]._send, scope["EvalPass"]._receive
    key = (torch.tensor(2), torch.tensor(1))
    sent = send(key)
    assert sent[0] == "tuple" and [s[:1] + s[2:] for s in sent[1]] == [("tensor", "cpu"), ("tensor", "cpu")]
    back = receive(sent)
    assert isinstance(back, tuple) and [int(x) for x in back] == [2, 1]
    conf = torch.zeros(3, 3, dtype=torch.long)
    conf[back] += 1
    assert int(conf[2, 1]) == 1 and int(conf.sum()) == 1
    items = receive(send([torch.ones(2), ("a", 3), None]))
    assert isinstance(items, list) and items[1] == ("a", 3) and items[2] is None and items[0].tolist() == [1.0, 1.0]
    assert receive(send(None)) is None
