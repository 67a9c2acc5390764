"""Golden-file tests for every migration transform, plus real runs of every output.

Layout: ``fixtures/<transform>/<case>.in.py`` -> ``<case>.out.py`` and, when the case
produces warnings, ``<case>.txt`` (``path:line:col: CODE message`` lines, path relative to
the fixture folder). Cases named ``noop_<why>`` must come out unchanged.
``pytest --regen`` rewrites the golden files from the current output.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dp2ddp.migrate import Options, migrate_bytes
from tests._scripts import copy_to, retry_exit_abort, run_python, run_torchrun
from tests.test_shard_eval import INFERENCE, SHARDED

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
REWRITE_DIRS = {
    "wrap_ddp": Options(),
    "sync_bn": Options(),
    "process_group": Options(),
    "shard_loaders": Options(),
    "rank_zero": Options(),
    "cuda_devices": Options(),
    "styles": Options(),
    "functional_dp": Options(),
    "mixed": Options(),
    "rank_writers": Options(),
    "map_location": Options(),
    "wrapper_uses": Options(),
    "valid_mean": Options(),
    "loss_scale": Options(),
    "keep_batch_size": Options(keep_batch_size=True),
    "print_all_ranks": Options(print_all_ranks=True),
    "no_sync": Options(),
    "hand_batches": Options(),
    "in_batch_loss": Options(),
    "shard_eval": Options(shard_eval=True),
    "rank_noise": Options(),
}
CASES = sorted(p for d in REWRITE_DIRS for p in (FIXTURES / d).glob("*.in.py"))
# ``*_race_warns``: the output keeps a race the rewrite warns about (in a project module it does
# not edit); two ranks may really crash there, so it is not run
RUNNABLE = [p for p in CASES if not p.name.startswith("noop_") and not p.name.endswith("_race_warns.in.py")]
# the fixtures tests/test_shard_eval.py runs under torchrun and python itself, comparing what
# they print with the original's: run once there, not twice
_RUN_BY_SHARD_EVAL = {f"shard_eval/{name}" for name in (*SHARDED, *INFERENCE, "inference_ood_capped")}
# The cross-check that the zygote launch the others get (tests/_scripts.py) runs them alike:
# under the real torchrun and python run the first case of every folder with project modules
# beside its cases (imported from the script's folder), of process_group (a CRLF source)
# and of no_sync (AMP, accumulation); tests/test_zygote.py compares the two launches directly.
_REAL_DIRS = {"wrap_ddp", "shard_loaders", "rank_writers", "in_batch_loss", "process_group", "no_sync"}
REAL_LAUNCH = {min(p for p in RUNNABLE if p.parent.name == d) for d in _REAL_DIRS}


def _id(p: Path) -> str:
    return f"{p.parent.name}/{p.name[: -len('.in.py')]}"


def _migrate(path: Path):
    # the real path, so that project modules beside a case are found; reports name the file alone
    return migrate_bytes(path.read_bytes(), str(path), REWRITE_DIRS[path.parent.name])


def _warnings_text(result) -> str:
    return "".join(f"{Path(result.path).name}:{w.line}:{w.col + 1}: {w.code} {w.message}\n" for w in result.migration.warnings)


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_fixture_output(case: Path, regen: bool) -> None:
    result = _migrate(case)
    expected_out = case.with_name(case.name.replace(".in.py", ".out.py"))
    expected_txt = case.with_name(case.name.replace(".in.py", ".txt"))
    warnings = _warnings_text(result)
    if case.name.startswith("noop_"):
        assert result.output == case.read_bytes(), "a no-op case must come out byte-identical"
        assert not expected_out.exists()
    if regen:
        if not case.name.startswith("noop_"):
            expected_out.write_bytes(result.output)
        if warnings:
            expected_txt.write_text(warnings)
        elif expected_txt.exists():
            expected_txt.unlink()
        return
    if not case.name.startswith("noop_"):
        assert result.changed, "expected the migration to change this file"
        assert result.output.decode(_encoding(case)) == expected_out.read_bytes().decode(_encoding(case))
        assert result.output == expected_out.read_bytes()  # byte for byte: line endings, encoding
    assert warnings == (expected_txt.read_text() if expected_txt.exists() else "")


def _encoding(p: Path) -> str:
    head = p.read_bytes()[:200]
    return "latin-1" if b"latin-1" in head else "utf-8"


@pytest.mark.parametrize("case", RUNNABLE, ids=_id)
def test_fixture_idempotent_and_compiles(case: Path) -> None:
    once = _migrate(case).output
    compile(once, str(case), "exec")
    twice = migrate_bytes(once, case.name, REWRITE_DIRS[case.parent.name])
    assert twice.output == once, "rewriting the output again must change nothing"
    # no DataParallel left, but a wrapper made only to read `module.` keys (it stays: key_only_wraps)
    from dp2ddp.model.core import build
    from dp2ddp.model.wraps import dp_other_refs, dp_wraps, key_only_wraps

    out = build(once, case.name)
    assert not dp_wraps(out) and not dp_other_refs(out)
    if not key_only_wraps(out):
        assert "DataParallel(" not in once.decode(_encoding(case)).replace("DistributedDataParallel(", "")


def _with_project_modules(script: Path, case: Path) -> Path:
    """Copy the modules a case imports from its folder (``dp_helpers.py``) beside it."""
    for mod in case.parent.glob("*.py"):
        if not mod.name.endswith((".in.py", ".out.py")):
            shutil.copyfile(mod, script.parent / mod.name)
    return script


@pytest.mark.torchrun
@pytest.mark.parametrize("case", [p for p in RUNNABLE if _id(p) not in _RUN_BY_SHARD_EVAL], ids=_id)
def test_fixture_output_trains(case: Path, tmp_path: Path) -> None:
    """The expected output really runs: under torchrun with 2 CPU ranks (gloo) and as plain python."""
    expected_out = case.with_name(case.name.replace(".in.py", ".out.py"))
    real = case in REAL_LAUNCH
    script = _with_project_modules(copy_to(expected_out, tmp_path / "torchrun"), case)
    r = retry_exit_abort(lambda: run_torchrun(script, script.parent, real=real), _id(case))
    assert r.returncode == 0, r.stdout[-4000:]
    script = _with_project_modules(copy_to(expected_out, tmp_path / "python"), case)
    r = run_python(script, script.parent, real=real)
    assert r.returncode == 0, r.stdout[-4000:]
