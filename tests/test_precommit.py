"""The pre-commit hooks, with real pre-commit: the hook environment is built from a
commit of this checkout (uncommitted work included), installs without torch, and
`dp2ddp-check` blocks only *new* DataParallel usage."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PRE_COMMIT = shutil.which("pre-commit", path=str(BIN)) or shutil.which("pre-commit")

pytestmark = [
    pytest.mark.slow,
    # one worker runs them all: the module's hook environment (a pip install, ~100 s of CPU) is
    # then built once, not once on each worker that gets one of these tests
    pytest.mark.xdist_group("precommit"),
    pytest.mark.skipif(PRE_COMMIT is None or shutil.which("git") is None, reason="needs pre-commit and git"),
]

LEGACY = textwrap.dedent(
    """\
    import torch.nn as nn

    model = nn.DataParallel(Net())
    """
)


def git(cwd, *args, check=True):
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false", *args],
        cwd=cwd,
        check=check,
        capture_output=True,
        text=True,
        timeout=600,
    )


def snapshot_checkout(dest: Path) -> str:
    """Commit the working tree (tracked and untracked, not ignored) into a new repo."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if not src.is_file():
            continue  # deleted in the working tree
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    git(dest, "init", "-q", "-b", "main")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "snapshot")
    return git(dest, "rev-parse", "HEAD").stdout.strip()


@pytest.fixture(scope="module")
def hook_project(tmp_path_factory):
    base = tmp_path_factory.mktemp("precommit")
    hookrepo = base / "hookrepo"
    hookrepo.mkdir()
    rev = snapshot_checkout(hookrepo)
    proj = base / "proj"
    proj.mkdir()
    git(proj, "init", "-q", "-b", "main")
    (proj / ".pre-commit-config.yaml").write_text(
        f"repos:\n- repo: {hookrepo}\n  rev: {rev}\n  hooks:\n  - id: dp2ddp-check\n"
    )
    (proj / "legacy.py").write_text(LEGACY)
    git(proj, "add", "-A")
    git(proj, "commit", "-q", "--no-verify", "-m", "legacy code")
    env = {
        **os.environ,
        "PRE_COMMIT_HOME": str(base / "cache"),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    subprocess.run([PRE_COMMIT, "install"], cwd=proj, env=env, check=True, capture_output=True, timeout=120)
    # build the hook environment once (pip-installs the snapshot)
    proc = subprocess.run(
        [PRE_COMMIT, "install-hooks"], cwd=proj, env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proj, env, base / "cache"


def commit(proj, env, message):
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false",
         "commit", "-m", message],
        cwd=proj,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_hook_env_has_no_torch(hook_project):
    proj, env, cache = hook_project
    pythons = [p for p in cache.rglob("bin/python") if p.parent.parent.joinpath("pyvenv.cfg").exists()]
    assert pythons, "no hook virtualenv was built"
    for py in pythons:
        proc = subprocess.run(
            [str(py), "-c", "import importlib.util as u; print(u.find_spec('torch') is None, u.find_spec('libcst') is not None)"],
            capture_output=True,
            text=True,
        )
        assert proc.stdout.split() == ["True", "True"], proc.stdout + proc.stderr


def test_commit_adding_data_parallel_is_blocked(hook_project):
    proj, env, _ = hook_project
    (proj / "new_model.py").write_text("from torch.nn import DataParallel as DP\n\nnet = DP(net)\n")
    git(proj, "add", "new_model.py")
    proc = commit(proj, env, "add DP")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "new_model.py:3:7: DDP001" in out
    git(proj, "reset", "-q", "HEAD")
    (proj / "new_model.py").unlink()


def test_commit_touching_legacy_file_passes(hook_project):
    proj, env, _ = hook_project
    (proj / "legacy.py").write_text(LEGACY + "print('still DataParallel, but nothing new')\n")
    git(proj, "add", "legacy.py")
    proc = commit(proj, env, "touch legacy")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # adding DataParallel to the legacy file is blocked, on the added line only
    (proj / "legacy.py").write_text(LEGACY + "other = nn.DataParallel(Other())\n")
    git(proj, "add", "legacy.py")
    proc = commit(proj, env, "more DP in legacy")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "legacy.py:4:9: DDP001" in out and "legacy.py:3:" not in out
    git(proj, "reset", "-q", "--hard", "HEAD")


def test_clean_commit_passes(hook_project):
    proj, env, _ = hook_project
    (proj / "clean.py").write_text("import os\n\nprint(os.getcwd())\n")
    git(proj, "add", "clean.py")
    proc = commit(proj, env, "clean")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Passed" in proc.stdout + proc.stderr


def test_hooks_manifest():
    import yaml

    hooks = {h["id"]: h for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}
    assert set(hooks) == {"dp2ddp-check", "dp2ddp-lint"}
    for h in hooks.values():
        assert h["language"] == "python" and h["types"] == ["python"]
        assert h.get("pass_filenames", True) is True
    assert "--new-only" in hooks["dp2ddp-check"]["entry"] and "DDP001" in hooks["dp2ddp-check"]["entry"]
