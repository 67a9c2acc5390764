"""The styles corpus (fixtures/corpus, listed in MANIFEST.toml): every original runs.

Each script is a DataParallel training script in the style of a widely copied public
repository; together they are the acceptance corpus of `dp2ddp rewrite`. This module only
checks the originals: each runs under plain ``python`` in a scratch copy of the corpus
folder with ``fixtures/corpus/_support`` (stand-ins for tqdm/tensorboardX/wandb) on
``PYTHONPATH``, exits 0, and, when the manifest says ``trains = true``, takes at least one
optimizer step. Steps are counted by a global ``torch.optim`` step hook that a tiny driver
installs before running the script with ``runpy`` (no ``sitecustomize`` involved), forked
from a zygote like the other scripts the tests run (tests/_scripts.py).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import pytest

from tests._scripts import run_script

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fixtures" / "corpus"
MANIFEST = tomllib.loads((CORPUS / "MANIFEST.toml").read_text())
SCRIPTS = MANIFEST["scripts"]
SUPPORT = [CORPUS / p for p in MANIFEST["corpus"]["pythonpath"]]
TIMEOUT = 180

DRIVER = r"""
import atexit, os, runpy, sys
import torch
_steps = [0]
def _count(optimizer, args, kwargs):
    _steps[0] += 1
from torch.optim.optimizer import register_optimizer_step_post_hook
register_optimizer_step_post_hook(_count)
def _report():
    sys.stderr.write("\n[corpus] optimizer steps: %d\n" % _steps[0])
    sys.stderr.flush()
atexit.register(_report)
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
runpy.run_path(script, run_name="__main__")
"""


def _env() -> dict:
    env = dict(os.environ)
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(p) for p in SUPPORT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _copy_corpus(dest: Path) -> Path:
    shutil.copytree(CORPUS, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def test_manifest_lists_every_script():
    on_disk = {p.name for p in CORPUS.glob("*.py")}
    listed = {entry["file"] for entry in SCRIPTS.values()}
    assert on_disk == listed, f"not in MANIFEST: {sorted(on_disk - listed)}; missing on disk: {sorted(listed - on_disk)}"
    assert len(SCRIPTS) >= 32
    expects = [entry["expect"] for entry in SCRIPTS.values()]
    assert set(expects) <= {"migrate", "refuse"}
    # inference-only scripts and those no correct automatic migration exists for are refused
    # (deeplab_trainer moved to "refuse" when its migration was found wrong: a Saver picking its
    # folder from a listing; timm_train, simclr_pretrain and pt_imagenet went there for a
    # per-process batch on the script's own distributed path, and came back when the migration
    # divided it where the process group starts, DDP172; simclr_pretrain went back for good
    # when its GatherLayer's backward was found not to sum over the ranks, DDP188)
    assert expects.count("migrate") >= 20
    assert sum(1 for entry in SCRIPTS.values() if not entry["trains"]) <= 2


@pytest.mark.parametrize("key", ["style", "idioms", "trains", "args", "expect", "notes", "loss_match"])
def test_manifest_fields(key):
    for name, entry in SCRIPTS.items():
        assert key in entry, f"{name}: no {key}"
        if key == "idioms":
            assert entry[key] and all(isinstance(x, str) for x in entry[key]), name
        if key == "args":
            assert all(isinstance(x, str) for x in entry[key]), name


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_docstring_names_its_style(name):
    source = (CORPUS / SCRIPTS[name]["file"]).read_text()
    assert re.search(r"\bstyle of\b", source[:3000]), f"{name}: the module docstring must name the style it follows"


# the originals of migrated scripts run inside tests/test_corpus.py (verify runs both sides)
NOT_VERIFIED = sorted(k for k, v in SCRIPTS.items() if v["expect"] != "migrate" or not v["trains"])


@pytest.mark.slow
@pytest.mark.parametrize("name", NOT_VERIFIED)
def test_original_runs(name, tmp_path):
    entry = SCRIPTS[name]
    work = _copy_corpus(tmp_path / "corpus")
    driver = tmp_path / "driver" / "corpus_driver.py"  # it puts the script's folder first on sys.path itself
    driver.parent.mkdir()
    driver.write_text(DRIVER)
    start = time.monotonic()
    # forked from a zygote (tests/_scripts.py; the real python with DP2DDP_TEST_REAL_LAUNCH=1):
    # stdout and stderr in one capture
    proc = run_script([str(driver), entry["file"], *entry["args"]], work, env=_env(), timeout=TIMEOUT)
    elapsed = time.monotonic() - start
    output = proc.stdout + (proc.stderr or "")
    assert proc.returncode == 0, f"{name} exited {proc.returncode} after {elapsed:.1f}s:\n{output[-4000:]}"
    found = re.findall(r"\[corpus\] optimizer steps: (\d+)", output)
    assert found, f"{name}: the step counter did not report:\n{output[-2000:]}"
    steps = int(found[-1])
    if entry["trains"]:
        assert steps >= 1, f"{name}: no optimizer step:\n{output[-2000:]}"
    else:
        assert steps == 0, f"{name}: trains = false but {steps} optimizer steps were taken"
