"""verify and torch 2.13's exit race on gloo (see tests/_scripts.py for the cause): a run in
which every rank finished and reported its parameters, and a process then died with
libstdc++'s terminate message while Python shut down, is compared in full and not blamed
on the migration; anything less than that stays a crash."""

from __future__ import annotations

from pathlib import Path

import pytest

from dp2ddp.verify import analyze, options
from dp2ddp.verify.runner import Rank, RunResult

SIGN = "terminate called without an active exception"
STEPS = 6


def _opts() -> options.Options:
    return options.Options(steps=STEPS, warmup=1, rtol=1e-5, stochastic_rtol=1e-2, min_speedup=0.0, timeout=30,
                           user_dirs=[], nproc=2, nnodes=1)


def _rank(rank: int, samples: int, end: bool = True, error: bool = False) -> Rank:
    r = Rank(rank=rank, steps=[{"loss": 2.0 - 0.1 * i, "samples": samples, "t": 1.0 + i} for i in range(STEPS)])
    r.steps[0]["modules"] = ["ddp"] if samples == 8 else []
    if end:
        r.end = {"ev": "end", "why": "exit", "steps": STEPS, "hash": "abc", "norm": 1.5}
    if error:
        r.error = {"t": 3.0, "type": "RuntimeError", "message": "boom", "traceback": "Traceback ...\nRuntimeError: boom"}
    return r


def _run(tmp_path: Path, role: str, ranks, code: int, log: str = "") -> RunResult:
    path = tmp_path / f"{role}.log"
    path.write_text(log)
    return RunResult(role=role, exit_code=code, wall_s=2.0, ranks={r.rank: r for r in ranks}, logs=[path])


def _original(tmp_path: Path) -> RunResult:
    return _run(tmp_path, "original", [_rank(0, 16)], 0)


def test_finished_ranks_then_terminate_is_not_a_failure(tmp_path):
    mig = _run(tmp_path, "migrated", [_rank(0, 8), _rank(1, 8)], 1, f"training done\n{SIGN}\nChildFailedError\n")
    report = analyze.compare(_original(tmp_path), mig, _opts())
    assert report["verdict"] == "pass", report["problems"]
    assert report["losses_agree"] and report["replicas_in_sync"]
    assert any("torch 2.13" in n for n in report["notes"]), report["notes"]
    assert report["migrated"]["exit_code"] == 1  # reported as it was


@pytest.mark.parametrize(
    "ranks, log",
    [
        pytest.param([_rank(0, 8), _rank(1, 8, end=False)], SIGN, id="a_rank_never_finished"),
        pytest.param([_rank(0, 8), _rank(1, 8, error=True)], SIGN, id="a_rank_raised"),
        pytest.param([_rank(0, 8), _rank(1, 8)], "Segmentation fault", id="another_signal"),
    ],
)
def test_anything_less_is_still_a_crash(tmp_path, ranks, log):
    report = analyze.compare(_original(tmp_path), _run(tmp_path, "migrated", ranks, 1, log), _opts())
    assert report["verdict"] == "fail"
    assert any("crashed" in p or "failed" in p for p in report["problems"]), report["problems"]
    assert not any("torch 2.13" in n for n in report.get("notes", []))
