"""Project mode: ``dp2ddp rewrite train.py --with-helpers`` migrates the script that runs and
the project modules that hold its DataParallel wraps as one plan."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dp2ddp.cli import main
from tests._scripts import retry_exit_abort, run_script

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ROOT / "fixtures" / "project" / "factory_in_models"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    d = tmp_path / "proj"
    shutil.copytree(PROJECT, d)
    return d


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PYTHONPATH")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def test_script_without_dataparallel_whose_helper_wraps_is_refused_not_silent(project: Path, capsys) -> None:
    before = {p: p.read_bytes() for p in project.rglob("*.py")}
    assert main(["rewrite", str(project / "train.py")]) == 1
    err = capsys.readouterr().err
    assert "DDP151" in err and "models/__init__.py:18" in err and "--with-helpers" in err
    assert {p: p.read_bytes() for p in project.rglob("*.py")} == before  # nothing written, nothing changed


AGENT_SCRIPT = """import argparse
import torch
import agents

p = argparse.ArgumentParser()
p.add_argument("--agent_type", default="regular")
p.add_argument("--agent_name", default="Plain")
args = p.parse_args()
agent = agents.__dict__[args.agent_type].__dict__[args.agent_name]({"gpus": [0, 1]})
for _ in range(3):
    print(agent.step(torch.randn(8, 4)))
"""
AGENT_MODULE = """import torch
import torch.nn as nn


def bare(net):
    return net.module if isinstance(net, nn.DataParallel) else net


class Plain:
    def __init__(self, config):
        self.net = nn.Linear(4, 1)
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.1)
        if len(config["gpus"]) > 1:
            self.net = nn.DataParallel(self.net)

    def step(self, x):
        loss = self.net(x).pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss.item()
"""


@pytest.mark.parametrize("lookup", ["agents.__dict__[args.agent_type].__dict__[args.agent_name]",
                                    "getattr(getattr(agents, args.agent_type), args.agent_name)"])
def test_a_class_looked_up_by_name_in_a_project_package_that_wraps_is_refused_not_silent(tmp_path: Path, capsys, lookup) -> None:
    """GT-RIPL/Continual-Learning-Benchmark's shape: the agent class is looked up by name in
    the project package the script imports, and the agent wraps its model in DataParallel.
    No call graph says which class runs: "nothing to migrate" (exit 0) was a silent miss."""
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "__init__.py").write_text("from . import regular\n")
    (tmp_path / "agents" / "regular.py").write_text(AGENT_MODULE)
    script = tmp_path / "train.py"
    script.write_text(AGENT_SCRIPT.replace("agents.__dict__[args.agent_type].__dict__[args.agent_name]", lookup))
    assert main(["rewrite", str(script)]) == 1
    err = capsys.readouterr().err
    # the line of the wrap, not of the isinstance test above it
    assert "train.py:9:9: DDP151" in err and "agents/regular.py:14" in err and "--with-helpers" in err
    assert not (tmp_path / "train_ddp.py").exists()
    # the same lookup in a package with no DataParallel: nothing to migrate, as before
    (tmp_path / "agents" / "regular.py").write_text(AGENT_MODULE.replace("nn.DataParallel(self.net)", "self.net"))
    assert main(["rewrite", str(script)]) == 0
    assert "nothing to migrate" in capsys.readouterr().out


RANKED_LOGGER = """import logging
import os


def make_logger(name, folder, rank):
    log = logging.getLogger(name)
    log.setLevel(logging.INFO)
    if rank > 0:  # only the main process writes a log
        return log
    os.makedirs(folder, exist_ok=True)
    handler = logging.FileHandler(os.path.join(folder, "train.log"), mode="w")
    log.addHandler(handler)
    return log
"""
RANKED_LOGGER_SCRIPT = """import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from ranklog import make_logger


def main():
    log = make_logger("run", "out", 0)
    torch.manual_seed(0)
    model = nn.DataParallel(nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,))), batch_size=8, shuffle=True)
    for epoch in range(3):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        log.info("epoch %d loss %.4f", epoch, loss.item())


if __name__ == "__main__":
    main()
"""


@pytest.mark.torchrun
def test_a_logger_helper_that_takes_the_rank_is_handed_the_process_s_rank(tmp_path: Path, capsys) -> None:
    """maskrcnn-benchmark's ``setup_logger(name, save_dir, distributed_rank)`` shape, called with
    a literal 0 from a DataParallel script: its handler opens the log with mode "w", which on
    every rank would empty rank 0's file, but it adds no handler where the rank it is given is
    above 0. The migration hands it the process's rank: one log, each line once."""
    (tmp_path / "ranklog.py").write_text(RANKED_LOGGER)
    (tmp_path / "train.py").write_text(RANKED_LOGGER_SCRIPT)
    assert main(["rewrite", str(tmp_path / "train.py")]) == 0
    out = (tmp_path / "train_ddp.py").read_text()
    assert 'make_logger("run", "out", dist.get_rank())' in out
    assert "handed this process's rank" in capsys.readouterr().out
    r = retry_exit_abort(lambda: run_script(["train_ddp.py"], tmp_path, env=_env(), nproc=2), "ranked logger")
    assert r.returncode == 0, r.stdout[-3000:]
    lines = (tmp_path / "out" / "train.log").read_text().splitlines()
    assert [ln.split()[1] for ln in lines] == ["0", "1", "2"]


def test_with_helpers_needs_an_output_mode(project: Path, capsys) -> None:
    assert main(["rewrite", "--with-helpers", str(project / "train.py")]) == 2
    assert "--in-place, --diff, or -o DIR" in capsys.readouterr().err


def test_with_helpers_into_a_folder_that_is_not_empty_is_a_one_line_error(project: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine\n")
    assert main(["rewrite", "--with-helpers", "-o", str(out), str(project / "train.py")]) == 2
    err = capsys.readouterr().err
    assert f"{out}: not empty; -o with --with-helpers needs a new or empty folder" in err and "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]


def test_the_project_copy_keeps_symbolic_links_as_links(project: Path, tmp_path: Path) -> None:
    """-o DIR copies the project; a linked data folder (``data -> /datasets/x``) and a file
    linked from elsewhere stay links to what they point at (absolute outside the project,
    relative inside it, so the copy's link points into the copy); a dangling link is left out."""
    outside = tmp_path / "datasets" / "cifar"
    outside.mkdir(parents=True)
    (outside / "batch_1.bin").write_bytes(b"\x00" * 16)
    (project / "data").symlink_to(outside)
    (project / "configs").mkdir()
    (project / "configs" / "base.yaml").write_text("lr: 0.1\n")
    (project / "config.yaml").symlink_to(Path("configs") / "base.yaml")
    (project / "gone").symlink_to(tmp_path / "nowhere")
    out = tmp_path / "out"
    assert main(["rewrite", "--with-helpers", "-o", str(out), str(project / "train.py")]) == 0
    assert (out / "data").is_symlink() and os.readlink(out / "data") == str(outside)
    assert (out / "data" / "batch_1.bin").read_bytes() == b"\x00" * 16
    assert (out / "config.yaml").is_symlink() and not os.path.isabs(os.readlink(out / "config.yaml"))
    assert (out / "config.yaml").resolve() == (out / "configs" / "base.yaml").resolve()
    assert not os.path.lexists(out / "gone")
    assert (out / "train.py").read_text() != (project / "train.py").read_text()  # the migration is there too


def test_a_model_handed_to_a_library_engine_that_trains_on_its_own_data_is_refused(tmp_path: Path, capsys) -> None:
    """deep-person-reid's shape: a data manager makes the loaders, an engine class of the
    library (its loop in the base class's module, its backward in the subclass's) trains the
    model it is handed on the manager's loader; the script never sees a loader. Migrated, every
    rank would train on all of it: refused (DDP105) with the loop and the backward, nothing
    written. A project function that loops over the loader it is handed is not refused so."""
    d = tmp_path / "proj"
    shutil.copytree(ROOT / "fixtures" / "project" / "trains_a_managers_loader", d)
    out = tmp_path / "out.py"
    assert main(["rewrite", str(d / "main.py"), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert ("main.py:11:12: DDP105 `RegressionEngine(...)` is handed the model and trains it in project code this migration "
            "does not edit (a loop over data at engine.py:17, a backward pass at regression.py:12)") in err, err
    assert not out.exists()
    # an evaluation under attack in a project module (a loop over the loader it is handed, a
    # backward pass for the attack's gradients) is not that: the caller's loader decides
    (d / "attack.py").write_text(
        "import torch\n\n\ndef eval_robust(model, loader):\n    total = 0.0\n    for x, y in loader:\n"
        "        x = x.clone().requires_grad_(True)\n        model(x).sum().backward()\n        total += float(x.grad.abs().sum())\n"
        "    return total\n")
    main_py = (d / "main.py").read_text().replace("from regression import RegressionEngine\n",
                                                  "from regression import RegressionEngine\nfrom attack import eval_robust\n")
    main_py = main_py.replace("    engine.run(max_epoch=2)\n", "    print(eval_robust(model, datamanager.test_loader))\n")
    main_py = main_py.replace("    engine = build_engine(datamanager, model, optimizer)\n", "")
    (d / "main.py").write_text(main_py)
    assert main(["rewrite", str(d / "main.py"), "-o", str(out)]) in (0, 1)
    assert "is handed the model and trains it" not in capsys.readouterr().err


@pytest.mark.torchrun
def test_project_copy_migrated_runs_and_its_evaluation_script_still_loads(project: Path, tmp_path: Path) -> None:
    """-o DIR: a copy of the project with the entry and its helper migrated; it trains under
    torchrun (2 ranks) and plain python, the evaluation script (no process group) builds the
    model with the migrated factory and loads the checkpoint, and a second rewrite of the
    copy changes nothing."""
    out = tmp_path / "proj_ddp"
    assert main(["rewrite", "--with-helpers", "-o", str(out), str(project / "train.py")]) == 0
    assert (out / "evaluate.py").read_bytes() == (project / "evaluate.py").read_bytes()
    helper = (out / "models" / "__init__.py").read_text()
    assert "DataParallel(" not in helper.replace("DistributedDataParallel(", "") and "dist.is_initialized()" in helper
    r = retry_exit_abort(lambda: run_script(["train.py"], out, env=_env(), nproc=2), "project")
    assert r.returncode == 0, r.stdout[-3000:]
    assert r.stdout.count("outputs 1") == 1  # printed by rank 0 only
    ev = subprocess.run([sys.executable, "evaluate.py"], cwd=out, env=_env(), capture_output=True, text=True, timeout=120)
    assert ev.returncode == 0 and ev.stdout.startswith("eval Net"), ev.stderr[-2000:]
    r = run_script(["train.py"], out, env=_env())
    assert r.returncode == 0, r.stdout[-3000:]
    again = tmp_path / "again"
    assert main(["rewrite", "--with-helpers", "-o", str(again), str(out / "train.py")]) == 0
    for rel in ("train.py", "models/__init__.py"):
        assert (again / rel).read_bytes() == (out / rel).read_bytes(), rel


def test_the_migrated_project_modules_beside_a_migration_become_its_runs_overlays(project: Path, tmp_path: Path) -> None:
    """verify of a project migration (``rewrite --with-helpers -o DIR``): the modules of DIR
    that differ from the project's are what the migrated runs import, placed into real
    files of the run's copy (never written through a link to the user's file); a migration
    beside the original has none."""
    from dp2ddp.verify import scratch

    out = tmp_path / "proj_ddp"
    assert main(["rewrite", "--with-helpers", "-o", str(out), str(project / "train.py")]) == 0
    found = scratch.migrated_modules(project / "train.py", out / "train.py")
    assert found == {project / "models" / "__init__.py": (out / "models" / "__init__.py").read_bytes()}
    assert scratch.migrated_modules(project / "train.py", project / "train_ddp.py") == {}
    overlays = scratch.in_root(project, found)
    assert list(overlays) == [Path("models/__init__.py")]
    original_helper = (project / "models" / "__init__.py").read_bytes()
    place = scratch.prepare(out / "train.py", tmp_path / "run", root=project, cwd=project, at=Path("train.py"), overlays=overlays)
    copied = place.root / "models" / "__init__.py"
    assert not copied.is_symlink() and copied.read_bytes() == overlays[Path("models/__init__.py")]
    assert (project / "models" / "__init__.py").read_bytes() == original_helper


def test_verify_rewrites_a_project_in_memory_when_its_wraps_are_in_helpers(project: Path) -> None:
    """`dp2ddp verify train.py` of a script whose DataParallel is in a project module: the
    refusal DDP151 asks for the project rewrite, so verify makes it (in memory) and hands
    the migrated helpers to the migrated runs."""
    from dp2ddp.verify.command import _rewrite

    content, helpers = _rewrite(project / "train.py")
    assert b"init_process_group" in content
    ((path, data),) = helpers.items()
    assert path == (project / "models" / "__init__.py").resolve() and b"DistributedDataParallel(" in data


@pytest.mark.torchrun
def test_verify_of_a_project_migration_runs_its_migrated_helpers(project: Path, tmp_path: Path) -> None:
    """The migrated runs import the migrated ``models/__init__.py`` (which wraps in DDP), not
    the project's: the replicas stay in sync and the losses agree (with the project's own
    helper, which wraps only with several GPUs, each rank would train its own model)."""
    from tests.verify_helpers import verify

    out = tmp_path / "proj_ddp"
    assert main(["rewrite", "--with-helpers", "-o", str(out), str(project / "train.py")]) == 0
    code, rep, text, _ = verify(tmp_path, str(project / "train.py"), "--migrated", str(out / "train.py"), "--steps", "0")
    assert code == 0, text
    assert rep["migrated"]["helpers"] == ["models/__init__.py"] and rep["replicas_in_sync"] and rep["losses_agree"]
    assert any(n.startswith("a project migration: the migrated runs use the migrated project modules beside") for n in rep["notes"])


def test_a_loader_wrapped_on_one_path_only_is_refused_not_sharded_on_that_path(tmp_path: Path, capsys) -> None:
    """pytorch-segmentation's shape: the base class (another module) keeps the loader it is
    given, the subclass replaces it with a Prefetcher only ``if prefetch:`` (off on CPU).
    Sharding after that assignment left the loader whole on the other path (every rank
    trained on all of it, which verify of the project migration showed); now refused."""
    d = tmp_path / "proj"
    shutil.copytree(ROOT / "fixtures" / "project" / "prefetch_on_one_path", d)
    before = {p: p.read_bytes() for p in d.rglob("*.py")}
    assert main(["rewrite", "--with-helpers", "--diff", str(d / "train.py")]) == 1
    err = capsys.readouterr().err
    assert "trainer.py:23:33: DDP105 `self.train_loader` is set here only on some paths (line 23 is under a condition)" in err
    assert "project not migrated, no file written" in err
    assert {p: p.read_bytes() for p in d.rglob("*.py")} == before


UNPACKED_LOADERS = ROOT / "fixtures" / "project" / "loaders_unpacked_from_a_helper"


def test_loaders_unpacked_from_a_project_helpers_list_are_sharded_by_the_name_the_loop_iterates(tmp_path: Path) -> None:
    """pytorch-playground's shape: ``train_loader, test_loader = dataset.get(...)`` where the
    helper appends its DataLoaders to a list on some paths. The name the training loop
    iterates says it holds a loader: it is sharded at run time right after the unpacking
    (``shard_loader`` fails loudly on anything but a DataLoader); the evaluation loader
    stays whole. It used to be refused ("cannot trace to a DataLoader")."""
    d = tmp_path / "proj"
    shutil.copytree(UNPACKED_LOADERS, d)
    assert main(["rewrite", "-q", str(d / "train.py")]) == 0
    out = (d / "train_ddp.py").read_text()
    assert ("train_loader, test_loader = dataset.get(batch_size=args.batch_size, num_workers=0)\n"
            "train_loader = shard_loader(train_loader)\n") in out
    assert "shard_loader(test_loader)" not in out


def test_an_unpacked_value_whose_name_says_nothing_of_a_loader_stays_refused(tmp_path: Path, capsys) -> None:
    """The same helper unpacked into ``train_data, test_data``: nothing says the value the
    loop iterates is a loader (it could be a list of batches), so it is refused as before,
    the script left as it was."""
    d = tmp_path / "proj"
    shutil.copytree(UNPACKED_LOADERS, d)
    src = (d / "train.py").read_text().replace("train_loader", "train_data").replace("test_loader", "test_data")
    (d / "train.py").write_text(src)
    assert main(["rewrite", "-q", str(d / "train.py")]) == 1
    err = capsys.readouterr().err
    assert "DDP105 the training loop at line 20 iterates `train_data`, made by `dataset.get(" in err
    assert not (d / "train_ddp.py").exists()


@pytest.mark.torchrun
def test_loaders_unpacked_from_a_project_helper_verify(tmp_path: Path) -> None:
    """The migration of that shape trains like the original: the shards are disjoint and
    cover each epoch, a new order each epoch, the losses within the noise envelope."""
    from tests.verify_helpers import verify

    d = tmp_path / "proj"
    shutil.copytree(UNPACKED_LOADERS, d)
    assert main(["rewrite", "-q", str(d / "train.py")]) == 0
    code, rep, text, _ = verify(tmp_path, str(d / "train.py"), "--migrated", str(d / "train_ddp.py"), "--steps", "0")
    assert code == 0, text
    assert "epoch 0: 32+32 served, disjoint, the original's epoch exactly" in text and "a new order each epoch" in text, text


LOADER_FROM_A_METHOD = ROOT / "fixtures" / "project" / "loader_from_a_method"


def test_a_loader_a_project_objects_method_returns_is_sharded_where_the_entry_hands_it(tmp_path: Path) -> None:
    """Self-Attention-GAN's shape: ``Trainer(batches.loader(), cfg)`` where ``batches`` is an
    object of a data module's class whose method returns a DataLoader, and the Trainer
    (the helper with the DataParallel) iterates it with ``next(iter(...))``. The entry
    shards the value where it hands it; the helper's parameter is the entry's to shard;
    the Trainer, which also saves checkpoints, trains on every rank (no rank-0-only
    logger); the checkpoints keep the `module.` keys the user's ``--parallel`` run wrote."""
    d = tmp_path / "proj"
    shutil.copytree(LOADER_FROM_A_METHOD, d)
    out = tmp_path / "proj_ddp"
    assert main(["rewrite", "--with-helpers", "-o", str(out), str(d / "main.py")]) == 0
    entry = (out / "main.py").read_text()
    assert "trainer = Trainer(shard_loader(batches.loader()), cfg)\n" in entry
    assert "trainer.train()\n" in entry and "cfg) if dist.get_rank() == 0" not in entry  # not made on rank 0 only
    helper = (out / "trainer.py").read_text()
    assert "torch.save(self.net.state_dict()," in helper  # the wrapper's keys: `module.`, as the original's


def test_a_helper_parameter_no_module_of_the_plan_hands_stays_refused(tmp_path: Path, capsys) -> None:
    """The same Trainer made by a module without DataParallel (``runner.py``), which the
    project migration does not edit: nobody in the plan shards what it hands, so the
    helper's loop over its parameter is refused, nothing written."""
    d = tmp_path / "proj"
    shutil.copytree(LOADER_FROM_A_METHOD, d)
    (d / "runner.py").write_text(
        "from data import Batches\nfrom trainer import Trainer\n\n\ndef run(cfg):\n"
        "    Trainer(Batches(cfg.batch_size).loader(), cfg).train()\n")
    main_py = (d / "main.py").read_text()
    main_py = main_py.replace("from trainer import Trainer\n", "from runner import run\n").replace(
        "        trainer = Trainer(batches.loader(), cfg)\n        trainer.train()\n", "        run(cfg)\n")
    (d / "main.py").write_text(main_py)
    before = {p: p.read_bytes() for p in d.rglob("*.py")}
    assert main(["rewrite", "--with-helpers", "--diff", str(d / "main.py")]) == 1
    err = capsys.readouterr().err
    assert "trainer.py:25:29: DDP105 the training loop at line 23 iterates `data_iter`, made by `data_loader` (line 9)" in err
    assert {p: p.read_bytes() for p in d.rglob("*.py")} == before


@pytest.mark.torchrun
def test_verify_passes_the_migration_of_a_loader_a_project_method_returns(tmp_path: Path) -> None:
    """verify of that project migration: the losses agree against the envelope, the
    replicas stay in sync, each epoch's data is the original's split disjointly between the
    ranks, and the checkpoints equal the original's (their `module.` keys included); the
    migration also runs as plain python."""
    from tests.verify_helpers import verify

    d = tmp_path / "proj"
    shutil.copytree(LOADER_FROM_A_METHOD, d)
    out = tmp_path / "proj_ddp"
    assert main(["rewrite", "--with-helpers", "-o", str(out), str(d / "main.py")]) == 0
    code, rep, text, _ = verify(tmp_path, str(d / "main.py"), "--migrated", str(out / "main.py"), "--steps", "0")
    assert code == 0, text
    assert rep["replicas_in_sync"] and rep["losses_agree"], text
    assert "disjoint, the original's epoch exactly" in text and "outputs: 1 problem" not in text, text
    r = run_script(["main.py"], out, env=_env())
    assert r.returncode == 0, r.stdout[-3000:]


def test_training_on_a_loader_made_in_a_plain_project_module_is_refused_alone_and_migrated_as_a_project(tmp_path: Path, capsys) -> None:
    """``engine.fit(model)`` builds its own DataLoader and trains in a module without
    DataParallel (its docstring names DataParallel: not a helper for that): migrating the
    script alone would leave that loader whole on every rank, and ``fit`` also saves (as a
    rank-0 writer, rank 1 would miss every backward). Alone: refused, nothing written. As a
    project (``--with-helpers``): engine.py is migrated with it, for its loader, prints and
    save."""
    d = tmp_path / "proj"
    shutil.copytree(ROOT / "fixtures" / "project" / "trains_in_a_plain_module", d)
    before = {p: p.read_bytes() for p in d.rglob("*.py")}
    assert main(["rewrite", str(d / "main.py")]) == 1
    err = capsys.readouterr().err
    assert ("main.py:8:5: DDP105 `engine.fit(...)` reaches a training loop (engine.py:16) over `loader`, made there "
            "(engine.py:9) in a module this migration does not edit") in err and "--with-helpers" in err
    assert {p: p.read_bytes() for p in d.rglob("*.py")} == before and not (d / "main_ddp.py").exists()
    out = tmp_path / "proj_ddp"
    assert main(["rewrite", "--with-helpers", "-o", str(out), str(d / "main.py")]) == 0
    engine = (out / "engine.py").read_text()
    assert "    return shard_loader(DataLoader(data, batch_size=8, shuffle=True))\n" in engine
    assert "== 0:\n        torch.save(model.state_dict(), out)\n" in engine
    main_py = (out / "main.py").read_text()
    assert '\n    engine.fit(model, epochs=2, out="model.pt")\n' in main_py  # on every rank: it trains


def test_verify_rewrites_in_memory_a_project_whose_plain_module_trains_on_its_own_loader() -> None:
    """`dp2ddp verify main.py` without --migrated: the script alone is refused (DDP105, the
    loader made in engine.py), the project migration is not: verify makes that one."""
    from dp2ddp.verify.command import _rewrite

    d = ROOT / "fixtures" / "project" / "trains_in_a_plain_module"
    content, helpers = _rewrite(d / "main.py")
    assert b"init_process_group" in content
    ((path, data),) = helpers.items()
    assert path == (d / "engine.py").resolve() and b"shard_loader(DataLoader(" in data


@pytest.mark.torchrun
def test_verify_passes_a_project_whose_plain_module_trains_on_its_own_loader(tmp_path: Path) -> None:
    """verify of that project migration: the loader made in engine.py is split disjointly,
    each epoch the original's; the losses agree, the replicas stay in sync, model.pt is the
    original's."""
    from tests.verify_helpers import verify

    d = tmp_path / "proj"
    shutil.copytree(ROOT / "fixtures" / "project" / "trains_in_a_plain_module", d)
    out = tmp_path / "proj_ddp"
    assert main(["rewrite", "--with-helpers", "-o", str(out), str(d / "main.py")]) == 0
    code, rep, text, _ = verify(tmp_path, str(d / "main.py"), "--migrated", str(out / "main.py"), "--steps", "0")
    assert code == 0, text
    assert rep["losses_agree"] and rep["replicas_in_sync"] and rep["migrated"]["helpers"] == ["engine.py"], text
    assert "disjoint, the original's epoch exactly" in text and "outputs: equal" in text, text


def test_a_function_that_trains_and_saves_is_not_run_on_rank_0_alone() -> None:
    """The writer fact for project helpers: a function that trains (a loop of backward
    passes) is not 'only writes', however it ends with a save."""
    from dp2ddp.model.core import build
    from dp2ddp.model.companion_writes import writes_only
    from dp2ddp.model.output_objects import trains_in

    path = ROOT / "fixtures" / "project" / "trains_in_a_plain_module" / "engine.py"
    pm = build(path.read_bytes(), str(path))
    fit = next(f for f in pm.tree.body if getattr(f, "name", "") == "fit")
    make = next(f for f in pm.tree.body if getattr(f, "name", "") == "make_loader")
    assert trains_in(pm, fit) == 15 and not writes_only(pm, fit)
    assert trains_in(pm, make) is None


def test_a_project_objects_method_that_writes_is_reported_once_and_runs_on_rank_0(tmp_path: Path, capsys) -> None:
    """``saver.save_checkpoint(state)`` on an object of a project class: one finding (it was
    reported twice, as a function and as a method, once project calls learnt methods), and
    the call runs on rank 0 only; also where ``saver`` is ``None`` on another path."""
    (tmp_path / "saver.py").write_text(
        "import torch\n\n\nclass Saver:\n    def __init__(self, path):\n        self.path = path\n\n"
        "    def save_checkpoint(self, state):\n        torch.save(state, self.path)\n")
    (tmp_path / "train.py").write_text(
        "import sys\n\nimport torch\nimport torch.nn as nn\n\nfrom saver import Saver\n\n"
        "model = nn.DataParallel(nn.Linear(4, 1))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "saver = Saver('ck.pt') if len(sys.argv) < 2 else None\nfor _ in range(2):\n"
        "    loss = model(torch.randn(8, 4)).sum()\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
        "if saver is not None:\n    saver.save_checkpoint({'model': model.state_dict()})\n")
    assert main(["rewrite", str(tmp_path / "train.py")]) == 0
    out = capsys.readouterr().out
    assert out.count("Saver.save_checkpoint writes files (saver.py:9) and nothing else: it runs on rank 0 only") == 1, out
    assert "save_checkpoint writes files" not in out.replace("Saver.save_checkpoint writes files", "")
    migrated = (tmp_path / "train_ddp.py").read_text()
    assert "        if dist.get_rank() == 0:\n            saver.save_checkpoint(" in migrated or \
        "    if dist.get_rank() == 0:\n        saver.save_checkpoint(" in migrated, migrated[-600:]


TRAINER_SAVES_IN_BASE = ROOT / "fixtures" / "project" / "trainer_saves_in_base"
# prepended to the migrated train.py by the tests: every torch.save, with the rank that made it
_RECORD_SAVES = (
    "import os as _os\nimport torch as _torch\n_save = _torch.save\n\n\n"
    "def _recorded(obj, f, *a, **k):\n"
    "    with open('saves-rank%s.txt' % _os.environ.get('RANK', '0'), 'a') as fh:\n"
    "        fh.write(str(f) + '\\n')\n"
    "    return _save(obj, f, *a, **k)\n\n\n_torch.save = _recorded\n"
)


def test_a_training_class_whose_base_saves_is_refused_alone_and_its_saves_guarded_as_a_project(tmp_path: Path, capsys) -> None:
    """pytorch-template's shape: ``Trainer(BaseTrainer)`` trains in trainer/trainer.py and its
    base (base/base_trainer.py, no DataParallel) saves a checkpoint every ``save_period``
    epochs and ``model_best.pth`` with no rank test. Alone: refused at the ``Trainer(...)``
    call, naming the save (that module is not edited). As a project: the base is migrated
    with the script, its saves and its print run on rank 0, the subclass is left as it was."""
    d = tmp_path / "proj"
    shutil.copytree(TRAINER_SAVES_IN_BASE, d)
    before = {p: p.read_bytes() for p in d.rglob("*.py")}
    assert main(["rewrite", str(d / "train.py")]) == 1
    err = capsys.readouterr().err
    assert ("train.py:18:15: DDP110 Trainer trains (trainer/trainer.py:16) and saves a file with no rank test "
            "(base/base_trainer.py:34), in a module this migration does not edit") in err, err
    assert {p: p.read_bytes() for p in d.rglob("*.py")} == before
    out = tmp_path / "proj_ddp"
    capsys.readouterr()
    # 1: written, with one warning: the fixture never places its model (a CPU-only script), DDP171
    assert main(["rewrite", "--with-helpers", "-o", str(out), str(d / "train.py")]) == 1
    assert "train.py:16:17: DDP171 model is never placed on a GPU" in capsys.readouterr().err
    base = (out / "base" / "base_trainer.py").read_text()
    assert (' == 0:\n            torch.save(state, os.path.join(self.save_dir, "checkpoint-epoch{}.pth".format(epoch)))\n'
            '            if save_best:\n                torch.save(state, os.path.join(self.save_dir, "model_best.pth"))\n') in base, base
    assert (out / "trainer" / "trainer.py").read_bytes() == (d / "trainer" / "trainer.py").read_bytes()
    assert "shard_loader(DataLoader(train, batch_size=16, shuffle=True))" in (out / "train.py").read_text()
    again = tmp_path / "again"
    assert main(["rewrite", "--with-helpers", "-o", str(again), str(out / "train.py")]) == 0
    for rel in ("train.py", "base/base_trainer.py"):
        assert (again / rel).read_bytes() == (out / rel).read_bytes(), rel


def test_a_training_class_that_stops_early_is_refused_and_one_that_shares_its_writer_migrates(tmp_path: Path, capsys) -> None:
    """Not soundly guardable in the base's module alone: an epoch loop that breaks on the
    epoch's results (early stopping: a training metric is each rank's own under DDP, so one
    rank would leave while the others wait in the next epoch's collectives): refused with its
    line. A writer kept in ``self.writer`` that the subclass, in a module the plan does not
    edit, uses migrates with a stand-in on the other ranks (as ``None`` it would raise there)."""
    d = tmp_path / "proj"
    shutil.copytree(TRAINER_SAVES_IN_BASE, d)
    base = d / "base" / "base_trainer.py"
    text = base.read_text()
    text = text.replace("            if best:\n                self.best = log[\"val_loss\"]\n",
                        "            if best:\n                self.best = log[\"val_loss\"]\n                bad = 0\n"
                        "            else:\n                bad += 1\n            if bad > 2:\n                break\n")
    text = text.replace("        for epoch in range(1, self.epochs + 1):\n", "        bad = 0\n        for epoch in range(1, self.epochs + 1):\n")
    base.write_text(text)
    assert main(["rewrite", "--with-helpers", "--diff", str(d / "train.py")]) == 1
    err = capsys.readouterr().err
    assert ("train.py:18:15: DDP110 Trainer trains (trainer/trainer.py:16) and its epoch loop ends early "
            "(base/base_trainer.py:33) on a test of values dp2ddp cannot show are alike on every rank") in err, err
    d = tmp_path / "proj2"  # another folder: project files are read once per process
    shutil.copytree(TRAINER_SAVES_IN_BASE, d)
    base = d / "base" / "base_trainer.py"
    base.write_text(base.read_text().replace(
        "        os.makedirs(save_dir, exist_ok=True)\n",
        "        os.makedirs(save_dir, exist_ok=True)\n        from torch.utils.tensorboard import SummaryWriter\n"
        "        self.writer = SummaryWriter(save_dir)\n"))
    sub = d / "trainer" / "trainer.py"
    sub.write_text(sub.read_text().replace("            self.optimizer.step()\n",
                                           "            self.optimizer.step()\n            self.writer.add_scalar(\"loss\", loss.item())\n"))
    assert main(["rewrite", "--with-helpers", "--diff", str(d / "train.py")]) == 1
    captured = capsys.readouterr()
    # the subclass's uses cannot be guarded from here: rank 0 makes the writer, the other ranks a
    # stand-in whose add_* do nothing (DDP173), instead of None (on which the subclass would raise)
    assert "DDP110" not in captured.err, captured.err
    assert re.search(r"\+ +self\.writer = SummaryWriter\(save_dir\) if \(?dist\.get_rank\(\).* == 0 else WritesNothing\(\)\n",
                     captured.out), captured.out


@pytest.mark.torchrun
def test_the_migrated_training_class_writes_one_checkpoint_set_from_rank_0(tmp_path: Path) -> None:
    """The project migration of that shape trains under torchrun (2 ranks) and plain python;
    every torch.save (recorded with its rank) comes from rank 0, once per file: the
    checkpoints of epochs 2 and 4 and model_best.pth, and the epoch lines print once."""
    out = tmp_path / "proj_ddp"
    # 1: written, with DDP171 (the fixture never places its model: a CPU-only script)
    assert main(["rewrite", "--with-helpers", "-o", str(out), str(TRAINER_SAVES_IN_BASE / "train.py")]) == 1
    (out / "train.py").write_text(_RECORD_SAVES + (out / "train.py").read_text())
    r = retry_exit_abort(lambda: run_script(["train.py"], out, env=_env(), nproc=2), "trainer project")
    assert r.returncode == 0, r.stdout[-3000:]
    assert r.stdout.count("epoch 4 val_loss") == 1, r.stdout[-2000:]
    assert not (out / "saves-rank1.txt").exists()
    # rank 0's saves of files (the set-up's own in-memory ones aside), as the original's: each
    # period's checkpoint once, model_best.pth on the periods that improved (the validation
    # loss is every rank's alike: the validation loader stays whole)
    saves = [s for s in (out / "saves-rank0.txt").read_text().splitlines() if s.startswith("saved")]
    assert [s for s in saves if "epoch" in s] == ["saved/checkpoint-epoch2.pth", "saved/checkpoint-epoch4.pth"], saves
    assert sorted(os.listdir(out / "saved")) == sorted({os.path.basename(s) for s in saves})
    shutil.rmtree(out / "saved")
    (out / "saves-rank0.txt").unlink()
    r = run_script(["train.py"], out, env=_env())
    assert r.returncode == 0, r.stdout[-3000:]
    plain = [s for s in (out / "saves-rank0.txt").read_text().splitlines() if s.startswith("saved")]
    assert [s for s in plain if "epoch" in s] == ["saved/checkpoint-epoch2.pth", "saved/checkpoint-epoch4.pth"], plain


def test_project_copy_to_a_folder_named_with_a_trailing_slash(project: Path, tmp_path: Path) -> None:
    """`-o DIR/` with --with-helpers is the project copy's folder, as `-o DIR` is (a single
    file's `-o DIR/` writes the file inside the folder instead)."""
    out = tmp_path / "proj_ddp"
    assert main(["rewrite", "-q", "--with-helpers", "-o", str(out) + "/", str(project / "train.py")]) == 0
    assert (out / "train.py").is_file() and (out / "models" / "__init__.py").is_file()
    assert not (out / "train.py" / "train.py").exists()


LIB_ON_PATH = ROOT / "fixtures" / "project" / "lib_on_sys_path"


def test_project_packages_put_on_sys_path_by_a_module_beside_the_script_are_found(tmp_path: Path) -> None:
    """``import _paths`` first, which puts ``../lib`` on ``sys.path``: the script's imports
    of ``engine.loop`` are the project's own files, read like any module beside it."""
    from dp2ddp.model.module_files import module_file, path_roots

    d = tmp_path / "proj"
    shutil.copytree(LIB_ON_PATH, d)
    assert path_roots(str(d / "tools")) == (str(d / "lib"),)
    assert path_roots(str(d / "tools"), importer=str(d / "tools" / "train.py")) == (str(d / "lib"),)
    assert module_file(str(d / "tools"), "engine.loop") == str(d / "lib" / "engine" / "loop.py")
    # a script beside it that does not import _paths gets nothing from it
    (d / "tools" / "other.py").write_text("import torch\n")
    assert path_roots(str(d / "tools"), importer=str(d / "tools" / "other.py")) == ()
    # only what can be read without running anything: a folder read from the environment,
    # or one that is not there, counts not
    (d / "tools" / "_paths.py").write_text(
        "import os, sys\nsys.path.append(os.environ['LIB'])\n"
        "sys.path.append(os.path.join(os.path.dirname(__file__), 'missing'))\n"
    )
    from dp2ddp.model import module_files

    module_files._ROOTS.clear()
    assert path_roots(str(d / "tools")) == ()
    assert module_file(str(d / "tools"), "engine.loop") is None


def test_a_folder_put_on_sys_path_relative_to_the_working_directory_is_read_from_the_scripts_folder(tmp_path: Path, capsys) -> None:
    """``sys.path.append('core')`` (RAFT's train.py, run from the repository's root): the
    folder is the working directory's, read from the script's own folder, where such a
    script is run from. Its dataset seeds each worker by its id alone, a fact dp2ddp must
    see to refuse (DDP184): with the folder unread, the migration was written and every
    rank drew the same augmentations."""
    from dp2ddp.model import module_files
    from dp2ddp.model.module_files import module_file, path_roots

    d = tmp_path / "proj"
    (d / "core").mkdir(parents=True)
    (d / "core" / "seeded.py").write_text(
        "import random\nimport torch\n\n\nclass Pairs(torch.utils.data.Dataset):\n"
        "    def __init__(self):\n        self.seeded = False\n\n    def __len__(self):\n        return 16\n\n"
        "    def __getitem__(self, i):\n        if not self.seeded:\n            info = torch.utils.data.get_worker_info()\n"
        "            if info is not None:\n                random.seed(info.id)\n                self.seeded = True\n"
        "        return torch.full((4,), float(i) + random.random()), i % 2\n")
    (d / "train.py").write_text(
        "import sys\nsys.path.append('core')\n\nimport torch\nimport torch.nn as nn\nfrom seeded import Pairs\n\n\n"
        "def main():\n    model = nn.DataParallel(nn.Linear(4, 2))\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    loader = torch.utils.data.DataLoader(Pairs(), batch_size=4, shuffle=True, num_workers=2)\n"
        "    for epoch in range(2):\n        for x, y in loader:\n            loss = nn.functional.cross_entropy(model(x), y)\n"
        "            opt.zero_grad()\n            loss.backward()\n            opt.step()\n\n\nif __name__ == '__main__':\n    main()\n")
    module_files._ROOTS.clear()
    assert path_roots(str(d), importer=str(d / "train.py")) == (str(d / "core"),)
    assert module_file(str(d), "seeded") == str(d / "core" / "seeded.py")
    before = (d / "train.py").read_bytes()
    assert main(["rewrite", str(d / "train.py")]) == 1
    assert re.search(r"train\.py:12:\d+: DDP184 .*core/seeded\.py:16", capsys.readouterr().err)
    assert (d / "train.py").read_bytes() == before and not (d / "train_ddp.py").exists()


def test_a_project_training_function_that_writes_what_each_rank_saw_further_down_is_refused(tmp_path: Path, capsys) -> None:
    """``run_epoch`` (lib/engine/loop.py) trains and calls ``dump_batch`` (lib/utils/dump.py),
    which saves the batch it was given: under DDP every rank would save its own share under
    one name. The write is two modules down, on a folder only ``sys.path`` names."""
    d = tmp_path / "proj"
    shutil.copytree(LIB_ON_PATH, d)
    before = (d / "tools" / "train.py").read_bytes()
    assert main(["rewrite", str(d / "tools" / "train.py")]) == 1
    err = capsys.readouterr().err
    assert re.search(r"train\.py:21:9: DDP110 run_epoch writes a file \(\.\./lib/utils/dump\.py:8\) on every rank.*"
                     r"it also trains \(\.\./lib/engine/loop\.py:8\)", err), err
    assert (d / "tools" / "train.py").read_bytes() == before and not (d / "tools" / "train_ddp.py").exists()
    # without the dump the same project migrates, its loader sharded where it is made
    (d / "lib" / "engine" / "loop.py").write_text(
        (d / "lib" / "engine" / "loop.py").read_text().replace(
            '            dump_batch(x, out, "epoch%d" % epoch)  # the batch this process saw, as a file\n', "            pass\n"))
    assert main(["rewrite", str(d / "tools" / "train.py")]) == 0
    assert "shard_loader(torch.utils.data.DataLoader(" in (d / "tools" / "train_ddp.py").read_text()


@pytest.mark.torchrun
def test_verify_runs_a_script_whose_imports_come_from_a_folder_put_on_sys_path(tmp_path: Path) -> None:
    """verify mirrors the folder ``_paths.py`` puts on ``sys.path`` (``../lib``) with the
    script's own: both runs import ``engine.loop`` from there, and the migration passes."""
    from dp2ddp.verify.scratch import project_root
    from tests.verify_helpers import verify

    d = tmp_path / "proj"
    shutil.copytree(LIB_ON_PATH, d)
    loop = d / "lib" / "engine" / "loop.py"
    loop.write_text(loop.read_text().replace('            dump_batch(x, out, "epoch%d" % epoch)  # the batch this process saw, as a file\n', "            pass\n"))
    assert project_root(d / "tools" / "train.py") == d.resolve()
    assert main(["rewrite", str(d / "tools" / "train.py")]) == 0
    code, rep, text, _ = verify(tmp_path, str(d / "tools" / "train.py"), "--migrated", str(d / "tools" / "train_ddp.py"), "--steps", "0")
    assert code == 0, text
    assert rep["replicas_in_sync"] and rep["losses_agree"], text


def test_a_script_that_calls_only_the_plain_functions_of_a_module_that_wraps_elsewhere_is_not_a_project_to_migrate(tmp_path: Path, capsys) -> None:
    """``misc.seed_all()`` runs nothing that names DataParallel, though ``misc.parallel()``
    beside it wraps: the script has nothing to migrate (no DDP151). Calling a function that
    reaches the wrap through another function of the module is still one (DDP151)."""
    d = tmp_path / "proj"
    (d / "utils").mkdir(parents=True)
    (d / "utils" / "__init__.py").write_text("")
    (d / "utils" / "misc.py").write_text(
        "import random\n\nimport torch\n\n\n"
        "def seed_all(seed):\n    random.seed(seed)\n    torch.manual_seed(seed)\n\n\n"
        "def _wrap(model):\n    return torch.nn.DataParallel(model)\n\n\n"
        "def parallel(model):\n    return _wrap(model)\n"
    )
    (d / "prepare.py").write_text("from utils import misc\n\nmisc.seed_all(0)\nprint('ready')\n")
    assert main(["rewrite", str(d / "prepare.py")]) == 0
    out = capsys.readouterr()
    assert "DDP151" not in out.err + out.out and not (d / "prepare_ddp.py").exists(), out
    (d / "train.py").write_text(
        "import torch\nfrom utils import misc\n\nmodel = misc.parallel(torch.nn.Linear(2, 2))\nprint(model(torch.ones(4, 2)).sum())\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nmodel(torch.ones(4, 2)).sum().backward()\nopt.step()\n"
    )
    assert main(["rewrite", str(d / "train.py")]) == 1
    assert re.search(r"train\.py:4:9: DDP151 misc\.parallel\(\) reaches DataParallel in the project module utils/misc\.py:12", capsys.readouterr().err)


LOADER_FROM_THE_HELPER = ROOT / "fixtures" / "project" / "loader_from_the_helper_that_wraps"


@pytest.mark.torchrun
def test_a_loader_the_migrated_helper_shards_and_returns_is_not_sharded_again_by_the_entry(tmp_path: Path) -> None:
    """``make_loader()`` of the helper (in the plan: it also wraps) shards its loader, and the
    entry, which would shard what a project function returns when migrated alone, leaves it as
    it is: each of 2 ranks takes 4 of every batch of 8 and the ranks see all 64 samples per
    epoch between them (sharded twice, each would take 2 and half the data would be lost)."""
    d = tmp_path / "proj"
    shutil.copytree(LOADER_FROM_THE_HELPER, d)
    out = tmp_path / "proj_ddp"
    assert main(["rewrite", "--with-helpers", "-o", str(out), str(d / "train.py")]) == 0
    assert "shard_loader(torch.utils.data.DataLoader(" in (out / "setup_utils.py").read_text()
    r = retry_exit_abort(lambda: run_script(["train.py"], out, env=_env(), nproc=2), "project")
    assert r.returncode == 0, r.stdout[-3000:]
    sizes = [int(line.split()[-1]) for line in r.stdout.splitlines() if re.search(r"\bbatch \d+$", line)]
    assert sizes and set(sizes) == {4}, r.stdout[-2000:]
    r = run_script(["train.py"], out, env=_env())
    assert r.returncode == 0 and "samples 128 distinct 64" in r.stdout, r.stdout[-2000:]


MIXED_PROJECT_LOADER = ROOT / "fixtures" / "project" / "mixed_loader_from_a_project_function"


@pytest.mark.torchrun
def test_a_mixed_scripts_loader_a_project_function_gives_its_own_distributed_sampler_is_left_to_it(tmp_path: Path) -> None:
    """yolov5's shape: ``build_loader(..., rank=rank)`` in data_utils.py makes a DataLoader
    subclass with ``DistributedSampler(dataset) if rank != -1 else None``, and the script's own
    distributed path calls its ``set_epoch``. The migration hands the run to that path: no
    shard_loader on top; under torchrun each of 2 ranks reads 16 of the 32 samples per epoch,
    as plain python reads all 32; verify passes. (Its dataset's debugging branch, switched off
    by ``dump_subset = False``, deletes a folder: code that never runs is no refusal.)"""
    from tests.verify_helpers import verify

    d = tmp_path / "proj"
    shutil.copytree(MIXED_PROJECT_LOADER, d)
    assert main(["rewrite", str(d / "train.py")]) == 0
    migrated = (d / "train_ddp.py").read_text()
    assert "shard_loader" not in migrated and "DataParallel(" not in migrated.replace("DistributedDataParallel(", "")
    r = retry_exit_abort(lambda: run_script(["train_ddp.py"], d, env=_env(), nproc=2), "mixed project loader")
    assert r.returncode == 0 and "rank 0 epoch 1 samples 16 steps 4" in r.stdout, r.stdout[-3000:]
    r = run_script(["train_ddp.py"], d, env=_env())
    assert r.returncode == 0 and "rank 0 epoch 1 samples 32 steps 4" in r.stdout, r.stdout[-3000:]
    code, rep, text, _ = verify(tmp_path, str(d / "train.py"), "--migrated", str(d / "train_ddp.py"), "--steps", "0")
    assert code == 0, text
    assert rep["replicas_in_sync"] and rep["losses_agree"], text


def test_a_mixed_scripts_batch_a_project_function_reads_per_process_and_no_one_divides_is_refused(tmp_path: Path, capsys) -> None:
    """The same project, its script not dividing ``--batch-size`` on its own path: the loader
    ``build_loader(n, opt.batch_size)`` makes reads it per process (bound by the function's
    signature), so under torchrun the global batch would double. The process group starts in
    the ``__main__`` block, not in ``train()`` that builds the loader, so the migration cannot
    divide it where the group starts: refused (DDP152), the file left as it was."""
    d = tmp_path / "proj"
    shutil.copytree(MIXED_PROJECT_LOADER, d)
    script = d / "train.py"
    text = script.read_text()
    for line in ("        assert opt.batch_size % opt.world_size == 0\n", "        opt.batch_size = opt.batch_size // opt.world_size\n"):
        assert line in text
        text = text.replace(line, "")
    script.write_text(text)
    assert main(["rewrite", str(script)]) == 1
    assert re.search(r"train\.py:22:40: DDP152 the loader build_loader\(\) returns reads `batch_size=opt.batch_size` per process",
                     capsys.readouterr().err)
    assert script.read_text() == text and not (d / "train_ddp.py").exists()


MIXED_FALLBACK = ROOT / "fixtures" / "project" / "mixed_fallback_checkpoint"


@pytest.mark.torchrun
def test_a_mixed_scripts_dataparallel_fallback_keeps_its_checkpoint_keys_in_a_world_of_one(tmp_path: Path) -> None:
    """Under plain python the mixed script's own DDP path is off and its DataParallel fallback
    wrapped the model: the migration wraps it in DDP over a world of one there (wrap_alone), so
    the checkpoint keeps its ``module.`` keys. The original's checkpoint resumes in the
    migration and the migration's in the original, under python and under torchrun. (Taking
    the fallback off left a bare model: its keys lost ``module.`` and neither resumed the other.)"""
    d = tmp_path / "proj"
    shutil.copytree(MIXED_FALLBACK, d)
    assert main(["rewrite", str(d / "train.py")]) == 0
    assert "wrap_alone(model)" in (d / "train_ddp.py").read_text()
    r = run_script(["train.py", "--out", "o.pt"], d, env=_env())
    assert r.returncode == 0 and "keys module.0.bias" in r.stdout, r.stdout[-2000:]
    r = run_script(["train_ddp.py", "--resume", "o.pt", "--out", "m.pt"], d, env=_env())
    assert r.returncode == 0 and "resumed" in r.stdout and "keys module.0.bias" in r.stdout, r.stdout[-2000:]
    r = run_script(["train.py", "--resume", "m.pt", "--out", "o2.pt"], d, env=_env())
    assert r.returncode == 0 and "resumed" in r.stdout, r.stdout[-2000:]
    r = retry_exit_abort(lambda: run_script(["train_ddp.py", "--resume", "o.pt", "--out", "t.pt"], d, env=_env(), nproc=2), "fallback")
    assert r.returncode == 0 and "resumed" in r.stdout and "keys module.0.bias" in r.stdout, r.stdout[-2000:]


def test_a_factory_that_dispatches_through_a_table_to_a_function_that_wraps_is_still_a_project_to_migrate(tmp_path: Path, capsys) -> None:
    """``nets.create("small")`` looks its builder up in a dict; the builder wraps in
    DataParallel. The call graph does not follow the table, so the module counts as reached
    (DDP151), never "nothing to migrate"."""
    d = tmp_path / "proj"
    d.mkdir()
    (d / "nets.py").write_text(
        "import torch.nn as nn\n\n\n"
        "def small():\n    return nn.DataParallel(nn.Linear(2, 2))\n\n\n"
        "BUILDERS = {'small': small}\n\n\n"
        "def create(name):\n    return BUILDERS[name]()\n"
    )
    (d / "train.py").write_text("import torch\nimport nets\n\nmodel = nets.create('small')\nprint(model(torch.ones(4, 2)).sum())\n"
                                "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nmodel(torch.ones(4, 2)).sum().backward()\n"
                                "opt.step()\n")  # (a script that only evaluates is refused as one: DDP115)
    assert main(["rewrite", str(d / "train.py")]) == 1
    assert "DDP151 nets.create() reaches DataParallel" in capsys.readouterr().err


_FACTORY = '''import torch
import torch.nn as nn


def define_net(cuda=True):
    net = nn.Linear(4, 2)
{wrap}
    return net
'''
_KD_ENTRY = '''import torch
from network import define_net
from utils import load_filtered

net = define_net(cuda=torch.cuda.is_available())
load_filtered(net, torch.load("teacher.pth")["net"])
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for step in range(2):
    opt.zero_grad()
    net(torch.randn(8, 4)).sum().backward()
    opt.step()
torch.save({"net": net.state_dict()}, "student.pth")
'''
_FILTERED = '''def load_filtered(model, pretrained):
    own = model.state_dict()
    own.update({k: v for k, v in pretrained.items() if k in own})  # keys that differ are dropped, silently
    model.load_state_dict(own)
'''


@pytest.mark.parametrize("wrap,keys", [
    # Knowledge-Distillation-Zoo's define_tsnet: DataParallel on both branches of ``if cuda:``
    ("    if cuda:\n        net = torch.nn.DataParallel(net).cuda()\n    else:\n        net = torch.nn.DataParallel(net)\n",
     "with `module.`"),
    ("    if torch.cuda.device_count() > 1:\n        net = torch.nn.DataParallel(net)\n", "without `module.`"),
], ids=["wrapped-on-every-branch-keeps-module-keys", "wrapped-only-with-several-gpus-writes-plain-keys"])
def test_the_keys_of_a_wrapper_a_project_factory_returns_are_the_ones_it_wrote(tmp_path: Path, capsys, wrap, keys) -> None:
    """A factory of the project returns the wrapper: where it wraps on every path, the
    original's checkpoints had ``module.`` keys and the migration keeps them (a loader that
    drops the keys it does not know would load nothing from plain keys); where only several
    GPUs wrapped, one GPU wrote plain keys, and the migration writes those."""
    d = tmp_path / "proj"
    d.mkdir()
    (d / "network.py").write_text(_FACTORY.format(wrap=wrap))
    (d / "utils.py").write_text(_FILTERED)
    (d / "train.py").write_text(_KD_ENTRY)
    assert main(["rewrite", "--with-helpers", "-o", str(tmp_path / "out"), str(d / "train.py")]) == 0
    said = "".join(capsys.readouterr())
    assert re.search(rf"state_dict keys of net {re.escape(keys)}", said), said
    text = (tmp_path / "out" / "train.py").read_text()
    saved = 'torch.save({"net": net.state_dict()}, "student.pth")' if keys.startswith("with ") else \
        'torch.save({"net": net.module.state_dict()}, "student.pth")'
    assert saved in text, text


def test_a_script_whose_own_path_starts_the_process_group_in_a_project_module_is_refused(tmp_path: Path, capsys) -> None:
    """KAIR's shape: ``if opt['dist']: init_dist('pytorch')``, a function of ``utils/dist.py``
    that calls ``init_process_group``. The script has its own distributed path; a migration
    that starts the process group at the top would start it twice on that path. Refused
    with the line of the call and of the init, nothing written."""
    d = tmp_path / "proj"
    (d / "utils").mkdir(parents=True)
    (d / "utils" / "__init__.py").write_text("")
    (d / "utils" / "dist.py").write_text(
        "import os\nimport torch.distributed as dist\n\n\ndef init_dist(launcher, backend='nccl'):\n"
        "    if launcher == 'pytorch':\n        _init_pytorch(backend)\n\n\ndef _init_pytorch(backend):\n"
        "    dist.init_process_group(backend=backend)\n"
    )
    (d / "train.py").write_text(
        "import argparse\nimport torch\nimport torch.nn as nn\nfrom utils.dist import init_dist\n\n"
        "parser = argparse.ArgumentParser()\nparser.add_argument('--dist', action='store_true')\nargs = parser.parse_args()\n"
        "if args.dist:\n    init_dist('pytorch')\nmodel = nn.DataParallel(nn.Linear(4, 2))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor x in torch.utils.data.DataLoader(torch.randn(16, 4), batch_size=4):\n"
        "    opt.zero_grad()\n    model(x).sum().backward()\n    opt.step()\n"
    )
    before = (d / "train.py").read_bytes()
    assert main(["rewrite", str(d / "train.py")]) == 1
    err = capsys.readouterr().err
    assert re.search(r"train\.py:10:5: DDP104 init_dist\(\) starts the process group in a project module "
                     r"\(utils/dist\.py:11\)", err), err
    assert (d / "train.py").read_bytes() == before and not (d / "train_ddp.py").exists()


def test_a_file_a_project_function_writes_on_rank_zero_and_another_hands_to_a_program_gets_a_barrier(tmp_path: Path, capsys) -> None:
    """RepBERT's evaluation: ``generate_rank(scores, ranking)`` (a project function that only
    writes) runs on rank 0, then ``eval_results(ranking)`` runs a scorer program on that file
    on every rank: a barrier after the write, or rank 1 scores a file not written yet."""
    d = tmp_path / "proj"
    d.mkdir()
    (d / "utils.py").write_text(
        "import subprocess\n\n\ndef generate_rank(scores, ranking):\n    with open(ranking, 'w') as f:\n"
        "        f.write(open(scores).read())\n\n\ndef eval_results(ranking):\n"
        "    return float(subprocess.check_output(['python', 'score.py', ranking]))\n"
    )
    (d / "train.py").write_text(
        "import torch\nimport torch.nn as nn\nfrom utils import eval_results, generate_rank\n\n\n"
        "def evaluate(model):\n    scores = 'scores.tsv'\n    ranking = 'ranking.tsv'\n"
        "    with open(scores, 'w') as f:\n        f.write(str(model(torch.ones(1, 4)).sum().item()))\n"
        "    generate_rank(scores, ranking)\n    return eval_results(ranking)\n\n\n"
        "model = nn.DataParallel(nn.Linear(4, 2))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x in torch.utils.data.DataLoader(torch.randn(16, 4), batch_size=4):\n"
        "    opt.zero_grad()\n    model(x).sum().backward()\n    opt.step()\nprint(evaluate(model))\n"
    )
    assert main(["rewrite", str(d / "train.py")]) == 0
    said = "".join(capsys.readouterr())
    assert re.search(r"11 +dist\.barrier\(\) after the rank-0 write: line 12 reads the file on every rank", said), said
    text = (d / "train_ddp.py").read_text()
    assert "        generate_rank(scores, ranking)\n    dist.barrier()\n    return eval_results(ranking)\n" in text, text


def test_a_rewritten_helper_that_other_scripts_import_is_named_with_each_of_them(tmp_path: Path, capsys) -> None:
    """``define_net()`` (network.py) wraps in DataParallel; train.py and distill.py both
    import it. Migrating train.py rewrites network.py, which then gives distill.py (no process
    group) the bare model: DDP175 names distill.py and its import line, the exit code says
    there is something to read; a project whose helper no other script imports gets none."""
    d = tmp_path / "proj"
    d.mkdir()
    (d / "network.py").write_text(_FACTORY.format(
        wrap="    if cuda:\n        net = torch.nn.DataParallel(net).cuda()\n    else:\n        net = torch.nn.DataParallel(net)\n"))
    (d / "utils.py").write_text(_FILTERED)
    (d / "train.py").write_text(_KD_ENTRY)
    assert main(["rewrite", "--with-helpers", "-o", str(tmp_path / "alone"), str(d / "train.py")]) == 0
    assert "DDP175" not in "".join(capsys.readouterr())
    (d / "distill.py").write_text("import torch\n\nfrom network import define_net\n\nteacher = define_net(cuda=False)\n")
    assert main(["rewrite", "--with-helpers", "-o", str(tmp_path / "out"), str(d / "train.py")]) == 1
    said = "".join(capsys.readouterr())
    assert re.search(r"network\.py:1:1: DDP175 network\.py is also imported by scripts this migration leaves as they "
                     r"were \(distill\.py:3\)", said), said
    assert (tmp_path / "out" / "network.py").exists()  # written: a warning, not a refusal


def test_an_entry_whose_helpers_only_test_for_dataparallel_gets_no_process_group(tmp_path: Path, capsys) -> None:
    """KAIR's test scripts: no wrap of their own, and ``utils_model.describe_model`` only tests
    ``isinstance(model, torch.nn.DataParallel)``. The script, which wraps nothing, gets no
    process group (under torchrun it would only repeat itself), and the helper's test stays as
    it is: it serves the project's scripts that wrap in DataParallel."""
    d = tmp_path / "proj"
    d.mkdir()
    (d / "utils_model.py").write_text(
        "import torch\n\n\ndef describe_model(model):\n    if isinstance(model, torch.nn.DataParallel):\n"
        "        model = model.module\n    return type(model).__name__\n"
    )
    (d / "main_test.py").write_text(
        "import torch\nimport torch.nn as nn\nimport utils_model\n\nmodel = nn.Linear(4, 2)\n"
        "print(utils_model.describe_model(model))\nwith torch.no_grad():\n    print(model(torch.ones(1, 4)))\n"
    )
    main(["rewrite", "--with-helpers", "-o", str(tmp_path / "out"), str(d / "main_test.py")])
    out = tmp_path / "out"
    assert (out / "main_test.py").read_text() == (d / "main_test.py").read_text()
    assert (out / "utils_model.py").read_text() == (d / "utils_model.py").read_text()


def test_an_evaluation_script_whose_helper_wraps_its_model_is_refused_as_a_project(tmp_path: Path, capsys) -> None:
    """Deep_Metric's shape: ``test.py`` asks a helper for the features of a trained model; the
    helper wraps it in DataParallel and runs it over a loader; nothing the script or its
    project reaches trains. Migrated as a project, every rank would repeat the whole
    extraction: refused (DDP115) at the call that reaches the wrap, nothing written. The same
    helper called by a script that trains is migrated."""
    d = tmp_path / "proj"
    d.mkdir()
    (d / "features.py").write_text(
        "import torch\nimport torch.nn as nn\n\n\ndef extract(net, data, batch_size=8):\n"
        "    model = nn.DataParallel(net)\n    loader = torch.utils.data.DataLoader(data, batch_size=batch_size)\n"
        "    out = []\n    with torch.no_grad():\n        for x, in loader:\n            out.append(model(x))\n"
        "    return torch.cat(out)\n")
    (d / "test.py").write_text(
        "import torch\nfrom features import extract\n\nif __name__ == \"__main__\":\n    net = torch.nn.Linear(4, 2)\n"
        "    feats = extract(net, torch.utils.data.TensorDataset(torch.randn(16, 4)))\n    print(feats.norm())\n")
    out = tmp_path / "out"
    assert main(["rewrite", str(d / "test.py"), "--with-helpers", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert ("test.py:6:13: DDP115 its model is wrapped in DataParallel by extract() (features.py:6), and nothing this "
            "script or its project modules run trains it: under DDP every rank would repeat the whole inference") in err, err
    assert not out.exists()
    (d / "test.py").write_text((d / "test.py").read_text().replace(
        "    print(feats.norm())\n", "    opt = torch.optim.SGD(net.parameters(), lr=0.1)\n    feats.sum().backward()\n"
        "    opt.step()\n"))
    main(["rewrite", str(d / "test.py"), "--with-helpers", "-o", str(out)])
    assert "DDP115" not in capsys.readouterr().err


def test_a_project_evaluation_that_writes_a_plot_two_modules_down_runs_on_rank_0_first(tmp_path: Path, capsys) -> None:
    """SCAN's shape: ``stats = evaluate(preds, plot_file=...)`` (metrics.py) returns numbers and
    calls ``plot_confusion`` (plots.py), which saves a figure: under DDP every rank would write
    it at once. Its result is used, so it cannot run on rank 0 alone: it runs on rank 0 first,
    then on the others, a barrier between (DDP132). Where the ranks cannot be shown to reach
    it alike (a ``while`` loop), it is refused (DDP110) with the write's place."""
    d = tmp_path / "proj"
    d.mkdir()
    (d / "plots.py").write_text("import matplotlib.pyplot as plt\n\n\ndef plot_confusion(values, path):\n"
                                "    plt.plot(values)\n    plt.savefig(path)\n")
    (d / "metrics.py").write_text("from plots import plot_confusion\n\n\ndef evaluate(values, plot_file=None):\n"
                                  "    if plot_file is not None:\n        plot_confusion(values, plot_file)\n"
                                  "    return {'mean': sum(values) / len(values)}\n")
    train = (
        "import torch\nimport torch.nn as nn\nfrom metrics import evaluate\n\n\ndef main():\n"
        "    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 4)), batch_size=8, shuffle=True)\n"
        "    model = nn.DataParallel(nn.Linear(4, 1))\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    losses = []\n    for (x,) in loader:\n        loss = model(x).pow(2).mean()\n        opt.zero_grad()\n"
        "        loss.backward()\n        opt.step()\n        losses.append(loss.item())\n"
        "    stats = evaluate(losses, plot_file='confusion.png')\n    print(stats)\n\n\n"
        "if __name__ == '__main__':\n    main()\n")
    (d / "train.py").write_text(train)
    assert main(["rewrite", str(d / "train.py")]) == 0
    out = (d / "train_ddp.py").read_text()
    assert ("    if dist.get_rank() != 0:\n        dist.barrier()  # rank 0 runs evaluate first (it writes plots.py:6)\n"
            "    stats = evaluate(losses, plot_file='confusion.png')\n    if dist.get_rank() == 0:\n        dist.barrier()\n") in out, out
    (d / "train_ddp.py").unlink()
    (d / "train.py").write_text(train.replace("    stats = evaluate(", "    while len(losses) < 8:\n        losses.append(0.0)\n"
                                              "        stats = evaluate(").replace("    print(stats)\n", "        print(stats)\n"))
    assert main(["rewrite", str(d / "train.py")]) == 1
    err = capsys.readouterr().err
    assert "DDP110 evaluate writes a file (plots.py:6) on every rank, and dp2ddp cannot run it on rank 0 alone: its result is used" in err, err
    assert not (d / "train_ddp.py").exists()
    # handed the model and running it, rank 0 cannot run it while the others wait: a DDP
    # forward in it would wait for them (a hang); refused too
    (d / "train.py").write_text(train.replace("evaluate(losses, plot_file=", "evaluate(losses, model, plot_file="))
    plain_metrics = (d / "metrics.py").read_text()
    (d / "metrics.py").write_text(plain_metrics.replace(
        "def evaluate(values, plot_file=None):\n", "def evaluate(values, net, plot_file=None):\n    values = net(values)\n"))
    assert main(["rewrite", str(d / "train.py")]) == 1
    err = capsys.readouterr().err
    assert "DDP110 evaluate writes a file (plots.py:6) on every rank" in err, err
    assert not (d / "train_ddp.py").exists()
    # handed the model only to read it (no forward: no collective), it runs on rank 0 first as before
    (d / "metrics.py").write_text(plain_metrics.replace(
        "def evaluate(values, plot_file=None):\n", "def evaluate(values, net, plot_file=None):\n    sizes = net.state_dict()\n"))
    assert main(["rewrite", str(d / "train.py")]) == 0
    assert "dist.barrier()  # rank 0 runs evaluate first (it writes plots.py:6)" in (d / "train_ddp.py").read_text()


def test_the_evaluation_loader_a_project_maker_returns_stays_whole(tmp_path: Path) -> None:
    """SRFBN's shape: one project function makes every phase's loader, shuffling for the
    training phase only; the script binds its results to ``train_loader`` and ``val_loader``,
    and the validation loop steps through a solver's method. The training loader is sharded;
    the validation loader (its name says so, and no training loop reads it) stays whole, so
    every rank's PSNR, and its best-epoch choice, counts every image."""
    d = tmp_path / "proj"
    d.mkdir()
    (d / "data.py").write_text(
        "import torch\n\n\ndef create_dataloader(dataset, phase):\n    shuffle = phase == 'train'\n"
        "    return torch.utils.data.DataLoader(dataset, batch_size=4 if shuffle else 2, shuffle=shuffle)\n")
    (d / "train.py").write_text(
        "import torch\nimport torch.nn as nn\nfrom data import create_dataloader\n\n\ndef main():\n"
        "    ds = torch.utils.data.TensorDataset(torch.randn(16, 4))\n"
        "    train_loader = create_dataloader(ds, 'train')\n    val_loader = create_dataloader(ds, 'val')\n"
        "    model = nn.DataParallel(nn.Linear(4, 1))\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for (x,) in train_loader:\n        opt.zero_grad()\n        model(x).pow(2).mean().backward()\n        opt.step()\n"
        "    with torch.no_grad():\n        print(sum(model(x).sum().item() for (x,) in val_loader))\n\n\n"
        "if __name__ == '__main__':\n    main()\n")
    assert main(["rewrite", str(d / "train.py")]) in (0, 1)
    out = (d / "train_ddp.py").read_text()
    assert "    train_loader = shard_loader(train_loader)\n" in out, out
    assert "shard_loader(val_loader)" not in out, out


def test_a_call_that_makes_a_folder_and_trains_is_not_run_on_rank_0_first(tmp_path: Path, capsys) -> None:
    """edge-connect's shape: ``main(mode=2)`` makes its checkpoint folder without exist_ok and
    then trains. Rank 0 running it first while the others wait at a barrier would train
    alone, its DDP waiting for them: a hang. Refused (DDP110) with the training's place; a call
    that only makes the folder still runs on rank 0 first."""
    d = tmp_path / "proj"
    d.mkdir()
    (d / "runner.py").write_text(
        "import os\nimport torch\n\n\ndef make_dirs(path):\n    if not os.path.exists(path):\n        os.makedirs(path)\n\n\n"
        "def main(model, loader, path):\n    if not os.path.exists(path):\n        os.makedirs(path)\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    for (x,) in loader:\n        opt.zero_grad()\n"
        "        model(x).pow(2).mean().backward()\n        opt.step()\n")
    script = (
        "import torch\nimport torch.nn as nn\nfrom runner import main, make_dirs\n\n\ndef run():\n"
        "    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 4)), batch_size=8, shuffle=True)\n"
        "    model = nn.DataParallel(nn.Linear(4, 1))\n    CALL\n\n\nif __name__ == '__main__':\n    run()\n")
    (d / "train.py").write_text(script.replace("CALL", "main(model, loader, 'ckpt')"))
    assert main(["rewrite", str(d / "train.py")]) == 1
    err = capsys.readouterr().err
    assert "DDP110 main creates a folder without exist_ok (runner.py:12) on every rank, and rank 0 cannot run it first" in err, err
    assert "it also trains (runner.py:14)" in err, err
    (d / "train.py").write_text(script.replace("CALL", "make_dirs('ckpt')\n    for (x,) in loader:\n"
                                               "        model(x).pow(2).mean().backward()"))
    main(["rewrite", str(d / "train.py")])
    out = (d / "train_ddp.py").read_text()
    assert "dist.barrier()  # rank 0 creates make_dirs's folders first" in out, out


def test_a_project_save_that_also_makes_its_folder_runs_on_rank_0_only(tmp_path: Path) -> None:
    """pytorch-3dunet's ``save_checkpoint(state, is_best, checkpoint_dir)`` makes its folder
    (checked, without exist_ok) and saves: it only writes, so it runs on rank 0 alone, under a
    rank test; the other ranks never write the checkpoint (not after rank 0 either)."""
    d = tmp_path / "proj"
    d.mkdir()
    (d / "ckpt.py").write_text(
        "import os\nimport torch\n\n\ndef save_checkpoint(state, checkpoint_dir):\n    if not os.path.exists(checkpoint_dir):\n"
        "        os.mkdir(checkpoint_dir)\n    torch.save(state, os.path.join(checkpoint_dir, 'last.pt'))\n")
    (d / "train.py").write_text(
        "import torch\nimport torch.nn as nn\nfrom ckpt import save_checkpoint\n\n\ndef main():\n"
        "    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 4)), batch_size=8, shuffle=True)\n"
        "    model = nn.DataParallel(nn.Linear(4, 1))\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for epoch in range(2):\n        for (x,) in loader:\n            opt.zero_grad()\n"
        "            model(x).pow(2).mean().backward()\n            opt.step()\n"
        "        save_checkpoint({'model': model.state_dict()}, 'runs')\n\n\nif __name__ == '__main__':\n    main()\n")
    assert main(["rewrite", str(d / "train.py")]) == 0
    out = (d / "train_ddp.py").read_text()
    assert "        if dist.get_rank() == 0:\n            save_checkpoint(" in out, out


def _informer_project(d: Path, handed_on: bool = False) -> None:
    """Autoformer's shape: ``run.py`` makes an experiment object whose class lives in
    ``exp.py``; there ``_get_data(flag)`` asks ``data.py`` for the loader of each phase, and the
    model is wrapped in DataParallel in ``_build_model``."""
    d.mkdir()
    (d / "data.py").write_text(
        "import torch\n\n\ndef data_provider(flag):\n    ds = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))\n"
        "    return ds, torch.utils.data.DataLoader(ds, batch_size=8, shuffle=flag == 'train')\n")
    (d / "exp.py").write_text(
        "import torch\nimport torch.nn as nn\nfrom data import data_provider\n\n\nclass Exp:\n"
        "    def __init__(self, args):\n        self.model = nn.DataParallel(nn.Linear(4, 1))\n\n"
        "    def _get_data(self, flag):\n        data_set, data_loader = data_provider(flag)\n        return data_set, data_loader\n\n"
        "    def vali(self, loader):\n        self.model.eval()\n        total = 0.0\n        with torch.no_grad():\n"
        "            for x, y in loader:\n                total += float(nn.functional.mse_loss(self.model(x), y))\n"
        "        self.model.train()\n        return total\n\n"
        "    def train(self):\n        _, train_loader = self._get_data(flag='train')\n        _, vali_loader = self._get_data(flag='val')\n"
        "        opt = torch.optim.SGD(self.model.parameters(), lr=0.1)\n        for epoch in range(2):\n"
        "            for x, y in train_loader:\n                opt.zero_grad()\n"
        "                nn.functional.mse_loss(self.model(x), y).backward()\n                opt.step()\n"
        "            print(self.vali(vali_loader))\n")
    call = "Experiment = Exp\n    Experiment(None).train()" if handed_on else "Exp(None).train()"
    (d / "run.py").write_text(f"from exp import Exp\n\nif __name__ == '__main__':\n    {call}\n")


def test_a_loader_function_that_serves_training_and_evaluation_is_sharded_where_training_binds_it(tmp_path: Path, capsys) -> None:
    """Sharding the loader ``data_provider()`` returns inside ``_get_data(flag)`` would shard
    the validation too (each rank's own loss, and an early stop that differs between the
    ranks). The training loop's loader is bound by a call of its own,
    ``self._get_data(flag='train')``: it is sharded after that statement, and the validation
    loader (``flag='val'``) stays whole. Where the validation loop reads the training call's
    loader under another name, the project migration is refused (DDP105) at the maker's call,
    nothing written."""
    d = tmp_path / "proj"
    _informer_project(d)
    out = tmp_path / "out"
    assert main(["rewrite", str(d / "run.py"), "--with-helpers", "-o", str(out)]) == 0
    exp = (out / "exp.py").read_text()
    assert ("        _, train_loader = self._get_data(flag='train')\n        train_loader = shard_loader(train_loader)\n"
            "        _, vali_loader = self._get_data(flag='val')\n") in exp, exp
    assert "data_loader = shard_loader(" not in exp
    shutil.rmtree(out)
    (d / "exp.py").write_text((d / "exp.py").read_text().replace(
        "        _, vali_loader = self._get_data(flag='val')\n", "        vali_loader = train_loader\n"))
    assert main(["rewrite", str(d / "run.py"), "--with-helpers", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "exp.py:11:33: DDP105 the loader data_provider() returns is also the one the evaluation loop at line 18 iterates" in err, err
    assert not out.exists()


def test_a_class_with_dataparallel_handed_on_as_a_value_is_no_silent_miss(tmp_path: Path, capsys) -> None:
    """``Experiment = Exp`` then ``Experiment(args)``: the class that wraps is never called by
    its own name. Rewritten alone the script is not "nothing to migrate" but DDP151, naming
    the value and the helper's DataParallel."""
    d = tmp_path / "proj"
    _informer_project(d, handed_on=True)
    assert main(["rewrite", str(d / "run.py")]) == 1
    err = capsys.readouterr().err
    assert "run.py:4:18: DDP151 `Exp`, handed on as a value, reaches DataParallel in the project module exp.py:8" in err, err


def test_a_library_module_is_no_entry_for_a_project_migration(tmp_path: Path, capsys) -> None:
    """BERT-NER's ``callback/trainingmonitor.py`` (a class, no main guard) imports a helper that
    wraps in DataParallel. ``rewrite trainingmonitor.py --with-helpers`` used to give it a process
    group at import; it is refused (DDP116), nothing written."""
    d = tmp_path / "proj"
    d.mkdir()
    (d / "common.py").write_text("import torch.nn as nn\n\n\ndef model_device(model):\n    return nn.DataParallel(model)\n")
    (d / "monitor.py").write_text("from common import model_device\n\n\nclass Monitor:\n    def wrap(self, model):\n"
                                  "        return model_device(model)\n")
    out = tmp_path / "out"
    assert main(["rewrite", str(d / "monitor.py"), "--with-helpers", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "monitor.py:1:1: DDP116 library module" in err, err
    assert not out.exists()


def test_a_project_save_handed_the_model_keeps_the_wrapper_and_its_keys(tmp_path: Path) -> None:
    """SupContrast's ``save_model(model, optimizer, opt, epoch, file)`` reads
    ``model.state_dict()`` and runs no forward: it runs on rank 0 handed the wrapper, so its
    file keeps the original's ``module.`` keys; only a helper that calls the model it is
    handed gets the bare module."""
    d = tmp_path / "proj"
    d.mkdir()
    (d / "util.py").write_text("import torch\n\n\ndef save_model(model, path):\n    torch.save({'model': model.state_dict()}, path)\n")
    (d / "train.py").write_text(
        "import torch\nimport torch.nn as nn\nfrom util import save_model\n\n\ndef main():\n"
        "    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 4)), batch_size=8, shuffle=True)\n"
        "    model = nn.DataParallel(nn.Linear(4, 1))\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for (x,) in loader:\n        opt.zero_grad()\n        model(x).pow(2).mean().backward()\n        opt.step()\n"
        "    save_model(model, 'last.pth')\n\n\nif __name__ == '__main__':\n    main()\n")
    assert main(["rewrite", str(d / "train.py")]) == 0
    out = (d / "train_ddp.py").read_text()
    assert "        save_model(model, 'last.pth')\n" in out and "model.module" not in out, out


def test_a_helper_that_only_tests_for_dataparallel(tmp_path: Path, capsys) -> None:
    """CPC's ``feature_loader.get_module`` unwraps ``torch.nn.DataParallel`` for every script
    of the project. An entry that wraps nothing leaves it alone (its evaluation scripts were
    "migrated" by rewriting only that test, which then missed the DataParallel of the scripts
    still using it: their checkpoints gained ``module.``); migrated with an entry that wraps,
    the test accepts both wrappers."""
    d = tmp_path / "proj"
    d.mkdir()
    (d / "helpers.py").write_text("import torch\n\n\ndef get_module(m):\n    if isinstance(m, torch.nn.DataParallel):\n"
                                  "        return get_module(m.module)\n    return m\n")
    (d / "evaluate.py").write_text("import torch\nfrom helpers import get_module\n\n\nif __name__ == '__main__':\n"
                                   "    print(get_module(torch.nn.Linear(2, 1)))\n")
    out = tmp_path / "out"
    assert main(["rewrite", str(d / "evaluate.py"), "--with-helpers", "-o", str(out)]) == 0
    said = capsys.readouterr()
    assert "nothing to migrate" in said.out + said.err
    assert not (out / "helpers.py").exists() or (out / "helpers.py").read_text() == (d / "helpers.py").read_text()
    shutil.rmtree(out, ignore_errors=True)
    (d / "train.py").write_text(
        "import torch\nimport torch.nn as nn\nfrom helpers import get_module\n\n\ndef main():\n"
        "    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8, shuffle=True)\n"
        "    model = nn.DataParallel(nn.Linear(4, 1))\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for x, y in loader:\n        opt.zero_grad()\n        nn.functional.mse_loss(model(x), y).backward()\n        opt.step()\n"
        "    torch.save(get_module(model).state_dict(), 'm.pt')\n\n\nif __name__ == '__main__':\n    main()\n")
    assert main(["rewrite", str(d / "train.py"), "--with-helpers", "-o", str(out)]) == 0
    helper = (out / "helpers.py").read_text()
    assert "isinstance(m, (torch.nn.DataParallel, DistributedDataParallel))" in helper, helper


def test_a_model_placed_by_the_caller_after_the_wrap_is_refused(tmp_path: Path, capsys) -> None:
    """Autoformer's ``Exp_Basic.__init__`` runs ``self.model = self._build_model().to(self.device)``
    with ``self.device`` from ``args.gpu``, while ``Exp_Main._build_model`` wraps and returns the
    model: DDP would be built over a module still on the CPU (on a GPU it raises), and then moved
    to one device for every rank. Refused (DDP101) at the wrap, naming the caller's line; a
    caller's bare ``.cuda()`` (the current device, the rank's) is no such placement."""
    d = tmp_path / "proj"
    d.mkdir()
    (d / "basic.py").write_text("import torch\n\n\nclass Basic:\n    def __init__(self, gpu):\n"
                                "        self.device = torch.device('cuda:%d' % gpu if torch.cuda.is_available() else 'cpu')\n"
                                "        self.model = self._build_model().to(self.device)\n")
    (d / "exp.py").write_text(
        "import torch\nimport torch.nn as nn\nfrom basic import Basic\n\n\nclass Exp(Basic):\n    def _build_model(self):\n"
        "        model = nn.Linear(4, 1)\n        model = nn.DataParallel(model)\n        return model\n\n"
        "    def train(self):\n        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8, shuffle=True)\n"
        "        opt = torch.optim.SGD(self.model.parameters(), lr=0.1)\n        for x, y in loader:\n            opt.zero_grad()\n"
        "            nn.functional.mse_loss(self.model(x), y).backward()\n            opt.step()\n")
    (d / "run.py").write_text("from exp import Exp\n\nif __name__ == '__main__':\n    Exp(0).train()\n")
    out = tmp_path / "out"
    assert main(["rewrite", str(d / "run.py"), "--with-helpers", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "exp.py:9:17: DDP101 the model this function returns after the wrap is placed on a device by its caller (basic.py:7" in err, err
    assert not out.exists()
    (d / "basic.py").write_text((d / "basic.py").read_text().replace(".to(self.device)", ".cuda()"))
    assert main(["rewrite", str(d / "run.py"), "--with-helpers", "-o", str(out)]) == 0


def test_absolute_imports_are_found_up_to_the_repository_root(tmp_path: Path) -> None:
    """IIC runs its scripts as modules of the repository (``python -m
    code.scripts.cluster.analysis.eval``): ``from code.utils.cluster.cluster_eval import
    cluster_eval`` is found four folders above the script, at the root its LICENSE marks. An
    evaluation script whose helper could not be read counted as one that may train, and was
    migrated to repeat the whole evaluation on every rank. Without a root mark, the search
    stays within three folders above the script."""
    from dp2ddp.model.module_files import module_file

    root = tmp_path / "repo"
    deep = root / "code" / "scripts" / "cluster" / "analysis"
    deep.mkdir(parents=True)
    (root / "code" / "utils").mkdir()
    (root / "code" / "utils" / "evaluation.py").write_text("def run(net):\n    return 0\n")
    assert module_file(str(deep), "code.utils.evaluation") is None  # no root mark: three folders up only
    (root / "LICENSE").write_text("a repository\n")
    assert module_file(str(deep), "code.utils.evaluation") == str(root / "code" / "utils" / "evaluation.py")


def test_a_subpackages_readme_is_no_repository_root(tmp_path: Path) -> None:
    """CPC_audio keeps a README.md inside its ``cpc`` package: the search for ``cpc.dataset``
    from ``cpc/train.py`` must go on to the folder above (a package's folder is never the
    root its absolute imports start from), or the writes in ``dataset.py`` go unseen."""
    from dp2ddp.model.module_files import module_file

    root = tmp_path / "repo"
    (root / "cpc").mkdir(parents=True)
    (root / "LICENSE").write_text("a repository\n")
    (root / "cpc" / "__init__.py").write_text("")
    (root / "cpc" / "README.md").write_text("the package\n")
    (root / "cpc" / "dataset.py").write_text("def find(path):\n    return []\n")
    assert module_file(str(root / "cpc"), "cpc.dataset") == str(root / "cpc" / "dataset.py")


def test_a_triplet_loss_handed_to_the_projects_training_code_is_refused_at_the_value_handed(tmp_path: Path, capsys) -> None:
    """reid-strong-baseline's shape: the script builds the loss with the project's factory (a
    closure over a batch-hard triplet loss whose distances a helper computes) and hands it to
    the project's training code, which wraps the model and calls the loss in a step function
    it builds. Migrated, the step would mine each rank's share of the batch: refused (DDP153)
    at the value handed, with where it is called and where it compares; nothing written. The
    same script handing a plain loss migrates."""
    d = tmp_path / "proj"
    d.mkdir()
    src = ROOT / "fixtures" / "in_batch_loss"
    for name in ("metric_losses.py", "reid_engine.py"):
        shutil.copyfile(src / name, d / name)
    shutil.copyfile(src / "noop_triplet_loss_handed_to_a_project_trainer_refused.in.py", d / "train.py")
    out = tmp_path / "out"
    assert main(["rewrite", str(d / "train.py"), "--with-helpers", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert ("train.py:29:35: DDP153 `loss_func`, handed to fit() as `loss_fn` and called where it trains "
            "(reid_engine.py:10), runs HardTripletLoss, which compares the samples of a batch with each other "
            "(metric_losses.py:11)") in err, err
    assert not out.exists()
    (d / "train.py").write_text((d / "train.py").read_text().replace('build_loss("softmax_triplet")',
                                                                      "torch.nn.CrossEntropyLoss()"))
    (d / "reid_engine.py").write_text((d / "reid_engine.py").read_text().replace(
        "loss_fn(logits, feats, ids)", "loss_fn(logits, ids)"))
    assert main(["rewrite", str(d / "train.py"), "--with-helpers", "-o", str(out)]) in (0, 1)
    assert "DDP153" not in capsys.readouterr().err
    assert (out / "reid_engine.py").exists()


@pytest.mark.torchrun
def test_a_logging_helper_the_script_imports_through_its_own_sys_path_edit_runs_on_rank_zero(tmp_path: Path, capsys) -> None:
    """audioset_tagging_cnn's shape: `sys.path.insert(1, os.path.join(sys.path[0], '../utils'))`
    in the script, then `from utilities import create_logging`, which numbers the log file
    after those already there. The helper was not found, ran on every rank, and two ranks could
    pick one file or two. It is found now, runs on rank 0 (DDP135), and the project copy (-o)
    holds ../utils, so the copy runs: one log file after a torchrun of two ranks."""
    d = tmp_path / "proj"
    (d / "pytorch").mkdir(parents=True)
    (d / "utils").mkdir()
    (d / "utils" / "utilities.py").write_text(
        "import logging\nimport os\n\n\ndef create_logging(log_dir, filemode):\n    os.makedirs(log_dir, exist_ok=True)\n"
        "    i = 0\n    while os.path.isfile(os.path.join(log_dir, '{:04d}.log'.format(i))):\n        i += 1\n"
        "    logging.basicConfig(level=logging.INFO, filename=os.path.join(log_dir, '{:04d}.log'.format(i)), filemode=filemode)\n"
        "    return logging\n")
    (d / "pytorch" / "main.py").write_text(
        "import logging\nimport os\nimport sys\nsys.path.insert(1, os.path.join(sys.path[0], '../utils'))\n"
        "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\n"
        "from utilities import create_logging\n\n\ndef train():\n    create_logging('logs', filemode='w')\n"
        "    model = nn.DataParallel(nn.Linear(4, 2))\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,))), batch_size=4, shuffle=True)\n"
        "    for x, y in loader:\n        loss = nn.functional.cross_entropy(model(x), y)\n        opt.zero_grad()\n"
        "        loss.backward()\n        opt.step()\n        logging.info('loss %.4f', loss.item())\n\n\n"
        "if __name__ == '__main__':\n    train()\n")
    out = tmp_path / "out"
    assert main(["rewrite", str(d / "pytorch" / "main.py"), "--with-helpers", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "`create_logging(...)` configures logging to a file (../utils/utilities.py:10)" in text, text
    assert (out / "utils" / "utilities.py").exists()
    r = retry_exit_abort(lambda: run_script(["main.py"], out / "pytorch", env=_env(), nproc=2), "logging")
    assert r.returncode == 0, r.stdout[-3000:]
    assert sorted(p.name for p in (out / "pytorch" / "logs").iterdir()) == ["0000.log"]


TRAINER_HANDED_CALLBACKS = ROOT / "fixtures" / "project" / "trainer_handed_callbacks"


@pytest.mark.torchrun
def test_saves_of_callbacks_a_training_class_is_handed_are_refused_alone_and_made_on_rank_zero_as_a_project(
        tmp_path: Path, capsys) -> None:
    """``Trainer(model, ..., model_checkpoint=ModelCheckpoint(...), training_monitor=...)``:
    the trainer's epoch loop calls methods of the objects it was handed, whose classes (in
    other project modules) save the model and write a history file with no rank test.
    Alone: refused at the ``Trainer(...)`` call, naming each save (before, the migration was
    written and every rank wrote the same files at once). As a project: the callbacks'
    modules are migrated with the script and only rank 0 saves, each file once, as the
    original did; the trainer's module is left as it was."""
    d = tmp_path / "proj"
    shutil.copytree(TRAINER_HANDED_CALLBACKS, d)
    before = {p: p.read_bytes() for p in d.rglob("*.py")}
    assert main(["rewrite", str(d / "train.py")]) == 1
    err = capsys.readouterr().err
    for where in ("callbacks/checkpoint.py:16", "callbacks/monitor.py:11"):
        assert (f"train.py:25:15: DDP110 Trainer trains (engine/trainer.py:16) and saves a file with no rank test "
                f"({where})") in err, err
    assert {p: p.read_bytes() for p in d.rglob("*.py")} == before
    out = tmp_path / "proj_ddp"
    assert main(["rewrite", "--with-helpers", "-o", str(out), str(d / "train.py")]) == 1  # 1: DDP171, a CPU-only fixture
    assert (out / "engine" / "trainer.py").read_bytes() == (d / "engine" / "trainer.py").read_bytes()
    (out / "train.py").write_text(_RECORD_SAVES + (out / "train.py").read_text())
    r = retry_exit_abort(lambda: run_script(["train.py"], out, env=_env(), nproc=2), "handed callbacks")
    assert r.returncode == 0, r.stdout[-3000:]
    assert not (out / "saves-rank1.txt").exists()
    saves = [s for s in (out / "saves-rank0.txt").read_text().splitlines() if s.startswith("saved")]
    assert [s for s in saves if "epoch_" in s] == ["saved/epoch_1.pth", "saved/epoch_2.pth", "saved/epoch_3.pth"], saves
    assert len(json.loads((out / "saved" / "history.json").read_text())) == 3


def _closure_step_project(d: Path, loss_line: str) -> None:
    """A detection trainer's shape: ``Trainer(model, steps.make_step(), optimizer)``, the
    trainer class keeping the step it is handed (a tuple assignment) and calling it where it
    trains; the step a closure whose sibling computes the loss."""
    d.mkdir(parents=True)
    (d / "steps.py").write_text(
        "import torch\nimport torch.nn.functional as F\n\n\ndef make_step():\n"
        "    def point_loss(out, y):\n        per_point = F.cross_entropy(out, y.clamp(min=0), reduction='none')\n"
        "        valid = (y >= 0).float()\n" + loss_line +
        "\n    def model_fn(model, batch):\n        x, y = batch\n        return point_loss(model(x), y)\n\n    return model_fn\n")
    (d / "trainer.py").write_text(
        "class Trainer:\n    def __init__(self, model, model_fn, optimizer):\n"
        "        self.model, self.model_fn, self.optimizer = model, model_fn, optimizer\n\n"
        "    def _train_it(self, batch):\n        loss = self.model_fn(self.model, batch)\n"
        "        self.optimizer.zero_grad()\n        loss.backward()\n        self.optimizer.step()\n\n"
        "    def train(self, epochs, loader):\n        for epoch in range(epochs):\n            for batch in loader:\n"
        "                self._train_it(batch)\n")
    (d / "train.py").write_text(
        "import torch\nimport torch.nn as nn\n\nimport steps\nfrom trainer import Trainer\n\n\ndef main():\n"
        "    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randint(-1, 3, (32,)))\n"
        "    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)\n"
        "    model = nn.DataParallel(nn.Linear(4, 3))\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    Trainer(model, steps.make_step(), opt).train(2, loader)\n\n\nif __name__ == '__main__':\n    main()\n")


def test_a_count_normalised_loss_handed_to_a_trainer_class_is_refused(tmp_path: Path, capsys) -> None:
    """PointRCNN's shape: the step handed to ``Trainer(...)`` divides by the valid points of
    its batch (``torch.clamp(valid.sum(), min=1.0)``) in a closure of another module. Under
    DDP the trainer would call it on each rank's share, each dividing by its own count: the
    migration was written and trained another step. Refused (DDP185), naming both places;
    a plain mean in the same place migrates."""
    d = tmp_path / "proj"
    _closure_step_project(d, "        return (per_point * valid).sum() / torch.clamp(valid.sum(), min=1.0)\n")
    before = (d / "train.py").read_bytes()
    for argv in (["rewrite", str(d / "train.py")], ["rewrite", "--with-helpers", "--diff", str(d / "train.py")]):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert re.search(r"train\.py:13:20: DDP185 `steps\.make_step\(\)`, handed to Trainer\(\) as `model_fn` and called "
                         r"where it trains \(trainer\.py:6\), averages the loss over a count of its batch \(steps\.py:9\)", err), err
    assert (d / "train.py").read_bytes() == before and not (d / "train_ddp.py").exists()
    e = tmp_path / "mean"
    _closure_step_project(e, "        return (per_point * valid).mean()\n")
    assert main(["rewrite", str(e / "train.py")]) in (0, 1)
    assert "DDP185" not in capsys.readouterr().err
    assert (e / "train_ddp.py").is_file()


def _metric_project(d: Path, dropped: str) -> None:
    """A metric-learning project's shape: ``losses.create(name, ...)`` picks a loss class
    from the package's dict by the configured name; ``mkdir_if_missing`` in a helper package
    drops the error of a folder that exists (``dropped``: its handler's body)."""
    (d / "losses").mkdir(parents=True)
    (d / "utils").mkdir()
    (d / "utils" / "__init__.py").write_text("from .osutils import mkdir_if_missing\n")
    (d / "utils" / "osutils.py").write_text(
        "import errno\nimport os\n\n\ndef mkdir_if_missing(path):\n    try:\n        os.makedirs(path)\n"
        "    except OSError as e:\n" + dropped)
    (d / "losses" / "plain.py").write_text(
        "import torch.nn as nn\n\n\nclass PlainLoss(nn.Module):\n    def forward(self, out, y):\n"
        "        return nn.functional.cross_entropy(out, y)\n")
    (d / "losses" / "pairs.py").write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass PairLoss(nn.Module):\n    def forward(self, feats, y):\n"
        "        sim = torch.matmul(feats, feats.t())\n        same = (y.unsqueeze(0) == y.unsqueeze(1)).float()\n"
        "        return ((sim - same) ** 2).mean()\n")
    (d / "losses" / "__init__.py").write_text(
        "from .pairs import PairLoss\nfrom .plain import PlainLoss\n\n__factory = {\n    'pairs': PairLoss,\n"
        "    'plain': PlainLoss,\n}\n\n\ndef create(name, *args, **kwargs):\n    return __factory[name](*args, **kwargs)\n")
    (d / "train.py").write_text(
        "import argparse\nimport os\n\nimport torch\nimport torch.nn as nn\n\nimport losses\nfrom utils import mkdir_if_missing\n\n\n"
        "def main():\n    parser = argparse.ArgumentParser()\n    parser.add_argument('--loss', default='plain')\n"
        "    parser.add_argument('--save_dir', default='runs')\n    args = parser.parse_args()\n"
        "    for sub in sorted(os.listdir('.')):\n        mkdir_if_missing(os.path.join(args.save_dir, 'seen'))\n"
        "    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,)))\n"
        "    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)\n"
        "    model = nn.DataParallel(nn.Linear(4, 3))\n    criterion = losses.create(args.loss).cuda()\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    for epoch in range(2):\n        for x, y in loader:\n"
        "            loss = criterion(model(x), y)\n            opt.zero_grad()\n            loss.backward()\n            opt.step()\n"
        "\n\nif __name__ == '__main__':\n    main()\n")


def test_a_loss_a_factory_picks_from_its_dict_by_name_is_any_of_them(tmp_path: Path, capsys) -> None:
    """``losses.create(args.loss).cuda()`` returns ``__factory[name](...)``: the loss the
    script gets is whichever class the configuration names, so each of the dict's classes
    counts; one of them compares the batch's samples (DDP153). Deep_Metric's migration was
    written with every rank's loss over half the batch."""
    d = tmp_path / "proj"
    _metric_project(d, "        if e.errno != errno.EEXIST:\n            raise\n")
    before = (d / "train.py").read_bytes()
    assert main(["rewrite", str(d / "train.py")]) == 1
    err = capsys.readouterr().err
    assert re.search(r"train\.py:25:20: DDP153 PairLoss compares the samples of a batch with each other \(losses/pairs\.py:7\)", err), err
    assert (d / "train.py").read_bytes() == before and not (d / "train_ddp.py").exists()
    # with the pairwise loss out of the dict, the same project migrates: the folder is made
    # by a helper that drops FileExistsError, under a loop over what exists (no barrier needed)
    (d / "losses" / "__init__.py").write_text(
        "from .plain import PlainLoss\n\n__factory = {\n    'plain': PlainLoss,\n}\n\n\n"
        "def create(name, *args, **kwargs):\n    return __factory[name](*args, **kwargs)\n")
    assert main(["rewrite", str(d / "train.py")]) == 0, capsys.readouterr().err
    assert "DDP110" not in capsys.readouterr().err


@pytest.mark.parametrize("handler", [
    pytest.param("        print('exists:', path)\n        raise SystemExit(1)\n", id="a_handler_that_exits_still_races"),
    pytest.param("        if e.errno == errno.EEXIST:\n            raise\n", id="a_handler_that_reraises_the_exists_error_still_races"),
])
def test_a_folder_helper_that_does_not_drop_the_exists_error_is_refused_in_a_loop(tmp_path: Path, capsys, handler: str) -> None:
    d = tmp_path / "proj"
    _metric_project(d, handler)
    (d / "losses" / "__init__.py").write_text(
        "from .plain import PlainLoss\n\n__factory = {\n    'plain': PlainLoss,\n}\n\n\n"
        "def create(name, *args, **kwargs):\n    return __factory[name](*args, **kwargs)\n")
    assert main(["rewrite", str(d / "train.py")]) == 1
    assert re.search(r"DDP110 mkdir_if_missing creates a folder without exist_ok \(utils/osutils\.py:7\)", capsys.readouterr().err)


@pytest.mark.parametrize("listing_first", [False, True], ids=["a_cache_listed_after_it_is_made_runs_on_rank_zero_first",
                                                             "a_folder_named_from_a_listing_is_refused"])
def test_a_listing_counts_only_where_it_can_name_the_folder_made(tmp_path: Path, capsys, listing_first: bool) -> None:
    """pytorch_pretrained_bert's ``get_from_cache``: makes its cache folder when missing, then
    lists it for a file already downloaded. The listing names no folder: rank 0 runs it first
    (DDP132). DeepLab's Saver lists ``experiment_*`` to number the folder it then makes:
    every rank would pick its own (DDP110)."""
    d = tmp_path / "proj"
    d.mkdir()
    made = "    if not os.path.exists(folder):\n        os.makedirs(folder)\n"
    listed = "    found = [f for f in os.listdir(folder if os.path.isdir(folder) else '.') if f.startswith(name)]\n"
    (d / "cache.py").write_text(
        "import os\n\n\ndef fetch(name, folder='cache'):\n" + (listed + made if listing_first else made + listed)
        + "    return os.path.join(folder, found[-1] if found else name)\n")
    (d / "train.py").write_text(
        "import torch\nimport torch.nn as nn\n\nfrom cache import fetch\n\n\ndef main():\n    path = fetch('weights')\n"
        "    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1))\n"
        "    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)\n"
        "    model = nn.DataParallel(nn.Linear(4, 1))\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for epoch in range(2):\n        for x, y in loader:\n            loss = nn.functional.mse_loss(model(x), y)\n"
        "            opt.zero_grad()\n            loss.backward()\n            opt.step()\n    print(path)\n\n\n"
        "if __name__ == '__main__':\n    main()\n")
    code = main(["rewrite", str(d / "train.py")])
    err = capsys.readouterr().err
    if listing_first:
        assert code == 1 and re.search(r"train\.py:8:\d+: DDP110 fetch picks the folder it creates from what already exists", err), err
        assert not (d / "train_ddp.py").exists()
    else:
        assert code == 0, err
        assert "dist.barrier()" in (d / "train_ddp.py").read_text()


def test_a_project_function_that_hands_back_the_wrapper_it_was_given_keeps_it(tmp_path: Path, capsys) -> None:
    """deep_gcns: ``model, best, epoch = load_pretrained_models(model, path, phase)`` of
    utils/ckpt_util.py returns the model it was given (its weights loaded): the same wrapper,
    not another model (no DDP101). One that returns a new model is another value (DDP101)."""
    d = tmp_path / "proj"
    (d / "utils").mkdir(parents=True)
    (d / "utils" / "__init__.py").write_text("")
    (d / "utils" / "ckpt.py").write_text(
        "import os\n\nimport torch\n\n\ndef load_pretrained(model, path):\n    epoch = -1\n"
        "    if path and os.path.isfile(path):\n        state = torch.load(path)\n        model.load_state_dict(state['model'])\n"
        "        epoch = state['epoch']\n    return model, epoch\n\n\n"
        "def fresh(model, path):\n    return torch.nn.Linear(4, 1), -1\n")
    script = (
        "import torch\nimport torch.nn as nn\n\nfrom utils.ckpt import fresh, load_pretrained\n\n\ndef main():\n"
        "    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1))\n"
        "    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)\n"
        "    model = nn.DataParallel(nn.Linear(4, 1))\n    model, start = LOADER(model, '')\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for epoch in range(start + 1, 2):\n        for x, y in loader:\n            loss = nn.functional.mse_loss(model(x), y)\n"
        "            opt.zero_grad()\n            loss.backward()\n            opt.step()\n\n\nif __name__ == '__main__':\n    main()\n")
    (d / "train.py").write_text(script.replace("LOADER", "load_pretrained"))
    assert main(["rewrite", str(d / "train.py")]) == 0, capsys.readouterr().err
    assert "DistributedDataParallel(" in (d / "train_ddp.py").read_text()
    (d / "train_ddp.py").unlink()
    (d / "train.py").write_text(script.replace("LOADER", "fresh"))
    assert main(["rewrite", str(d / "train.py")]) == 1
    assert "DDP101 `model, start = fresh(model, '')` (line 11) binds `model` to another model after the wrap" in capsys.readouterr().err


def test_a_project_trainer_that_pulls_its_batches_from_a_queue_is_refused(tmp_path: Path, capsys) -> None:
    """kospeech: the trainer module (migrated with the script, it tests for DataParallel)
    trains in ``while True:`` on ``inputs, targets, lengths = queue.get()``, a queue its own
    loader threads fill. It wraps no model, so no forward of a wrap led to the batch, and the
    migration was written: every rank would pull whole batches of its own. Refused (DDP105)."""
    d = tmp_path / "proj"
    d.mkdir()
    (d / "trainer.py").write_text(
        "import queue\nimport threading\n\nimport torch\nimport torch.nn as nn\n\n\n"
        "def fill(q, data, bs):\n    for i in range(0, len(data[0]), bs):\n        q.put((data[0][i:i + bs], data[1][i:i + bs]))\n"
        "    q.put((torch.zeros(0, 4), torch.zeros(0, 1)))\n\n\n"
        "def train(model, data, optimizer, epochs=2):\n    for epoch in range(epochs):\n        q = queue.Queue(4)\n"
        "        threading.Thread(target=fill, args=(q, data, 8), daemon=True).start()\n        while True:\n"
        "            inputs, targets = q.get()\n            if inputs.shape[0] == 0:\n                break\n"
        "            loss = nn.functional.mse_loss(model(inputs), targets)\n            optimizer.zero_grad()\n"
        "            loss.backward()\n            optimizer.step()\n"
        "    core = model.module if isinstance(model, nn.DataParallel) else model\n    return core\n")
    (d / "train.py").write_text(
        "import torch\nimport torch.nn as nn\n\nimport trainer\n\n\ndef main():\n"
        "    data = (torch.randn(32, 4), torch.randn(32, 1))\n    model = nn.DataParallel(nn.Linear(4, 1))\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    trainer.train(model, data, opt)\n\n\n"
        "if __name__ == '__main__':\n    main()\n")
    before = (d / "train.py").read_bytes()
    assert main(["rewrite", "--with-helpers", "--diff", str(d / "train.py")]) == 1
    err = capsys.readouterr().err
    assert re.search(r"trainer\.py:19:\d+: DDP105 the training loop at line 18 takes its batch from no DataLoader: "
                     r"`q\.get\(\)` \(line 19\) hands it a batch from something dp2ddp cannot shard", err), err
    assert (d / "train.py").read_bytes() == before


def test_a_project_loss_a_factory_method_returns_averaging_over_valid_pixels_is_refused(tmp_path: Path, capsys) -> None:
    """DeepLab's shape: ``self.criterion = SegLosses(weight).build_loss(mode)`` returns
    ``self.CrossEntropyLoss`` (or ``self.FocalLoss``), whose ``nn.CrossEntropyLoss(...,
    ignore_index=255)`` averages over the valid pixels of the batch it is given. Under DDP
    each rank's mean covers its share's valid pixels, the means weighted alike: another step,
    and the rewrite cannot edit the loss module. Refused (DDP185); the same loss without
    ignore_index migrates."""
    d = tmp_path / "proj"
    (d / "utils").mkdir(parents=True)
    (d / "utils" / "__init__.py").write_text("")
    loss = (
        "import torch.nn as nn\n\n\nclass SegLosses:\n    def __init__(self, weight=None):\n        self.weight = weight\n\n"
        "    def build_loss(self, mode='ce'):\n        if mode == 'ce':\n            return self.CrossEntropyLoss\n"
        "        return self.PlainLoss\n\n"
        "    def CrossEntropyLoss(self, logit, target):\n"
        "        criterion = nn.CrossEntropyLoss(weight=self.weight, ignore_index=255)\n"
        "        return criterion(logit, target.long())\n\n"
        "    def PlainLoss(self, logit, target):\n        return nn.functional.cross_entropy(logit, target.long())\n")
    (d / "utils" / "loss.py").write_text(loss)
    (d / "utils" / "metrics.py").write_text(  # a count the step only logs: no loss of it
        "def pixel_accuracy(logit, target):\n    valid = target != 255\n"
        "    return ((logit.argmax(1) == target) & valid).sum() / valid.sum()\n")
    (d / "train.py").write_text(
        "import torch\nimport torch.nn as nn\n\nfrom utils.loss import SegLosses\nfrom utils.metrics import pixel_accuracy\n\n\nclass Trainer:\n"
        "    def __init__(self):\n        data = torch.utils.data.TensorDataset(torch.randn(16, 3, 4, 4), torch.randint(0, 3, (16, 4, 4)))\n"
        "        self.loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)\n"
        "        self.model = nn.DataParallel(nn.Conv2d(3, 3, 1))\n"
        "        self.criterion = SegLosses().build_loss(mode='ce')\n"
        "        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)\n\n"
        "    def training(self, epoch):\n        for image, target in self.loader:\n"
        "            out = self.model(image)\n            loss = self.criterion(out, target)\n            self.optimizer.zero_grad()\n"
        "            loss.backward()\n            self.optimizer.step()\n            print(pixel_accuracy(out, target))\n\n\n"
        "def main():\n    trainer = Trainer()\n    for epoch in range(2):\n        trainer.training(epoch)\n\n\n"
        "if __name__ == '__main__':\n    main()\n")
    before = (d / "train.py").read_bytes()
    assert main(["rewrite", str(d / "train.py")]) == 1
    err = capsys.readouterr().err
    assert re.search(r"train\.py:19:\d+: DDP185 `self\.criterion\(out, target\)` runs CrossEntropyLoss, project "
                     r"code that averages the loss over a count of its batch \(utils/loss\.py:14\)", err), err
    assert (d / "train.py").read_bytes() == before and not (d / "train_ddp.py").exists()
    (d / "utils" / "loss.py").write_text(loss.replace(", ignore_index=255", ""))
    assert main(["rewrite", str(d / "train.py")]) == 0, capsys.readouterr().err


def test_a_count_mean_on_any_class_a_factory_may_pick_in_a_helper_is_refused(tmp_path: Path, capsys) -> None:
    """The script's step calls a project helper that builds its loss by name from a factory
    (``crit = create(name)``): the factory's dict names a plain loss first and one with
    ``ignore_index`` (a mean over the valid targets) second. Every class the factory may
    pick is followed, not only the first: refused (DDP185) naming the second; with
    neither averaging over a count, it migrates."""
    d = tmp_path / "proj"
    d.mkdir()
    losses = (
        "import torch.nn as nn\nimport torch.nn.functional as F\n\n\nclass Plain(nn.Module):\n"
        "    def forward(self, out, y):\n        return F.cross_entropy(out, y)\n\n\n"
        "class Masked(nn.Module):\n    def forward(self, out, y):\n        return F.cross_entropy(out, y, ignore_index=-1)\n\n\n"
        "LOSSES = {'plain': Plain, 'masked': Masked}\n\n\ndef create(name):\n    return LOSSES[name]()\n")
    (d / "losses.py").write_text(losses)
    (d / "helpers.py").write_text(
        "from losses import create\n\n\ndef compute(out, y, name):\n    crit = create(name)\n    return crit(out, y)\n")
    (d / "train.py").write_text(
        "import sys\n\nimport torch\nimport torch.nn as nn\n\nfrom helpers import compute\n\n\ndef main():\n"
        "    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,)))\n"
        "    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)\n"
        "    model = nn.DataParallel(nn.Linear(4, 3))\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for epoch in range(2):\n        for x, y in loader:\n            loss = compute(model(x), y, sys.argv[1])\n"
        "            opt.zero_grad()\n            loss.backward()\n            opt.step()\n\n\n"
        "if __name__ == '__main__':\n    main()\n")
    before = (d / "train.py").read_bytes()
    assert main(["rewrite", str(d / "train.py")]) == 1
    err = capsys.readouterr().err
    assert re.search(r"train\.py:\d+:\d+: DDP185 .*losses\.py:12", err), err
    assert (d / "train.py").read_bytes() == before and not (d / "train_ddp.py").exists()
    (d / "losses.py").write_text(losses.replace(", ignore_index=-1", ""))
    assert main(["rewrite", str(d / "train.py")]) == 0, capsys.readouterr().err


def _logger_project(d: Path, script_tail: str = "") -> None:
    """SimSiam's shape: a project Logger keeping a step counter and a plotter's history on
    itself, changing the dict it is handed (tensors to floats) and writing files."""
    (d / "tools").mkdir(parents=True)
    (d / "tools" / "__init__.py").write_text("from .logger import Logger\n")
    (d / "tools" / "logger.py").write_text(
        "import json\nimport os\n\nimport torch\n\n\nclass Logger:\n    def __init__(self, log_dir):\n"
        "        self.log_dir = log_dir\n        self.counter = {}\n        self.history = {}\n\n"
        "    def update_scalers(self, ordered_dict):\n        for key, value in ordered_dict.items():\n"
        "            if isinstance(value, torch.Tensor):\n                ordered_dict[key] = value.item()\n"
        "            self.counter[key] = self.counter.get(key, 0) + 1\n"
        "            self.history.setdefault(key, []).append(ordered_dict[key])\n"
        "        with open(os.path.join(self.log_dir, 'history.json'), 'w') as f:\n            json.dump(self.history, f)\n")
    (d / "train.py").write_text(
        "import os\n\nimport torch\nimport torch.nn as nn\n\nfrom tools import Logger\n\n\ndef main():\n"
        "    os.makedirs('logs', exist_ok=True)\n    logger = Logger('logs')\n"
        "    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))\n"
        "    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)\n"
        "    model = nn.DataParallel(nn.Linear(4, 1))\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for epoch in range(2):\n        for x, y in loader:\n            loss = nn.functional.mse_loss(model(x), y)\n"
        "            opt.zero_grad()\n            loss.backward()\n            opt.step()\n"
        "            data_dict = {'loss': loss.detach()}\n            logger.update_scalers(data_dict)\n"
        + script_tail + "\n\nif __name__ == '__main__':\n    main()\n")


def test_a_logger_object_that_keeps_its_state_to_itself_runs_on_rank_zero(tmp_path: Path, capsys) -> None:
    """``logger.update_scalers(data_dict)`` keeps a counter and a history on the logger,
    turns the dict's tensors into floats and writes a file. Nothing but its own methods
    reads that state, and the dict is made anew before each read: on rank 0 alone it writes
    what the original wrote, the other ranks losing nothing they use (DDP132)."""
    d = tmp_path / "proj"
    _logger_project(d)
    assert main(["rewrite", str(d / "train.py")]) == 0, capsys.readouterr().err
    out = (d / "train_ddp.py").read_text()
    assert "if dist.get_rank() == 0:\n                logger.update_scalers(data_dict)" in out


@pytest.mark.parametrize("tail, why", [
    ("    print(logger.counter)\n", "the_state_is_read_by_the_script"),
    ("    print(data_dict)\n", "the_dict_it_changes_is_read_after_the_call"),
])
def test_a_logger_whose_state_or_changed_argument_the_script_reads_is_refused(tmp_path: Path, capsys, tail: str, why: str) -> None:
    d = tmp_path / "proj"
    _logger_project(d, tail)
    assert main(["rewrite", str(d / "train.py")]) == 1
    assert "DDP110 Logger.update_scalers writes a file (tools/logger.py:19) on every rank" in capsys.readouterr().err


def test_a_transformers_model_is_wrapped_finding_unused_parameters(tmp_path: Path, capsys) -> None:
    """lonePatient's run_xlnet.py: ``XlnetForMultiLable.from_pretrained(...)`` (a class of the
    project deriving from transformers' ``XLNetPreTrainedModel``) handed to a Trainer whose
    helper ``model_device(n_gpu, model)`` wraps it. XLNet leaves ``mask_emb`` unused in a
    classification step: the migration crashed at step 2 with "Expected to have finished
    reduction". Its wraps now find unused parameters, as transformers' Trainer builds DDP;
    a script wrapping its own plain model does not."""
    d = tmp_path / "proj"
    (d / "models").mkdir(parents=True)
    (d / "models" / "__init__.py").write_text("")
    (d / "models" / "xlnet_head.py").write_text(
        "import torch.nn as nn\nfrom transformers.modeling_xlnet import XLNetModel, XLNetPreTrainedModel\n\n\n"
        "class XlnetForLabels(XLNetPreTrainedModel):\n    def __init__(self, config):\n        super().__init__(config)\n"
        "        self.transformer = XLNetModel(config)\n        self.classifier = nn.Linear(config.d_model, 2)\n\n"
        "    def forward(self, ids):\n        return self.classifier(self.transformer(ids)[0][:, -1])\n")
    (d / "tools.py").write_text(
        "import torch\n\n\ndef model_device(n_gpu, model):\n    device = torch.device('cuda' if n_gpu else 'cpu')\n"
        "    if n_gpu > 1:\n        model = torch.nn.DataParallel(model)\n    model = model.to(device)\n    return model, device\n")
    (d / "train.py").write_text(
        "import torch\n\nfrom models.xlnet_head import XlnetForLabels\nfrom tools import model_device\n\n\ndef main():\n"
        "    model = XlnetForLabels.from_pretrained('xlnet-base-cased')\n"
        "    model, device = model_device(torch.cuda.device_count(), model)\n"
        "    data = torch.utils.data.TensorDataset(torch.randint(0, 100, (16, 8)), torch.randint(0, 2, (16,)))\n"
        "    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    for epoch in range(2):\n        for ids, y in loader:\n"
        "            loss = torch.nn.functional.cross_entropy(model(ids), y)\n            opt.zero_grad()\n"
        "            loss.backward()\n            opt.step()\n\n\nif __name__ == '__main__':\n    main()\n")
    assert main(["rewrite", "--with-helpers", "-o", str(tmp_path / "out") + "/", str(d / "train.py")]) in (0, 1)
    err = capsys.readouterr()
    tools = (tmp_path / "out" / "tools.py").read_text()
    assert "find_unused_parameters=True" in tools, err
    assert "the model is a transformers model (`XLNetModel` of transformers.modeling_xlnet)" in " ".join(err.out.split())
    # the same project with a model of its own (no transformers class imported anywhere)
    (d / "models" / "xlnet_head.py").write_text(
        "import torch.nn as nn\n\n\nclass XlnetForLabels(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.emb = nn.Embedding(100, 8)\n        self.classifier = nn.Linear(8, 2)\n\n"
        "    def forward(self, ids):\n        return self.classifier(self.emb(ids).mean(1))\n\n    @classmethod\n"
        "    def from_pretrained(cls, name):\n        return cls()\n")
    assert main(["rewrite", "--with-helpers", "-o", str(tmp_path / "out2") + "/", str(d / "train.py")]) in (0, 1)
    capsys.readouterr()
    assert "find_unused_parameters=True" not in (tmp_path / "out2" / "tools.py").read_text()


def test_a_transformers_model_wrapped_in_the_script_finds_unused_parameters(tmp_path: Path, capsys) -> None:
    """The n_gpu-era fine-tuning script: ``model = model_class.from_pretrained(...)`` with the
    class from transformers, wrapped where ``n_gpu > 1``."""
    script = tmp_path / "run_glue.py"
    script.write_text(
        "import torch\nfrom transformers import XLNetForSequenceClassification\n\n\ndef main():\n"
        "    n_gpu = torch.cuda.device_count()\n    model_class = XLNetForSequenceClassification\n"
        "    model = model_class.from_pretrained('xlnet-base-cased')\n    if n_gpu > 1:\n"
        "        model = torch.nn.DataParallel(model)\n"
        "    data = torch.utils.data.TensorDataset(torch.randint(0, 100, (16, 8)), torch.randint(0, 2, (16,)))\n"
        "    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    for epoch in range(2):\n        for ids, y in loader:\n"
        "            loss = model(ids, labels=y)[0]\n            if n_gpu > 1:\n                loss = loss.mean()\n"
        "            opt.zero_grad()\n            loss.backward()\n            opt.step()\n\n\nif __name__ == '__main__':\n    main()\n")
    assert main(["rewrite", str(script)]) in (0, 1)
    capsys.readouterr()
    assert "find_unused_parameters=True" in (tmp_path / "run_glue_ddp.py").read_text()


@pytest.mark.parametrize("helper_body, migrates", [
    ("    dir_path = 'output/' + args.name\n", True),
    ("    args.out = 'output/' + args.name\n    dir_path = args.out\n", False),  # the helper changes args: every rank reads it
], ids=["helper-only-reads-its-argument", "helper-changes-its-argument-refused"])
def test_a_results_writer_handing_its_argument_to_a_path_helper_runs_on_rank_0(tmp_path: Path, capsys, helper_body: str,
                                                                               migrates: bool) -> None:
    """TabSurvey's shape: ``save_results_to_file(args, results)`` builds its path with a
    function of its module, ``get_output_path(args, ...)``, which only reads ``args``. The
    writer changes nothing the other ranks read, so it runs on rank 0 alone; a path helper
    that stores into ``args`` changes the caller's object, and the file is refused (DDP110)."""
    d = tmp_path / "proj"
    (d / "utils").mkdir(parents=True)
    (d / "utils" / "__init__.py").write_text("")
    (d / "utils" / "io_utils.py").write_text(
        "import os\n\n\ndef get_output_path(args, filename):\n" + helper_body +
        "    if not os.path.isdir(dir_path):\n        os.makedirs(dir_path)\n    return dir_path + '/' + filename\n\n\n"
        "def save_results_to_file(args, results):\n    filename = get_output_path(args, filename='results.txt')\n"
        "    with open(filename, 'a') as fh:\n        for key, value in results.items():\n"
        "            fh.write('%s: %.5f\\n' % (key, value))\n")
    (d / "train.py").write_text(
        "import argparse\n\nimport torch\nimport torch.nn as nn\n\nfrom utils.io_utils import save_results_to_file\n\n\n"
        "def main():\n    parser = argparse.ArgumentParser()\n    parser.add_argument('--name', default='run')\n"
        "    args = parser.parse_args()\n"
        "    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))\n"
        "    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)\n"
        "    model = nn.DataParallel(nn.Linear(4, 1))\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    total = 0.0\n    for epoch in range(2):\n        for x, y in loader:\n"
        "            loss = nn.functional.mse_loss(model(x), y)\n            opt.zero_grad()\n            loss.backward()\n"
        "            opt.step()\n            total += loss.item()\n    save_results_to_file(args, {'loss': total})\n\n\n"
        "if __name__ == '__main__':\n    main()\n")
    before = (d / "train.py").read_bytes()
    code = main(["rewrite", str(d / "train.py")])
    err = capsys.readouterr().err
    if migrates:
        assert code == 0, err
        out = (d / "train_ddp.py").read_text()
        assert re.search(r"if dist\.get_rank\(\) == 0:\n\s+save_results_to_file\(args, \{'loss': total\}\)", out), out
    else:
        assert code == 1
        assert re.search(r"train\.py:\d+:\d+: DDP110 save_results_to_file writes a file \(utils/io_utils\.py:\d+\) on every rank", err), err
        assert (d / "train.py").read_bytes() == before and not (d / "train_ddp.py").exists()


@pytest.mark.parametrize("child", [
    "class TrainOptions(BaseOptions):\n    pass\n",
    "class TrainOptions(BaseOptions):\n    def __init__(self):\n        super().__init__()\n        self.args.lr = 0.1\n",
], ids=["inherited-init", "super-init"])
def test_a_clock_folder_made_by_a_base_class_of_another_module_runs_on_rank_0(tmp_path: Path, capsys, child: str) -> None:
    """pix2pix's options shape: ``TrainOptions`` (options/train_options.py) derives from
    ``BaseOptions`` (options/base_options.py), whose ``__init__`` makes the run's folder named
    by the clock. The subclass inherits that ``__init__`` or calls ``super().__init__()``:
    either way the folder is seen, and the set-up call runs on rank 0 (DDP114), where every
    rank made a folder of its own before."""
    d = tmp_path / "proj"
    (d / "options").mkdir(parents=True)
    (d / "options" / "__init__.py").write_text("")
    (d / "options" / "base_options.py").write_text(
        "import argparse\nimport os\nimport time\n\n\nclass BaseOptions:\n    def __init__(self):\n"
        "        parser = argparse.ArgumentParser()\n        parser.add_argument('--root', default='runs')\n"
        "        self.args = parser.parse_args()\n"
        "        self.args.exp_dir = os.path.join(self.args.root, time.strftime('%Y%m%d-%H%M%S'))\n"
        "        os.makedirs(self.args.exp_dir)\n\n    def parse(self):\n        return self.args\n")
    (d / "options" / "train_options.py").write_text("from options.base_options import BaseOptions\n\n\n" + child)
    (d / "train.py").write_text(
        "import os\n\nimport torch\nimport torch.nn as nn\n\nfrom options.train_options import TrainOptions\n\n\n"
        "def main():\n    opt = TrainOptions().parse()\n"
        "    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))\n"
        "    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)\n"
        "    model = nn.DataParallel(nn.Linear(4, 1))\n    opt_ = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for epoch in range(2):\n        for x, y in loader:\n            loss = nn.functional.mse_loss(model(x), y)\n"
        "            opt_.zero_grad()\n            loss.backward()\n            opt_.step()\n"
        "    torch.save(model.module.state_dict(), os.path.join(opt.exp_dir, 'model.pt'))\n\n\n"
        "if __name__ == '__main__':\n    main()\n")
    assert main(["rewrite", str(d / "train.py")]) == 0, capsys.readouterr().err
    out = (d / "train_ddp.py").read_text()
    assert "opt = run_on_rank_zero(TrainOptions).parse()" in out, out


def test_a_save_method_inherited_from_a_base_class_of_another_module_runs_on_rank_0(tmp_path: Path, capsys) -> None:
    """``saver.save(epoch)`` where ``Saver`` (lib/saver.py) inherits ``save`` from
    ``BaseSaver`` (lib/base.py), which writes a checkpoint and appends to a log: the method is
    found through the base class of the other module, and the call runs on rank 0. Before,
    it was not found: every rank appended the log line and wrote the checkpoint."""
    d = tmp_path / "proj"
    (d / "lib").mkdir(parents=True)
    (d / "lib" / "__init__.py").write_text("")
    (d / "lib" / "base.py").write_text(
        "import os\n\nimport torch\n\n\nclass BaseSaver:\n    def __init__(self, model, folder):\n"
        "        self.model = model\n        self.folder = folder\n\n    def save(self, epoch):\n"
        "        torch.save(self.model.state_dict(), os.path.join(self.folder, 'net_%d.pth' % epoch))\n"
        "        with open(os.path.join(self.folder, 'log.txt'), 'a') as fh:\n            fh.write('saved %d\\n' % epoch)\n")
    (d / "lib" / "saver.py").write_text(
        "from lib.base import BaseSaver\n\n\nclass Saver(BaseSaver):\n    def describe(self):\n        return self.folder\n")
    (d / "train.py").write_text(
        "import os\n\nimport torch\nimport torch.nn as nn\n\nfrom lib.saver import Saver\n\n\ndef main():\n"
        "    os.makedirs('ckpt', exist_ok=True)\n"
        "    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))\n"
        "    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)\n"
        "    model = nn.DataParallel(nn.Linear(4, 1))\n    saver = Saver(model, 'ckpt')\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for epoch in range(2):\n        for x, y in loader:\n            loss = nn.functional.mse_loss(model(x), y)\n"
        "            opt.zero_grad()\n            loss.backward()\n            opt.step()\n        saver.save(epoch)\n\n\n"
        "if __name__ == '__main__':\n    main()\n")
    assert main(["rewrite", str(d / "train.py")]) == 0, capsys.readouterr().err
    out = (d / "train_ddp.py").read_text()
    assert re.search(r"if dist\.get_rank\(\) == 0:\n\s+saver\.save\(epoch\)", out), out


@pytest.mark.parametrize("tail, migrates", [
    ("", True),
    ("    if os.path.isfile(os.path.join(args.checkpoint, 'last.pth')):\n        print('resuming')\n", False),
], ids=["clock-folder-made-by-a-project-mkdir_p", "looked-for-after-refused"])
def test_a_clock_named_folder_a_project_mkdir_p_makes_takes_rank_0s_name(tmp_path: Path, capsys, tail: str, migrates: bool) -> None:
    """A point-cloud trainer's shape: ``args.checkpoint`` is named from ``time_str`` (the
    clock) and made by the project's ``mkdir_p`` (``try: os.makedirs(p)`` / ``except OSError
    as exc: if exc.errno == errno.EEXIST and os.path.isdir(p): pass`` / ``else: raise``: as
    idempotent as ``exist_ok=True``). Every rank would name it by its own clock: the clock
    read takes rank 0's value. Where the script then looks for a file in it, one name could
    let a rank find what another made: refused (DDP110) naming that line."""
    d = tmp_path / "proj"
    (d / "utils").mkdir(parents=True)
    (d / "utils" / "__init__.py").write_text("from .misc import mkdir_p\n")
    (d / "utils" / "misc.py").write_text(
        "import errno\nimport os\n\n\ndef mkdir_p(path):\n    try:\n        os.makedirs(path)\n    except OSError as exc:\n"
        "        if exc.errno == errno.EEXIST and os.path.isdir(path):\n            pass\n        else:\n            raise\n")
    (d / "train.py").write_text(
        "import argparse\nimport datetime\nimport os\n\nimport torch\nimport torch.nn as nn\n\nfrom utils import mkdir_p\n\n\n"
        "def main():\n    args = argparse.ArgumentParser().parse_args()\n"
        "    time_str = str(datetime.datetime.now().strftime('-%Y%m%d%H%M%S'))\n"
        "    args.checkpoint = 'checkpoints/net' + time_str\n    if not os.path.isdir(args.checkpoint):\n"
        "        mkdir_p(args.checkpoint)\n" + tail +
        "    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))\n"
        "    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)\n"
        "    model = nn.DataParallel(nn.Linear(4, 1))\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for epoch in range(2):\n        for x, y in loader:\n            loss = nn.functional.mse_loss(model(x), y)\n"
        "            opt.zero_grad()\n            loss.backward()\n            opt.step()\n"
        "    torch.save(model.state_dict(), os.path.join(args.checkpoint, 'last.pth'))\n\n\n"
        "if __name__ == '__main__':\n    main()\n")
    code = main(["rewrite", str(d / "train.py")])
    err = capsys.readouterr().err
    if migrates:
        assert code == 0, err
        out = (d / "train_ddp.py").read_text()
        assert "time_str = rank_zero_value(str(datetime.datetime.now().strftime('-%Y%m%d%H%M%S')))" in out, out
        assert "        mkdir_p(args.checkpoint)\n" in out and "barrier" not in out.split("def main")[1], out
    else:
        assert code == 1
        assert re.search(r"train\.py:16:9: DDP110 the folder `args\.checkpoint` is named by the clock .* line 17 looks for it", err), err


def test_a_mixed_scripts_batch_divided_by_accumulation_steps_is_still_the_global_batch(tmp_path: Path, capsys) -> None:
    """BERT-NER's shape: ``args.train_batch_size = args.train_batch_size //
    args.gradient_accumulation_steps`` is no division by the world size; the script's own
    DistributedSampler path reads it per process, so under torchrun the global batch doubled
    (verify: 8 samples in the original, 16 over the ranks). Refused (DDP152) where dp2ddp
    cannot divide it, never read as the script's own answer."""
    (tmp_path / "train.py").write_text(
        "import argparse\n\nimport torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, RandomSampler, TensorDataset\n"
        "from torch.utils.data.distributed import DistributedSampler\n\n\ndef main():\n    parser = argparse.ArgumentParser()\n"
        "    parser.add_argument('--local_rank', type=int, default=-1)\n    parser.add_argument('--train_batch_size', type=int, default=8)\n"
        "    parser.add_argument('--gradient_accumulation_steps', type=int, default=1)\n    args = parser.parse_args()\n"
        "    if args.local_rank == -1:\n        n_gpu = torch.cuda.device_count()\n    else:\n"
        "        torch.distributed.init_process_group(backend='gloo')\n        n_gpu = 1\n"
        "    args.train_batch_size = args.train_batch_size // args.gradient_accumulation_steps\n"
        "    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))\n"
        "    sampler = RandomSampler(data) if args.local_rank == -1 else DistributedSampler(data)\n"
        "    loader = DataLoader(data, sampler=sampler, batch_size=args.train_batch_size)\n"
        "    model = nn.Linear(4, 1)\n    if args.local_rank != -1:\n"
        "        model = torch.nn.parallel.DistributedDataParallel(model)\n    elif n_gpu > 1:\n"
        "        model = torch.nn.DataParallel(model)\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for x, y in loader:\n        loss = nn.functional.mse_loss(model(x), y)\n        opt.zero_grad()\n"
        "        loss.backward()\n        opt.step()\n\n\nif __name__ == '__main__':\n    main()\n")
    code = main(["rewrite", str(tmp_path / "train.py")])
    err = capsys.readouterr().err
    assert code == 1 and re.search(r"DDP152 loader reads `batch_size=args\.train_batch_size` per process", err), err


_SEMSEG_WRITER = (
    "import os\n\nimport torch\nimport torch.nn as nn\nfrom torch.utils.tensorboard import SummaryWriter\n\n\n"
    "def log(writer, value, i):\n    writer.add_scalar('loss', value, i)\n\n\n"
    "def main():\n    writer = SummaryWriter('runs/x')\n"
    "    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))\n"
    "    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)\n"
    "    model = nn.DataParallel(nn.Linear(4, 1))\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "    for i, (x, y) in enumerate(loader):\n        loss = nn.functional.mse_loss(model(x), y)\n        opt.zero_grad()\n"
    "        loss.backward()\n        opt.step()\n        log(writer, loss.item(), i)\n"
    "    path = os.path.join(writer.file_writer.get_logdir(), 'best.pkl')\n    torch.save(model.state_dict(), path)\n\n\n"
    "if __name__ == '__main__':\n    main()\n")


def test_a_summary_writer_whose_folder_is_read_from_it_gets_a_stand_in_told_the_folder(tmp_path: Path) -> None:
    """pytorch-semseg's shape: the writer is handed on as a value (so a stand-in stands on the
    other ranks), and the checkpoint path is read from it (``writer.file_writer.get_logdir()``)
    on every rank. Rank 1 crashed at the first validation when the stand-in could not give it,
    and then it was refused; the stand-in is now made with the writer's folder and gives it."""
    (tmp_path / "train.py").write_text(_SEMSEG_WRITER)
    assert main(["rewrite", "-q", str(tmp_path / "train.py")]) == 0
    out = (tmp_path / "train_ddp.py").read_text()
    assert "writer = SummaryWriter('runs/x') if dist.get_rank() == 0 else WritesNothing('runs/x')" in out, out


def test_a_summary_writer_that_names_its_own_folder_read_from_it_is_refused(tmp_path: Path, capsys) -> None:
    """The same with ``SummaryWriter()``, which picks its folder's name itself (clock, host):
    no stand-in can know it. Refused (DDP110) naming the read and what to do."""
    (tmp_path / "train.py").write_text(_SEMSEG_WRITER.replace("SummaryWriter('runs/x')", "SummaryWriter()"))
    code = main(["rewrite", str(tmp_path / "train.py")])
    err = capsys.readouterr().err
    assert code == 1 and re.search(r"train\.py:24:\d+: DDP110 SummaryWriter left on every rank .* reads its state "
                                   r"\(`writer\.file_writer`\), its folder, a name the writer picked itself .* give the writer "
                                   r"its folder \(log_dir=\.\.\.\)", err), err


def test_the_model_handed_to_a_trainer_picked_from_a_dict_is_refused(tmp_path: Path, capsys) -> None:
    """mdistiller's shape: ``trainer_dict[cfg.trainer](name, distiller, train_loader, val_loader,
    cfg)`` with the trainer classes in a project dict; the script itself has no backward pass.
    The migration was written with exit 0: the loader unsharded, every rank logging and
    saving in the trainer. Refused (DDP105): dp2ddp cannot tell what the call runs."""
    d = tmp_path / "proj"
    d.mkdir()
    (d / "engine.py").write_text(
        "import torch\n\n\nclass BaseTrainer:\n    def __init__(self, name, model, train_loader, cfg):\n"
        "        self.model, self.loader = model, train_loader\n"
        "        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)\n\n    def train(self):\n"
        "        for x, y in self.loader:\n            loss = torch.nn.functional.mse_loss(self.model(x), y)\n"
        "            self.opt.zero_grad()\n            loss.backward()\n            self.opt.step()\n"
        "        torch.save(self.model.state_dict(), 'latest')\n\n\ntrainer_dict = {'base': BaseTrainer}\n")
    (d / "train.py").write_text(
        "import sys\n\nimport torch\nimport torch.nn as nn\n\nfrom engine import trainer_dict\n\n\ndef main():\n"
        "    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))\n"
        "    train_loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)\n"
        "    model = nn.DataParallel(nn.Linear(4, 1))\n"
        "    trainer = trainer_dict[sys.argv[1]]('exp', model, train_loader, {})\n    trainer.train()\n\n\n"
        "if __name__ == '__main__':\n    main()\n")
    before = (d / "train.py").read_bytes()
    assert main(["rewrite", str(d / "train.py")]) == 1
    err = capsys.readouterr().err
    assert re.search(r"train\.py:13:15: DDP105 `trainer_dict\[sys\.argv\[1\]\]\(\.\.\.\)` is handed the model, and dp2ddp "
                     r"cannot tell what it runs", err), err
    assert (d / "train.py").read_bytes() == before


TRAINED_AND_EVALUATED = ROOT / "fixtures" / "project" / "trained_and_evaluated_through_a_factory"


def test_a_wrap_two_modules_below_a_class_the_script_makes_is_found(tmp_path: Path, capsys) -> None:
    """adversarial_robustness' shape: the script makes ``Trainer(...)`` (engine.py), whose
    ``__init__`` calls the models package's factory, which wraps in DataParallel. The script
    alone names no DataParallel; ``rewrite train.py`` used to say "nothing to migrate" and
    exit 0. It now names the class and the wrap (DDP151) and writes nothing."""
    d = tmp_path / "proj"
    shutil.copytree(TRAINED_AND_EVALUATED, d)
    assert main(["rewrite", str(d / "train.py")]) == 1
    err = capsys.readouterr().err
    assert ("train.py:16:11: DDP151 Trainer() reaches DataParallel in the project module models/__init__.py:17: migrate "
            "the script and its helpers together with `dp2ddp rewrite train.py --with-helpers`") in err, err
    assert not (d / "train_ddp.py").exists()


def test_a_factory_wrap_whose_caller_trains_is_migrated_not_taken_off(tmp_path: Path, capsys) -> None:
    """With its helpers, the factory's ``return net.to(device)`` hands the wrapper to the
    Trainer, which trains it: the wrap becomes DistributedDataParallel. (It was taken off as
    an evaluation-only wrap, since only ``return net`` counted as handing it back: the
    replicas would have trained apart.) engine.py runs with the entry, so DDP175 names only
    evaluate.py as a script left behind."""
    d = tmp_path / "proj"
    shutil.copytree(TRAINED_AND_EVALUATED, d)
    out = tmp_path / "proj_ddp"
    assert main(["rewrite", "--with-helpers", "-o", str(out), str(d / "train.py")]) == 1  # (the DDP175 warning)
    factory = (out / "models" / "__init__.py").read_text()
    assert "net = DistributedDataParallel(net" in factory and "return net.to(device)" in factory
    err = capsys.readouterr().err
    assert "DDP175 models/__init__.py is also imported by scripts this migration leaves as they were (evaluate.py:7)" in err
    assert "shard_loader(train_loader)" in (out / "train.py").read_text()


def test_an_evaluation_script_through_the_factory_is_refused_not_sharded(tmp_path: Path, capsys) -> None:
    """adversarial_robustness' eval-aa.py shape: the evaluation script gets the wrapped model
    from the factory and unpacks a shuffling ``train_loader`` from the data helper, to
    evaluate on it whole. It used to be migrated with ``train_loader`` sharded (each rank
    evaluating half of the set). Nothing trains: refused (DDP115), nothing written, and no
    DDP175 for a plan that writes nothing."""
    d = tmp_path / "proj"
    shutil.copytree(TRAINED_AND_EVALUATED, d)
    out = tmp_path / "proj_ddp"
    assert main(["rewrite", "--with-helpers", "-o", str(out), str(d / "evaluate.py")]) == 1
    err = capsys.readouterr().err
    assert ("evaluate.py:19:9: DDP115 its model is wrapped in DataParallel by create_model() (models/__init__.py:17), and "
            "nothing this script or its project modules run trains it") in err, err
    assert "DDP175" not in err and not out.exists()


@pytest.mark.torchrun
def test_a_factory_wrap_whose_caller_trains_verify(tmp_path: Path) -> None:
    """The migration of that project trains like the original: verify passes with its
    loader's shards disjoint and its losses within the envelope."""
    from tests.verify_helpers import verify

    d = tmp_path / "proj"
    shutil.copytree(TRAINED_AND_EVALUATED, d)
    out = tmp_path / "proj_ddp"
    assert main(["rewrite", "-q", "--with-helpers", "-o", str(out), str(d / "train.py")]) == 1  # (the DDP175 warning)
    code, rep, text, _ = verify(tmp_path, str(d / "train.py"), "--migrated", str(out / "train.py"), "--steps", "0")
    assert code == 0, text
    assert "served, disjoint, the original's epoch exactly" in text, text


TRAINER_BY_OPTION = ROOT / "fixtures" / "project" / "trainer_chosen_by_an_option"


def test_a_loader_handed_to_the_method_of_either_of_two_trainers_is_sharded(tmp_path: Path, capsys) -> None:
    """adversarial_robustness' train-wa.py shape: ``trainer = AveragingTrainer(...)`` or
    ``Trainer(...)`` by an option, then ``trainer.train(train_loader)``; each class has its own
    epoch loop over the parameter. Both methods are followed: the script trains (no DDP115)
    and the entry shards the loader it hands them. It used to be refused, first as "cannot
    trace to a DataLoader" (DDP105), then as a script where nothing trains."""
    d = tmp_path / "proj"
    shutil.copytree(TRAINER_BY_OPTION, d)
    out = tmp_path / "proj_ddp"
    assert main(["rewrite", "--with-helpers", "-o", str(out), str(d / "train.py")]) == 0
    err = capsys.readouterr().err
    assert "DDP105" not in err and "DDP115" not in err, err
    entry = (out / "train.py").read_text()
    assert "train_loader, test_loader = get_loaders(8)\ntrain_loader = shard_loader(train_loader)\n" in entry
    assert "shard_loader(test_loader)" not in entry


@pytest.mark.torchrun
def test_a_loader_handed_to_the_method_of_either_of_two_trainers_verify(tmp_path: Path) -> None:
    """On the subclass's path (``--average``) the migration trains like the original."""
    from tests.verify_helpers import verify

    d = tmp_path / "proj"
    shutil.copytree(TRAINER_BY_OPTION, d)
    out = tmp_path / "proj_ddp"
    assert main(["rewrite", "-q", "--with-helpers", "-o", str(out), str(d / "train.py")]) == 0
    code, rep, text, _ = verify(tmp_path, str(d / "train.py"), "--migrated", str(out / "train.py"), "--steps", "0",
                                "--", "--average")
    assert code == 0, text
    assert "epoch 1: 20+20 served, disjoint, the original's epoch exactly; a new order each epoch" in text, text


_TABLE_TRAINER = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def trainer_small(args, model, out):
    model = nn.DataParallel(model)
    loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4, shuffle=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for x, y in loader:
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    torch.save(model.state_dict(), out)
"""

_TABLE_ENTRY = """\
import argparse

import torch.nn as nn

from trainer import trainer_small

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", default="small")
    args = parser.parse_args()
    net = nn.Linear(4, 1)
    trainer = {"small": trainer_small}
    trainer[args.dataset](args, net, "net.pt")
"""


def test_a_trainer_picked_from_a_table_is_not_taken_for_an_inference_script(tmp_path: Path, capsys) -> None:
    """TransUNet's shape: the script hands its model to a trainer it picks from a dict
    (``trainer[name](args, net, path)``); the wrap and the training are both in that
    function. dp2ddp cannot follow the dispatch, so finding no training step in what it
    follows is no proof that nothing trains: not DDP115 (and no crash on the trainer handed
    on as a value, which the refusal's message used to read as a call)."""
    (tmp_path / "trainer.py").write_text(_TABLE_TRAINER)
    (tmp_path / "train.py").write_text(_TABLE_ENTRY)
    out = tmp_path / "out"
    code = main(["rewrite", "--with-helpers", "-o", str(out), str(tmp_path / "train.py")])
    err = capsys.readouterr().err
    assert "DDP115" not in err and "Traceback" not in err, err
    assert code == 0, err
    assert "DistributedDataParallel(" in (out / "trainer.py").read_text()


LOGGER_CLASS = ROOT / "fixtures" / "project" / "logger_from_a_helper_class"


def test_a_logger_a_helper_class_hands_out_logs_on_rank_zero_only(tmp_path: Path) -> None:
    """CIFAR-ZOO's ``Logger(...).get_log()``: the class adds a FileHandler to a named logger
    and a method returns it. The logger is disabled on the other ranks, as one a helper
    function returns is (DDP135). It used to be left alone: every rank appended every line.
    The class only sets up logging, so rank 0 alone makes it; the other ranks get a disabled
    logger and open no file (a folder only rank 0 made, a name from each rank's clock)."""
    d = tmp_path / "proj"
    shutil.copytree(LOGGER_CLASS, d)
    assert main(["rewrite", "-q", str(d / "train.py")]) == 0
    out = (d / "train_ddp.py").read_text()
    assert ('logger = Logger(log_file_name=os.path.join(args.work_dir, "log.txt"), logger_name="zoo").get_log() '
            'if dist.get_rank() == 0 else logging.getLogger("dp2ddp.other_ranks")\n'
            'if dist.get_rank() != 0:\n    logger.disabled = True\n') in out, out
    assert "\nimport logging\n" in out


def test_a_helper_logger_whose_handler_empties_its_file_migrates_when_rank_zero_alone_makes_it(tmp_path: Path) -> None:
    """The same class with ``FileHandler(path, mode="w")``: made on every rank, each later rank
    would empty what rank 0 has written already; made on rank 0 alone, nothing empties it."""
    d = tmp_path / "proj"
    shutil.copytree(LOGGER_CLASS, d)
    logs = d / "logs.py"
    logs.write_text(logs.read_text().replace("FileHandler(log_file_name)", 'FileHandler(log_file_name, mode="w")'))
    assert main(["rewrite", "-q", str(d / "train.py")]) == 0
    assert 'else logging.getLogger("dp2ddp.other_ranks")' in (d / "train_ddp.py").read_text()


def test_a_helper_logger_that_also_writes_and_empties_its_file_is_refused(tmp_path: Path, capsys) -> None:
    """A class that also writes its options beside the log (more than logging: every rank must
    make it) with ``FileHandler(path, mode="w")``: each later rank would empty what rank 0 has
    written already. Refused (DDP110), nothing written."""
    d = tmp_path / "proj"
    shutil.copytree(LOGGER_CLASS, d)
    logs = d / "logs.py"
    logs.write_text(logs.read_text().replace("FileHandler(log_file_name)", 'FileHandler(log_file_name, mode="w")').replace(
        "        self.__logger.addHandler(handler)\n",
        "        self.__logger.addHandler(handler)\n        with open(log_file_name + '.opts', 'w') as f:\n            f.write(logger_name)\n"))
    assert main(["rewrite", str(d / "train.py")]) == 1
    err = capsys.readouterr().err
    assert "train.py:14:1: DDP110 `logger` logs to a file its handler opens with mode 'w' when it is made (logs.py:9)" in err, err
    assert not (d / "train_ddp.py").exists()


@pytest.mark.torchrun
def test_a_logger_a_helper_class_hands_out_verify(tmp_path: Path) -> None:
    """verify passes it: rank 0 alone makes the logger and writes the log, which holds the
    original's lines (rank 1 used to open it to append as well, which verify noted)."""
    from tests.verify_helpers import verify

    d = tmp_path / "proj"
    shutil.copytree(LOGGER_CLASS, d)
    assert main(["rewrite", "-q", str(d / "train.py")]) == 0
    code, rep, text, _ = verify(tmp_path, str(d / "train.py"), "--migrated", str(d / "train_ddp.py"), "--steps", "0")
    assert code == 0, text
    assert "exp/log.txt (lines; numbers differ on 8 of 8 lines)" in text and "opened to append by every rank" not in text, text


SNAPSHOT_BEFORE_WRAP = ROOT / "fixtures" / "project" / "snapshot_loaded_before_a_gpu_count_wrap"


def test_a_snapshot_loaded_before_the_wrap_keeps_plain_keys(tmp_path: Path, capsys) -> None:
    """outlier-exposure: the script and its tuning stage load snapshots into the bare network,
    before `if args.ngpu > 1:` wraps it. Those loaders want plain keys: the migration saves
    through `.module` (it used to read tune.py's load as one into a wrapper, kept `module.`,
    and could not resume from its own snapshots)."""
    d = tmp_path / "proj"
    shutil.copytree(SNAPSHOT_BEFORE_WRAP, d)
    assert main(["rewrite", str(d / "train.py")]) == 0
    err = capsys.readouterr().err + capsys.readouterr().out
    out = (d / "train_ddp.py").read_text()
    assert 'torch.save(net.module.state_dict(), os.path.join(args.save, "baseline_epoch_" + str(epoch) + ".pt"))' in out, out


@pytest.mark.torchrun
def test_a_snapshot_loaded_before_the_wrap_resumes_under_torchrun(tmp_path: Path) -> None:
    """The migration resumes from its own snapshot under torchrun, and the tuning stage loads it."""
    d = tmp_path / "proj"
    shutil.copytree(SNAPSHOT_BEFORE_WRAP, d)
    assert main(["rewrite", "-q", str(d / "train.py")]) == 0
    first = run_script([str(d / "train_ddp.py"), "--epochs", "1"], d, nproc=2)
    assert first.returncode == 0, first.stdout + first.stderr
    again = run_script([str(d / "train_ddp.py"), "--epochs", "2", "--load", "snapshots"], d, nproc=2)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "epoch 1 loss" in again.stdout and "epoch 0 loss" not in again.stdout
    tune = run_script([str(d / "tune.py")], d)
    assert tune.returncode == 0 and "loaded snapshots/baseline_epoch_1.pt" in tune.stdout, tune.stdout + tune.stderr


_LOOSE_CKPT = """\
import torch


def load_checkpoint(path, model, optimizer):
    state = torch.load(path)
    model.load_state_dict(state["state_dict"], strict=False)
    optimizer.load_state_dict(state["optimizer"])
    return state["epoch"]
"""


def test_a_wrapper_handed_to_a_loose_loader_is_refused(tmp_path: Path, capsys) -> None:
    """CIFAR-ZOO's resume: `load_checkpoint(path, net, optimizer)` of the project loads with
    strict=False. Handed the DDP wrapper (there on every run, where the original's wrap ran
    only with CUDA), a checkpoint with plain keys would load nothing, silently: refused
    (DDP187), the script left as it was."""
    (tmp_path / "ckpt.py").write_text(_LOOSE_CKPT)
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nimport torch.nn as nn\nfrom ckpt import load_checkpoint\n\n"
        "net = nn.Linear(4, 2)\nif torch.cuda.is_available():\n    net = nn.DataParallel(net).cuda()\n"
        "opt = torch.optim.SGD(net.parameters(), lr=0.1)\nstart = load_checkpoint(\"ckpt.pth\", net, opt)\n"
        "loader = torch.utils.data.DataLoader(torch.randn(16, 4), batch_size=4, shuffle=True)\n"
        "for x in loader:\n    opt.zero_grad()\n    net(x).sum().backward()\n    opt.step()\n"
        "torch.save({\"state_dict\": net.state_dict(), \"optimizer\": opt.state_dict(), \"epoch\": 1}, \"ckpt.pth\")\n")
    before = script.read_bytes()
    assert main(["rewrite", str(script)]) == 1
    err = capsys.readouterr().err
    assert ("train.py:9:9: DDP187 load_checkpoint loads a state dict into the model it is handed with strict=False "
            "(ckpt.py:6)") in err, err
    assert script.read_bytes() == before and not (tmp_path / "train_ddp.py").exists()


def test_a_number_made_from_a_sharded_loader_may_be_pickled(tmp_path: Path) -> None:
    """`torch.save({"iters": epochs * len(loader)}, path)`: what the save writes is a number,
    not the loader (shard_loader keeps the original's steps per epoch): migrated. The loader
    itself pickled stays refused (fixture shard_loaders/noop_training_loader_pickled_...)."""
    from dp2ddp.migrate import migrate_bytes

    src = (ROOT / "fixtures" / "shard_loaders" / "noop_training_loader_pickled_for_another_script.in.py").read_text()
    changed = src.replace('torch.save(trainloader, os.path.join(args.save_dir, "trainloader.dat"))',
                          'torch.save({"iters": 2 * len(trainloader)}, os.path.join(args.save_dir, "meta.pt"))')
    assert changed != src
    result = migrate_bytes(changed.encode(), str(tmp_path / "train.py"))
    assert not result.migration.blocked, [f.message for f in result.migration.findings]
    assert result.changed


_RUNNERS = """\
import torch
import torch.nn.functional as F


class Trainer:
    def __init__(self, net):
        self.net = net
        self.opt = torch.optim.SGD(net.parameters(), lr=0.1)

    def run(self, loader):
        for x, y in loader:
            self.opt.zero_grad()
            F.cross_entropy(self.net(x), y).backward()
            self.opt.step()


class Tester:
    def __init__(self, net):
        self.net = net

    def run(self, loader):
        right = 0
        with torch.no_grad():
            for x, y in loader:
                right += (self.net(x).argmax(1) == y).sum().item()
        print("acc", right / len(loader.dataset))
"""


_EITHER_SCRIPT = (
        "import argparse\nimport torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\n"
        "from runners import Trainer, Tester\n\nparser = argparse.ArgumentParser()\n"
        "parser.add_argument(\"--test\", action=\"store_true\")\nargs = parser.parse_args()\n"
        "net = nn.DataParallel(nn.Linear(4, 2))\n"
        "loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,))), batch_size=8, shuffle=True)\n"
        "runner = Tester(net) if args.test else Trainer(net)\nrunner.run(loader)\n")


def test_a_loader_handed_to_a_trainer_or_a_tester_by_an_option_is_refused(tmp_path: Path, capsys) -> None:
    """`runner = Tester(net) if args.test else Trainer(net)`, then `runner.run(loader)`: the
    loader trains in one class's method and is evaluated in the other's. Sharded for
    training, `--test` would evaluate each rank's share only: refused (DDP105) at the call."""
    (tmp_path / "runners.py").write_text(_RUNNERS)
    script = tmp_path / "main.py"
    script.write_text(_EITHER_SCRIPT)
    before = script.read_bytes()
    assert main(["rewrite", str(script)]) == 1
    err = capsys.readouterr().err
    assert ("main.py:13:1: DDP105 `loader` is handed to `runner.run(...)`, which is Trainer.run (it trains on it) or "
            "Tester.run (it does not) depending on the path") in err, err
    assert script.read_bytes() == before


def test_every_call_to_either_of_two_classes_is_judged(tmp_path: Path, capsys) -> None:
    """adversarial_robustness' train-wa.py calls `trainer.train(...)` and `trainer.eval(...)`,
    `trainer` one of two classes: each such call is judged (the second one used to crash the
    migration with a TypeError)."""
    (tmp_path / "runners.py").write_text(_RUNNERS)
    script = tmp_path / "main.py"
    script.write_text(_EITHER_SCRIPT + "runner.run(loader)\n")
    assert main(["rewrite", str(script)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("DDP105 `loader` is handed to `runner.run(...)`") == 2, err



def test_the_evaluation_script_alone_says_why_its_project_is_refused(tmp_path: Path, capsys) -> None:
    """`rewrite evaluate.py` without `--with-helpers` says DDP115 at once, as its project plan
    would, instead of DDP151's "migrate with --with-helpers" (which then refused)."""
    d = tmp_path / "proj"
    shutil.copytree(TRAINED_AND_EVALUATED, d)
    assert main(["rewrite", str(d / "evaluate.py")]) == 1
    err = capsys.readouterr().err
    assert "evaluate.py:19:9: DDP115 its model is wrapped in DataParallel by create_model() (models/__init__.py:17)" in err, err
    assert "DDP151" not in err


GATHER_MODULE = """import torch
import torch.distributed as dist


class GatherEmbeddings(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(out, x)
        return tuple(out)

    @staticmethod
    def backward(ctx, *grads):
        return grads[dist.get_rank()].clone()
"""
GATHER_SUMMED = GATHER_MODULE.replace(
    "        return grads[dist.get_rank()].clone()",
    "        every = torch.stack(grads)\\n        dist.all_reduce(every)\\n        return every[dist.get_rank()]")
GATHER_LOSS = """import torch
import torch.nn.functional as F
from gathering import GatherEmbeddings


def pair_loss(a, b, world_size):
    if world_size > 1:
        a = torch.cat(GatherEmbeddings.apply(a))
        b = torch.cat(GatherEmbeddings.apply(b))
    logits = F.normalize(a, dim=1) @ F.normalize(b, dim=1).T / 0.5
    return F.cross_entropy(logits, torch.arange(len(a)))
"""
GATHER_SCRIPT = """import argparse
import torch
import torch.distributed as dist
import torch.nn as nn
from losses import pair_loss

p = argparse.ArgumentParser()
p.add_argument("--nodes", type=int, default=1)
p.add_argument("--node_rank", type=int, default=0)


def main(args):
    if args.nodes > 1:
        dist.init_process_group("gloo", rank=args.node_rank, world_size=args.world_size)
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    if args.nodes > 1:
        model = nn.parallel.DistributedDataParallel(model)
    else:
        model = nn.DataParallel(model)
    for step in range(3):
        x = torch.randn(16, 10)
        loss = pair_loss(model(x + 0.1 * torch.randn_like(x)), model(x), args.world_size)
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    args = p.parse_args()
    args.world_size = args.nodes
    main(args)
"""


def test_a_script_whose_own_gather_does_not_sum_its_gradients_is_refused(tmp_path: Path, capsys) -> None:
    """Spijkervet/SimCLR's shape: a mixed script whose own distributed path gathers the
    embeddings with an autograd Function (in a module two imports away) whose backward keeps
    this rank's slice of its own gradient. The migration switches that path on under
    torchrun, and every gradient through the gather would be 1/world of the original's
    (verify saw the losses part from step 2 under SGD): refused, naming the backward. The
    same project with a backward that sums over the ranks first migrates."""
    (tmp_path / "gathering.py").write_text(GATHER_MODULE)
    (tmp_path / "losses.py").write_text(GATHER_LOSS)
    (tmp_path / "train.py").write_text(GATHER_SCRIPT)
    before = (tmp_path / "train.py").read_bytes()
    assert main(["rewrite", str(tmp_path / "train.py")]) == 1
    err = capsys.readouterr().err
    assert "train.py:5:1: DDP188" in err and "gathering.py:14" in err
    assert (tmp_path / "train.py").read_bytes() == before and not (tmp_path / "train_ddp.py").exists()
    (tmp_path / "gathering.py").write_text(GATHER_SUMMED)
    assert main(["rewrite", str(tmp_path / "train.py")]) in (0, 1)
    assert "DDP188" not in capsys.readouterr().err
    assert (tmp_path / "train_ddp.py").exists()


def test_a_migrated_module_four_imports_away_is_an_overlay_of_the_migrated_runs(tmp_path: Path) -> None:
    """pytorch-template's shape: the base class that saves (base/base_trainer.py) is four imports
    from the entry (train.py -> trainer -> trainer.trainer -> base -> base.base_trainer), past
    the depth the project's imports are followed to. verify ran the project's own base there,
    saw its checkpoint written by every rank and failed a correct migration; every module of the
    copy that differs from the project's is an overlay."""
    from dp2ddp.verify import scratch

    out = tmp_path / "proj_ddp"
    assert main(["rewrite", "--with-helpers", "-q", "-o", str(out), str(TRAINER_SAVES_IN_BASE / "train.py")]) == 1  # DDP171
    found = scratch.migrated_modules(TRAINER_SAVES_IN_BASE / "train.py", out / "train.py")
    base = (TRAINER_SAVES_IN_BASE / "base" / "base_trainer.py").resolve()
    assert list(found) == [base] and found[base] == (out / "base" / "base_trainer.py").read_bytes()


def test_a_trainer_module_wrapping_in_the_sync_bn_packages_dataparallel_is_reached(tmp_path: Path, capsys) -> None:
    """SPADE's shape: the script makes a ``Trainer`` of another module, which wraps its model
    in the vendored sync-BN package's ``DataParallelWithCallback`` under ``if len(gpu_ids) > 0:``.
    ``rewrite train.py`` said "no DataParallel found, nothing to migrate" with exit 0 (the
    trainer module was read as one that only tests for DataParallel). It is DDP151 now, and
    ``--with-helpers`` migrates the trainer (DDP over SyncBatchNorm with CUDA)."""
    d = tmp_path / "proj"
    d.mkdir()
    shutil.copy(ROOT / "fixtures" / "sync_bn" / "sync_batchnorm.py", d / "sync_batchnorm.py")
    (d / "trainer.py").write_text(
        "import torch\nimport torch.nn as nn\nfrom sync_batchnorm import DataParallelWithCallback\n\n\n"
        "class Trainer:\n    def __init__(self, gpu_ids):\n"
        "        self.model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))\n"
        "        if len(gpu_ids) > 0:\n            self.model = DataParallelWithCallback(self.model, device_ids=gpu_ids)\n"
        "        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)\n\n"
        "    def run_one_step(self, x, y):\n        self.optimizer.zero_grad()\n"
        "        loss = nn.functional.cross_entropy(self.model(x), y)\n        loss.backward()\n"
        "        self.optimizer.step()\n        return loss.item()\n")
    (d / "train.py").write_text(
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom trainer import Trainer\n\n"
        "torch.manual_seed(0)\nloader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,))), batch_size=16, "
        "shuffle=True)\ntrainer = Trainer(gpu_ids=[0])\nfor epoch in range(2):\n    for x, y in loader:\n"
        "        loss = trainer.run_one_step(x, y)\n    print('epoch', epoch, 'loss', loss)\n")
    assert main(["rewrite", "--diff", str(d / "train.py")]) == 1
    assert re.search(r"train\.py:7:\d+: DDP151 Trainer\(\) reaches DataParallel in the project module trainer\.py:10",
                     capsys.readouterr().err)
    assert main(["rewrite", "-q", "--with-helpers", "-o", str(tmp_path / "out"), str(d / "train.py")]) == 0
    helper = (tmp_path / "out" / "trainer.py").read_text()
    assert "DistributedDataParallel(torch.nn.SyncBatchNorm.convert_sync_batchnorm(self.model)" in helper, helper
    assert "DataParallelWithCallback(" not in helper


def _srfbn_like(d: Path, skip: bool) -> None:
    """SRFBN's layout: ``networks.create_model`` wraps in DataParallel, the solver module (no
    DataParallel of its own; made by ``solvers.create_solver``, a package's function) makes
    the model through it, writes a summary file and steps, under a test of the batch's loss
    where ``skip``."""
    d.mkdir()
    (d / "networks.py").write_text(
        "import torch\nimport torch.nn as nn\n\n\ndef create_model():\n    net = nn.Linear(4, 1)\n"
        "    if torch.cuda.is_available() or True:\n        net = nn.DataParallel(net)\n    return net\n")
    step = ("        if loss_batch < 3.0 * self.last_loss:\n            self.optimizer.step()\n            self.last_loss = loss_batch\n"
            if skip else "        self.optimizer.step()\n")
    (d / "solvers").mkdir()
    (d / "solvers" / "__init__.py").write_text("from .srsolver import Solver\n\n\ndef create_solver(root):\n    return Solver(root)\n")
    (d / "solvers" / "srsolver.py").write_text(
        "import os\n\nimport torch\nimport torch.nn as nn\n\nfrom networks import create_model\n\n\nclass Solver:\n"
        "    def __init__(self, root):\n        self.model = create_model()\n"
        "        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)\n        self.last_loss = 1e8\n"
        "        os.makedirs(root, exist_ok=True)\n"
        "        with open(os.path.join(root, 'network_summary.txt'), 'w') as f:\n            f.write(str(self.model))\n\n"
        "    def train_step(self, x, y):\n        self.optimizer.zero_grad()\n"
        "        loss = nn.functional.mse_loss(self.model(x), y)\n        loss.backward()\n        loss_batch = loss.item()\n"
        + step + "        return loss_batch\n\n"
        "    def save(self, path):\n        net = self.model.module if isinstance(self.model, nn.DataParallel) else self.model\n"
        "        torch.save(net.state_dict(), path)\n")
    (d / "train.py").write_text(
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n\nfrom solvers import create_solver\n\n"
        "torch.manual_seed(0)\nloader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8, shuffle=True)\n"
        "solver = create_solver('exp')\nfor epoch in range(2):\n    for x, y in loader:\n        loss = solver.train_step(x, y)\n"
        "    print('epoch', epoch, loss)\n")


def test_a_solver_migrated_with_the_script_writes_its_own_files_and_its_loss_decided_step_is_refused(tmp_path: Path, capsys) -> None:
    """SRFBN: with ``--with-helpers`` the solver module is migrated too, so its summary file is
    its own migration's (opened on rank 0 only there): the script no longer refuses DDP110
    for it. Its step under a test of the batch's loss is refused (DDP180) in the solver,
    where the module was migrated with no word about it (each rank would test its share)."""
    _srfbn_like(tmp_path / "a", skip=False)
    assert main(["rewrite", "-q", "--with-helpers", "-o", str(tmp_path / "out_a"), str(tmp_path / "a" / "train.py")]) == 0
    assert "else os.devnull" in (tmp_path / "out_a" / "solvers" / "srsolver.py").read_text()
    capsys.readouterr()
    _srfbn_like(tmp_path / "b", skip=True)
    assert main(["rewrite", "--with-helpers", "-o", str(tmp_path / "out_b"), str(tmp_path / "b" / "train.py")]) == 1
    err = capsys.readouterr().err
    assert re.search(r"srsolver\.py:\d+:\d+: DDP180 `self\.optimizer\.step\(\)` runs only if `loss_batch < 3\.0 \* self\.last_loss`",
                     err), err
    assert "DDP110" not in err and not (tmp_path / "out_b").exists()


def test_a_trainer_picked_from_a_projects_table_reaches_its_dataparallel(tmp_path: Path, capsys) -> None:
    """CenterNet's shape: ``Trainer = train_factory[opt.task]`` (a dict of trainer classes in
    a project package), then ``Trainer(opt, model, optimizer)``, whose base class wraps the
    model in DataParallel in a method. ``rewrite main.py`` said "no DataParallel found,
    nothing to migrate" with exit 0; it is DDP151 at the table now."""
    d = tmp_path / "proj"
    (d / "trains").mkdir(parents=True)
    (d / "trains" / "__init__.py").write_text("")
    (d / "trains" / "base.py").write_text(
        "import torch.nn as nn\n\n\nclass BaseTrainer:\n    def __init__(self, model, optimizer):\n"
        "        self.model, self.optimizer = model, optimizer\n\n    def set_device(self, gpus):\n"
        "        if len(gpus) > 1:\n            self.model = nn.DataParallel(self.model, device_ids=gpus)\n\n"
        "    def train(self, loader):\n        for x, y in loader:\n"
        "            loss = nn.functional.cross_entropy(self.model(x), y)\n            self.optimizer.zero_grad()\n"
        "            loss.backward()\n            self.optimizer.step()\n")
    (d / "trains" / "ctdet.py").write_text("from .base import BaseTrainer\n\n\nclass CtdetTrainer(BaseTrainer):\n    pass\n")
    (d / "trains" / "factory.py").write_text("from .ctdet import CtdetTrainer\n\ntrain_factory = {'ctdet': CtdetTrainer}\n")
    (d / "main.py").write_text(
        "import torch\nimport torch.nn as nn\n\nfrom trains.factory import train_factory\n\n\ndef main():\n"
        "    model = nn.Linear(4, 2)\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    Trainer = train_factory['ctdet']\n    trainer = Trainer(model, optimizer)\n    trainer.set_device([0, 1])\n"
        "    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))\n"
        "    trainer.train(torch.utils.data.DataLoader(data, batch_size=4, shuffle=True))\n\n\n"
        "if __name__ == '__main__':\n    main()\n")
    assert main(["rewrite", "--diff", str(d / "main.py")]) == 1
    err = capsys.readouterr().err
    assert re.search(r"main\.py:10:\d+: DDP151 `train_factory\[\.\.\.\]`, a table of the project looked up by key, reaches "
                     r"DataParallel in the project module trains/base\.py:10", err), err
