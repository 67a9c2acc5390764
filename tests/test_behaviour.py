"""`rewrite` never breaks a script that ran: each promise proven by running the migration.

Every fixture of ``fixtures/behaviour/`` is a DataParallel script; the test migrates it and
runs the original (plain ``python``), the migration under ``torchrun --nproc_per_node=2``
(gloo) and the migration as plain ``python``, each in its own scratch folder. The scripts
report facts on standard error (``CHECK <name> <rank> <value>``); the probe on
``PYTHONPATH`` (tests/behaviour_probe) adds whether a DistributedDataParallel object
exists at the first optimizer step and a hash of the optimizer's parameters at exit.
An exit code of 0 proves nothing on its own: every test asserts on what the runs did.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Dict, List

import pytest

from dp2ddp.migrate import migrate_source
from tests import _zygote
from tests._scripts import retry_exit_abort, run_script

ROOT = Path(__file__).resolve().parent.parent
BEHAVIOUR = ROOT / "fixtures" / "behaviour"
SUPPORT = ROOT / "fixtures" / "corpus" / "_support"
PROBE = Path(__file__).resolve().parent / "behaviour_probe"
# a CHECK line is one write to stderr, but another rank's print may have written its text
# and not yet its newline (print writes them separately): a CHECK starts anywhere on a line
CHECK = re.compile(r"CHECK (\S+) (\S+) (.*)$", re.MULTILINE)

pytestmark = pytest.mark.torchrun


def _env() -> dict:
    env = dict(os.environ)
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    env["PYTHONPATH"] = os.pathsep.join([str(PROBE), str(SUPPORT)])
    env["DP2DDP_BEHAVIOUR_PROBE"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Run:
    def __init__(self, folder: Path, proc: subprocess.CompletedProcess) -> None:
        self.folder = folder
        self.returncode = proc.returncode
        self.output = proc.stdout or ""
        self.checks: Dict[str, Dict[str, str]] = defaultdict(dict)
        for name, rank, value in CHECK.findall(self.output):
            self.checks[name][rank] = value.strip()

    def values(self, name: str) -> List[str]:
        return list(self.checks[name].values())


def _folder(tmp_path: Path, tag: str) -> Path:
    d = tmp_path / tag
    d.mkdir()
    for f in BEHAVIOUR.glob("*.py"):
        shutil.copy(f, d / f.name)
    return d


def _migrate(name: str) -> bytes:
    src = BEHAVIOUR / f"{name}.py"
    result = migrate_source(src.read_bytes(), str(src))  # the real path: project modules beside it are read
    assert not result.migration.blocked, [f"{f.line}: {f.code} {f.message}" for f in result.migration.findings]
    assert result.changed
    # DDP171 (a model never placed on a GPU, wrapped only under a device count) is about GPU
    # machines: some of these CPU fixtures never place their model, and run here as written
    warnings = [w for w in result.migration.warnings if w.code != "DDP171"]
    assert not warnings, [f"{f.line}: {f.code} {f.message}" for f in warnings]
    return result.output


def _runs(name: str, tmp_path: Path, args=(), python_ddp: bool = True) -> Dict[str, Run]:
    """original (python), migrated under torchrun (2 ranks) and as plain python (a world of
    one with DDP; ``python_ddp=False`` for a script whose own non-distributed path runs
    without torchrun)."""
    migrated = _migrate(name)
    out = {}
    d = _folder(tmp_path, "original")
    out["original"] = Run(d, run_script([f"{name}.py", *args], d, env=_env()))
    d = _folder(tmp_path, "torchrun")
    (d / f"{name}.py").write_bytes(migrated)
    out["torchrun"] = Run(d, retry_exit_abort(lambda: run_script([f"{name}.py", *args], d, env=_env(), nproc=2), name))
    d = _folder(tmp_path, "python")
    (d / f"{name}.py").write_bytes(migrated)
    out["python"] = Run(d, run_script([f"{name}.py", *args], d, env=_env()))
    for tag, r in out.items():
        assert r.returncode == 0, f"{tag} run failed:\n{r.output[-4000:]}"
    tr = out["torchrun"]
    # the wrapper exists before the first optimizer step, on every rank; replicas in sync
    assert tr.checks["ddp-at-first-step"] == {"0": "True", "1": "True"}, tr.output[-3000:]
    assert out["python"].values("ddp-at-first-step") == [str(python_ddp)]
    assert len(tr.checks["params"]) == 2 and len(set(tr.values("params"))) == 1, "replicas out of sync"
    return out


def _keys(path: Path) -> list:
    import torch

    obj = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(obj, dict) and "net" in obj:
        obj = obj["net"]
    return sorted(obj.keys())


def test_wrap_inside_main_guard_takes_effect_before_training(tmp_path: Path) -> None:
    runs = _runs("wrap_in_main_guard", tmp_path)
    # printed once per epoch: by rank 0 only
    assert runs["torchrun"].output.count("epoch ") == 2


def test_evaluation_inside_print_runs_on_every_rank(tmp_path: Path) -> None:
    migrated = _migrate("eval_in_print").decode()
    assert "nn.DataParallel(model)" not in migrated  # the evaluation re-wrap is gone
    runs = _runs("eval_in_print", tmp_path)
    tr = runs["torchrun"]
    assert tr.checks["finished"] == {"0": "1", "1": "1"}, tr.output[-3000:]
    assert tr.output.count("eval loss = ") == 2  # two epochs, printed on rank 0 only


def test_folder_made_on_every_rank_and_one_log_file(tmp_path: Path) -> None:
    runs = _runs("makedirs_logging", tmp_path)
    tr = runs["torchrun"]
    assert tr.checks["finished"] == {"0": "1", "1": "1"}
    logs = list(tr.folder.rglob("train.log"))
    assert [p.relative_to(tr.folder).as_posix() for p in logs] == ["out/run1/train.log"]
    assert logs[0].read_text().count("epoch") == 2  # rank 0's records only
    assert (tr.folder / "ckpt" / "last.pt").exists()
    assert _keys(tr.folder / "ckpt" / "last.pt") == _keys(runs["original"].folder / "ckpt" / "last.pt")


def test_model_methods_attributes_and_freezing_through_the_wrapper(tmp_path: Path) -> None:
    runs = _runs("model_methods", tmp_path)
    for tag in ("torchrun", "python"):
        r = runs[tag]
        assert set(r.values("predict-shape")) == {"(5,)"}, r.output[-2000:]
        assert set(r.values("classes")) == {"3"}
        assert set(r.values("backbone-unchanged-after-freeze")) == {"True"}
        assert set(r.values("head-trained")) == {"True"}
    assert len(runs["torchrun"].checks["predict-shape"]) == 2
    # the wrap, under `device_count() > 1`, did not exist on one GPU: the keys stay without `module.`
    assert _keys(runs["torchrun"].folder / "model.pt") == _keys(runs["original"].folder / "model.pt")
    assert not any(k.startswith("module.") for k in _keys(runs["torchrun"].folder / "model.pt"))


def test_checkpoint_keys_as_before_and_a_resumed_run_loads(tmp_path: Path) -> None:
    runs = _runs("checkpoint_resume", tmp_path)
    tr = runs["torchrun"]
    ours = _keys(tr.folder / "checkpoint" / "ckpt.pth")
    assert ours == _keys(runs["original"].folder / "checkpoint" / "ckpt.pth")
    assert all(k.startswith("module.") for k in ours)  # unconditional wrap: the prefix as before
    argv = ["checkpoint_resume.py", "--resume", "--epochs", "1"]
    resumed = Run(tr.folder, retry_exit_abort(lambda: run_script(argv, tr.folder, env=_env(), nproc=2), "resume"))
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert resumed.checks["resumed-from"] == {"0": "1", "1": "1"}
    migrated = (tr.folder / "checkpoint_resume.py").read_text()
    assert "map_location" in migrated


def test_writers_exactly_one_of_each_per_run(tmp_path: Path) -> None:
    runs = _runs("writers_all", tmp_path)
    for tag in ("original", "torchrun", "python"):
        r = runs[tag]
        events = list((r.folder / "runs").glob("events.out.tfevents.*"))
        assert len(events) == 1, (tag, events)
        assert len(list((r.folder / "wandb").glob("offline-run-*"))) == 1, tag
        assert json.loads((r.folder / "results.json").read_text()).keys() == {"0", "1"}
        assert (r.folder / "logs" / "train.log").read_text().count("epoch") == 2, tag
        assert r.output.count("[tqdm stand-in]") == 2, (tag, r.output[-2000:])  # one bar per epoch
    assert runs["torchrun"].checks["finished"] == {"0": "1", "1": "1"}


def test_a_writer_kept_in_a_dict_writes_one_event_file(tmp_path: Path) -> None:
    """HRNet's `writer_dict`: the writer's uses cannot be put under a rank test one by one,
    so rank 0 makes the SummaryWriter and the other ranks a stand-in that writes nothing
    (DDP173): one event file per run, and every rank finishes."""
    runs = _runs("writer_in_a_dict", tmp_path)
    for tag in ("original", "torchrun", "python"):
        events = list((runs[tag].folder / "log").glob("events.out.tfevents.*"))
        assert len(events) == 1, (tag, events)
    assert runs["torchrun"].checks["finished"] == {"0": "1", "1": "1"}
    assert b"else WritesNothing()" in _migrate("writer_in_a_dict")


def test_positional_inline_dataset_is_sharded(tmp_path: Path) -> None:
    """verify: the migration's per-step global loss equals the original's, replicas in sync."""
    _runs("positional_inline_dataset", tmp_path)
    work = _folder(tmp_path, "verify")
    (work / "positional_inline_dataset_ddp.py").write_bytes(_migrate("positional_inline_dataset"))
    report = tmp_path / "verify.json"
    env = _env()
    env.pop("DP2DDP_BEHAVIOUR_PROBE")
    r = _zygote.run_verify(  # verify and its runs forked from a zygote (real with DP2DDP_TEST_REAL_LAUNCH=1)
        ["positional_inline_dataset.py", "--steps", "0", "--min-speedup", "0", "--repeat", "1", "--json", str(report)],
        work, _zygote.verify_env(env), timeout=600,
    )
    assert _zygote.forks_alive() == [], "runs of verify outlived it"
    _zygote.verify_fallbacks()
    data = json.loads(report.read_text())
    assert data["verdict"] == "pass", (r.stdout[-3000:], data.get("problems"))
    assert data["losses_agree"] and data["replicas_in_sync"]


def test_gan_functional_data_parallel_both_models_wrapped(tmp_path: Path) -> None:
    migrated = _migrate("gan_functional").decode()
    import ast

    called = {ast.unparse(c.func) for c in ast.walk(ast.parse(migrated)) if isinstance(c, ast.Call)}
    assert not any(name.endswith("data_parallel") for name in called)
    assert migrated.count("netG = DistributedDataParallel(") == 1 and migrated.count("netD = DistributedDataParallel(") == 1
    runs = _runs("gan_functional", tmp_path)
    tr = runs["torchrun"]
    assert tr.checks["finished"] == {"0": "1", "1": "1"}
    for ckpt in ("netG.pth", "netD.pth"):
        assert _keys(tr.folder / ckpt) == _keys(runs["original"].folder / ckpt)  # no `module.`: no wrapper existed


def test_mixed_script_forms_a_world_of_two_and_runs_as_plain_python(tmp_path: Path) -> None:
    runs = _runs("mixed_local_rank", tmp_path, python_ddp=False)
    assert runs["torchrun"].checks["world"] == {"0": "2", "1": "2"}
    assert runs["python"].values("world") == ["1"]
    assert runs["torchrun"].checks["finished"] == {"0": "1", "1": "1"}


def test_unresolved_spelling_exits_1_naming_the_line(tmp_path: Path) -> None:
    src = tmp_path / "unresolved_star.py"
    shutil.copy(BEHAVIOUR / "unresolved_star.py", src)
    r = subprocess.run([sys.executable, "-m", "dp2ddp", "rewrite", str(src)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{src}:5:9: DDP107" in r.stderr
    assert not (tmp_path / "unresolved_star_ddp.py").exists()


def test_training_loaders_sharded_wherever_their_values_go(tmp_path: Path) -> None:
    """Loaders handed to a Trainer, zipped, with a sampler that is None, weighted, batch-sampled,
    built by a project module, held by a project class imported with a star, and pulled from a
    generator: under torchrun the two ranks serve disjoint halves of every epoch, together the
    whole data set, a new order every epoch, as many steps as the original. The evaluation
    loop that takes its inputs' gradients (an attack, no optimizer step) reads the whole set
    on every rank."""
    runs = _runs("data_partition", tmp_path)
    orig, tr, py = runs["original"], runs["torchrun"], runs["python"]
    names = sorted({n.rsplit("-epoch", 1)[0] for n in orig.checks if n[-1].isdigit() and "-epoch" in n} - {"eval"})
    assert names == ["buckets", "fitted", "held", "helper", "none", "src", "stream", "tgt", "weighted"], sorted(orig.checks)
    for epoch in (0, 1):
        whole = orig.checks[f"eval-epoch{epoch}"]["-"]
        assert whole == ",".join(map(str, range(10)))
        assert tr.checks[f"eval-epoch{epoch}"] == {"0": whole, "1": whole}
    for name in names:
        for epoch in (0, 1):
            key = f"{name}-epoch{epoch}"
            whole = sorted(int(i) for i in orig.checks[key]["-"].split(","))
            shares = [[int(i) for i in tr.checks[key][r].split(",")] for r in ("0", "1")]
            assert not set(shares[0]) & set(shares[1]), (key, shares)
            assert sorted(shares[0] + shares[1]) == whole, (key, shares, whole)
            assert sorted(int(i) for i in py.checks[key]["-"].split(",")) == whole, key
        if name != "fitted":  # its sampler is sequential: the same order every epoch, as in the original
            assert tr.checks[f"{name}-epoch0"]["0"] != tr.checks[f"{name}-epoch1"]["0"], f"{name}: epoch 1 replays epoch 0"
    assert tr.checks["src-epoch0"]["0"] != tr.checks["tgt-epoch0"]["0"], "two zipped loaders drew one permutation"
    assert tr.checks["steps-per-epoch"] == {"0": orig.checks["steps-per-epoch"]["-"], "1": orig.checks["steps-per-epoch"]["-"]}


def test_whole_model_checkpoints_load_without_a_process_group(tmp_path: Path) -> None:
    """``torch.save(net)`` / ``{"net": net}`` of the wrapper: the migration's files load in a fresh
    python with no process group and no dp2ddp (an evaluation script), as the original's do,
    and hold the model itself."""
    runs = _runs("whole_model_save", tmp_path)
    probe = (
        "import sys, torch\n"
        "whole = torch.load('model.pth', weights_only=False)\n"
        "ckpt = torch.load('ckpt.pth', weights_only=False)\n"
        "for m in (whole, ckpt['net']):\n"
        "    inner = getattr(m, 'module', m)\n"
        "    print(type(m).__name__, tuple(inner(torch.zeros(2, 4)).shape))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    seen = {}
    for tag in ("original", "torchrun", "python"):
        r = subprocess.run([sys.executable, "-c", probe], cwd=runs[tag].folder, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (tag, r.stderr[-2000:])
        seen[tag] = r.stdout.split("\n")
        assert "DistributedDataParallel" not in r.stdout, (tag, r.stdout)
    assert seen["torchrun"][0] == "Sequential (2, 1)" and seen["torchrun"] == seen["python"]
    assert seen["original"][0] == "DataParallel (2, 1)"  # the original pickled its wrapper


def test_a_training_step_in_a_closure_trains_through_ddp(tmp_path: Path) -> None:
    """reid-strong-baseline's ``create_supervised_trainer``: the wrap is local to the factory
    and the step is a closure handed to an Engine. _runs checks DDP exists at the first step
    on both ranks and the replicas end in sync; the evaluator's wrap is gone."""
    migrated = _migrate("closure_trainer").decode()
    assert migrated.count("DistributedDataParallel(model") == 1 and "DataParallel(model)" not in migrated
    runs = _runs("closure_trainer", tmp_path)
    assert runs["torchrun"].checks["finished"] == {"0": "1", "1": "1"}


def test_a_helpers_log_holds_each_line_once_and_its_whole_save_loads_without_a_process_group(tmp_path: Path) -> None:
    """pt.darts: ``utils.get_logger(path)`` gives a logger a file handler on every rank, and
    ``utils.save_checkpoint(model, ...)`` pickles what it is handed. The migration's log has
    the original's lines, once each; its file holds the bare model, loadable anywhere."""
    runs = _runs("helpers_logger_and_whole_save", tmp_path)
    probe = "import torch\nm = torch.load('model.pth', weights_only=False)\nprint(type(m).__name__, tuple(m(torch.zeros(2, 4)).shape))\n"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    original_log = (runs["original"].folder / "augment.log").read_text()
    assert original_log == "epoch 0 done\nepoch 1 done\n"
    for tag in ("torchrun", "python"):
        assert (runs[tag].folder / "augment.log").read_text() == original_log, tag
        r = subprocess.run([sys.executable, "-c", probe], cwd=runs[tag].folder, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and r.stdout == "Sequential (2, 1)\n", (tag, r.stdout, r.stderr[-2000:])


def test_checkpoint_keys_as_the_projects_evaluation_script_reads_them(tmp_path: Path) -> None:
    """The checkpoint policy (model/checkpoint_keys.py key_policy): evaluate.py beside the script
    loads into the bare model, so the migration writes plain keys; evaluate.py reads the
    migration's file in a fresh python (no process group), and a resumed torchrun run
    loads it back into the wrapper."""
    src = BEHAVIOUR / "eval_script_keys"
    result = migrate_source((src / "train.py").read_bytes(), str(src / "train.py"))
    assert not result.migration.blocked and result.changed
    assert any(f.code == "DDP150" and "evaluate.py:9" in f.message for f in result.migration.findings)
    runs = {}
    for tag in ("original", "torchrun"):
        d = tmp_path / tag
        shutil.copytree(src, d)
        if tag == "original":
            runs[tag] = run_script(["train.py"], d, env=_env())
        else:
            (d / "train.py").write_bytes(result.output)
            runs[tag] = retry_exit_abort(lambda: run_script(["train.py"], d, env=_env(), nproc=2), "eval_keys")
        assert runs[tag].returncode == 0, (tag, runs[tag].stdout[-3000:])
        ev = subprocess.run([sys.executable, "evaluate.py"], cwd=d, capture_output=True, text=True, timeout=120,
                            env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RANK", "WORLD_SIZE")})
        assert ev.returncode == 0 and ev.stdout.startswith("eval"), (tag, ev.stderr[-2000:])
        keys = sorted(__import__("torch").load(d / "out" / "last.pth", weights_only=True)["model"])
        assert not any(k.startswith("module.") for k in keys), (tag, keys)
    d = tmp_path / "torchrun"
    resumed = retry_exit_abort(lambda: run_script(["train.py", "--resume"], d, env=_env(), nproc=2), "eval_keys_resume")
    assert resumed.returncode == 0, resumed.stdout[-3000:]


def test_a_whole_model_loaded_before_the_wrap_resumes_from_the_originals_checkpoint(tmp_path: Path) -> None:
    """fixup's shape: ``net = checkpoint["net"]`` above the wrap. The original's checkpoint
    pickles its DataParallel wrapper; the migration, resumed from it under torchrun and as
    plain python, unwraps it (the script's own check right after the load sees the bare
    model), wraps the model in DDP, trains and saves the bare model, which it then resumes
    from again."""
    import torch

    runs = _runs("resume_whole_before_wrap", tmp_path)
    assert "resumed" not in runs["original"].checks  # a fresh run: nothing to resume
    original_ckpt = runs["original"].folder / "ckpt.pth"
    assert type(torch.load(original_ckpt, weights_only=False)["net"]).__name__ == "DataParallel"
    for tag in ("torchrun", "python"):
        d = runs[tag].folder
        shutil.copy(original_ckpt, d / "ckpt.pth")
        nproc = 2 if tag == "torchrun" else None
        for _ in range(2):  # the original's file, then the migration's own
            r = Run(d, retry_exit_abort(lambda: run_script(["resume_whole_before_wrap.py"], d, env=_env(), nproc=nproc), tag))
            assert r.returncode == 0, r.output[-3000:]
            assert set(r.values("resumed")) == {"Sequential"}, r.output[-3000:]
            assert len(set(r.values("params"))) == 1, "replicas out of sync"
            assert type(torch.load(d / "ckpt.pth", weights_only=False)["net"]).__name__ == "Sequential"


@pytest.mark.parametrize("workers", ["2", "0"])
def test_an_iterable_dataset_is_split_as_dataparallel_split_its_batches(tmp_path: Path, workers: str) -> None:
    """An IterableDataset's loader (issue 20), its stream split by DataLoader worker or read
    in one process: under torchrun, rank 0's slice of every step followed by rank 1's is the
    original's batch, as many steps, and the mean of the ranks' losses is the original's loss
    at every step (the global batch trains as before)."""
    runs = _runs("text_stream", tmp_path, args=("--workers", workers))
    orig, tr = runs["original"], runs["torchrun"]
    for epoch in (0, 1):
        assert tr.checks[f"steps-{epoch}"] == {"0": orig.checks[f"steps-{epoch}"]["-"], "1": orig.checks[f"steps-{epoch}"]["-"]}
    steps = sorted(k for k in orig.checks if k.startswith("rows-"))
    assert len(steps) == (8 if workers == "2" else 6), steps
    for key in steps:
        whole = json.loads(orig.checks[key]["-"])
        shares = [json.loads(tr.checks[key][r]) for r in ("0", "1")]
        assert len(shares[0]) == len(shares[1]) == len(whole) // 2 and shares[0] + shares[1] == whole, key
        loss = key.replace("rows-", "loss-")
        mean = (float(tr.checks[loss]["0"]) + float(tr.checks[loss]["1"])) / 2
        assert mean == pytest.approx(float(orig.checks[loss]["-"]), rel=1e-4, abs=1e-5), (key, mean, orig.checks[loss])
    mine = [k for k in orig.checks if k.startswith(("rows-", "loss-", "steps-"))]
    assert {k: runs["python"].checks[k] for k in mine} == {k: orig.checks[k] for k in mine}  # a world of one: the original


def test_noise_drawn_per_sample_is_the_originals_split_between_the_ranks(tmp_path: Path) -> None:
    """Each rank draws the global batch's timesteps and noise and keeps its rows: together the
    ranks hold the original's draw, not world-size copies of one half of it."""
    migrated = _migrate("noise_per_sample").decode()
    assert migrated.count(".chunk(dist.get_world_size())[dist.get_rank()]") == 2
    runs = _runs("noise_per_sample", tmp_path)
    orig, tr, py = runs["original"], runs["torchrun"], runs["python"]
    assert tr.checks["finished"] == {"0": "1", "1": "1"}
    for name in ("timesteps", "noise"):
        whole = orig.values(name)[0].split(",")
        halves = [tr.checks[name][r].split(",") for r in ("0", "1")]
        assert halves[0] != halves[1], f"{name}: both ranks drew the same rows"
        assert halves[0] + halves[1] == whole, name
        assert py.values(name) == orig.values(name)  # a world of one draws what the original drew


def test_noise_shaped_like_the_batch_differs_between_the_ranks(tmp_path: Path) -> None:
    """``torch.randn(img.size())`` and ``torch.randn_like(img)``: each rank keeps its own of
    world-size draws made alike on every rank, so the ranks' noise differs; a world of one
    draws what the original drew."""
    migrated = _migrate("noise_shaped").decode()
    assert migrated.count("for _ in range(dist.get_world_size())][dist.get_rank()]") == 2
    runs = _runs("noise_shaped", tmp_path)
    tr = runs["torchrun"]
    assert tr.checks["finished"] == {"0": "1", "1": "1"}
    assert tr.checks["noise"]["0"] != tr.checks["noise"]["1"], "both ranks drew the same noise"
    assert runs["python"].values("noise") == runs["original"].values("noise")


def test_in_batch_loss_gathers_every_ranks_share_and_trains_as_the_original(tmp_path: Path) -> None:
    """An NT-Xent loss over the batch: its inputs are gathered from every rank (DDP154), so
    each rank computes the original's loss on the global batch, step after step (the
    gradient each rank keeps makes DDP's average the original's step)."""
    migrated = _migrate("contrastive_gathered").decode()
    assert "nt_xent_loss(GatherBatch.apply(p1), GatherBatch.apply(p2))" in migrated
    _every_rank_steps_as_the_original(_runs("contrastive_gathered", tmp_path), "loss", 8)


def test_a_dice_loss_over_the_whole_batch_is_gathered_and_trains_as_the_original(tmp_path: Path) -> None:
    """A soft Dice loss of the project (a ratio of totals over the whole batch, in a helper
    method of the loss class): its inputs are gathered from every rank (DDP154), so every
    rank computes the original's Dice loss over the global batch, step after step; the
    cross-entropy beside it stays each rank's mean. Ungathered, each rank's Dice over its
    half differs from the original's at the first step."""
    migrated = _migrate("dice_gathered").decode()
    assert "dice(GatherBatch.apply(outputs), GatherBatch.apply(label_batch))" in migrated
    assert "ce(outputs, label_batch)" in migrated
    _every_rank_steps_as_the_original(_runs("dice_gathered", tmp_path), "dice", 6)


def _every_rank_steps_as_the_original(runs, name: str, steps: int) -> None:
    """The value ``name<step>`` each rank reports under torchrun, and the world of one's, is
    the original's at every step (a gathered loss: every rank computes the global batch's)."""
    orig, tr, py = runs["original"], runs["torchrun"], runs["python"]
    assert tr.checks["finished"] == {"0": "1", "1": "1"}
    for step in range(steps):
        want = float(orig.values(f"{name}{step}")[0])
        for rank in ("0", "1"):
            assert abs(float(tr.checks[f"{name}{step}"][rank]) - want) <= 1e-4 * max(1.0, abs(want)), (step, rank)
        assert abs(float(py.values(f"{name}{step}")[0]) - want) <= 1e-5 * max(1.0, abs(want))


def test_loaders_by_phase_shard_the_training_key_and_keep_the_others_whole(tmp_path: Path) -> None:
    """A dict of loaders by phase (a comprehension, a literal walked by ``.items()``): under
    torchrun the two ranks serve disjoint halves of the training key's epoch, together the
    whole set, a new order every epoch; the evaluation key is served whole on every rank."""
    runs = _runs("phase_loaders", tmp_path)
    orig, tr, py = runs["original"], runs["torchrun"], runs["python"]
    for form in ("comp", "literal"):
        for epoch in (0, 1):
            key = f"{form}-train-epoch{epoch}"
            whole = sorted(int(i) for i in orig.checks[key]["-"].split(","))
            shares = [[int(i) for i in tr.checks[key][r].split(",")] for r in ("0", "1")]
            assert not set(shares[0]) & set(shares[1]), (key, shares)
            assert sorted(shares[0] + shares[1]) == whole, (key, shares, whole)
            assert sorted(int(i) for i in py.checks[key]["-"].split(",")) == whole, key
            val = f"{form}-val-epoch{epoch}"
            every = sorted(int(i) for i in orig.checks[val]["-"].split(","))
            for r in ("0", "1"):
                assert sorted(int(i) for i in tr.checks[val][r].split(",")) == every, (val, r)
        assert tr.checks[f"{form}-train-epoch0"]["0"] != tr.checks[f"{form}-train-epoch1"]["0"], f"{form}: epoch 1 replays epoch 0"
    assert tr.checks["steps-per-epoch"] == {"0": orig.checks["steps-per-epoch"]["-"], "1": orig.checks["steps-per-epoch"]["-"]}


def test_unseeded_draws_before_training_are_alike_on_every_rank(tmp_path: Path) -> None:
    """A split, a shuffle and a NumPy permutation drawn without a seed: each forked rank starts
    from its own random state, and the migration's set-up makes them go on from rank 0's."""
    tr = _runs("unseeded_split", tmp_path)["torchrun"]
    for name in ("split", "shuffled", "numpy"):
        assert len(tr.checks[name]) == 2 and len(set(tr.values(name))) == 1, (name, tr.checks[name])


def test_parameters_frozen_at_the_wrap_and_unfrozen_later_train_alike_on_every_rank(tmp_path: Path) -> None:
    """The backbone, frozen when the model is wrapped, is unfrozen at epoch 1: the migration
    builds the wrapper over every parameter (DDP112), so the backbone's gradients are averaged
    once it trains. Without that, the replicas' backbones drift apart (the probe's parameter
    hash and the backbone's sum differ between the ranks)."""
    runs = _runs("unfreeze_after_wrap", tmp_path)
    tr = runs["torchrun"]
    assert set(tr.values("backbone-trained")) == {"True"}, tr.output[-3000:]
    assert len(tr.checks["backbone-sum"]) == 2 and len(set(tr.values("backbone-sum"))) == 1, tr.checks["backbone-sum"]


def test_a_dtype_conversion_after_the_wrap_keeps_the_replicas_in_sync(tmp_path: Path) -> None:
    """`model.double()` on the wrapper after the wrap: the migration wraps the converted
    module again (DDP129); a DDP built for float32 would leave the float64 gradients of each
    rank's share unaveraged (the probe's parameter hash would differ between the ranks)."""
    runs = _runs("double_after_wrap", tmp_path)
    assert set(runs["torchrun"].values("dtype")) == {"torch.float64"}


def test_a_project_evaluation_handed_the_model_runs_on_rank_0_with_the_bare_module(tmp_path: Path) -> None:
    """lightweight-human-pose-estimation: ``evaluate(..., net)`` (a project helper that runs
    the model and writes a file) runs on rank 0 alone, handed ``net.module``: handed the DDP
    wrapper, its forward's buffer broadcast would wait for ranks that never come (the run
    failed so before). Every run finishes and writes the file."""
    migrated = _migrate("eval_handed_model").decode()
    assert "evaluate(val_images, \"val_output.json\", fed_like_the_wrapper(net.module))" in migrated, migrated
    runs = _runs("eval_handed_model", tmp_path)
    for tag in ("original", "torchrun", "python"):
        assert len(json.loads((runs[tag].folder / "val_output.json").read_text())) == 3, tag
