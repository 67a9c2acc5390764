"""What the runs leave behind: snapshots, grouping of per-process names, checkpoint
structures (loaded only with weights_only=True), the findings and their advice; then real
`python`/`torchrun` runs of the writer fixtures."""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import time
from pathlib import Path

import pytest

from dp2ddp.verify import checkpoint_files, file_diffs, file_kinds, outputs, run_files
from dp2ddp.verify.runner import Rank, RunResult
from tests.verify_helpers import FIXTURES, fixture, verify

torch = pytest.importorskip("torch")


# --------------------------------------------------------------------------- pieces


@pytest.mark.parametrize(
    "path, expect",
    [
        ("runs/events.out.tfevents.1716200000.host.example.com.4242.0", "runs/events.out.tfevents.*"),
        ("runs/May20_10-30-00_host/events.out.tfevents.1716200000.host.77", "runs/May<n>_host/events.out.tfevents.*"),
        # a clock and the suffix that keeps a second archive of the same second apart: one group
        ("experiments/run_archived_185935_1/model.pt", "experiments/run_archived_<n>/model.pt"),
        ("experiments/run_archived_185936/model.pt", "experiments/run_archived_<n>/model.pt"),
        ("logs/rank1.log", "logs/rank<n>.log"),
        ("model.pt", "model.pt"),
    ],
)
def test_names_are_grouped_up_to_numbers(path, expect):
    assert file_kinds.pattern(path) == expect


def test_paths_named_in_the_arguments_outside_the_run_folder(tmp_path):
    cwd = tmp_path / "run"
    cwd.mkdir()
    (tmp_path / "shared").mkdir()
    ext = tmp_path / "ext"
    ext.mkdir()
    args = ["--out-dir", str(ext), f"--log={ext}/sub", "--save_dir=../shared", "--data", "data/x", "--lr", "0.1",
            str(tmp_path / "nope" / "deeper"), "/dev/null"]
    assert run_files.named_paths(args, cwd) == [ext, tmp_path / "shared"]  # ext/sub is inside ext


def _run(role: str, writes=None, pids=None, stopped=False) -> RunResult:
    ranks = {}
    for r, pid in (pids or {0: 100}).items():
        rank = Rank(rank=r, pid=pid)
        rank.writes = list((writes or {}).get(r, []))
        rank.end = {"why": "limit" if stopped else "exit"}
        ranks[r] = rank
    return RunResult(role=role, exit_code=0, wall_s=1.0, ranks=ranks, logs=[])


def _two_runs(tmp_path: Path, write_orig, write_mig, mig_pids=None, mig_writes=None, orig_writes=None):
    """Each run's folder, written by ``write_*(folder)``, watched like verify watches it."""
    seen = {}
    for role, write, pids, writes in (("original", write_orig, None, orig_writes),
                                      ("migrated", write_mig, mig_pids or {0: 200, 1: 201}, mig_writes)):
        folder = tmp_path / role
        folder.mkdir(parents=True)
        (folder / "input.txt").write_text("mirrored before the run\n")
        watch = run_files.Watch(folder, [])
        write(folder)
        w = {r: [str(folder / p) for p in ps] for r, ps in (writes or {}).items()}
        seen[role] = watch.after(_run(role, w, pids))
    return seen["original"], seen["migrated"]


def _inproc(jobs):
    """ckpt_load's loading in this process (the unit tests' shortcut; the real loader runs in
    a fresh Python: see the tests that use checkpoint_files.load_checkpoints)."""
    from dp2ddp.verify import ckpt_load

    return {role: {str(p): ckpt_load.load_one(torch, {"path": str(p), "flat": str(f) if f else None, "mode": m})
                   for p, f, m in files} for role, (run, files) in jobs.items()}


def _compare(o, m, world=2, dp_in_original=True, **kw):
    return outputs.compare(o, m, world=world, dp_in_original=dp_in_original, loader=kw.pop("loader", _inproc), **kw)


def _save(state, path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))


def test_unchanged_files_are_not_outputs_and_pycache_is_ignored(tmp_path):
    def write(folder):
        (folder / "__pycache__").mkdir()
        (folder / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"x")
        (folder / "out.txt").write_text("hello\n")

    o, m = _two_runs(tmp_path, write, write)
    assert set(o.files) == {"out.txt"} and o.created == {"out.txt"}
    rep = _compare(o, m)
    assert rep["equal"] and rep["summary"] == "equal (1 file: out.txt (lines))"


def test_module_prefix_gained_is_a_problem_with_advice(tmp_path):
    model = _model()
    o, m = _two_runs(
        tmp_path,
        lambda f: _save({"net": model.state_dict(), "epoch": 1}, f / "ckpt" / "model.pt"),
        lambda f: _save({"net": torch.nn.parallel.DataParallel(model).state_dict(), "epoch": 1}, f / "ckpt" / "model.pt"),
    )
    rep = _compare(o, m)
    (d,) = rep["differences"]
    assert d["kind"] == "module_prefix" and d["severity"] == "problem"
    assert "under ['net'] gained the `module.` prefix" in d["message"] and "module.0.weight" in d["message"]
    assert "model.module.state_dict()" in d["advice"]
    assert rep["files"][0]["compared"] == "keys, shapes and dtypes"


def test_module_prefix_is_a_warning_when_the_original_ran_without_dataparallel(tmp_path):
    model = _model()
    o, m = _two_runs(
        tmp_path,
        lambda f: _save(model.state_dict(), f / "m.pt"),
        lambda f: _save(torch.nn.parallel.DataParallel(model).state_dict(), f / "m.pt"),
    )
    (d,) = _compare(o, m, dp_in_original=False)["differences"]
    assert d["severity"] == "warning" and "without DataParallel" in d["message"]
    assert "loads either form (DDP170)" in d["advice"]


def test_module_prefix_lost(tmp_path):
    model = _model()
    o, m = _two_runs(
        tmp_path,
        lambda f: _save(torch.nn.parallel.DataParallel(model).state_dict(), f / "m.pt"),
        lambda f: _save(model.state_dict(), f / "m.pt"),
    )
    (d,) = _compare(o, m)["differences"]
    assert d["kind"] == "module_prefix" and "lost the `module.` prefix" in d["message"]


def test_keys_shapes_dtypes_and_types_in_nested_checkpoints(tmp_path):
    def orig(f):
        _save({"model": {"w": torch.zeros(4, 3), "b": torch.zeros(3)}, "opt": [torch.zeros(2)], "step": 3, "extra": 1}, f / "c.pt")

    def mig(f):
        _save({"model": {"w": torch.zeros(2, 3), "b": torch.zeros(3, dtype=torch.float16)}, "opt": [torch.zeros(2), 1],
               "step": "3", "new": 2}, f / "c.pt")

    o, m = _two_runs(tmp_path, orig, mig)
    diffs = _compare(o, m)["differences"]
    kinds = {d["kind"]: d["message"] for d in diffs}
    assert set(kinds) == {"keys", "shape", "dtype", "length", "type"}
    assert "only in the original: extra" in kinds["keys"] and "only in the migration: new" in kinds["keys"]
    assert "['model']['w'] has shape [4, 3] in the original, [2, 3]" in kinds["shape"]
    assert "['model']['b'] is float32 in the original, float16" in kinds["dtype"]
    assert all(d["severity"] == "problem" for d in diffs)


def test_the_same_finding_in_several_checkpoints_is_one_difference(tmp_path):
    model = _model()

    def write(wrap):
        def w(f):
            for e in range(3):
                _save((torch.nn.parallel.DataParallel(model) if wrap else model).state_dict(), f / f"epoch{e}.pt")
        return w

    o, m = _two_runs(tmp_path, write(False), write(True))
    (d,) = _compare(o, m)["differences"]
    assert d["paths"] == ["epoch0.pt", "epoch1.pt", "epoch2.pt"]
    assert d["message"].startswith("epoch0.pt, epoch1.pt, epoch2.pt: its keys gained")


def test_a_saved_batch_tensor_that_is_a_ranks_share_is_a_note_not_a_problem(tmp_path):
    """DCGAN saves the current real batch: under DDP rank 0 holds (and saves) its share."""
    def write(rows):
        def w(f):
            for e in range(2):
                _save(torch.zeros(rows, 3, 4, 4), f / "out" / f"real_{e}.pt")
        return w

    o, m = _two_runs(tmp_path, write(16), write(8), mig_writes={0: ["out/real_0.pt", "out/real_1.pt"]})
    rep = _compare(o, m)
    assert rep["equal"] is True and rep["differences"] == []
    (note,) = rep["notes"]
    assert note.startswith("out/real_0.pt, out/real_1.pt: the saved tensor is rank 0's share of a batch, not the whole batch")
    assert "[8, 3, 4, 4] in the migration, [16, 3, 4, 4] in the original" in note and "dist.all_gather" in note
    assert {f["status"] for f in rep["files"]} == {"share"}
    assert "a rank's share of the batch" in rep["summary"]


@pytest.mark.parametrize(
    "orig, mig",
    [
        ({"w": torch.zeros(16, 3)}, {"w": torch.zeros(8, 3)}),  # a checkpoint entry: a real change
        (torch.zeros(16, 3), torch.zeros(4, 3)),  # not the world size's share
        (torch.zeros(16, 6), torch.zeros(16, 3)),  # another dimension
        (torch.zeros(16, 3), torch.zeros(8, 2)),  # dimension 0 and another
    ],
)
def test_other_shape_changes_stay_problems(tmp_path, orig, mig):
    o, m = _two_runs(tmp_path, lambda f: _save(orig, f / "t.pt"), lambda f: _save(mig, f / "t.pt"))
    (d,) = _compare(o, m)["differences"]
    assert (d["kind"], d["severity"]) == ("shape", "problem")


def test_a_halved_tensor_is_a_problem_in_a_world_of_one(tmp_path):
    o, m = _two_runs(tmp_path, lambda f: _save(torch.zeros(16), f / "t.pt"), lambda f: _save(torch.zeros(8), f / "t.pt"))
    (d,) = _compare(o, m, world=1)["differences"]
    assert d["kind"] == "shape"


def _bn_state(shift: float):
    """A BatchNorm model's state_dict, its statistics and weights moved by ``shift``."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    with torch.no_grad():
        net[1].running_mean.add_(1.0 + shift)
        net[1].weight.add_(shift)
    return net.state_dict()


def _runs_with_envelope(tmp_path: Path, orig_state, mig_state, env_state):
    """Original, migration and envelope run, each saving a state_dict after the same step."""
    o, m = _two_runs(tmp_path, lambda f: _save(orig_state, f / "out" / "netD.pth"),
                     lambda f: _save(mig_state, f / "out" / "netD.pth"), mig_writes={0: ["out/netD.pth"]})
    folder = tmp_path / "envelope"
    folder.mkdir()
    watch = run_files.Watch(folder, [])
    _save(env_state, folder / "out" / "netD.pth")
    e = watch.after(_run("envelope"))
    for run in (o, m, e):
        run.steps["out/netD.pth"] = 4
    m.work = tmp_path
    return o, m, e


def test_values_beyond_an_unsplit_envelope_are_not_judged_for_batchnorm(tmp_path):
    """DCGAN on CPU: the original calls DataParallel only on CUDA, so the envelope run could
    not split its batches (it perturbed the gradients instead) and says nothing of
    per-rank BatchNorm statistics: the values are reported as not judged, not as a problem."""
    o, m, e = _runs_with_envelope(tmp_path, _bn_state(0.0), _bn_state(0.5), _bn_state(1e-7))
    rep = _compare(o, m, dp_in_original=False, envelope=e, split=False, stochastic=["batchnorm"])
    (d,) = rep["differences"]
    assert (d["kind"], d["severity"]) == ("values", "warning"), d
    assert d["message"].startswith("out/netD.pth: values not judged: they differ by more than the noise envelope allows "
                                   "(worst: 1.")
    assert "BatchNorm normalises each rank's 1/2 of the batch" in d["message"]
    assert "the original ran no DataParallel forward on this machine" in d["message"]
    assert "split into 2 chunks" in d["message"]
    (f,) = rep["files"]
    assert f["status"] == "not judged" and f["values"]["judged"] is False


@pytest.mark.parametrize("stochastic", [["batchnorm"], ["dropout"]])
def test_values_beyond_a_split_envelope_are_not_judged_for_batchnorm_or_dropout(tmp_path, stochastic):
    """deep-text-recognition: the envelope run split each batch into DataParallel's contiguous
    chunks, but a rank's share is what its loaders hand it (a batch assembled from several
    loaders holds half of each), DDP keeps rank 0's running statistics where the chunks
    update them in turn, and dropout masks come from each rank's own stream: the chunked
    envelope measures float noise, not these, so the values are not judged (a warning)."""
    o, m, e = _runs_with_envelope(tmp_path, _bn_state(0.0), _bn_state(0.5), _bn_state(1e-7))
    rep = _compare(o, m, envelope=e, split=True, stochastic=stochastic)
    (d,) = rep["differences"]
    assert (d["kind"], d["severity"]) == ("values", "warning"), d
    assert d["message"].startswith("out/netD.pth: values not judged")
    assert "contiguous slices" in d["message"] or "one stream in turn" in d["message"]
    assert "split into 2 chunks, by DataParallel or at the model's outermost call" in d["message"]


@pytest.mark.parametrize("split, stochastic", [(True, []), (False, [])])
def test_values_beyond_the_envelope_stay_problems_without_batchnorm_or_dropout(tmp_path, split, stochastic):
    o, m, e = _runs_with_envelope(tmp_path, _bn_state(0.0), _bn_state(0.5), _bn_state(1e-7))
    rep = _compare(o, m, envelope=e, split=split, stochastic=stochastic)
    (d,) = rep["differences"]
    assert (d["kind"], d["severity"]) == ("values", "problem")
    assert "its values differ beyond float noise" in d["message"]


def _with_small(scale: float, seed: int):
    """A state with ordinary weights and one tensor of ``scale`` magnitude drawn from ``seed``."""
    state = dict(_bn_state(0.0))
    g = torch.Generator().manual_seed(seed)
    state["key.bias"] = torch.randn(32, generator=g) * scale
    return state


@pytest.mark.parametrize("scale, problem", [(1e-11, False), (1e-3, True)])
def test_a_tensor_left_at_float_noise_differs_by_noise_not_by_what_it_computes(tmp_path, scale, problem):
    """SpanBERT's TACRED run: an attention key's bias, which no gradient reaches, holds values
    of 1e-11 and differed by 1.8e-11 (relative difference 1.39): verify called the checkpoint
    changed. Measured against the checkpoint's typical magnitude such a tensor is equal; a
    small tensor with values of its own (1e-3) that differ stays a problem."""
    o, m, e = _runs_with_envelope(tmp_path, _with_small(scale, 1), _with_small(scale, 2), _with_small(scale, 1))
    rep = _compare(o, m, envelope=e, split=True, stochastic=[])
    kinds = [(d["kind"], d["severity"]) for d in rep["differences"]]
    assert (("values", "problem") in kinds) is problem, rep["differences"]


def test_structure_changes_stay_problems_where_the_envelope_did_not_split(tmp_path):
    state = _bn_state(0.0)
    half = {k: (v.half() if k == "1.weight" else v) for k, v in _bn_state(0.5).items()}
    o, m, e = _runs_with_envelope(tmp_path, state, half, state)
    rep = _compare(o, m, dp_in_original=False, envelope=e, split=False, stochastic=["batchnorm"])
    (d,) = rep["differences"]
    assert (d["kind"], d["severity"]) == ("dtype", "problem")


def _png(w, h):
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) + chunk(b"IEND", b"")


@pytest.mark.parametrize(
    "orig, mig, batches, share",
    [
        ((530, 68), (266, 68), [8], (8, 4)),  # DCGAN: save_image(real_cpu) of a batch of 8 (64x64), nrow 8
        ((530, 134), (530, 68), [16], (16, 8)),  # two rows of 8, then one
        ((70, 36), (32, 32), [2], (2, 1)),  # one image: make_grid returns it without padding
        ((530, 68), (266, 68), [5], None),  # not a grid of a batch the original stepped on
        ((530, 68), (200, 68), [8], None),  # not a grid of the same tiles
    ],
)
def test_grid_share(orig, mig, batches, share):
    assert file_diffs.grid_share(orig, mig, batches, 2) == share


def test_an_image_of_a_ranks_share_of_a_batch_is_a_warning(tmp_path):
    o, m = _two_runs(tmp_path, lambda f: (f / "real_samples.png").write_bytes(_png(530, 68)),
                     lambda f: (f / "real_samples.png").write_bytes(_png(266, 68)), mig_writes={0: ["real_samples.png"]})
    rep = _compare(o, m, batches=[8, 0])
    (d,) = rep["differences"]
    assert (d["kind"], d["severity"]) == ("dimensions", "warning")
    assert d["message"] == ("real_samples.png is 266x68 in the migration, 530x68 in the original: a grid of 4 images "
                            "where the original's has 8, rank 0's share of a batch of 8 (under DDP each rank holds 1/2 "
                            "of the global batch)")
    assert rep["files"][0]["status"] == "share"
    # another size, or no batch it matches: a problem as before
    (d,) = _compare(o, m, batches=[32])["differences"]
    assert (d["kind"], d["severity"]) == ("dimensions", "problem")


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


@pytest.mark.slow  # a fresh Python that imports torch
def test_checkpoints_that_need_a_full_unpickler_are_unpickled_only_in_a_fresh_process_in_the_run(tmp_path):
    """A checkpoint that does not load with torch.load's defaults (weights_only) is loaded the
    way the original's own code must load it (weights_only=False), in a fresh Python started
    in the run's folder: what its pickle does happens there, never in verify."""
    o, m = _two_runs(
        tmp_path,
        lambda f: _save({"x": _Evil("pwned"), "w": torch.zeros(2)}, f / "c.pt"),
        lambda f: _save({"x": _Evil("pwned"), "w": torch.zeros(2)}, f / "c.pt"),
    )
    rep = outputs.compare(o, m, world=2, dp_in_original=True)
    assert not (Path.cwd() / "pwned").exists()
    assert (tmp_path / "original" / "pwned").exists() and (tmp_path / "migrated" / "pwned").exists()
    (f,) = rep["files"]
    assert f["original"]["load"] == f["migrated"]["load"] == "full"
    assert f["compared"].startswith("keys, shapes and dtypes (loaded with weights_only=False")
    assert rep["equal"] is True, rep["differences"]


@pytest.mark.slow  # a fresh Python that imports torch
def test_a_pickled_ddp_wrapper_fails_and_names_the_line_that_saved_it(tmp_path):
    """The real loader (a fresh Python, no process group): the original pickles the bare
    model, the migration the DDP wrapper, which does not load there."""
    import torch.distributed as dist

    net = _model()
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(net)
        o, m = _two_runs(
            tmp_path,
            lambda f: _save({"net": net, "epoch": 1}, f / "ckpt.pt"),
            lambda f: _save({"net": ddp, "epoch": 1}, f / "ckpt.pt"),
            mig_writes={0: ["ckpt.pt"]},
        )
    finally:
        dist.destroy_process_group()
    m.sites["ckpt.pt"] = "train_ddp.py:57"
    rep = outputs.compare(o, m, world=2, dp_in_original=True)
    (d,) = rep["differences"]
    assert d["kind"] == "wrapper" and d["severity"] == "problem"
    assert d["message"].startswith("ckpt.pt pickles the DistributedDataParallel wrapper (saved at train_ddp.py:57): "
                                   "it loads only where a process group exists")
    assert "\x1b[" not in d["message"] and "process group" in d["message"].split("(", 2)[-1]
    assert "model.module" in d["advice"]
    assert checkpoint_files.DDP_REF in checkpoint_files.pickle_refs(m.where["ckpt.pt"])
    assert checkpoint_files.DDP_REF not in checkpoint_files.pickle_refs(o.where["ckpt.pt"])


def _safetensors(path: Path, tensors: dict) -> None:
    header, off = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = 4 * math_prod(shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * off)


def math_prod(shape):
    out = 1
    for s in shape:
        out *= s
    return out


def test_safetensors_headers_are_compared(tmp_path):
    o, m = _two_runs(
        tmp_path,
        lambda f: _safetensors(f / "model.safetensors", {"w": ("F32", [2, 3])}),
        lambda f: _safetensors(f / "model.safetensors", {"module.w": ("F32", [2, 3])}),
    )
    (d,) = _compare(o, m)["differences"]
    assert d["kind"] == "module_prefix" and "module.w" in d["message"]


def _events(folder: Path, pid: int) -> None:
    (folder / "runs").mkdir(exist_ok=True)
    (folder / "runs" / f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{pid}.0").write_bytes(b"e" * 40)


def test_one_event_file_on_each_side_is_equal_two_against_one_is_not(tmp_path):
    o, m = _two_runs(tmp_path / "a", lambda f: _events(f, 100), lambda f: _events(f, 200))
    rep = _compare(o, m)
    assert rep["equal"], rep["differences"]
    assert rep["files"][0]["path"] == "runs/events.out.tfevents.*" and len(rep["files"][0]["names"]) == 2

    o, m = _two_runs(tmp_path / "b", lambda f: _events(f, 100), lambda f: (_events(f, 200), _events(f, 201)))
    (d,) = _compare(o, m)["differences"]
    assert d["kind"] == "count" and d["severity"] == "problem"
    assert d["message"] == ("the migration writes 2 TensorBoard event files in runs/, the original 1 "
                            "(one per process of 2; the names carry the pids of ranks 0 and 1)")
    assert "SummaryWriter under `if dist.get_rank() == 0:`" in d["advice"]


def test_missing_extra_fewer_and_deleted_files(tmp_path):
    def orig(f):
        (f / "results.json").write_text("{}")
        for e in range(3):
            (f / f"ckpt_{e}.bin").write_text("x")
        (f / "input.txt").unlink()

    def mig(f):
        (f / "ckpt_0.bin").write_text("x")
        (f / "store").write_text("rendezvous")

    o, m = _two_runs(tmp_path, orig, mig)
    diffs = {d["kind"]: d for d in _compare(o, m)["differences"]}
    assert diffs["missing"]["message"] == "the migration does not write results.json; the original does"
    assert "LOCAL_RANK" in diffs["missing"]["advice"] and diffs["missing"]["severity"] == "problem"
    assert diffs["count"]["message"] == "the migration writes 1 of the original's 3 files named ckpt_<n>.bin in ./"
    assert diffs["extra"]["severity"] == "warning" and "store" in diffs["extra"]["message"]
    assert diffs["deleted"]["severity"] == "warning" and "the original deletes input.txt" in diffs["deleted"]["message"]


def test_a_file_every_rank_writes(tmp_path):
    o, m = _two_runs(
        tmp_path,
        lambda f: (f / "train.log").write_text("epoch 0\n"),
        lambda f: (f / "train.log").write_text("epoch 0\nepoch 0\n"),
        mig_writes={0: ["train.log"], 1: ["train.log"]},
        orig_writes={0: ["train.log"]},
    )
    (d,) = _compare(o, m)["differences"]
    assert d["kind"] == "writers" and d["message"] == "train.log is written by every rank (ranks 0 and 1): 2 lines against the original's 1"
    assert "`if dist.get_rank() == 0:`" in d["advice"]


@pytest.mark.parametrize(
    "mig_text, kind, severity",
    [
        ("a\nb\na\nb\n", "lines", "problem"),  # world-size times the lines: every rank appends?
        ("", "lines", "problem"),  # emptied
        ("a\nb\nc\n", "lines", "warning"),  # differs: the lines may depend on the run
    ],
)
def test_text_files_are_compared_by_their_lines(tmp_path, mig_text, kind, severity):
    o, m = _two_runs(tmp_path, lambda f: (f / "log.txt").write_text("a\nb\n"), lambda f: (f / "log.txt").write_text(mig_text))
    (d,) = _compare(o, m)["differences"]
    assert (d["kind"], d["severity"]) == (kind, severity)


@pytest.mark.parametrize(
    "orig_text, mig_text, header_problem",
    [
        ("2.2868,2.2802\n2.10,2.05\n", "2.2863,2.2794\n2.11,2.04\n", False),  # a loss log with no header: values of the run
        ("epoch,loss\n0,2.28\n", "epoch,acc\n0,2.28\n", True),  # a header that changed: other columns
        ("epoch,loss\n0,2.28\n", "0,2.28\n1,2.10\n", True),  # the header is gone
        ("loss_1,loss_2\n0.3,0.2\n", "loss_1,loss_2\n0.4,0.1\n", False),  # names with digits, the same
        # log lines with times (temporal-shift-module's log.csv): the run's values, not columns
        ("Epoch: [0][0/2],  lr: 0.00100\tTime 4.046 (4.046)\tLoss 3.9262\n", "Epoch: [0][0/2],  lr: 0.00100\tTime 5.678 (5.678)\tLoss 3.9262\n", False),
    ],
)
def test_a_csv_whose_first_row_is_numbers_has_no_header_to_compare(tmp_path, orig_text, mig_text, header_problem):
    """vision-transformers-cifar10 writes its losses per epoch as a CSV row with no header:
    the first rows differed as the losses do, and verify called it a changed header."""
    o, m = _two_runs(tmp_path, lambda f: (f / "log.csv").write_text(orig_text), lambda f: (f / "log.csv").write_text(mig_text))
    kinds = {d["kind"] for d in _compare(o, m)["differences"]}
    assert ("header" in kinds) is header_problem


def test_same_lines_of_other_lengths_are_equal_and_no_size_is_compared(tmp_path):
    o, m = _two_runs(tmp_path, lambda f: (f / "log.txt").write_text("loss 0.5\n"), lambda f: (f / "log.txt").write_text("loss 0.49999\n"))
    rep = _compare(o, m)
    assert rep["equal"] and rep["files"][0]["compared"] == "lines"


@pytest.mark.parametrize(
    "orig_text, mig_text, shown",
    [
        ("mse:0.53, mae:0.51\ndone\n", "mse:0.27, mae:0.40\ndone\n", "result.txt (lines; numbers differ on 1 of 2 lines)"),
        ("mse:0.53\ndone\n", "mse:0.53\nfinished\n", "result.txt (lines; words differ on 1 of 2 lines)"),
        ("mse:0.53\ndone\n", "mse:0.53\ndone\n", "result.txt (lines)"),
    ],
)
def test_a_text_of_equal_length_says_how_many_of_its_lines_differ(tmp_path, orig_text, mig_text, shown):
    """Autoformer's result.txt held other metrics in the migration, and the summary said
    "equal": the line count was all it compared. The numbers are not judged (times and the
    run's values), but the summary says they differ."""
    o, m = _two_runs(tmp_path, lambda f: (f / "result.txt").write_text(orig_text),
                     lambda f: (f / "result.txt").write_text(mig_text))
    rep = _compare(o, m)
    assert rep["equal"] and rep["differences"] == []
    assert rep["summary"] == f"equal (1 file: {shown})"


def test_files_are_classified_and_compared_by_kind(tmp_path):
    import struct as st
    import zlib

    def png(w, h):
        def chunk(kind, data):
            return st.pack(">I", len(data)) + kind + data + st.pack(">I", zlib.crc32(kind + data))
        return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", st.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) + chunk(b"IEND", b"")

    def write(rows, width, keys):
        def w(f):
            (f / "grid.png").write_bytes(png(width, 32))
            (f / "hist.csv").write_text("epoch,loss\n" + "".join(f"{i},0.5\n" for i in range(rows)))
            (f / "results.json").write_text(json.dumps({k: [1, 2] for k in keys}))
            (f / "blob.bin").write_bytes(bytes(range(256)) * (2 if rows > 2 else 1))
        return w

    o, m = _two_runs(tmp_path, write(2, 64, ["acc", "loss"]), write(4, 32, ["acc"]))
    rep = _compare(o, m)
    kinds = {f["path"]: (f["kind"], f["status"]) for f in rep["files"]}
    assert kinds == {"grid.png": ("image", "differs"), "hist.csv": ("csv", "differs"), "results.json": ("json", "differs"),
                     "blob.bin": ("other", "not compared")}
    diffs = {d["kind"]: d for d in rep["differences"]}
    assert diffs["dimensions"]["message"] == "grid.png is 32x32 in the migration, 64x32 in the original"
    assert diffs["rows"]["message"].startswith("hist.csv: 4 rows in the migration, 2 in the original: does every rank")
    assert diffs["keys"]["message"] == "results.json: its keys differ (only in the original: loss)"
    assert any(n == "not compared (a kind verify does not read): blob.bin" for n in rep["notes"]), rep["notes"]
    assert not any("bytes" in d["message"] for d in rep["differences"])


def test_stopped_runs_and_writes_outside_are_noted(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    elsewhere = Path.home() / ".dp2ddp-test-not-written"
    watch = run_files.Watch(folder, [])
    o = watch.after(_run("original", {0: [str(elsewhere)]}, stopped=True))
    m = run_files.Watch(folder, []).after(_run("migrated", {}, {0: 1, 1: 2}, stopped=True))
    rep = _compare(o, m, steps=5)
    assert rep["summary"] == "neither run wrote a file (nothing to compare)"
    assert any("stopped after 5 steps" in n for n in rep["notes"])
    assert any(str(elsewhere) in n and "not compared" in n for n in rep["notes"])


# --------------------------------------------------------------------------- real runs


def _writer(tmp_path: Path, migrated: str, *extra: str, envelope: bool = False):
    # a difference in the files the runs write: the losses are judged by --rtol, not a
    # measured envelope (a clean migration's checkpoint values are judged by it: envelope=True)
    return verify(tmp_path, fixture("writer.py"), "--migrated", fixture(migrated), "--steps", "0", "--min-speedup", "0",
                  *([] if envelope else ["--no-envelope"]), *extra)


def _differences(rep):
    return {d["kind"]: d for d in rep["outputs"]["differences"]}


@pytest.mark.torchrun
def test_clean_migration_passes_with_its_outputs_equal(tmp_path):
    ext = tmp_path / "results"
    code, rep, out, _ = _writer(tmp_path, "writer_ddp.py", "--", "--out-dir", str(ext), envelope=True)
    assert code == 0, out
    o = rep["outputs"]
    assert o["equal"] is True and o["differences"] == []
    assert {f["path"] for f in o["files"]} == {
        "runs/events.out.tfevents.*", "checkpoints/epoch0.pt", "checkpoints/epoch1.pt", "train.log", f"{ext}/results.json"}
    assert all(f["status"] == "equal" for f in o["files"])
    assert {f["path"]: f.get("compared") for f in o["files"]}["checkpoints/epoch1.pt"] == "keys, shapes and dtypes, values"
    assert {f["path"]: f["kind"] for f in o["files"]} == {
        "runs/events.out.tfevents.*": "events", "checkpoints/epoch0.pt": "checkpoint", "checkpoints/epoch1.pt": "checkpoint",
        "train.log": "text", f"{ext}/results.json": "json"}
    ckpt = {f["path"]: f for f in o["files"]}["checkpoints/epoch1.pt"]
    assert ckpt["original"]["load"] == ckpt["migrated"]["load"] == "default" and ckpt["values"]["worst_ratio"] <= 1
    assert str(ext) in o["roots"]
    assert "outputs: equal (5 files:" in out
    assert json.loads((ext / "results.json").read_text()) == {"epochs": 2, "steps": 16}


@pytest.mark.torchrun
def test_per_rank_event_files_and_a_log_every_rank_writes_are_reported(tmp_path):
    plot = tmp_path / "p.png"
    code, rep, out, _ = _writer(tmp_path, "writer_every_rank_ddp.py", "--plot", str(plot))
    assert code == 1, out
    assert rep["losses_agree"] and rep["replicas_in_sync"]  # trains identically; only the outputs differ
    d = _differences(rep)
    assert set(d) == {"count", "writers"}, rep["outputs"]["differences"]
    assert d["count"]["message"].startswith("the migration writes 2 TensorBoard event files in runs/, the original 1")
    assert "the names carry the pids of ranks 0 and 1" in d["count"]["message"]
    assert d["writers"]["message"] == ("train.log is written by every rank (ranks 0 and 1): 4 lines against the "
                                       "original's 2 (written at fixtures/verify/writer_every_rank_ddp.py:73)")
    assert "outputs: the migration writes 2 TensorBoard event files" in out and "advice: only rank 0 should write" in out
    assert plot.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.torchrun
def test_checkpoint_keys_that_gain_module_are_reported(tmp_path):
    code, rep, out, _ = _writer(tmp_path, "writer_module_keys_ddp.py")
    assert code == 1, out
    (d,) = rep["outputs"]["differences"]
    assert d["kind"] == "module_prefix" and d["paths"] == ["checkpoints/epoch0.pt", "checkpoints/epoch1.pt"]
    assert "gained the `module.` prefix: the original saves 0.weight, 0.bias, 2.weight, ..." in d["message"]
    assert "the migration module.0.weight, module.0.bias, module.2.weight, ..." in d["message"]
    assert "neither loads into the other's model" in d["message"]
    assert d["line"] == "fixtures/verify/writer_module_keys_ddp.py:71"
    # neutral: both ways named, no side taken against the migration's choice
    assert "`model.module.state_dict()` gives the bare keys" in d["advice"] and "`module.` ones" in d["advice"]
    assert rep["verdict"] == "fail" and any("gained the `module.` prefix" in p for p in rep["problems"])


@pytest.mark.torchrun
def test_a_file_no_rank_writes_any_more_is_reported(tmp_path):
    code, rep, out, _ = _writer(tmp_path, "writer_no_results_ddp.py")
    assert code == 1, out
    (d,) = rep["outputs"]["differences"]
    assert d["kind"] == "missing" and d["message"] == ("the migration does not write results/results.json; the original "
                                                       "does, at fixtures/verify/writer.py:60")
    assert "LOCAL_RANK" in d["advice"]


@pytest.mark.torchrun
def test_the_same_script_on_both_sides_shows_no_measurable_difference(tmp_path):
    """Both sides run one process doing the same work, so the true speed-up is 1: the
    repeated measurement must give an interval around it. A 95 % interval misses the truth
    one time in twenty, so a miss is measured once more (both missing: 1 in 400)."""
    work = tmp_path / "proj"
    work.mkdir()
    shutil.copy(FIXTURES / "same.py", work / "same.py")
    shutil.copy(FIXTURES / "same.py", work / "same_ddp.py")
    plot = tmp_path / "speed.png"
    for attempt in (1, 2):
        keep = tmp_path / f"scratch{attempt}"
        code, rep, out, _ = verify(
            tmp_path, str(work / "same.py"), "--nproc", "1", "--steps", "40", "--repeat", "2", "--threads", "1",
            "--workdir", str(keep), "--plot", str(plot),
        )
        assert code in (0, 1) and rep is not None, out
        if rep["speed"]["verdict"] == "no measurable difference":
            break
        if attempt == 1:
            import warnings

            warnings.warn(f"same script on both sides: {rep['speed']} (a 1-in-20 miss); measuring again")
    sp = rep["speed"]
    assert sp["verdict"] == "no measurable difference", (sp, out)
    lo, hi = sp["ci"]
    assert lo < 1 < hi and lo <= sp["geometric_mean"] <= hi
    assert sp["pairs"] == 2
    assert code == 0 and rep["verdict"] == "pass", out  # --min-speedup 1 is judged on the interval
    assert "no measurable difference" in out and "95% interval" in out
    # every run's figures are kept: 2 measured pairs, and a warm-up pair when the first was short
    warm = rep["pairs"][0]["warmup"]
    assert len(rep["pairs"]) == 2 + warm and warm == (rep["pairs"][0]["wall_s"] < 30)
    assert len(rep["runs"]) == 2 * len(rep["pairs"])
    assert all(r["samples_per_s"] > 0 and r["throughput"] for r in rep["runs"])
    assert [p["order"][0] for p in rep["pairs"]] == ["migrated", "original", "migrated"][: len(rep["pairs"])]
    # the same thread budget in both runs, stated in the report and seen by the scripts
    assert rep["threads"]["original"] == rep["threads"]["migrated"] == 1 and rep["threads"]["source"] == "--threads"
    assert "threads: 1 per process in both runs" in out
    for role in ("original", "migrated"):
        assert (keep / "pair1" / role / "threads.txt").read_text() == "1\n"
    assert plot.read_bytes()[:4] == b"\x89PNG"
    assert os.path.isdir(keep / "pair1" / "probe")


def test_module_prefix_is_judged_by_the_projects_own_loaders():
    # resnext's shape: train.py saves net.state_dict() of a wrap taken with --ngpu > 1, and
    # test.py strips `module.` before load_state_dict: rewrite writes the bare keys (its key
    # policy), and verify judges the difference by the same loaders
    from dp2ddp.model.checkpoint_keys import EITHER, PLAIN, PREFIXED, LoadSite
    from dp2ddp.verify.advice import module_prefix

    d = {"prefix": "module.", "how": "lost", "count": 2, "original_keys": ["module.a", "module.b"], "migrated_keys": ["a", "b"]}
    either = LoadSite("test.py", 83, EITHER)
    assert module_prefix(d, "its keys", True)[0] == "problem"  # no loader known: a problem
    sev, msg, _ = module_prefix(d, "its keys", True, [either])
    assert sev == "warning" and "test.py:83" in msg
    assert module_prefix(d, "its keys", True, [LoadSite("eval.py", 9, PLAIN)])[0] == "warning"
    sev, msg, _ = module_prefix(d, "its keys", True, [either, LoadSite("eval.py", 9, PREFIXED)])
    assert sev == "problem" and "eval.py:9" in msg


def _best_and_latest(tmp_path):
    def orig(folder):
        (folder / "out").mkdir()
        (folder / "out" / "latest.txt").write_text("state\n")
        (folder / "out" / "best.txt").write_text("state\n")

    def mig(folder):
        (folder / "out").mkdir()
        (folder / "out" / "latest.txt").write_text("state\n")

    o, m = _two_runs(tmp_path, orig, mig)
    o.sites.update({"out/latest.txt": "train.py:40", "out/best.txt": "train.py:40"})
    m.sites.update({"out/latest.txt": "train_ddp.py:55"})
    return o, m


@pytest.mark.parametrize("stochastic", [["batchnorm"], ["dropout"]])
def test_a_best_checkpoint_of_a_batchnorm_model_missing_where_its_line_runs_is_not_judged(tmp_path, stochastic):
    """robustness_madry: `save_checkpoint` writes checkpoint.pt.latest every epoch and
    checkpoint.pt.best when the validation accuracy improves; per-rank BatchNorm moved the
    migration's accuracy by one sample of 16 (0.0 against the original's 6.25), so only the
    original wrote the best. The same line wrote a file the migration writes too: the write
    runs on a rank, the missing file was a metric's decision: a warning, not a problem."""
    o, m = _best_and_latest(tmp_path)
    rep = _compare(o, m, stochastic=stochastic)
    (d,) = rep["differences"]
    assert (d["kind"], d["severity"]) == ("missing", "warning"), d
    assert d["message"].startswith("the migration does not write out/best.txt; the original does, at train.py:40, "
                                   "where the migration writes out/latest.txt too")
    assert "not judged" in d["message"]


@pytest.mark.parametrize("stochastic, same_line, values", [([], True, True), (["batchnorm"], False, True),
                                                            (["batchnorm"], True, False)])
def test_a_missing_file_stays_a_problem_for_a_deterministic_model_or_a_line_that_runs_on_no_rank(
        tmp_path, stochastic, same_line, values):
    o, m = _best_and_latest(tmp_path)
    if not same_line:
        o.sites["out/latest.txt"] = "train.py:41"
    rep = _compare(o, m, stochastic=stochastic, values=values)
    (d,) = rep["differences"]
    assert (d["kind"], d["severity"]) == ("missing", "problem"), d
    assert d["message"] == "the migration does not write out/best.txt; the original does, at train.py:40"


_SAVE_CHECKPOINT = """\
import shutil
import torch


def save_checkpoint(state, is_best, filename="out/latest.txt"):
    torch.save(state, filename)
    if is_best:
        shutil.copyfile(filename, "out/best.txt")
"""


@pytest.mark.parametrize("under_if", [True, False])
def test_a_best_copy_under_an_if_of_the_function_that_writes_the_latest_is_not_judged(tmp_path, under_if):
    """pytorch/examples imagenet: `save_checkpoint` saves checkpoint.pth.tar, then copies it
    to model_best.pth.tar under `if is_best:` on another line. Where the migration wrote the
    first from that function, the best copy was a metric's decision (a warning); a second
    write of the function under no `if` that the migration skipped stays a problem."""
    o, m = _best_and_latest(tmp_path)
    source = _SAVE_CHECKPOINT if under_if else _SAVE_CHECKPOINT.replace("    if is_best:\n        shutil", "    shutil")
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "train.py").write_text(source)
    o.base = tmp_path / "project"
    o.sites.update({"out/latest.txt": "train.py:6", "out/best.txt": "train.py:8" if under_if else "train.py:7"})
    rep = _compare(o, m, stochastic=["batchnorm"])
    (d,) = rep["differences"]
    assert (d["kind"], d["severity"]) == (("missing", "warning") if under_if else ("missing", "problem")), d
    if under_if:
        assert "at train.py:8, where the migration writes out/latest.txt too (the same line, or the same function" in d["message"]


def _with_optimizer(momentum_shift: float):
    """A checkpoint with a model and an SGD optimizer's state, its momentum buffer moved by
    ``momentum_shift`` (relative)."""
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    net(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
    state = opt.state_dict()
    for s in state["state"].values():
        s["momentum_buffer"] = s["momentum_buffer"] * (1 + momentum_shift)
    return {"model": net.state_dict(), "optimizer": state}


@pytest.mark.parametrize("shift, problem", [(3.6e-6, False), (1e-2, True)])
def test_momentum_buffers_are_judged_by_the_noise_of_summed_gradients(tmp_path, shift, problem):
    """train_det-style checkpoint (model and optimizer): a correct migration's momentum buffer
    differed by 3.6e-6 where the envelope's differed by 1.8e-7 (a gradient whose terms cancel
    rounds far more than its size); within the accumulators' floor (1e-4) that passes, while a
    momentum buffer 1 % off (a gradient scaled or not averaged) stays a problem."""
    o, m, e = _runs_with_envelope(tmp_path, _with_optimizer(0.0), _with_optimizer(shift), _with_optimizer(1.8e-7))
    rep = _compare(o, m, envelope=e, split=False, stochastic=[])
    problems = [d for d in rep["differences"] if d["severity"] == "problem"]
    if problem:
        (d,) = problems
        assert "momentum_buffer" in d["message"] and "beyond float noise" in d["message"], d
    else:
        assert not problems, problems


# --------------------------------------------------------------------------- NumPy's files


def _npy(array, path: Path):
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, array)


@pytest.mark.parametrize(
    "orig_shape, mig_shape, status, problem",
    [
        ((100, 8), (100, 8), "equal", None),
        ((100, 8), (100, 4), "differs", "shape"),  # features of another width
        ((16, 3), (8, 3), "share", None),  # rank 0's half of a batch: a note, as for a saved tensor
        ((100, 8), (40, 8), "differs", "shape"),  # not the world size's share
    ],
)
def test_numpy_arrays_are_compared_by_shape_and_dtype(tmp_path, orig_shape, mig_shape, status, problem):
    import numpy as np

    o, m = _two_runs(tmp_path, lambda f: _npy(np.zeros(orig_shape, np.float32), f / "feats.npy"),
                     lambda f: _npy(np.ones(mig_shape, np.float32), f / "feats.npy"))
    rep = _compare(o, m)
    (entry,) = rep["files"]
    assert (entry["kind"], entry["status"]) == ("array", status)
    assert [d["kind"] for d in rep["differences"]] == ([problem] if problem else [])
    if problem:
        assert f"{list(mig_shape)}" in rep["differences"][0]["message"]
        assert "array file" in rep["differences"][0]["advice"]


def test_numpy_dtype_and_npz_names_are_compared(tmp_path):
    import numpy as np

    def write(dtype, names):
        def w(f):
            _npy(np.zeros(4, dtype), f / "pred.npy")
            np.savez(f / "all.npz", **{n: np.zeros(3) for n in names})
        return w

    o, m = _two_runs(tmp_path, write(np.float32, ["a", "b"]), write(np.float64, ["a"]))
    rep = _compare(o, m)
    kinds = {d["paths"][0]: d["kind"] for d in rep["differences"]}
    assert kinds == {"pred.npy": "dtype", "all.npz": "keys"}
    assert "float32 in the original, float64 in the migration" in next(
        d["message"] for d in rep["differences"] if d["kind"] == "dtype")


def test_a_file_named_npy_that_is_not_one_is_not_compared(tmp_path):
    o, m = _two_runs(tmp_path, lambda f: (f / "x.npy").write_bytes(b"junk"), lambda f: (f / "x.npy").write_bytes(b"junk2"))
    rep = _compare(o, m)
    assert rep["files"][0]["status"] == "not compared"
    assert any("unreadable NumPy header" in n for n in rep["notes"]), rep["notes"]
