"""Set-up calls that make the run's folder (DDP114, docs/design-setup-calls.md): run on rank
0, their result and the process state they set sent to every rank. The migrations of
fixtures/rank_writers/setup_call_*.in.py train as their originals (verify) and leave one run
folder where every rank made its own; fixtures/project/archive_on_start (a folder archived two
modules below the script) migrates and runs twice; the generated code stops every rank with
its message when a result cannot be pickled."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dp2ddp.cli import main
from dp2ddp.templates import load
from tests._scripts import retry_exit_abort, run_script, run_torchrun

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "fixtures" / "rank_writers"


def _place(tmp_path: Path, case: str) -> Path:
    """The original as train.py and its migration as train_ddp.py, with the folder's project
    modules (runsetup.py, runsaver.py ...) beside."""
    shutil.copyfile(CASES / f"{case}.in.py", tmp_path / "train.py")
    shutil.copyfile(CASES / f"{case}.out.py", tmp_path / "train_ddp.py")
    for mod in CASES.glob("*.py"):
        if not mod.name.endswith((".in.py", ".out.py")):
            shutil.copyfile(mod, tmp_path / mod.name)
    return tmp_path


@pytest.mark.parametrize("case", ["setup_call_clock_folder_seeds", "setup_call_config_class",
                                  "setup_call_configures_the_root_logger"])
def test_the_migrations_pass_check(case: str, capsys) -> None:
    """`dp2ddp check` finds nothing in the migrations (the broadcast is reached by every rank:
    no DDP009)."""
    assert main(["check", str(CASES / f"{case}.out.py")]) == 0, capsys.readouterr().out


@pytest.mark.torchrun
@pytest.mark.parametrize("case,root,files", [
    ("setup_call_clock_folder_seeds", "runs", {"args.json", "model.pt"}),
    ("setup_call_config_class", "saved", {"config.json", "info.log", "model.pt"}),
    ("setup_call_configures_the_root_logger", "log", {"train.log", "model.pt"}),
])
def test_a_setup_call_runs_on_rank_zero_and_every_rank_uses_its_folder(tmp_path: Path, case: str, root: str, files: set) -> None:
    """Under torchrun (2 ranks) one run folder is made, and it holds what rank 0 wrote (the
    checkpoint in the folder every rank was told); the seeds reached rank 1 (the data drawn
    after them are the same: the replicas and the losses agree with the original's)."""
    from tests.verify_helpers import verify

    d = _place(tmp_path, case)
    r = retry_exit_abort(lambda: run_torchrun(d / "train_ddp.py", d), case)
    assert r.returncode == 0, r.stdout[-3000:]
    (folder,) = list((d / root).iterdir())
    assert {p.name for p in folder.iterdir()} == files
    if "train.log" in files:  # the root logger is rank 0's: each epoch logged once
        assert (folder / "train.log").read_text().count("epoch 1 loss") == 1
    code, rep, text, _ = verify(tmp_path, str(d / "train.py"), "--migrated", str(d / "train_ddp.py"), "--steps", "0", cwd=d)
    assert code == 0, text
    assert rep["losses_agree"] and rep["replicas_in_sync"], text


@pytest.mark.torchrun
def test_an_archived_run_folder_two_modules_below_is_archived_once(tmp_path: Path) -> None:
    """``option.parse()`` -> ``util.mkdir_and_rename()`` moves an earlier run's folder away and
    makes a new one: migrated (rank 0 runs it), the second run under torchrun archives the
    first run's folder once and both ranks save into the new one; it also runs as plain
    python and passes verify."""
    from tests.verify_helpers import verify

    d = tmp_path / "proj"
    shutil.copytree(ROOT / "fixtures" / "project" / "archive_on_start", d)
    assert main(["rewrite", str(d / "train.py")]) == 0
    text = (d / "train_ddp.py").read_text()
    assert "opt = run_on_rank_zero(option.parse, parser.parse_args().name)" in text
    for _ in range(2):
        r = retry_exit_abort(lambda: run_torchrun(d / "train_ddp.py", d), "archive_on_start")
        assert r.returncode == 0, r.stdout[-3000:]
    made = sorted(p.name for p in (d / "experiments").iterdir())
    assert len(made) == 2 and made[0] == "run" and made[1].startswith("run_archived_"), made
    assert (d / "experiments" / "run" / "model.pt").exists() and (d / "experiments" / made[1] / "model.pt").exists()
    r = run_script([str(d / "train_ddp.py")], d)  # plain python: a world of one
    assert r.returncode == 0, r.stdout[-3000:]
    code, rep, text, _ = verify(tmp_path, str(d / "train.py"), "--migrated", str(d / "train_ddp.py"), "--steps", "0", cwd=d)
    assert code == 0 and rep["losses_agree"] and rep["replicas_in_sync"], text


@pytest.mark.torchrun
def test_a_result_that_cannot_be_pickled_stops_every_rank_with_the_reason(tmp_path: Path) -> None:
    """The generated code, with a set-up whose result holds a lambda: rank 0 ran it, no rank
    hangs in the broadcast, every rank raises the TypeError that says what to do."""
    helper = load("rank_zero_setup.py.tmpl").format(helper="run_on_rank_zero", dist="dist", torch="torch", os="os",
                                                     sys="sys", random="random")
    script = tmp_path / "s.py"
    script.write_text(
        "import os\nimport random\nimport sys\nimport torch\nimport torch.distributed as dist\n\n" + helper
        + "\n\ndef setup():\n    return {'f': lambda: 1}\n\n\ndist.init_process_group('gloo')\nrun_on_rank_zero(setup)\n"
    )
    r = run_script([str(script)], tmp_path, nproc=2)
    assert r.returncode != 0
    assert r.stdout.count("dp2ddp: setup() ran on rank 0 only (it makes the run's folder) and its result must reach the "
                          "other ranks, but it cannot be pickled") >= 1, r.stdout[-3000:]
    assert "Timeout" not in r.stdout


@pytest.mark.torchrun
def test_a_folder_named_by_the_clock_in_args_is_made_once(tmp_path: Path) -> None:
    """`args.save = "eval-{}-{}".format(args.save, time.strftime(...))`, then a project helper
    that makes it without exist_ok: under torchrun (2 ranks) one experiment folder, whose log
    has each epoch once and whose scripts were copied once."""
    d = _place(tmp_path, "setup_call_folder_named_by_the_clock_in_args")
    r = retry_exit_abort(lambda: run_torchrun(d / "train_ddp.py", d), "clock_in_args")
    assert r.returncode == 0, r.stdout[-3000:]
    (folder,) = list(d.glob("eval-EXP-*"))
    assert {p.name for p in folder.iterdir()} == {"log.txt", "scripts", "weights.pt"}
    assert (folder / "log.txt").read_text().count("epoch 1 loss") == 1
