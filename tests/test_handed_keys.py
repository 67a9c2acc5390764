"""The state_dict keys of a DataParallel wrapper the script hands to another project module
(dp2ddp.model.handed_wrappers, codemods/handed_keys.py): a Trainer that keeps it as
``self.model`` and saves or resumes through it, checkpoint helpers handed it. Where the
original's wrap ran only with several GPUs (plain keys on one GPU and on the CPU), the
migration keeps them plain in that module's migration, or refuses where it cannot edit it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dp2ddp.cli import main
from tests._scripts import retry_exit_abort, run_script

ROOT = Path(__file__).resolve().parent.parent
HELPERS = ROOT / "fixtures" / "project" / "checkpoint_helpers_handed_the_wrapper"
BASE_SAVES = ROOT / "fixtures" / "project" / "trainer_saves_in_base"
BARE = "(model.module if isinstance(model, DistributedDataParallel) else model)"


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PYTHONPATH")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _copy(src: Path, tmp_path: Path, name: str = "proj") -> Path:
    d = tmp_path / name
    shutil.copytree(src, d)
    return d


def _uses(script: Path):
    from dp2ddp.model.handed_wrappers import handed_key_policies
    from dp2ddp.model.project_defs import file_model

    return [(u.where, u.text, u.method, p.default) for u, p in handed_key_policies(file_model(str(script)))]


def test_uses_are_followed_through_super_init_into_the_base_class_module(tmp_path: Path) -> None:
    """pytorch-template's shape: ``Trainer(model, ...)`` passes the wrapper on through
    ``super().__init__(model, ...)`` to a base in another module that keeps it as
    ``self.model`` and saves its state_dict; the wrap is guarded by a device count: plain."""
    d = _copy(BASE_SAVES, tmp_path)
    assert _uses(d / "train.py") == [("base/base_trainer.py:32", "self.model", "state_dict", "plain")]


def test_a_wrapper_handed_to_functions_is_followed_into_their_parameters(tmp_path: Path) -> None:
    d = _copy(HELPERS, tmp_path)
    assert sorted(_uses(d / "train.py")) == [("ckpt.py:14", "model", "load_state_dict", "plain"),
                                            ("ckpt.py:8", "model", "state_dict", "plain")]


@pytest.mark.parametrize("why, edit", [
    ("helper_unwraps_itself", ("def save_checkpoint(model, optimizer, epoch, folder):\n",
                               "def save_checkpoint(model, optimizer, epoch, folder):\n    model = getattr(model, 'module', model)\n")),
    ("helper_strips_the_prefix", ('    model.load_state_dict(state["model"])\n',
                                  '    model.load_state_dict({k.replace("module.", ""): v for k, v in state["model"].items()})\n')),
])
def test_noop_a_helper_that_deals_with_wrappers_itself_is_not_followed(tmp_path: Path, why: str, edit) -> None:
    d = _copy(HELPERS, tmp_path)
    ckpt = d / "ckpt.py"
    text = ckpt.read_text()
    assert edit[0] in text
    ckpt.write_text(text.replace(edit[0], edit[1]))
    method = "load_state_dict" if why == "helper_unwraps_itself" else "state_dict"
    assert [u[2] for u in _uses(d / "train.py")] == [method], why


def test_noop_an_unconditional_wrap_keeps_its_module_keys_and_the_helper_is_not_edited(tmp_path: Path, capsys) -> None:
    """The original wrapped on every run (``module.`` keys everywhere): so does DDP, and the
    helpers are not part of the plan."""
    d = _copy(HELPERS, tmp_path)
    script = d / "train.py"
    script.write_text(script.read_text().replace("if torch.cuda.device_count() > 1:\n    net = nn.DataParallel(net)\n",
                                                 "net = nn.DataParallel(net)\n"))
    assert [u[3] for u in _uses(script)] == ["module.", "module."]
    out = tmp_path / "out"
    assert main(["rewrite", "--with-helpers", "-o", str(out), str(script)]) == 0
    assert (out / "ckpt.py").read_bytes() == (d / "ckpt.py").read_bytes()
    assert "DDP189" not in capsys.readouterr().err


def test_alone_the_script_is_refused_at_the_call_that_hands_the_wrapper(tmp_path: Path, capsys) -> None:
    """Without --with-helpers ckpt.py is not edited: its load would take plain keys into the
    DDP wrapper (a crash on resume) and its save would add `module.`: refused (DDP189), with
    the line, nothing written. Before, this migrated with exit 0."""
    d = _copy(HELPERS, tmp_path)
    before = {p: p.read_bytes() for p in d.rglob("*.py")}
    assert main(["rewrite", str(d / "train.py")]) == 1
    err = capsys.readouterr().err
    assert "train.py:29:13: DDP189 model.load_state_dict(...) of the wrapper handed to load_checkpoint(...) (ckpt.py:14)" in err, err
    assert err.count("DDP189") == 1, err  # once per module
    assert {p: p.read_bytes() for p in d.rglob("*.py")} == before
    assert not (d / "train_ddp.py").exists()


def test_with_helpers_the_checkpoint_module_keeps_plain_keys_and_loads_either(tmp_path: Path, capsys) -> None:
    d = _copy(HELPERS, tmp_path)
    out = tmp_path / "out"
    assert main(["rewrite", "--with-helpers", "-o", str(out), str(d / "train.py")]) == 0
    err = capsys.readouterr()
    ckpt = (out / "ckpt.py").read_text()
    assert f'"model": {BARE}.state_dict()' in ckpt, ckpt
    assert f'load_either_keys({BARE[1:-1]})(state["model"])' in ckpt, ckpt
    assert "from torch.nn.parallel import DistributedDataParallel\n" in ckpt
    assert "ckpt.py:14" in err.out + err.err
    # the migration's own check passes, and migrating the migration changes nothing
    again = tmp_path / "again"
    assert main(["rewrite", "--with-helpers", "-o", str(again), str(out / "train.py")]) == 0
    for rel in ("train.py", "ckpt.py"):
        assert (again / rel).read_bytes() == (out / rel).read_bytes(), rel


def test_with_helpers_a_base_trainer_saves_the_bare_models_keys(tmp_path: Path) -> None:
    d = _copy(BASE_SAVES, tmp_path)
    out = tmp_path / "out"
    assert main(["rewrite", "--with-helpers", "-q", "-o", str(out), str(d / "train.py")]) == 1  # DDP171: a CPU-only fixture
    base = (out / "base" / "base_trainer.py").read_text()
    assert '"state_dict": (self.model.module if isinstance(self.model, DistributedDataParallel) else self.model).state_dict()' in base


@pytest.mark.torchrun
def test_the_migration_resumes_the_originals_checkpoint_and_the_projects_evaluation_reads_its_own(tmp_path: Path) -> None:
    """Run for real: the original (plain python, the CPU: plain keys) trains one epoch; the
    migration under torchrun (2 ranks) resumes from the original's file and writes its own,
    whose keys are plain, which evaluate.py (a bare model, strict) loads; the original
    resumes from the migration's file too."""
    d = _copy(HELPERS, tmp_path)
    out = tmp_path / "out"
    assert main(["rewrite", "--with-helpers", "-q", "-o", str(out), str(d / "train.py")]) == 0
    r = run_script(["train.py", "--epochs", "1"], d, env=_env())
    assert r.returncode == 0, r.stdout[-3000:]
    original = d / "checkpoints" / "last.pth"
    r = retry_exit_abort(lambda: run_script(["train.py", "--epochs", "2", "--resume", str(original)], out, env=_env(), nproc=2),
                         "handed keys")
    assert r.returncode == 0, r.stdout[-3000:]
    assert r.stdout.count("epoch 1 loss") == 1 and "epoch 0 loss" not in r.stdout, r.stdout[-2000:]
    migrated = out / "checkpoints" / "last.pth"
    ev = subprocess.run([sys.executable, str(d / "evaluate.py"), str(migrated)], cwd=d, env=_env(), capture_output=True,
                        text=True, timeout=120)
    assert ev.returncode == 0 and "evaluate.py loaded" in ev.stdout, ev.stderr[-2000:]
    r = run_script(["train.py", "--epochs", "3", "--resume", str(migrated)], d, env=_env())
    assert r.returncode == 0 and "epoch 2 loss" in r.stdout, r.stdout[-3000:]



OWN_TRAINER = ROOT / "fixtures" / "wrapper_uses" / "trainer_class_of_the_script_saves_and_resumes_the_bare_keys.in.py"


def test_a_training_class_of_the_scripts_own_is_followed_too() -> None:
    """The same shape with the class in the script: its ``self.model`` uses were left on the
    wrapper (module. keys under DDP where the original wrote plain ones) with no word."""
    from dp2ddp.model.core import build
    from dp2ddp.model.handed_wrappers import handed_key_policies

    m = build(OWN_TRAINER.read_bytes(), str(OWN_TRAINER))
    got = [(u.subject.lineno, u.method, u.own, p.default) for u, p in handed_key_policies(m)]
    assert sorted(got) == [(24, "load_state_dict", True, "plain"), (35, "state_dict", True, "plain")]


@pytest.mark.torchrun
def test_the_scripts_own_trainer_writes_plain_keys_and_resumes_the_originals(tmp_path: Path) -> None:
    """Run for real: the original (the CPU: plain keys), then its migration under torchrun (2
    ranks) resuming from the original's checkpoint; the migration's checkpoint has plain keys
    and the original resumes from it."""
    import torch

    work = tmp_path / "w"
    work.mkdir()
    shutil.copy(OWN_TRAINER, work / "train.py")
    assert main(["rewrite", "-q", str(work / "train.py")]) == 0
    r = run_script(["train.py", "--epochs", "1"], work, env=_env())
    assert r.returncode == 0, r.stdout[-3000:]
    (work / "saved").rename(work / "original")
    r = retry_exit_abort(lambda: run_script(["train_ddp.py", "--epochs", "2", "--resume", "original/checkpoint.pth"], work,
                                            env=_env(), nproc=2), "own trainer")
    assert r.returncode == 0, r.stdout[-3000:]
    state = torch.load(work / "saved" / "checkpoint.pth")
    assert state["epoch"] == 2 and all(not k.startswith("module.") for k in state["state_dict"]), list(state["state_dict"])
    r = run_script(["train.py", "--epochs", "3", "--resume", "saved/checkpoint.pth"], work, env=_env())
    assert r.returncode == 0, r.stdout[-3000:]


@pytest.mark.parametrize("test, counts", [
    ("torch.cuda.device_count() > 1", True),
    ("use_cuda and torch.cuda.device_count() > 1", True),    # skips a one-GPU machine through its operand
    ("args.device.gpu and not args.serialized", False),      # lsq-net: a list of GPU ids, [0] on one GPU
    ("args.parallel or torch.cuda.device_count() > 1", False),
], ids=["count", "and_with_a_count", "and_of_a_gpu_list_and_a_flag", "or_with_a_flag"])
def test_a_boolean_test_counts_devices_only_through_an_operand_that_counts(test: str, counts: bool) -> None:
    """lsq-net wraps ``if args.device.gpu and not args.dataloader.serialized:``: its words name
    a GPU, so the whole ``and`` was taken for a count of the devices (one GPU ran bare, plain
    keys), where one GPU in the list wraps too: the user's switch (``module.`` keys)."""
    import ast

    from dp2ddp.model.core import build
    from dp2ddp.model.cuda_only import count_test

    m = build(f"import torch\nif {test}:\n    pass\n".encode(), "t.py")
    node = next(n for n in m.nodes(ast.If))
    assert count_test(m, node.test) is counts


def test_a_loader_whose_strict_is_a_parameter_defaulting_to_false_is_loose(tmp_path: Path, capsys) -> None:
    """lsq-net's ``load_checkpoint(model, path, device=None, strict=False, lean=False)`` loads with
    ``model.load_state_dict(sd, strict)``; the script passes no ``strict``: as loose as a literal
    ``strict=False`` (DDP187). Passed ``strict=True``, it is not."""
    d = tmp_path / "p"
    d.mkdir()
    (d / "ckpt.py").write_text("import torch\n\n\ndef load_checkpoint(model, path, strict=False):\n"
                              "    model.load_state_dict(torch.load(path)['sd'], strict)\n    return model\n")
    script = ("import torch\nimport torch.nn as nn\nfrom ckpt import load_checkpoint\n\n"
              "net = nn.Linear(4, 2)\nif torch.cuda.is_available():\n    net = nn.DataParallel(net).cuda()\n"
              "net = load_checkpoint(net, 'c.pth'CALL)\nopt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
              "loader = torch.utils.data.DataLoader(torch.randn(16, 4), batch_size=4, shuffle=True)\n"
              "for x in loader:\n    opt.zero_grad()\n    net(x).sum().backward()\n    opt.step()\n")
    (d / "train.py").write_text(script.replace("CALL", ""))
    assert main(["rewrite", str(d / "train.py")]) == 1
    assert "train.py:8:7: DDP187 load_checkpoint loads a state dict into the model it is handed with strict=False" in capsys.readouterr().err
    (d / "train.py").write_text(script.replace("CALL", ", strict=True"))
    main(["rewrite", "-o", str(tmp_path / "out.py"), str(d / "train.py")])
    assert "DDP187" not in capsys.readouterr().err


def test_the_class_name_saved_beside_the_keys_is_the_bare_models(tmp_path: Path) -> None:
    """pytorch-template saves ``arch = type(self.model).__name__`` beside ``self.model.state_dict()``:
    the model's class where one GPU ran bare; through the DDP wrapper it would read
    DistributedDataParallel. Where the keys stay plain, so does the name; a class name with no
    keys saved beside it is left alone."""
    d = _copy(BASE_SAVES, tmp_path)
    base = d / "base" / "base_trainer.py"
    base.write_text(base.read_text().replace('state = {"epoch": epoch, ', 'state = {"arch": type(self.model).__name__, "epoch": epoch, '))
    out = tmp_path / "out"
    main(["rewrite", "--with-helpers", "-q", "-o", str(out), str(d / "train.py")])
    text = (out / "base" / "base_trainer.py").read_text()
    assert '"arch": type(self.model.module if isinstance(self.model, DistributedDataParallel) else self.model).__name__' in text
    d2 = _copy(BASE_SAVES, tmp_path, "p2")
    base = d2 / "base" / "base_trainer.py"
    base.write_text(base.read_text().replace('state = {"epoch": epoch, "state_dict": self.model.state_dict(), ',
                                             'state = {"epoch": epoch, "arch": self.model.__class__.__name__, '))
    assert [u[2] for u in _uses(d2 / "train.py")] == []


def test_a_wrapper_returned_by_a_function_of_the_script_is_followed_to_the_helper(tmp_path: Path) -> None:
    """SupContrast's main_ce.py: ``model, criterion = set_model(opt)`` returns the wrapper made
    inside ``set_model`` (only with several GPUs), and ``save_model(model, ...)`` of util.py saves
    ``model.state_dict()``: followed through the return, as wrap_ddp follows it."""
    d = _copy(HELPERS, tmp_path)
    script = d / "train.py"
    text = script.read_text()
    made = ('net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))\ndevice = "cuda" if torch.cuda.is_available() '
            'else "cpu"\nnet = net.to(device)\nif torch.cuda.device_count() > 1:\n    net = nn.DataParallel(net)\n')
    assert made in text
    script.write_text(text.replace(made, (
        'device = "cuda" if torch.cuda.is_available() else "cpu"\n\n\ndef set_model():\n'
        '    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3)).to(device)\n'
        '    if torch.cuda.device_count() > 1:\n        model = nn.DataParallel(model)\n    return model, nn.CrossEntropyLoss()\n\n\n'
        'net, criterion = set_model()\n')))
    assert sorted(_uses(script)) == [("ckpt.py:14", "model", "load_state_dict", "plain"), ("ckpt.py:8", "model", "state_dict", "plain")]


def test_a_call_that_hands_module_on_the_other_branch_is_handed_module_on_this_one_too(tmp_path: Path, capsys) -> None:
    """layumi/Person_reID_baseline_pytorch: ``if len(opt.gpu_ids) > 1: save_network(model.module, ...)
    else: save_network(model, ...)``, inside a function handed the model. The original handed
    the bare model on both paths; the migration (the wrap on both) wrote ``module.`` keys from the
    else branch, with exit 0 and a note saying they had none. Now that branch hands
    ``model.module`` too (DDP124), alone, and the helper module is left as it was."""
    d = _copy(HELPERS, tmp_path)
    script = d / "train.py"
    text = script.read_text()
    old = '    save_checkpoint(net, optimizer, epoch + 1, "checkpoints")\n'
    assert old in text
    script.write_text(text.replace(old, (
        '    if torch.cuda.device_count() > 1:\n        save_checkpoint(net.module, optimizer, epoch + 1, "checkpoints")\n'
        '    else:\n        save_checkpoint(net, optimizer, epoch + 1, "checkpoints")\n')))
    uses = {(u[0], u[2]) for u in _uses(script)}
    assert ("ckpt.py:8", "state_dict") in uses
    capsys.readouterr()
    assert main(["rewrite", "--diff", str(script)]) == 1  # DDP189 of the load_checkpoint call, which has no such branch
    captured = capsys.readouterr()
    assert "DDP189 model.load_state_dict(...) of the wrapper handed to load_checkpoint(...)" in captured.err
    script.write_text(script.read_text().replace("    start = load_checkpoint(net, optimizer, args.resume)\n",
                                                 "    start = load_checkpoint(net.module if torch.cuda.device_count() > 1 else net, optimizer, args.resume)\n"))
    assert main(["rewrite", str(script)]) == 0, capsys.readouterr().err
    out = (d / "train_ddp.py").read_text()
    assert out.count('save_checkpoint(net.module, optimizer, epoch + 1, "checkpoints")') == 2, out[-1500:]
