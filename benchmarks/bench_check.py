"""Benchmark: `dp2ddp check` against Python's own parser, on the same files, in one run.

    python benchmarks/bench_check.py [--lines N] [--tree DIR] [--repeat N] [--no-torch]
                                     [--pip PACKAGE] [--compare-with DIR] [--keep DIR]

Trees (each measured on its own):
  * ``corpus``: real-style training scripts written by ``benchmarks/gen_script.py``
    (ImageNet-example, NLP-finetuning, image-model trainer, detector and CIFAR styles;
    ``--lines``, default 45,000), in a temporary folder;
  * ``torch``: torch's installed package (unless ``--no-torch``);
  * ``--tree DIR``: any folder (e.g. real repositories you have);
  * ``--pip PACKAGE``: a pure-Python package pip installs into a temporary folder at bench
    time (never into the project's environment).

For each tree, best of ``--repeat`` wall-clock times, measured in this run, and the CPU
time (user + system, every process of the run) of that best run, which other work on a
shared machine distorts less:
  * ``ast.parse``: this process reads and parses every ``.py`` file of the tree (the
    baseline: what the cheapest possible analysis costs);
  * ``check cold``: ``dp2ddp check --no-cache`` with the default rules (every file read,
    gated, and where a rule may fire parsed, modelled and checked), a new process;
  * ``check warm``: the same with a filled result cache;
  * ``hook``: the pre-commit hook's command, ``dp2ddp check --select DDP001 --new-only``,
    in a git repository holding the tree with one file changed (``git diff`` included).
The ratios to ``ast.parse`` are printed; the targets (issue: "one semantic model") are
cold check <= 2x ast.parse on the training-script corpus, and <= 3 s on torch's tree.

``--compare-with DIR`` also times the dp2ddp found in DIR (a checkout, e.g. an older
commit unpacked with ``git archive``) on the same trees, for before/after figures.
"""

from __future__ import annotations

import argparse
import ast
import gc
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from gen_script import write_corpus  # noqa: E402


def torch_tree(python: str) -> Optional[str]:
    out = subprocess.run(
        [python, "-c", "import torch, os; print(os.path.dirname(torch.__file__))"], capture_output=True, text=True
    )
    return out.stdout.strip() if out.returncode == 0 else None


def py_files(tree: str) -> List[str]:
    return sorted(os.path.join(r, f) for r, _d, fs in os.walk(tree) for f in fs if f.endswith(".py"))


def _cpu_of(fn) -> float:
    c = time.process_time()
    fn()
    return time.process_time() - c


def parse_time(files: List[str]) -> float:
    """Read and ``ast.parse`` every file, in this process (garbage collection off, as
    `check` runs)."""
    gc.collect()
    gc.disable()
    t = time.perf_counter()
    for f in files:
        with open(f, "rb") as fh:
            data = fh.read()
        try:
            ast.parse(data)
        except (SyntaxError, ValueError):
            pass
    took = time.perf_counter() - t
    gc.enable()
    return took


def best(fn, repeat: int, label: str = "") -> float:
    """The best wall-clock time of ``repeat`` runs (and, in ``CPU[label]``, the CPU time
    that run used: less sensitive to other work on a shared machine)."""
    runs = []
    for _ in range(repeat):
        c = time.process_time()
        w = fn()
        runs.append((w, getattr(run_time, "cpu", None) if label else time.process_time() - c))
        run_time.cpu = None  # type: ignore[attr-defined]
    w, cpu = min(runs, key=lambda r: r[0])
    if label:
        CPU[label] = cpu if cpu is not None else float("nan")
    return w


CPU: Dict[str, float] = {}  # label -> CPU seconds (user + system, all processes) of the best run


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_time(cmd: List[str], cwd: Optional[str] = None, env: Optional[Dict[str, str]] = None) -> float:
    c = _children_cpu()
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    took = time.perf_counter() - t
    run_time.cpu = _children_cpu() - c  # type: ignore[attr-defined]
    if proc.returncode not in (0, 1) or b"Traceback" in proc.stderr:
        raise SystemExit(f"{' '.join(cmd)} failed with exit {proc.returncode}: {proc.stderr.decode()[-500:]}")
    return took


# A pip-installed dp2ddp has its bytecode compiled at install time; a checkout run with
# PYTHONDONTWRITEBYTECODE=1 (as on our machines) compiles every one of its modules on every
# run instead (about 0.15 s here). compiled_copy() copies a contender's package into the
# scratch folder and compiles it there, so each timed run starts like an installed one.
def compiled_copy(package: str, into: str) -> str:
    dest = os.path.join(into, "dp2ddp")
    shutil.copytree(package, dest, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "compileall", "-q", dest], stdout=subprocess.DEVNULL, check=True)
    return into


def check_cmd(source: str) -> List[str]:
    """``dp2ddp check`` of the dp2ddp package in folder ``source``."""
    # -P: the current folder is not put on sys.path (a tree's own `signal` package, say,
    # would shadow the standard library's when the hook runs inside it)
    safe = ["-P"] if sys.version_info >= (3, 11) else []
    code = f"import sys; sys.path.insert(0, {source!r}); from dp2ddp.cli import console_main; sys.argv[0] = 'dp2ddp'; console_main()"
    return [sys.executable, *safe, "-c", code, "check"]


def hook_repo(tree: str, files: List[str], into: str) -> str:
    """A git repository holding ``tree``'s ``.py`` files, committed, with one file changed."""
    repo = tempfile.mkdtemp(prefix="hook-repo-", dir=into)
    for f in files:
        dest = os.path.join(repo, os.path.relpath(f, tree))
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(f, dest)
    git = ["git", "-c", "user.name=b", "-c", "user.email=b@example.com", "-c", "commit.gpgsign=false"]
    subprocess.run(git + ["init", "-q"], cwd=repo, check=True)
    subprocess.run(git + ["add", "-A"], cwd=repo, check=True)
    subprocess.run(git + ["commit", "-q", "-m", "tree"], cwd=repo, check=True)
    changed = os.path.join(repo, os.path.relpath(files[len(files) // 2], tree))
    with open(changed, "a") as fh:
        fh.write("\nimport torch.nn as nn\nnew_model = nn.DataParallel(nn.Linear(2, 2))\n")
    return repo


def measure(name: str, tree: str, repeat: int, contenders: List[Tuple[str, str]], scratch: str) -> Dict[str, float]:
    """Time ``ast.parse`` of ``tree`` and, for each ``(label suffix, package folder)``
    contender, a cold check, a warm check and the hook."""
    files = py_files(tree)
    lines = 0
    for f in files:
        with open(f, "rb") as fh:
            lines += fh.read().count(b"\n")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\n{name}: {tree} ({len(files)} .py files, {lines:,} lines), cpus: {os.cpu_count()}, load {load:.1f}", flush=True)
    parse_time(files)  # warm the page cache once so that every contender starts alike
    rows: Dict[str, float] = {}
    rows["ast.parse (this process)"] = best(lambda: parse_time(files), repeat, "")
    CPU["ast.parse (this process)"] = min(_cpu_of(lambda: parse_time(files)) for _ in range(repeat))
    base = rows["ast.parse (this process)"]
    repo = hook_repo(tree, files, scratch)
    for suffix, source in contenders:
        cmd = check_cmd(source) + ["--exit-zero", "-q"]
        label = "check cold (default rules, --no-cache)" + suffix
        rows[label] = best(lambda: run_time(cmd + ["--no-cache", tree]), repeat, label)
        cache = tempfile.mkdtemp(prefix="bench-cache-", dir=scratch)
        run_time(cmd + ["--cache-dir", cache, tree])
        label = "check warm (result cache)" + suffix
        rows[label] = best(lambda: run_time(cmd + ["--cache-dir", cache, tree]), repeat, label)
        hook = cmd + ["--no-cache", "--select", "DDP001", "--new-only", "."]
        label = "hook (--select DDP001 --new-only)" + suffix
        rows[label] = best(lambda: run_time(hook, cwd=repo), repeat, label)
    cbase = CPU["ast.parse (this process)"]
    print(f"  {'':<48} {'wall':>9}  {'':<14} {'CPU (all processes)':>20}")
    for label, t in rows.items():
        cpu = CPU.get(label, float("nan"))
        print(f"  {label:<48} {t:7.2f} s  {t / base:5.2f}x parse   {cpu:7.2f} s  {cpu / cbase:5.2f}x parse", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=45000, help="lines of the generated training-script corpus")
    ap.add_argument("--tree", action="append", default=[], help="also measure this folder")
    ap.add_argument("--no-torch", action="store_true", help="skip torch's installed tree")
    ap.add_argument("--pip", metavar="PACKAGE", help="also measure a package pip installs into a temporary folder")
    ap.add_argument("--python", default=sys.executable, help="interpreter with torch, to find its tree")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--compare-with", metavar="DIR", help="also time the dp2ddp of this checkout")
    ap.add_argument("--keep", metavar="DIR", help="write the corpus here and keep it")
    args = ap.parse_args()

    scratch = tempfile.mkdtemp(prefix="dp2ddp-bench-")
    results = {}
    try:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        contenders = [("", compiled_copy(os.path.join(here, "dp2ddp"), os.path.join(scratch, "current")))]
        if args.compare_with:
            contenders.append((" [compared]", compiled_copy(os.path.join(args.compare_with, "dp2ddp"), os.path.join(scratch, "compared"))))
        corpus_dir = args.keep or os.path.join(scratch, "corpus")
        write_corpus(corpus_dir, args.lines)
        results["corpus"] = measure("corpus (generated training scripts)", corpus_dir, args.repeat, contenders, scratch)
        trees = [(f"tree {i}", t) for i, t in enumerate(args.tree)]
        if args.pip:
            target = os.path.join(scratch, "pip")
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target, args.pip], check=True)
            trees.append((f"pip {args.pip}", target))
        if not args.no_torch:
            t = torch_tree(args.python)
            if t:
                trees.append(("torch", t))
        for name, tree in trees:
            results[name] = measure(name, tree, args.repeat, contenders, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    print("\ntargets:")
    c = results["corpus"]
    ratio = c["check cold (default rules, --no-cache)"] / c["ast.parse (this process)"]
    print(f"  corpus: cold check <= 2x ast.parse: {ratio:.2f}x -> {'meets' if ratio <= 2 else 'MISSES'}")
    if "torch" in results:
        t = results["torch"]["check cold (default rules, --no-cache)"]
        print(f"  torch:  cold check <= 3 s: {t:.2f} s -> {'meets' if t <= 3 else 'MISSES'}")
    if args.compare_with:
        for name, rows in results.items():
            now, then = rows["hook (--select DDP001 --new-only)"], rows["hook (--select DDP001 --new-only) [compared]"]
            print(f"  {name}: hook {now:.2f} s vs {then:.2f} s compared -> {'no slower' if now <= then * 1.05 else 'SLOWER'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
