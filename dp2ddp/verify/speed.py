"""The speed-up as a measurement, not one ratio: pairs of runs, an interval, a verdict.

One pair of runs (original, then migration) mixes the migration's effect with whatever
the machine did between the two runs. verify therefore runs several pairs, alternating
the order within them (M O, O M, M O, ...: a steady drift of the machine favours neither
side), and treats each pair's ratio of steady-state samples/s as one observation.

The interval: a Student t-interval of the mean of the pairs' *log* ratios, turned back
into a ratio (so it is the interval of the geometric-mean speed-up). Why this one:

* pairs are the independent unit (the two runs of a pair share the machine's moment);
* ratios are multiplicative (2x and 0.5x are equally far from 1): logs make them additive
  and the interval symmetric around the geometric mean;
* with 2 to 5 pairs, distribution-free intervals cannot reach 95 %: the widest
  order-statistics interval of the median, [min, max], covers it with probability
  1 - 2**(1-n) (75 % for 3 pairs), and a bootstrap of 3 values has 10 distinct
  resamples. The t-interval assumes roughly normal log ratios and pays for few pairs
  with width (t = 12.7 for 2 pairs, 4.3 for 3), which is the honest price;
* one disturbed pair widens the interval rather than moving it, so it errs towards
  "no measurable difference", never towards a speed-up that is not there.

The figure shown is the median of the pairs' ratios (robust to one disturbed pair), with
the range of the pairs and the interval; the verdict and ``--min-speedup`` use the
interval.
"""

from __future__ import annotations

import math
import os
import statistics
from typing import Any, Dict, List, Optional, Tuple

CONFIDENCE = 0.95

# Student t quantiles at 0.975 (two-sided 95 %) for 1..30 degrees of freedom
_T975 = (
    12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
    2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
    2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423,
)


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom."""
    if df < 1:
        raise ValueError("df must be >= 1")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964  # Cornish-Fisher expansion around the normal quantile: < 1e-4 off beyond 30
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def interval(ratios: List[float]) -> Optional[Tuple[float, float]]:
    """95 % interval of the geometric-mean ratio (t-interval of the mean log ratio);
    None with fewer than two ratios."""
    if len(ratios) < 2:
        return None
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    half = t975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean - half), math.exp(mean + half)


FASTER, SLOWER, SAME, ONE, NONE = "faster", "slower", "no measurable difference", "one pair", "not measured"


def summarize(ratios: List[Optional[float]], min_speedup: float) -> Dict[str, Any]:
    """The speed section of the report from the measured pairs' speed-ups (None where a
    pair had no steady-state throughput)."""
    values = [r for r in ratios if r is not None and r > 0 and math.isfinite(r)]
    out: Dict[str, Any] = {
        "pairs": len(values),
        "median": statistics.median(values) if values else None,
        "range": [min(values), max(values)] if values else None,
        "ci": None,
        "confidence": CONFIDENCE,
        "geometric_mean": math.exp(statistics.fmean(math.log(r) for r in values)) if values else None,
        "min_speedup": min_speedup,
    }
    ci = interval(values)
    if ci is not None:
        out["ci"] = [ci[0], ci[1]]
    if not values:
        out["verdict"] = NONE
    elif ci is None:
        out["verdict"] = ONE
    elif ci[0] > 1:
        out["verdict"] = FASTER
    elif ci[1] < 1:
        out["verdict"] = SLOWER
    else:
        out["verdict"] = SAME
    out["meets_min_speedup"], out["judgement"] = judge(out, min_speedup)
    return out


def judge(speed: Dict[str, Any], min_speedup: float) -> Tuple[bool, str]:
    """Does the speed-up meet ``--min-speedup``? Judged on the interval of several pairs
    only: it fails only when the whole interval lies below the bar (measurably too slow).
    One pair has no interval: its ratio is reported, not judged (one pair has given 4.40
    and 0.94 for the same script). ``0`` ignores speed."""
    if min_speedup <= 0:
        return True, "ignored (--min-speedup 0)"
    med, ci = speed["median"], speed["ci"]
    if med is None:
        return True, "not measured"
    if ci is None:
        return True, f"not judged: one pair has no interval ({med:.2f}; --repeat 2 or more judges it)"
    if ci[1] < min_speedup:
        return False, f"the whole interval lies below {min_speedup:g}"
    if ci[0] >= min_speedup:
        return True, f"the whole interval lies at or above {min_speedup:g}"
    return True, f"not shown below {min_speedup:g} (the interval reaches it); more pairs (--repeat) narrow the interval"


def x(v: float) -> str:
    """A ratio for people: two decimals, or two significant digits when far from 1."""
    return f"{v:.2f}" if 0.01 <= v < 1000 else f"{v:.2g}"


def describe(speed: Dict[str, Any]) -> str:
    """One line: the median, the pairs' range, the interval and what it means."""
    med = speed["median"]
    if med is None:
        return "not measured (no steady-state throughput in a complete pair)"
    if speed["ci"] is None:
        return f"{x(med)} (one pair: no interval; --repeat 2 or more gives one)"
    lo, hi = speed["ci"]
    rlo, rhi = speed["range"]
    what = {FASTER: "the migration is faster", SLOWER: "the migration is slower", SAME: "no measurable difference"}[speed["verdict"]]
    return (
        f"{x(med)}, median of {speed['pairs']} pairs ({x(rlo)} to {x(rhi)}); "
        f"{CONFIDENCE:.0%} interval {x(lo)} to {x(hi)}: {what}"
    )


def cores() -> int:
    """CPU cores this process may run on (affinity and cpusets included)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def thread_budget(threads: Optional[Tuple[int, int]], processes: int, environ=None, ncores: Optional[int] = None) -> Dict[str, Any]:
    """Intra-op threads (OMP_NUM_THREADS) for each process of both runs.

    Plain ``python`` would use every core while ``torchrun`` gives each of several
    workers one thread: the ratio would then measure thread pools as much as the
    migration. By default every process of both runs gets the same budget,
    ``max(1, cores // processes)`` with ``processes`` the migrated run's processes on this
    machine; ``OMP_NUM_THREADS`` set by the user is used as it is; ``--threads N[,M]``
    chooses (N for the original, M for each migrated process)."""
    environ = os.environ if environ is None else environ
    n = ncores or cores()
    if threads is not None:
        orig, mig = threads
        source = "--threads"
    else:
        user = (environ.get("OMP_NUM_THREADS") or "").strip()
        if user.isdigit() and int(user) >= 1:
            orig = mig = int(user)
            source = "OMP_NUM_THREADS from the environment"
        else:
            orig = mig = max(1, n // max(1, processes))
            source = f"{n} cores // {processes} processes"
    return {"original": orig, "migrated": mig, "source": source, "cores": n, "processes": processes}


def thread_env(count: int) -> Dict[str, str]:
    return {"OMP_NUM_THREADS": str(count), "MKL_NUM_THREADS": str(count)}


def describe_threads(budget: Dict[str, Any]) -> str:
    o, m = budget["original"], budget["migrated"]
    per = f"{o} per process in both runs" if o == m else f"original {o}, each migrated process {m}"
    return f"{per} (OMP_NUM_THREADS; {budget['source']})"
