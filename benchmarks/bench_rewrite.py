"""Benchmark `dp2ddp rewrite`: throughput and CLI start-up, each beside a baseline
measured in the same run.

    python benchmarks/bench_rewrite.py [--lines 1000] [--reps 7] [--json out.json]

Targets (issue #2): CLI start-up under 0.3 s; a 1,000-line script migrated in under 0.5 s.
Baselines: `python -c pass` (interpreter start-up) and a bare `libcst.parse_module` of
the same script (the floor for any LibCST codemod).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_script import generate  # noqa: E402


def _time_cmd(cmd, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _time_fn(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args()

    import libcst

    from dp2ddp.migrate import migrate_bytes

    text = generate(args.lines)
    data = text.encode()
    n_lines = text.count("\n")
    migrated = migrate_bytes(data, "big.py")
    assert migrated.changed and not migrated.migration.blocked

    t_parse = _time_fn(lambda: libcst.parse_module(data), args.reps)
    t_migrate = _time_fn(lambda: migrate_bytes(data, "big.py"), args.reps)

    py = sys.executable
    t_python = _time_cmd([py, "-c", "pass"], args.reps)
    t_import_libcst = _time_cmd([py, "-c", "import libcst"], args.reps)
    t_version = _time_cmd([py, "-m", "dp2ddp", "--version"], args.reps)
    t_help = _time_cmd([py, "-m", "dp2ddp", "rewrite", "--help"], args.reps)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "big.py")
        Path(src).write_text(text)
        t_cli = _time_cmd([py, "-m", "dp2ddp", "rewrite", "-q", src, "-o", os.path.join(tmp, "out.py")], args.reps)

    results = {
        "lines": n_lines,
        "parse_s": t_parse,
        "migrate_s": t_migrate,
        "migrate_lines_per_s": n_lines / t_migrate,
        "parse_lines_per_s": n_lines / t_parse,
        "migrate_over_parse": t_migrate / t_parse,
        "python_startup_s": t_python,
        "import_libcst_s": t_import_libcst,
        "cli_version_s": t_version,
        "cli_rewrite_help_s": t_help,
        "cli_rewrite_file_s": t_cli,
        "cli_startup_over_python": t_version / t_python,
    }
    print(f"rewrite benchmark ({n_lines}-line generated script, median of {args.reps})")
    print(f"  migrate in-process      {t_migrate * 1000:8.1f} ms  {n_lines / t_migrate:9.0f} lines/s   target < 500 ms: {'ok' if t_migrate < 0.5 else 'MISSED'}")
    print(f"  baseline libcst parse   {t_parse * 1000:8.1f} ms  {n_lines / t_parse:9.0f} lines/s   migrate/parse = {t_migrate / t_parse:.1f}x")
    print(f"  CLI start-up --version  {t_version * 1000:8.1f} ms   target < 300 ms: {'ok' if t_version < 0.3 else 'MISSED'}")
    print(f"  baseline python -c pass {t_python * 1000:8.1f} ms   start-up/python = {t_version / t_python:.1f}x")
    print(f"  rewrite --help          {t_help * 1000:8.1f} ms")
    print(f"  import libcst           {t_import_libcst * 1000:8.1f} ms")
    print(f"  rewrite big.py (CLI)    {t_cli * 1000:8.1f} ms   (start-up + import libcst + migrate + write)")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
