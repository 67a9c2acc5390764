"""verify's speed measurement without processes: the interval, the verdict, --min-speedup,
the thread budget, the combination of pairs, and the order, warm-up and time budget of
the pairs (runs replaced by synthetic results on a fake clock)."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from dp2ddp.verify import analyze, options, runner, session, speed
from dp2ddp.verify.runner import Rank, RunResult

STEPS = 8


# --------------------------------------------------------------------------- statistics


def _t_cdf(q: float, df: int, n: int = 20000) -> float:
    """Student's t CDF at q by Simpson's rule on the density (an independent check of the table)."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def pdf(t: float) -> float:
        return c * (1 + t * t / df) ** (-(df + 1) / 2)

    h = q / n
    total = pdf(0) + pdf(q) + sum((4 if i % 2 else 2) * pdf(i * h) for i in range(1, n))
    return 0.5 + total * h / 3


@pytest.mark.parametrize("df", [1, 2, 3, 4, 5, 9, 10, 29, 30, 31, 45, 100])
def test_t_quantiles_are_the_975_quantiles(df):
    assert _t_cdf(speed.t975(df), df) == pytest.approx(0.975, abs=2e-5)


def test_interval_of_the_geometric_mean():
    ratios = [1.5, 1.6, 1.7]
    lo, hi = speed.interval(ratios)
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    assert (lo, hi) == pytest.approx((math.exp(mean - 4.3027 * sd / math.sqrt(3)), math.exp(mean + 4.3027 * sd / math.sqrt(3))))
    assert lo < math.exp(mean) < hi
    # symmetric in the log: a slow-down mirrors a speed-up
    lo2, hi2 = speed.interval([1 / r for r in ratios])
    assert (lo2, hi2) == pytest.approx((1 / hi, 1 / lo))
    assert speed.interval([1.3]) is None


def test_interval_covers_the_true_ratio_about_95_percent_of_the_time():
    rng = random.Random(1)
    true, hits, trials = 1.3, 0, 4000
    for _ in range(trials):
        ratios = [true * math.exp(rng.gauss(0, 0.2)) for _ in range(3)]
        lo, hi = speed.interval(ratios)
        hits += lo <= true <= hi
    assert 0.935 <= hits / trials <= 0.965


@pytest.mark.parametrize(
    "ratios, verdict",
    [
        ([1.50, 1.62, 1.70], speed.FASTER),
        ([0.60, 0.64, 0.62], speed.SLOWER),
        ([0.80, 1.00, 1.25], speed.SAME),  # the interval includes 1
        ([1.40, 0.90], speed.SAME),
        ([1.40], speed.ONE),
        ([], speed.NONE),
        ([None, None], speed.NONE),
    ],
)
def test_verdict_comes_from_the_interval(ratios, verdict):
    s = speed.summarize(ratios, 1.0)
    assert s["verdict"] == verdict
    text = speed.describe(s)
    if verdict == speed.SAME:
        assert "no measurable difference" in text and "interval" in text
    if verdict == speed.ONE:
        assert "one pair: no interval" in text
    if verdict == speed.FASTER:
        assert s["ci"][0] > 1 and s["median"] == pytest.approx(1.62)


@pytest.mark.parametrize(
    "ratios, bar, ok",
    [
        ([0.60, 0.64, 0.62], 1.0, False),  # measurably slower than the bar
        ([0.80, 1.00, 1.25], 1.0, True),  # not shown below it: benefit of the doubt
        ([0.90, 0.95, 0.85], 1.0, True),  # median below the bar, interval reaching it
        ([1.50, 1.62, 1.70], 2.0, False),
        ([1.50, 1.62, 1.70], 1.5, True),
        ([0.90], 1.0, True),  # one pair: no interval, reported but not judged
        ([0.05], 1.0, True),
        ([1.10], 1.0, True),
        ([0.10, 0.11], 0.0, True),  # 0 ignores speed
    ],
)
def test_min_speedup_judges_the_interval(ratios, bar, ok):
    s = speed.summarize(ratios, bar)
    assert s["meets_min_speedup"] is ok
    if len(ratios) == 1 and bar:
        assert s["judgement"].startswith("not judged: one pair has no interval")


def test_extreme_intervals_stay_readable():
    s = speed.summarize([0.3, 1.9], 0)
    text = speed.describe(s)
    assert "interval" in text and "e+" not in text.split("interval")[0]
    assert speed.x(0.00021) == "0.00021" and speed.x(1274.8) == "1.3e+03" and speed.x(1.234) == "1.23"


@pytest.mark.parametrize(
    "threads, environ, cores, procs, expect",
    [
        (None, {}, 2, 2, (1, 1, "2 cores // 2 processes")),
        (None, {}, 16, 4, (4, 4, "16 cores // 4 processes")),
        (None, {}, 2, 4, (1, 1, "2 cores // 4 processes")),
        (None, {"OMP_NUM_THREADS": "3"}, 16, 4, (3, 3, "OMP_NUM_THREADS from the environment")),
        (None, {"OMP_NUM_THREADS": "junk"}, 8, 2, (4, 4, "8 cores // 2 processes")),
        ((2, 1), {"OMP_NUM_THREADS": "3"}, 2, 2, (2, 1, "--threads")),
    ],
)
def test_thread_budget(threads, environ, cores, procs, expect):
    b = speed.thread_budget(threads, procs, environ, cores)
    assert (b["original"], b["migrated"], b["source"]) == expect
    assert speed.thread_env(b["migrated"]) == {"OMP_NUM_THREADS": str(expect[1]), "MKL_NUM_THREADS": str(expect[1])}
    text = speed.describe_threads(b)
    assert ("per process in both runs" in text) == (expect[0] == expect[1])


def test_runner_passes_the_thread_budget_to_every_process(tmp_path):
    spec = runner.RunSpec(role="migrated", script=tmp_path / "t.py", args=[], cwd=tmp_path, out=tmp_path, tag="t",
                          steps=1, timeout=1, env=speed.thread_env(3))
    assert runner._env(spec)["OMP_NUM_THREADS"] == "3"


# --------------------------------------------------------------------------- pairs


def _opts(min_speedup: float = 1.0) -> options.Options:
    return options.Options(steps=STEPS, warmup=1, rtol=1e-5, stochastic_rtol=1e-2, min_speedup=min_speedup,
                           timeout=30, user_dirs=[], nproc=2, nnodes=1)


def _result(role: str, step_s: float, loss_shift: float = 0.0, pid: int = 100) -> RunResult:
    """A finished run: STEPS steps of 16 samples in all, one every ``step_s`` seconds."""
    ranks = [0] if role == "original" else [0, 1]
    samples = 16 // len(ranks)
    out = {}
    for r in ranks:
        rank = Rank(rank=r, pid=pid + r)
        rank.steps = [{"loss": 2.0 - 0.1 * i + loss_shift, "samples": samples, "t": 10.0 + step_s * i} for i in range(STEPS)]
        rank.steps[0]["modules"] = ["ddp"] if role == "migrated" else ["dp"]
        rank.samplers = [{"ev": "sampler", "kind": "distributed", "id": 5, "seed": 7, "epoch": 1, "shuffle": True, "n": 16}] \
            if role == "migrated" else []
        rank.end = {"ev": "end", "why": "limit", "steps": STEPS, "hash": "h", "norm": 1.0, "envelope": "chunks"}
        out[r] = rank
    return RunResult(role=role, exit_code=0, wall_s=1.0, ranks=out, logs=[])


def _pair(index: int, ratio: float, warmup: bool = False, shift: float = 0.0) -> session.Pair:
    p = session.Pair(index=index, order=("migrated", "original") if index % 2 else ("original", "migrated"))
    p.runs = {"original": _result("original", 0.1), "migrated": _result("migrated", 0.1 / ratio, shift)}
    p.report = analyze.compare(p.runs["original"], p.runs["migrated"], _opts())
    p.warmup, p.wall_s = warmup, 10.0
    return p


def test_combine_uses_measured_pairs_only_and_keeps_every_run():
    pairs = [_pair(1, 3.0, warmup=True), _pair(2, 0.9), _pair(3, 1.1), _pair(4, 1.0)]
    rep = analyze.combine(pairs, None, {"original": 1, "migrated": 1, "source": "x", "cores": 2, "processes": 2}, _opts(), [])
    assert rep["speedup"] == pytest.approx(1.0)  # the warm-up's 3.0 is left out
    assert rep["speed"]["pairs"] == 3 and rep["speed"]["verdict"] == speed.SAME
    assert rep["verdict"] == "pass", rep["problems"]
    assert [(r["pair"], r["role"], r["warmup"]) for r in rep["runs"][:4]] == [
        (1, "migrated", True), (1, "original", True), (2, "original", False), (2, "migrated", False)]
    assert len(rep["runs"]) == 8 and all(r["throughput"] for r in rep["runs"])
    assert [p["speedup"] for p in rep["pairs"]] == pytest.approx([3.0, 0.9, 1.1, 1.0])


def test_combine_fails_a_migration_measurably_below_the_bar():
    pairs = [_pair(1, 0.5), _pair(2, 0.52), _pair(3, 0.48)]
    rep = analyze.combine(pairs, None, {"original": 1, "migrated": 1, "source": "x", "cores": 2, "processes": 2}, _opts(), [])
    assert rep["verdict"] == "fail" and rep["losses_agree"] and rep["replicas_in_sync"]
    assert any("measurably slower" in p and "--min-speedup 1" in p for p in rep["problems"]), rep["problems"]


def test_combine_reports_the_first_pair_that_failed():
    pairs = [_pair(1, 1.0), _pair(2, 1.0, shift=0.5)]
    assert pairs[1].report["verdict"] == "fail"
    rep = analyze.combine(pairs, None, {"original": 1, "migrated": 1, "source": "x", "cores": 2, "processes": 2}, _opts(0), [])
    assert rep["verdict"] == "fail" and rep["pair"] == 2 and rep["losses_agree"] is False
    assert rep["problems"][0].startswith("pair 2 of runs failed after 1 that passed")


class _FakeRuns:
    """runner.run replaced: a finished run at once, with a clock that moves ``pair_s / 2`` a run."""

    def __init__(self, monkeypatch, pair_s: float, fail_at=None) -> None:
        self.now, self.pair_s, self.fail_at = 0.0, pair_s, fail_at
        self.calls = []
        monkeypatch.setattr(session.time, "monotonic", lambda: self.now)
        monkeypatch.setattr(runner, "run", self.run)

    def run(self, spec, progress=None):
        self.now += self.pair_s / 2
        folder = next(p for p in spec.out.parents if p.name.startswith("pair"))
        pair = int(folder.name[4:])
        role = "envelope" if spec.chunks else spec.role
        self.calls.append((pair, role, spec.samplers, spec.env["OMP_NUM_THREADS"], spec.steps, spec.extend, spec.chunks))
        shift = 0.5 if (pair == self.fail_at and spec.role == "migrated") else 0.0
        return _result(spec.role, 0.1, shift, pid=1000 + len(self.calls))


class _Quiet:
    def begin(self, *a):
        pass

    def update(self, *a):
        pass

    def end(self, *a):
        pass


def _setup(tmp_path: Path, repeat, envelope: bool = False) -> session.Setup:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "a.py").write_text("pass\n")
    (src / "a_ddp.py").write_text("pass\n")
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    return session.Setup(
        scratch=scratch, original=src / "a.py", migrated=src / "a_ddp.py", migrated_content=None, args=[], tag="t",
        steps=STEPS, timeout=30, startup_timeout=30, seed=0, nproc=2, nnodes=1,
        threads={"original": 2, "migrated": 1}, repeat=repeat, opts=_opts(0), envelope=envelope,
    )


def test_pairs_alternate_and_a_short_first_pair_is_a_warm_up(tmp_path, monkeypatch):
    fake = _FakeRuns(monkeypatch, pair_s=10)
    out = session.run(_setup(tmp_path, 3), _Quiet())
    assert [p.warmup for p in out.pairs] == [True, False, False, False]
    assert [c[:2] for c in fake.calls] == [
        (1, "migrated"), (1, "original"), (2, "original"), (2, "migrated"),
        (3, "migrated"), (3, "original"), (4, "original"), (4, "migrated")]
    # the original's sampler order uses the seed and epochs the first migrated run's DistributedSampler used
    assert [c[2] for c in fake.calls if c[1] == "original"] == [[{"n": 16, "seed": 7, "epochs": [1]}]] * 4
    assert [c[2] for c in fake.calls if c[1] == "migrated"] == [[]] * 4
    assert {(c[1], c[3]) for c in fake.calls} == {("original", "2"), ("migrated", "1")}
    assert any("warm-up" in n for n in out.notes)
    # later pairs' script folders are removed once they passed; the first pair's stay for the outputs
    assert (tmp_path / "scratch" / "pair1" / "original").is_dir()
    assert not (tmp_path / "scratch" / "pair3" / "original").exists()


def test_the_first_pair_measures_the_noise_envelope_and_goes_on_for_the_evidence(tmp_path, monkeypatch):
    """Pair 1: the migration (allowed past --steps up to --max-steps for the data evidence),
    the original for as many steps as the migration made, then the original again in
    world-size chunks (the envelope); later pairs run --steps, no envelope."""
    fake = _FakeRuns(monkeypatch, pair_s=10)
    setup = _setup(tmp_path, 2, envelope=True)
    setup.extend = 40
    out = session.run(setup, _Quiet())
    first = [c for c in fake.calls if c[0] == 1]
    assert [c[1] for c in first] == ["migrated", "original", "envelope"]
    assert [(c[5], c[6]) for c in first] == [(40, 0), (0, 0), (0, 2)]
    assert first[2][2] == first[1][2]  # the envelope follows the migration's sampler order too
    later = [c for c in fake.calls if c[0] > 1]
    assert later and all(c[1] != "envelope" and c[5] == 0 and c[4] == STEPS for c in later)
    assert "envelope" in out.pairs[0].runs and out.pairs[0].report["tolerance"]["kind"] == "envelope"
    assert not (tmp_path / "scratch" / "pair1" / "envelope").exists()  # removed once compared


def test_a_long_first_pair_counts(tmp_path, monkeypatch):
    _FakeRuns(monkeypatch, pair_s=session.WARMUP_PAIR_S + 5)
    out = session.run(_setup(tmp_path, 2), _Quiet())
    assert [p.warmup for p in out.pairs] == [False, False]


def test_repeat_one_is_one_pair(tmp_path, monkeypatch):
    fake = _FakeRuns(monkeypatch, pair_s=1)
    out = session.run(_setup(tmp_path, 1), _Quiet())
    assert len(out.pairs) == 1 and not out.pairs[0].warmup and len(fake.calls) == 2


@pytest.mark.parametrize("pair_s, measured", [(10, 3), (35, 3), (45, 2), (70, 1)])
def test_the_default_measures_three_pairs_when_time_allows(tmp_path, monkeypatch, pair_s, measured):
    _FakeRuns(monkeypatch, pair_s=pair_s)
    out = session.run(_setup(tmp_path, None), _Quiet())
    assert sum(not p.warmup for p in out.pairs) == measured
    if measured < 3:
        assert any("--repeat N measures N" in n for n in out.notes), out.notes


def test_the_first_failing_pair_ends_the_repetition(tmp_path, monkeypatch):
    fake = _FakeRuns(monkeypatch, pair_s=10, fail_at=2)
    out = session.run(_setup(tmp_path, 5), _Quiet())
    assert len(out.pairs) == 2 and out.pairs[1].report["verdict"] == "fail"
    assert len(fake.calls) == 4
    assert (tmp_path / "scratch" / "pair2" / "migrated").is_dir()  # a failed pair's folders are kept
