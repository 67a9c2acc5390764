"""Benchmark: `dp2ddp check` over torch's installed source tree vs `grep -rl DataParallel`.

    python benchmarks/bench_check.py [--tree DIR] [--repeat N] [--skip-default] [--verify]

Measured in the same run, best of N wall-clock times:
  * baseline: `grep -rl DataParallel TREE` (the whole tree, as in the issue), and
    `grep -rl --include=*.py DataParallel TREE` (only the files check reads);
  * `dp2ddp check --select DDP001 TREE`: the rule of the `dp2ddp-check` pre-commit hook;
  * `dp2ddp check TREE`: all default rules (torch's own tree is full of real
    torch.distributed code, so this one parses far more), cold (--no-cache: every file
    is analysed) and warm (a result cache filled by one untimed run: nothing changed).
Targets (issue 4): <= 2 s wall on a 2-core machine and <= 15x grep; each is reported
on its own for every run.

--verify (alias --verify-pruning) also checks the tree with the default rules twice more,
without source pruning (``DP2DDP_NO_PRUNE=1``, see dp2ddp/prune_source.py) and with no
shortcut at all (``DP2DDP_REFERENCE=1``: no ast tier in the pre-filter, no pruning,
positions from LibCST's PositionProvider; slow), and compares the JSON reports: they
must be identical.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import sys
import time


def torch_tree(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import torch, os; print(os.path.dirname(torch.__file__))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def best(cmd, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - t)
        if proc.returncode not in (0, 1):
            raise SystemExit(f"{' '.join(cmd)} failed with exit {proc.returncode}")
    return min(times)


def verify(check, tree: str) -> None:
    """The default rules report the same findings with every shortcut and without."""
    reports = []
    for name, env in (("default", {}), ("no-prune", {"DP2DDP_NO_PRUNE": "1"}), ("reference", {"DP2DDP_REFERENCE": "1"})):
        t = time.perf_counter()
        proc = subprocess.run(
            check + ["--no-cache", "--format", "json", tree], capture_output=True, env={**os.environ, **env}
        )
        reports.append(proc.stdout)
        print(f"  {name:<9} {time.perf_counter() - t:8.2f} s, {len(proc.stdout)} bytes of JSON")
    same = reports[0] == reports[1] == reports[2]
    print(f"default == no-prune == reference over {tree}: {'yes' if same else 'NO'}")
    if not same:
        raise SystemExit(1)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", help="source tree (default: the installed torch package)")
    ap.add_argument("--python", default=sys.executable, help="interpreter with torch, to find its tree")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-default", action="store_true", help="only the DDP001 (pre-commit hook) run")
    ap.add_argument(
        "--verify", "--verify-pruning", action="store_true", help="compare with runs without pruning and without any shortcut"
    )
    args = ap.parse_args()
    tree = args.tree or torch_tree(args.python)
    n_files = sum(1 for r, _d, fs in os.walk(tree) for f in fs if f.endswith(".py"))
    check = [sys.executable, "-m", "dp2ddp", "check", "--exit-zero", "-q"]

    # warm the page cache once so that every contender reads from memory
    subprocess.run(["grep", "-rlq", "zzzz-not-there", tree], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = []
    grep_all = best(["grep", "-rl", "DataParallel", tree], args.repeat)
    grep_py = best(["grep", "-rl", "--include=*.py", "DataParallel", tree], args.repeat)
    rows.append(("grep -rl DataParallel (baseline)", grep_all))
    rows.append(("grep -rl --include=*.py DataParallel", grep_py))
    hook = best(check + ["--no-cache", "--select", "DDP001", tree], args.repeat)
    rows.append(("dp2ddp check --select DDP001 (hook)", hook))
    default = warm = None
    if not args.skip_default:
        default = best(check + ["--no-cache", tree], args.repeat)
        rows.append(("dp2ddp check (default rules, cold)", default))
        cache = tempfile.mkdtemp(prefix="dp2ddp-bench-cache-")
        try:
            subprocess.run(check + ["--cache-dir", cache, tree], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            warm = best(check + ["--cache-dir", cache, tree], args.repeat)
            rows.append(("dp2ddp check (default rules, warm)", warm))
        finally:
            shutil.rmtree(cache, ignore_errors=True)

    print(f"tree: {tree} ({n_files} .py files), cpus: {os.cpu_count()}")
    for name, t in rows:
        print(f"  {name:<40} {t:8.2f} s   {t / grep_all:6.1f}x grep   {t / grep_py:7.1f}x grep(*.py)")
    if args.verify:
        verify(check, tree)
    for name, t in (("DDP001 (hook)", hook), ("default rules, cold", default), ("default rules, warm", warm)):
        if t is not None:
            wall = "meets" if t <= 2.0 else "MISSES"
            ratio = "meets" if t / grep_all <= 15 else "MISSES"
            print(f"{name + ':':<21} <= 2 s wall: {wall:<6}  <= 15x grep: {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
