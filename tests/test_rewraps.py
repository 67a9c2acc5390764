"""Checkpoint keys where a model is wrapped more than once or on several branches. A model
unwrapped and wrapped again under a user's option, after its first wrap: the
migration keeps one wrapper on every path, so the checkpoints keep the original's one
`module.` prefix (CondenseNet's ``--convert-from``: DDP of DDP, `module.module.` keys;
a merged wrap: ``.module`` of the bare model, a crash)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._scripts import copy_to, retry_exit_abort, run_python, run_torchrun

WRAP = Path(__file__).resolve().parents[1] / "fixtures" / "wrap_ddp"


def _keys(path: Path, key: str) -> list:
    import torch

    return sorted(torch.load(path, weights_only=False)[key])


@pytest.mark.torchrun
def test_a_rewrap_for_an_export_keeps_one_module_prefix(tmp_path: Path) -> None:
    script = copy_to(WRAP / "rewrapped_under_an_option_after_the_wrap.out.py", tmp_path)
    r = retry_exit_abort(lambda: run_torchrun(script, tmp_path, "--export", "exported.pth"), "rewrap-export")
    assert r.returncode == 0, r.stdout[-4000:]
    for f in (tmp_path / "out" / "checkpoint.pth", tmp_path / "exported.pth"):
        keys = _keys(f, "state_dict")
        assert keys == ["module.body.0.bias", "module.body.0.weight", "module.head.bias", "module.head.weight"], (f, keys)


@pytest.mark.torchrun
def test_a_restored_wrapper_unwrapped_and_rewrapped_trains_and_keeps_one_module_prefix(tmp_path: Path) -> None:
    original = copy_to(WRAP / "wrapper_restored_then_unwrapped_and_rewrapped.in.py", tmp_path, "original.py")
    r = run_python(original, tmp_path, "--out", "first.pth")
    assert r.returncode == 0, r.stdout[-4000:]
    script = copy_to(WRAP / "wrapper_restored_then_unwrapped_and_rewrapped.out.py", tmp_path)
    r = retry_exit_abort(lambda: run_torchrun(script, tmp_path, "--init-from", "first.pth", "--out", "second.pth"), "rewrap-restore")
    assert r.returncode == 0, r.stdout[-4000:]
    assert _keys(tmp_path / "second.pth", "weights") == _keys(tmp_path / "first.pth", "weights")
    assert all(k.startswith("module.") and not k.startswith("module.module.") for k in _keys(tmp_path / "second.pth", "weights"))


@pytest.mark.torchrun
def test_a_model_wrapped_on_both_branches_of_a_gpu_count_test_keeps_the_originals_keys(tmp_path: Path) -> None:
    """``if device_count() > 1: DataParallel(model) else: DataParallel(model, device_ids=None)``:
    the original saves `module.` keys on every machine; so does the migration."""
    original = copy_to(WRAP / "wrapped_on_both_branches_of_a_device_count_test.in.py", tmp_path / "o")
    assert run_python(original, original.parent).returncode == 0
    script = copy_to(WRAP / "wrapped_on_both_branches_of_a_device_count_test.out.py", tmp_path / "t")
    r = retry_exit_abort(lambda: run_torchrun(script, script.parent), "both-branches")
    assert r.returncode == 0, r.stdout[-4000:]
    want = _keys(original.parent / "checkpoint.pth", "state_dict")
    assert want[0].startswith("module.") and _keys(script.parent / "checkpoint.pth", "state_dict") == want
