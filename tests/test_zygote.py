"""The zygote launch (tests/_zygote.py) against the real commands it stands for.

One probe script reports what a script can see of how it was started; it runs as plain
``python`` and under ``torchrun --standalone --nproc_per_node=2``, both for real and forked
from the zygotes, and the facts must agree (except those that differ between any two
launches: ports, run ids, pids, seeds).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests._scripts import retry_exit_abort, run_script

pytestmark = pytest.mark.torchrun

PROBE = r'''
import atexit, json, os, random, sys
import torch
import torch.distributed as dist

facts = {
    "argv": sys.argv, "file": __file__, "name": __name__, "path0": sys.path[0], "cwd": os.getcwd(),
    "pythonpath_on_path": [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p in sys.path],
    "guard": "sitecustomize" in sys.modules,
    "env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                           "ROLE_RANK", "ROLE_NAME", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE",
                                           "MASTER_ADDR", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                                           "OMP_NUM_THREADS", "TORCH_NCCL_ASYNC_ERROR_HANDLING")},
    "has": sorted(k for k in ("MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE") if k in os.environ),
    "threads": torch.get_num_threads(),
    "seeds": [random.random(), torch.initial_seed(), hash("dp2ddp")],
}
if "RANK" in os.environ:
    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    facts["sum"] = t.item()
    dist.destroy_process_group()
open("left-open-%s.txt" % os.environ.get("RANK", "-"), "w").write("flushed at exit\n")
atexit.register(lambda: print("ATEXIT", os.environ.get("RANK", "-"), flush=True))
open("facts-%s.json" % os.environ.get("RANK", "-"), "w").write(json.dumps(facts))
print("FACTS", flush=True)
if os.environ.get("PROBE_EXIT"):
    sys.exit(int(os.environ["PROBE_EXIT"]))
'''


def _facts(folder: Path) -> list:
    # each process writes its own file: two ranks printing to one pipe may interleave their lines
    return [json.loads(p.read_text()) for p in sorted(folder.glob("facts-*.json"))]


def _launch(tmp_path: Path, tag: str, nproc, real: bool, **env):
    d = tmp_path / tag
    d.mkdir()
    (d / "probe.py").write_text(PROBE)
    from tests._scripts import _env

    r = retry_exit_abort(lambda: run_script(["probe.py", "--flag", "two words"], d, env=dict(_env(), **env), nproc=nproc,
                                            real=real), tag)
    return d, r


def _comparable(facts: dict, folder: Path) -> dict:
    out = dict(facts)
    out.pop("seeds")
    for key in ("file", "path0", "cwd"):
        out[key] = out[key].replace(str(folder), "<dir>")
    return out


@pytest.mark.parametrize("nproc", [None, 2], ids=["python", "torchrun"])
def test_a_forked_launch_shows_the_script_what_the_real_command_does(tmp_path: Path, nproc) -> None:
    seen = {}
    for real in (True, False):
        tag = "real" if real else "forked"
        d, r = _launch(tmp_path, tag, nproc, real)
        assert r.returncode == 0, r.stdout[-3000:]
        facts = sorted(_facts(d), key=lambda f: f["env"]["RANK"] or "")
        assert len(facts) == (nproc or 1), r.stdout[-3000:]
        assert r.stdout.count("FACTS") == (nproc or 1)  # and stdout reached the caller from every process
        assert r.stdout.count("ATEXIT") == (nproc or 1)  # atexit handlers ran in every process
        for rank in ([str(i) for i in range(nproc)] if nproc else ["-"]):
            assert (d / f"left-open-{rank}.txt").read_text() == "flushed at exit\n"
        seen[tag] = facts
    for forked, real in zip(seen["forked"], seen["real"]):
        forked, real = _comparable(forked, tmp_path / "forked"), _comparable(real, tmp_path / "real")
        diff = {k: (forked.get(k), real.get(k)) for k in set(forked) | set(real) if forked.get(k) != real.get(k)}
        diff.update({k: (forked["env"].get(k), real["env"].get(k)) for k in real["env"] if forked["env"].get(k) != real["env"].get(k)})
        assert forked == real, diff
    if nproc:
        for tag in seen:  # two processes: their own random state and string hashes
            a, b = (f["seeds"] for f in seen[tag])
            assert a[0] != b[0] and a[1] != b[1] and a[2] != b[2], (tag, a, b)
        assert seen["forked"][0]["sum"] == 3.0


def test_a_forked_launch_reports_failures_as_the_real_command_does(tmp_path: Path) -> None:
    for nproc, want in ((None, 3), (2, 1)):  # sys.exit(3): python exits 3; torchrun 1
        for real in (True, False):
            _, r = _launch(tmp_path, f"exit-{nproc}-{real}", nproc, real, PROBE_EXIT="3")
            assert r.returncode == want, (nproc, real, r.stdout[-2000:])


# what a verify report says that depends on how fast its runs went
_TIMING = ("speedup", "speed", "throughput", "runs", "pairs")


def _untimed(rep: dict, out_dir: Path) -> dict:
    rep = {k: v for k, v in rep.items() if k not in _TIMING}
    for side in ("original", "migrated"):
        rep[side] = {k: v for k, v in rep[side].items() if k not in ("wall_s", "samples_per_s")}
    for f in rep["outputs"]["files"]:
        if f["kind"] == "events":  # named by the time and the pid of the process that wrote them
            f["names"] = [re.sub(r"\.\d+\.(\w+)\.\d+\.", r".<time>.\1.<pid>.", n) for n in f["names"]]
    return json.loads(json.dumps(rep).replace(str(out_dir), "<out>"))


def test_a_forked_verify_reports_what_a_real_verify_does(tmp_path: Path) -> None:
    """dp2ddp verify forked with its runs (tests/_zygote.py run_verify, tests/_verify_launch.py:
    how the other verify tests run it) and for real: the same report but for the timings.
    Every kind of process a verify starts takes part: the original, torchrun's two ranks, the
    envelope, the checkpoint loaders (the writer fixture saves checkpoints, a log, TensorBoard
    events and results)."""
    from tests.verify_helpers import fixture, verify

    reports = {}
    for real in (True, False):
        tag = "real" if real else "forked"
        work, out_dir = tmp_path / tag, tmp_path / f"results-{tag}"
        work.mkdir()
        code, rep, out, _ = verify(work, fixture("writer.py"), "--migrated", fixture("writer_ddp.py"), "--steps", "0",
                                   "--min-speedup", "0", "--threads", "1", "--workdir", str(tmp_path / "scratch"),
                                   "--", "--out-dir", str(out_dir), real=real)
        assert code == 0 and rep is not None, out
        assert {f["kind"] for f in rep["outputs"]["files"]} >= {"checkpoint", "events", "text", "json"}, out
        reports[tag] = _untimed(rep, out_dir)
    real, forked = reports["real"], reports["forked"]
    assert forked == real, {k: (forked.get(k), real.get(k)) for k in set(forked) | set(real) if forked.get(k) != real.get(k)}


def test_a_launch_whose_port_was_taken_is_retried_and_a_plain_failure_is_not():
    """The harness's retry (tests/_scripts.py): a run that failed because the free port its
    ranks were given was taken before rank 0 listened (EADDRINUSE, a flake of parallel
    launches) runs again, with a warning; a run that failed for anything else does not."""
    import subprocess
    import warnings

    from tests._scripts import retry_exit_abort

    taken = subprocess.CompletedProcess([], 1, "torch.distributed.DistNetworkError: ... EADDRINUSE, message: address already in use", "")
    ok = subprocess.CompletedProcess([], 0, "done", "")
    bad = subprocess.CompletedProcess([], 1, "ValueError: a bug", "")
    results = [taken, ok]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert retry_exit_abort(lambda: results.pop(0), "t") is ok
    assert any("rendezvous port was taken" in str(w.message) for w in seen)
    calls = []
    assert retry_exit_abort(lambda: calls.append(1) or bad, "t") is bad and len(calls) == 1
