"""`dp2ddp verify`: run the original and the migrated script side by side and compare them."""

from __future__ import annotations

import shutil
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Dict, Optional

import click

EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class _Threads(click.ParamType):
    """``N`` (both runs) or ``N,M`` (original, each migrated process): positive integers."""

    name = "threads"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        parts = str(value).split(",")
        if len(parts) in (1, 2) and all(p.strip().isdigit() and int(p) >= 1 for p in parts):
            n = [int(p) for p in parts]
            return (n[0], n[-1])
        self.fail(f"{value!r} is not N or N,M with positive integers (threads per process)", param, ctx)


@click.command(
    "verify",
    context_settings={"help_option_names": ["-h", "--help"]},
    short_help="Run original and migrated scripts side by side and compare them.",
)
@click.argument("original", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--migrated", type=click.Path(dir_okay=False, path_type=Path), help="The DDP script (default: <stem>_ddp.py beside ORIGINAL, else a fresh rewrite).")
@click.option("--nproc", type=click.IntRange(min=1), help="Processes per node for the migrated run (default: GPU count, or 2 on CPU).")
@click.option("--nnodes", type=click.IntRange(min=1), default=1, show_default=True, help="torchrun agents on this machine (c10d rendezvous on 127.0.0.1).")
@click.option("--steps", type=click.IntRange(min=0), default=50, show_default=True, help="Stop each run after K optimizer steps (0: the whole run).")
@click.option("--warmup", type=click.IntRange(min=0), default=5, show_default=True, help="Steps left out of the throughput.")
@click.option("--rtol", type=click.FloatRange(min=0), default=1e-5, show_default=True, help="Relative loss difference per step that always passes (float precision); above it the measured noise envelope decides (or, without one, this is the tolerance).")
@click.option("--stochastic-rtol", type=click.FloatRange(min=0), default=0.1, show_default=True, help="Tolerance on the moving-average loss for models with BatchNorm or dropout.")
@click.option("--max-steps", type=click.IntRange(min=0), default=400, show_default=True, help="The first migrated run goes on past --steps until its training loader begins its second epoch, up to this many steps (0: stop at --steps).")
@click.option("--min-speedup", type=click.FloatRange(min=0), default=None, help="Speed-up (migrated/original samples/s) needed to pass, judged on the 95% interval of several pairs (fails when the whole interval is below); 0 ignores speed [default: 1.0 on CUDA; on CPU reported, not judged].")
@click.option("--repeat", type=click.IntRange(min=1), default=None, help="Measured pairs of runs (original and migration, alternating) [default: 3, fewer when a pair takes long: 2 minutes of runs in all]. A first pair under 30 s is an extra warm-up pair.")
@click.option("--threads", type=_Threads(), default=None, metavar="N[,M]", help="OMP_NUM_THREADS of each process: N for both runs, or N for the original and M for each migrated process [default: OMP_NUM_THREADS if set, else cores // processes, the same for both].")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=120.0, show_default=True, help="Seconds without a completed step before a run counts as hung.")
@click.option("--startup-timeout", type=click.FloatRange(min=0), default=60.0, show_default=True, help="Before the first step (imports, data, rendezvous), the hang timeout is at least this.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for random, NumPy and torch in every process.")
@click.option("--json", "json_path", metavar="PATH", help="Write the report as JSON ('-' for stdout).")
@click.option("--plot", "plot_path", metavar="PATH", help="Write a PNG: loss curves, every run's throughput, the speed-up per pair; a caption on threads, speed and outputs.")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), help="Scratch folder (kept); default: a temporary one, removed after a pass.")
@click.option("--project-root", type=click.Path(file_okay=False, exists=True, path_type=Path), help="The project the script belongs to, importable in both runs [default: the nearest folder above ORIGINAL with pyproject.toml, setup.py, setup.cfg or .git].")
@click.option("--envelope/--no-envelope", default=True, show_default=True, help="Measure the float-noise envelope (the original again, each batch in world-size chunks) and judge the losses against it.")
def verify(
    original: Path,
    script_args: tuple,
    migrated: Optional[Path],
    nproc: Optional[int],
    nnodes: int,
    steps: int,
    warmup: int,
    rtol: float,
    stochastic_rtol: float,
    max_steps: int,
    min_speedup: Optional[float],
    repeat: Optional[int],
    threads: Optional[tuple],
    timeout: float,
    startup_timeout: float,
    seed: int,
    json_path: Optional[str],
    plot_path: Optional[str],
    workdir: Optional[Path],
    project_root: Optional[Path],
    envelope: bool,
) -> int:
    """Run ORIGINAL (DataParallel, `python`) and its DDP migration (`torchrun`) on this machine,
    compare their per-step losses, final replicas and the files they write, and measure the
    speed-up over alternating pairs of runs.

    Arguments after `--` go to both scripts. Exit 0 pass, 1 fail, 2 usage error, 130 interrupted."""
    err = click.get_text_stream("stderr")
    if not original.is_file():
        click.echo(f"{original}: no such file", err=True)
        return EXIT_USAGE
    try:
        import torch  # noqa: F401
        import torch.distributed.run  # noqa: F401
    except ImportError:
        click.echo("dp2ddp verify needs torch: pip install 'dp2ddp[verify]'", err=True)
        return EXIT_USAGE
    if json_path and json_path != "-" and not Path(json_path).parent.exists():
        click.echo(f"{json_path}: folder does not exist", err=True)
        return EXIT_USAGE
    if plot_path and not Path(plot_path).parent.exists():
        click.echo(f"{plot_path}: folder does not exist", err=True)
        return EXIT_USAGE

    from dp2ddp.verify import scratch as scratch_mod

    migrated_content: Optional[bytes] = None
    helpers: Dict[Path, bytes] = {}  # a project migration: the migrated helper modules
    if migrated is None:
        candidate = original.with_name(original.stem + "_ddp.py")
        if candidate.is_file():
            migrated = candidate
        else:
            rc = _rewrite(original)
            if isinstance(rc, int):
                return rc
            migrated, (migrated_content, helpers) = candidate, rc
    elif not migrated.is_file():
        click.echo(f"{migrated}: no such file", err=True)
        return EXIT_USAGE
    else:
        helpers = scratch_mod.migrated_modules(original, migrated)
    if original.resolve() == migrated.resolve():
        click.echo(f"{migrated}: the migrated script is the original itself", err=True)
        return EXIT_USAGE

    root = scratch_mod.project_root(original, project_root)
    if root not in original.resolve().parents:
        click.echo(f"{original}: not inside --project-root {project_root}", err=True)
        return EXIT_USAGE
    overlays = scratch_mod.in_root(root, helpers)
    if len(overlays) < len(helpers):
        outside = sorted(str(p) for p in helpers if scratch_mod.relative_in(root, p) is None)
        click.echo(f"{original}: migrated project modules outside the project root {root}: {', '.join(outside)} "
                   "(--project-root DIR takes a folder above them)", err=True)
        return EXIT_USAGE
    run_cwd = scratch_mod.run_cwd(root, original, Path.cwd())

    own_scratch = workdir is None
    scratch = Path(tempfile.mkdtemp(prefix="dp2ddp-verify-")) if own_scratch else workdir
    scratch.mkdir(parents=True, exist_ok=True)
    scratch = scratch.resolve()

    import torch

    cuda = torch.cuda.is_available()
    if nproc is None:
        nproc = torch.cuda.device_count() if cuda else 0
        nproc = nproc or 2
    speed_notes = []
    if min_speedup is None:
        min_speedup = 1.0 if cuda else 0.0
        if not cuda:
            speed_notes.append("speed reported, not judged: on CPU a few cores cannot show DDP's gain "
                               "(--min-speedup X judges it)")

    from dp2ddp.verify import analyze, options, report, runner, session, speed

    original, migrated = original.resolve(), migrated.resolve()
    opts = options.Options(
        steps=steps,
        warmup=warmup,
        rtol=rtol,
        stochastic_rtol=stochastic_rtol,
        min_speedup=min_speedup,
        timeout=timeout,
        user_dirs=[str(scratch)],
        nproc=nproc,
        nnodes=nnodes,
        migrated=str(migrated),
    )
    budget = speed.thread_budget(threads, nproc * nnodes)
    setup = session.Setup(
        scratch=scratch, original=original, migrated=migrated, migrated_content=migrated_content,
        args=list(script_args), tag=uuid.uuid4().hex[:12], steps=steps, timeout=timeout,
        startup_timeout=startup_timeout, seed=seed, nproc=nproc, nnodes=nnodes, threads=budget,
        repeat=repeat, opts=opts, root=root, cwd=run_cwd, extend=max_steps, envelope=envelope,
        overlays=overlays,
    )
    progress = _Progress(err, steps)
    restore = _sigterm_as_interrupt()
    try:
        outcome = session.run(setup, progress)
    except (runner.Interrupted, KeyboardInterrupt):
        progress.close()
        click.echo("Interrupted: every process verify started has been ended.", err=True)
        _cleanup(scratch, own_scratch)
        return EXIT_INTERRUPTED
    finally:
        restore()
    rep = analyze.combine(outcome.pairs, outcome.outputs, budget, opts, outcome.notes + speed_notes)
    touched = outcome.mirror.modified()
    if touched:
        rep["problems"].append("your files changed during the runs (verify's guard should have kept them as they "
                               "were; a writer it does not see, such as a C library?): " + ", ".join(touched))
        rep["verdict"] = "fail"
    touched = outcome.mirror.touched()
    if touched:
        rep["notes"].append("your files were opened for writing during the runs by code verify's guard does not see (a C "
                            "library, such as HDF5 opening a file 'r+'), which changed their times but not a byte of "
                            "their contents: " + ", ".join(touched))
    folders = outcome.mirror.modified(folders=True)
    if folders:
        rep["notes"].append("entries changed during the runs in folders of your project the runs saw through links "
                            "(by you working meanwhile, or by a writer verify's guard does not see): " + ", ".join(folders[:4]))
    blocked = sorted({p for pair in outcome.pairs for run in pair.runs.values() for r in run.ranks.values()
                      for p in ((r.end or {}).get("blocked") or [])})
    if blocked:
        rep["problems"].append("the scripts tried to write into your project, which verify refused (PermissionError): "
                               + ", ".join(blocked[:4]) + ("" if len(blocked) <= 4 else f" and {len(blocked) - 4} more")
                               + "; write relative paths (the runs work in a copy of the project)")
        rep["verdict"] = "fail"
    rep["project_root"] = str(root)
    if speed_notes and rep.get("speed"):
        rep["speed"]["judgement"] = "on CPU by default; --min-speedup X judges it"
    rep["original"]["script"] = str(original)
    rep["migrated"]["script"] = str(migrated) + (" (rewritten by dp2ddp)" if migrated_content is not None else "")
    rep["workdir"] = str(scratch)
    if migrated_content is not None:
        rep["notes"].append(f"migrated script rewritten from {original.name} into {outcome.migrated_script}")
    if overlays:
        rep["migrated"]["helpers"] = [str(p) for p in sorted(overlays)]
        rep["notes"].append("a project migration: the migrated runs use the migrated "
                            + ("helper modules rewritten by dp2ddp (" if migrated_content is not None
                               else f"project modules beside {migrated} (")
                            + ", ".join(str(p) for p in sorted(overlays)) + ") in place of the project's own")
    crash = next(iter(rep.get("crashes", [])), None)
    if crash and crash.get("traceback"):
        who = f"rank {crash['rank']}" if crash["role"] == "migrated" and "rank" in crash else crash["role"]
        err.write(f"--- traceback of {who} ({crash['role']} run) ---\n{crash['traceback'].rstrip()}\n---\n")
    report.show(rep, sys.stdout if json_path != "-" else err)
    if json_path:
        report.write_json(rep, json_path)
    if plot_path:
        report.plot(rep, plot_path)
    passed = rep["verdict"] == "pass"
    if passed and own_scratch:
        _cleanup(scratch, True)
    else:
        click.echo(f"logs and records kept in {scratch}", err=True)
    return EXIT_PASS if passed else EXIT_FAIL


def _rewrite(original: Path):
    """Migrate ORIGINAL in memory; returns ``(bytes, {helper module path: bytes})`` (the
    helpers of a project whose DataParallel lives in its modules, migrated as ``rewrite
    --with-helpers`` would), or an exit code with a message shown."""
    from dp2ddp.source import InputError

    helpers: Dict[Path, bytes] = {}
    try:
        from dp2ddp.migrate import migrate_file, migrate_project

        result = migrate_file(str(original))
        if result.migration.blocked:
            # what `rewrite --with-helpers` migrates: DataParallel in a project module (DDP151), a
            # project module that trains on its own loaders (DDP105)
            project = migrate_project(str(original))
            only_helpers = {w.code for w in result.migration.warnings if w.severity == "error"} == {"DDP151"}
            if not project.blocked and len(project.files) > 1:
                result = project.files[0].result
                helpers = {original.resolve().parent / f.rel: f.result.output for f in project.files[1:] if f.result.changed}
            elif only_helpers:
                result = next(f.result for f in project.files if f.result.migration.blocked)
    except InputError as e:
        click.echo(str(e), err=True)
        return EXIT_USAGE
    except NotImplementedError:
        click.echo(f"{original}: the rewrite is not available; pass --migrated PATH", err=True)
        return EXIT_USAGE
    if result.migration.blocked:
        reasons = "; ".join(f.message for f in result.migration.warnings[:3])
        click.echo(f"{original}: cannot be rewritten automatically ({reasons}); pass --migrated PATH", err=True)
        return EXIT_USAGE
    if not result.changed:
        click.echo(f"{original}: nothing to migrate (no DataParallel found); pass --migrated PATH", err=True)
        return EXIT_USAGE
    return result.output, helpers


def _cleanup(scratch: Path, own: bool) -> None:
    if own:
        shutil.rmtree(scratch, ignore_errors=True)


def _sigterm_as_interrupt():
    """While runs are going, SIGTERM to verify ends them like Ctrl-C does."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, old)


class _Progress:
    """rich progress bars on a terminal, a few plain lines otherwise."""

    def __init__(self, stream, steps: int) -> None:
        self.stream, self.steps = stream, steps
        self.tty = stream.isatty()
        self.bar = None
        self.task = None
        self.last = 0.0
        self.role = self.label = ""

    def begin(self, role: str, how: str, label: str = "") -> None:
        self.role, self.label = role, label
        self.t0 = time.monotonic()
        prefix = f"{label}: " if label else ""
        if self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(
                TextColumn(f"{prefix}{role} ({how})"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=Console(file=self.stream), transient=False,
            )
            self.bar.start()
            self.task = self.bar.add_task(role, total=self.steps or None)
        else:
            self.stream.write(f"verify: {prefix}{role} run ({how}) started\n")
            self.stream.flush()

    def update(self, role: str, step: int, ranks) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=step)
        elif time.monotonic() - self.last > 5.0 and step:
            self.last = time.monotonic()
            total = f"/{self.steps}" if self.steps else ""
            prefix = f"{self.label}: " if self.label else ""
            self.stream.write(f"verify: {prefix}{self.role} step {step}{total}\n")  # the envelope's probe reports as "original"
            self.stream.flush()

    def end(self, result) -> None:
        self.close()
        state = "hung" if result.hung else f"exit code {result.exit_code}"
        prefix = f"{self.label}: " if self.label else ""
        self.stream.write(f"verify: {prefix}{self.role} run: {result.steps} steps in {result.wall_s:.1f} s, {state}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
