"""The styles corpus, migrated and run: the acceptance test of `dp2ddp rewrite`.

For every script of ``fixtures/corpus/MANIFEST.toml``:

* ``expect = "migrate"``: the rewrite is not refused and compiles (that `dp2ddp check`
  finds nothing in it is tests/test_rewrite_invariants.py's job); ``dp2ddp verify`` runs the original (plain python) and the migration
  (torchrun, 2 CPU ranks, gloo) and passes — losses agree step by step (a moving
  average for stochastic models), the replicas' parameters are identical, the global
  batch matches; the migration also runs as plain ``python`` (a world of one). Scripts
  without training steps run under torchrun and python instead of verify.
* ``expect = "refuse"``: the rewrite refuses with an error finding and writes nothing.

The runs happen in a scratch copy of the corpus folder with ``fixtures/corpus/_support``
(stand-ins for tqdm, tensorboardX, wandb) on ``PYTHONPATH``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib

from dp2ddp.migrate import migrate_source as _migrate_source
from tests import _zygote
from tests._scripts import guarded, retry_exit_abort, run_script

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fixtures" / "corpus"
MANIFEST = tomllib.loads((CORPUS / "MANIFEST.toml").read_text())
SCRIPTS = MANIFEST["scripts"]
SUPPORT = [str(CORPUS / p) for p in MANIFEST["corpus"]["pythonpath"]]
MIGRATE = sorted(k for k, v in SCRIPTS.items() if v.get("expect") == "migrate")
REFUSE = sorted(k for k, v in SCRIPTS.items() if v.get("expect") == "refuse")


@functools.lru_cache(maxsize=4)
def migrate_source(source: bytes, path: str):
    """The rewrite of ``source`` (what the test reads of it several times: computed once per
    content and path; the result is only read)."""
    return _migrate_source(source, path)


def _scratch(tmp_path: Path) -> Path:
    work = tmp_path / "corpus"
    shutil.copytree(CORPUS, work, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return work


def _env() -> dict:
    env = dict(os.environ)
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    env["PYTHONPATH"] = os.pathsep.join(SUPPORT + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return guarded(env)


def _migrated(name: str, work: Path) -> Path:
    spec = SCRIPTS[name]
    src = work / spec["file"]
    result = migrate_source(src.read_bytes(), str(src))
    errors = [f"{f.line}:{f.col + 1} {f.code} {f.message}" for f in result.migration.findings if f.severity == "error"]
    assert not result.migration.blocked, "refused:\n" + "\n".join(errors)
    assert result.changed
    compile(result.output, spec["file"], "exec")
    out = src.with_name(src.stem + "_ddp.py")
    out.write_bytes(result.output)
    return out


def _verify(work: Path, tmp_path: Path, spec: dict, out: Path, nproc: int, tag: str) -> dict:
    report = tmp_path / f"verify-{tag}.json"
    # dp2ddp verify and its runs forked from a zygote (tests/_zygote.py run_verify); DP2DDP_TEST_REAL_LAUNCH=1: real
    r = _zygote.run_verify(
        [str(work / spec["file"]), "--migrated", str(out), "--nproc", str(nproc), "--steps", "0", "--min-speedup", "0",
         "--repeat", "1", "--json", str(report), "--workdir", str(tmp_path / f"vw-{tag}"), "--", *spec.get("args", [])],
        work, _zygote.verify_env(_env()), timeout=600,
    )
    assert _zygote.forks_alive() == [], "runs of verify outlived it"
    _zygote.verify_fallbacks()

    assert report.exists(), r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(report.read_text())


# problems that follow from the batch a run splits, not from the migration being wrong:
# with one process per rank the script's own distributed path keeps its per-process batch
_LOSS = ("losses disagree",)
_BATCH = ("step ",)


# verify problems that a warning of the rewrite already announced
_WARNED = {
    "DDP106": ("a DistributedSampler was iterated",),  # set_epoch could not be placed
    "DDP105": ("step ",),  # a loader left unsharded: each rank repeats the original's batches
    "DDP110": ("outputs:",),  # a writer left on every rank (a SummaryWriter, a project module's Saver)
}
_PER_RANK = re.compile(r"every rank|one per process|per process of|TensorBoard event files|ranks 0 and 1")


def _warned(work: Path, spec: dict) -> set:
    src = work / spec["file"]
    return {f.code for f in migrate_source(src.read_bytes(), str(src)).migration.warnings}


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def _announced(crash: dict, work: Path, spec: dict) -> bool:
    """The crash happened at a place a warning of the rewrite names (``utils/saver.py:20``:
    a project module the rewrite does not edit)."""
    # the innermost frame of the project's own files (the standard library's come after it)
    frames = [(p, n) for p, n in _FRAME.findall(crash.get("traceback") or "") if not p.startswith("<")]
    if not frames:
        return False
    path, line = frames[-1]
    src = work / spec["file"]
    named = re.findall(r"\(([\w./-]+\.py):(\d+)\)", "\n".join(
        f.message for f in migrate_source(src.read_bytes(), str(src)).migration.warnings))
    return any(path.endswith("/" + f) and line == n for f, n in named)


def _summary(data: dict) -> str:
    keys = ("verdict", "losses_agree", "max_rel_loss_diff", "replicas_in_sync", "problems", "notes", "crashes", "hang")
    return json.dumps({k: data.get(k) for k in keys}, indent=1)[-5000:]


def _known(names):
    """A script whose manifest entry names a ``known_issue`` of the migration (not of the
    script): expected to fail until it is fixed (not strict: a race may let a run pass)."""
    return [
        pytest.param(n, marks=pytest.mark.xfail(reason=SCRIPTS[n]["known_issue"], strict=False)) if SCRIPTS[n].get("known_issue") else n
        for n in names
    ]


@pytest.mark.torchrun
@pytest.mark.parametrize("name", _known(MIGRATE))
def test_migration_trains_like_the_original(name: str, tmp_path: Path) -> None:
    """verify: same losses, replicas in sync, same global batch, same outputs; and plain
    python runs the migration.

    A script whose own distributed path the migration completed (DDP121) keeps that path's
    batch semantics (HF's per_gpu_train_batch_size is per process, so two processes take
    twice the original's batch): with two processes its replicas, crashes and what every
    rank writes are compared."""
    spec = SCRIPTS[name]
    work = _scratch(tmp_path)
    out = _migrated(name, work)
    args = list(spec.get("args", []))
    codes = {f.code for f in migrate_source((work / spec["file"]).read_bytes(), str(work / spec["file"])).migration.findings}
    mixed = "DDP121" in codes
    exact = spec.get("loss_match") == "exact"
    if spec.get("trains", True):
        two = _verify(work, tmp_path, spec, out, 2, "two")
        assert not two.get("hang"), _summary(two)
        crashes = [c for c in two.get("crashes") or [] if not _announced(c, work, spec)]
        assert not crashes, _summary(two)
        if two.get("crashes"):
            return  # a crash the rewrite warned about, at the line it named: nothing more to compare
        assert two["replicas_in_sync"] is True, _summary(two)
        assert two["steps_compared"] >= 1
        warned = _warned(work, spec)
        ignore = _LOSS if not exact else ()
        ignore += tuple(p for code, prefixes in _WARNED.items() if code in warned for p in prefixes)
        left = [p for p in two["problems"] if not p.startswith(ignore) and not p.startswith("  advice")]
        if mixed:
            # two processes of the script's own path take their own batch (and so a different number
            # of steps and checkpoints): only what every rank writes is compared here; where the
            # migration divides that batch (DDP172) the global batch is the original's and is compared
            # too (what the own path saves may differ: imagenet's all-reduced meters are floats)
            left = [p for p in left if _PER_RANK.search(p) or ("DDP172" in codes and p.startswith(_BATCH))]
        assert not left, _summary(two)
    else:
        r = retry_exit_abort(lambda: run_script([str(out), *args], work, env=_env(), nproc=2), name)
        assert r.returncode == 0, r.stdout[-4000:]
    r = run_script([str(out), *args], work, env=_env())
    assert r.returncode == 0, r.stdout[-4000:]


@pytest.mark.parametrize("name", REFUSE)
def test_refused_with_a_reason(name: str) -> None:
    spec = SCRIPTS[name]
    src = CORPUS / spec["file"]
    result = migrate_source(src.read_bytes(), str(src))
    assert result.migration.blocked
    assert not result.changed
    assert any(f.severity == "error" and f.code.startswith("DDP1") for f in result.migration.findings)
