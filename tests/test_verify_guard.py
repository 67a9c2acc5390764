"""verify never writes a file of the user's: the runs work in a copy of the project whose
links to the user's files become copies before anything writes through them, and a write
into the project itself is refused. Then the project's context: a script in a subfolder
importing from the project root, relative paths from where the user launches it."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dp2ddp.verify import scratch
from tests.verify_helpers import verify

PROBE_DIR = Path(__file__).resolve().parents[1] / "dp2ddp" / "verify" / "probe"


def _tree(root: Path) -> dict:
    """Every file and link under root (links not followed): path -> content digest or link target."""
    out = {}
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            p = Path(folder) / name
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                out[rel] = "dir"
    return out


def _user_project(tmp_path: Path) -> Path:
    proj = tmp_path / "proj"
    (proj / "scripts").mkdir(parents=True)
    (proj / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (proj / "big.bin").write_bytes(os.urandom(scratch.COPY_MAX + 10))  # large: linked
    (proj / "small.txt").write_text("small\n")  # small: copied
    data = tmp_path / "datasets"
    (data / "sub").mkdir(parents=True)
    (data / "blob.bin").write_bytes(bytes(16))
    (data / "sub" / "x").write_text("x")
    (proj / "data").symlink_to(data)  # a linked folder (a symlink in the user's tree)
    return proj


WRITER = r"""
import os, shutil, sys
project = sys.argv[1]
with open("big.bin", "r+b") as fh:  # in place, through a link: a copy first
    fh.write(b"X")
with open("small.txt", "a") as fh:
    fh.write("more\n")
with open("data/blob.bin", "r+b") as fh:  # a file in a linked folder
    fh.write(b"Y")
with open("data/new.txt", "w") as fh:  # a new file in a linked folder
    fh.write("new")
os.remove("data/sub/x")
os.replace("data/new.txt", "data/sub/renamed.txt")
fd = os.open("big2.bin", os.O_WRONLY | os.O_CREAT)
os.close(fd)
try:
    open(os.path.join(project, "evil.txt"), "w")  # a hard-coded path into the project
except PermissionError as e:
    print("refused:", e)
"""


_HANDING_OVER = """\
import importlib.machinery, importlib.util, os, sys
print("shim loaded", flush=True)
here = os.path.dirname(os.path.abspath(__file__))
rest = [p for p in sys.path if os.path.abspath(p or ".") != here]  # every other folder, above it too
spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
if spec is not None and spec.loader is not None:
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)
"""


@pytest.mark.parametrize("probe_first", [True, False], ids=["probe-first", "shim-first"])
def test_the_probe_and_a_shim_that_hands_over_to_any_other_sitecustomize_load_once_each(tmp_path, probe_first):
    """The realrun shim hands over to any other sitecustomize on the path, above it too; the
    probe handed over to any but its own. With both on PYTHONPATH each loaded the other
    until the recursion limit, and the script never ran. The probe now runs once per
    process and hands over only down the path."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(_HANDING_OVER)
    dirs = [str(PROBE_DIR), str(shim)] if probe_first else [str(shim), str(PROBE_DIR)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DP2DDP_VERIFY")}
    env["PYTHONPATH"] = os.pathsep.join(dirs)
    r = subprocess.run([sys.executable, "-c", "print('script ran')"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == ["shim loaded", "script ran"], r.stdout[-2000:]
    assert "RecursionError" not in r.stderr


def test_writes_through_links_become_copies_and_writes_into_the_project_are_refused(tmp_path):
    proj = _user_project(tmp_path)
    (proj / "scripts" / "w.py").write_text(WRITER)
    before, data_before = _tree(proj), _tree(tmp_path / "datasets")
    mirror = scratch.Mirror()
    place = scratch.prepare(proj / "scripts" / "w.py", tmp_path / "run", mirror=mirror, root=proj, cwd=proj)
    assert place.cwd == tmp_path / "run" and place.script == tmp_path / "run" / "scripts" / "w.py"
    assert (place.root / "big.bin").is_symlink() and (place.root / "data").is_symlink()
    assert not (place.root / "small.txt").is_symlink()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DP2DDP_VERIFY")}
    env.update(PYTHONPATH=str(PROBE_DIR), DP2DDP_VERIFY_ROLE="original", DP2DDP_VERIFY_OUT=str(tmp_path),
               DP2DDP_VERIFY_MIRROR=str(place.root), DP2DDP_VERIFY_PROJECT=str(proj),
               DP2DDP_VERIFY_LOCK=str(tmp_path / "lock"))
    p = subprocess.run([sys.executable, str(place.script), str(proj)], cwd=str(place.cwd), env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "refused: dp2ddp verify: " in p.stdout and "evil.txt is in your project" in p.stdout
    # the user's files are byte-identical, nothing added or removed
    assert _tree(proj) == before and _tree(tmp_path / "datasets") == data_before
    assert mirror.modified() == [] and mirror.modified(folders=True) == []
    # the run's copy holds what the script did
    run = place.root
    assert not (run / "big.bin").is_symlink() and (run / "big.bin").read_bytes()[:1] == b"X"
    assert (run / "big.bin").read_bytes()[1:] == (proj / "big.bin").read_bytes()[1:]
    assert (run / "small.txt").read_text() == "small\nmore\n"
    assert not (run / "data").is_symlink() and (run / "data" / "blob.bin").read_bytes() == b"Y" + bytes(15)
    assert (run / "data" / "sub" / "renamed.txt").read_text() == "new" and not (run / "data" / "sub" / "x").exists()
    assert (run / "data" / "sub").is_dir() and not (run / "data" / "sub").is_symlink()


def test_the_last_line_of_defence_sees_a_linked_file_changed(tmp_path):
    proj = _user_project(tmp_path)
    mirror = scratch.Mirror()
    place = scratch.prepare(proj / "small.txt", tmp_path / "run", mirror=mirror, root=proj)
    assert mirror.modified() == []
    with open(place.root / "big.bin", "r+b") as fh:  # no guard here: straight through the link
        fh.write(b"Z")
    assert mirror.modified() == [str((proj / "big.bin").resolve())]


def test_a_linked_file_written_back_unchanged_is_touched_not_modified(tmp_path):
    """dgcnn's dataset opens its h5 file 'r+' through h5py (a C library the guard does not
    see) and only reads it; HDF5 writes its header back as it was. The file's times change,
    not a byte of it: verify notes it (touched) and does not fail the run for a change it did
    not make. A byte that does change still counts (modified)."""
    proj = _user_project(tmp_path)
    mirror = scratch.Mirror()
    place = scratch.prepare(proj / "small.txt", tmp_path / "run", mirror=mirror, root=proj)
    big = (proj / "big.bin").resolve()
    first = big.read_bytes()[:1]
    os.utime(big, ns=(1, 1))  # times as a writer would leave them (ctime changes too)
    with open(place.root / "big.bin", "r+b") as fh:
        fh.write(first)
    assert mirror.modified() == [] and mirror.touched() == [str(big)]
    with open(place.root / "big.bin", "r+b") as fh:
        fh.write(bytes([first[0] ^ 1]))
    assert mirror.modified() == [str(big)] and mirror.touched() == []


def test_project_root_and_the_folder_runs_start_in(tmp_path):
    proj = _user_project(tmp_path)
    script = proj / "scripts" / "train.py"
    script.write_text("pass\n")
    assert scratch.project_root(script) == proj
    assert scratch.project_root(script, tmp_path) == tmp_path
    assert scratch.run_cwd(proj, script, proj) == proj  # launched from the root
    assert scratch.run_cwd(proj, script, tmp_path) == script.parent  # from outside: the script's folder
    assert scratch.remap(["--resume", str(proj / "ckpt.pt"), f"--out={proj}/out", "--x", "/elsewhere"], proj, tmp_path / "m") == [
        "--resume", str(tmp_path / "m" / "ckpt.pt"), f"--out={tmp_path / 'm' / 'out'}", "--x", "/elsewhere"]


RESUME = r'''"""Resumes from model_best.pth and rewrites every input it opens: the checkpoint
(torch.save over it), notes.txt (appended), data/blob.bin (in place); its data comes from
the project root's utils (a script in a subfolder, launched from the root)."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from utils import dataset  # the project root is importable

torch.manual_seed(0)
state = torch.load("model_best.pth")
net = nn.Linear(600, 1)
net.load_state_dict(state["model"])
model = nn.DataParallel(net)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(dataset(), batch_size=16, shuffle=True)
for epoch in range(2):
    for xb, yb in loader:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
torch.save({"model": net.state_dict(), "epoch": state["epoch"] + 2}, "model_best.pth")
with open("notes.txt", "a") as fh:
    fh.write("resumed at epoch %d\n" % state["epoch"])
with open("data/blob.bin", "r+b") as fh:
    fh.write(b"updated")
'''

RESUME_DDP = r'''"""resume.py migrated: rank 0 writes."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from utils import dataset  # the project root is importable

dist.init_process_group("gloo")
torch.manual_seed(0)
state = torch.load("model_best.pth")
net = nn.Linear(600, 1)
net.load_state_dict(state["model"])
model = nn.parallel.DistributedDataParallel(net)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ds = dataset()
loader = DataLoader(ds, batch_size=8, sampler=DistributedSampler(ds))
for epoch in range(2):
    loader.sampler.set_epoch(epoch)
    for xb, yb in loader:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
if dist.get_rank() == 0:
    torch.save({"model": net.state_dict(), "epoch": state["epoch"] + 2}, "model_best.pth")
    with open("notes.txt", "a") as fh:
        fh.write("resumed at epoch %d\n" % state["epoch"])
    with open("data/blob.bin", "r+b") as fh:
        fh.write(b"updated")
dist.destroy_process_group()
'''

UTILS = '''import torch
from torch.utils.data import TensorDataset


def dataset():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 600, generator=g)
    return TensorDataset(x, x[:, :1].clone())
'''


@pytest.mark.torchrun
def test_a_script_that_rewrites_its_inputs_in_the_projects_context_leaves_the_users_files_as_they_were(tmp_path):
    """Launched from the project root: the script in scripts/ imports the root's utils and
    opens model_best.pth (large: linked into the copies), notes.txt and data/ (a linked
    folder) relative to the root, and updates each in place. Both runs pass; every file
    of the user's is byte-identical afterwards, and nothing new appears in the project."""
    proj = _user_project(tmp_path)
    (proj / "utils.py").write_text(UTILS)
    import torch

    torch.manual_seed(0)
    torch.save({"model": torch.nn.Linear(600, 1).state_dict(), "epoch": 3, "pad": torch.zeros(300_000)}, proj / "model_best.pth")
    assert (proj / "model_best.pth").stat().st_size > scratch.COPY_MAX
    (proj / "notes.txt").write_text("trained 3 epochs\n")
    (proj / "scripts" / "resume.py").write_text(RESUME)
    (proj / "scripts" / "resume_ddp.py").write_text(RESUME_DDP)
    before, data_before = _tree(proj), _tree(tmp_path / "datasets")
    code, rep, out, _ = verify(tmp_path, str(proj / "scripts" / "resume.py"), "--steps", "0", "--no-envelope", cwd=proj)
    assert code == 0, out
    assert rep["verdict"] == "pass" and rep["losses_agree"] and rep["replicas_in_sync"]
    assert rep["project_root"] == str(proj)
    assert _tree(proj) == before and _tree(tmp_path / "datasets") == data_before
    files = {f["path"]: f for f in rep["outputs"]["files"]}
    assert files["model_best.pth"]["kind"] == "checkpoint" and files["model_best.pth"]["status"] == "equal"
    assert files["notes.txt"]["compared"] == "lines" and files["data/blob.bin"]["status"] == "not compared"
