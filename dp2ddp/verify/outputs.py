"""What the runs leave behind: the files each run created or changed, compared.

A migration can train identically and still change its outputs: checkpoints whose keys
gained DDP's ``module.`` prefix, one TensorBoard event file per rank, a log every rank
appends to, a file no rank writes any more. Each run works in a scratch folder of its
own, so what it wrote is the difference between a snapshot of that folder before and
after the run (relative paths, sizes, modification times; symbolic links are never
followed). Folders named in the script's arguments that lie outside the scratch folder
(``--out-dir /abs/path``, ``../shared``) are watched the same way, just before and after
each run.

Names that differ only in numbers (times, process ids: TensorBoard's
``events.out.tfevents.<time>.<host>.<pid>``, ``rank0.log``) are grouped, so one event
file on each side is equal and two against one is a finding. Checkpoints are opened only
with ``torch.load(weights_only=True)`` (never a full unpickler) or, for ``.safetensors``,
by reading their JSON header; their nested keys, shapes and dtypes are compared, not
their values (the replicas' parameter hashes cover those). Which rank wrote a file comes
from the probe (an audit hook on ``open``/``os.rename`` and a ``torch.save`` wrapper).
"""

from __future__ import annotations

import json
import os
import re
import struct
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

SKIP_DIRS = {"__pycache__"}  # bytecode of imported local modules: both runs write it
MAX_ENTRIES = 20000  # per watched folder; beyond it the folder is not compared
MAX_LISTED = 4  # examples per message
NOT_WATCHED = ("/dev", "/proc", "/sys")

Stat = Tuple[int, int]  # size, mtime_ns


def snapshot(root: Path) -> Tuple[Dict[str, Stat], bool]:
    """``relative path -> (size, mtime_ns)`` for every file under ``root`` (``""`` when
    ``root`` is a file), and whether the walk was complete. Symbolic links are recorded as
    links, never followed: linked folders are the user's own."""
    out: Dict[str, Stat] = {}
    try:
        st = root.lstat()
    except OSError:
        return out, True
    if not root.is_dir() or root.is_symlink():
        out[""] = (st.st_size, st.st_mtime_ns)
        return out, True
    stack = [(root, "")]
    while stack:
        folder, rel = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for e in entries:
            name = f"{rel}{e.name}"
            try:
                if e.is_dir(follow_symlinks=False):
                    if e.name not in SKIP_DIRS:
                        stack.append((Path(e.path), name + "/"))
                    continue
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            out[name] = (st.st_size, st.st_mtime_ns)
            if len(out) > MAX_ENTRIES:
                return out, False
    return out, True


def named_paths(args: Sequence[str], cwd: Path) -> List[Path]:
    """Paths in the script's arguments that resolve outside the run's folder ``cwd``:
    absolute ones, ``~`` ones and ones that climb out with ``..``, as plain arguments or
    as ``--opt=value``. Relative paths inside ``cwd`` are in the run's own snapshot
    already. Kept: existing paths, and new ones whose parent folder exists."""
    out: List[Path] = []
    for a in args:
        v = a.split("=", 1)[1] if a.startswith("-") and "=" in a else a
        if not v or v.startswith("-"):
            continue
        if not (os.path.isabs(v) or v.startswith("~") or ".." in Path(v).parts):
            continue
        p = Path(os.path.normpath(cwd / os.path.expanduser(v)))
        if p == cwd or cwd in p.parents or p.parent == p:
            continue
        if str(p).startswith(NOT_WATCHED) or p in out:
            continue
        try:
            if p.exists() or p.parent.is_dir():
                out.append(p)
        except OSError:
            continue
    # a path inside another watched one is covered by it
    return [p for p in out if not any(q != p and q in p.parents for q in out)]


@dataclass
class Root:
    label: str  # "" for the run's own folder, else the path as shown
    path: Path
    before: Dict[str, Stat] = field(default_factory=dict)
    complete: bool = True


@dataclass
class RunOutputs:
    """What one run created, changed and deleted, by displayed path."""

    role: str
    files: Dict[str, int] = field(default_factory=dict)  # created or changed: size
    created: Set[str] = field(default_factory=set)
    deleted: Set[str] = field(default_factory=set)
    where: Dict[str, Path] = field(default_factory=dict)  # displayed path -> absolute path
    writers: Dict[str, Set[int]] = field(default_factory=dict)  # displayed path -> ranks that wrote it
    outside: List[str] = field(default_factory=list)  # written outside every watched folder
    incomplete: List[str] = field(default_factory=list)
    pids: Dict[int, int] = field(default_factory=dict)  # rank -> pid
    stopped: bool = False  # stopped by verify after --steps steps
    roots: List[str] = field(default_factory=list)


class Watch:
    """Snapshots of one run's folder and of the folders its arguments name, taken
    just before the run; :meth:`after` diffs them once it has ended."""

    def __init__(self, cwd: Path, args: Sequence[str]) -> None:
        self.roots = [Root("", cwd)] + [Root(str(p), p) for p in named_paths(args, cwd)]
        for r in self.roots:
            r.before, r.complete = snapshot(r.path)

    def after(self, run) -> RunOutputs:
        out = RunOutputs(role=run.role)
        out.roots = [r.label or "." for r in self.roots]
        for r in self.roots:
            now, complete = snapshot(r.path)
            if not (complete and r.complete):
                out.incomplete.append(r.label or ".")
                continue
            for rel, st in now.items():
                shown = _join(r.label, rel)
                old = r.before.get(rel)
                if old is None or old != st:
                    out.files[shown] = st[0]
                    out.where[shown] = r.path / rel if rel else r.path
                    if old is None:
                        out.created.add(shown)
            out.deleted.update(_join(r.label, rel) for rel in r.before if rel not in now)
        temp = tempfile.gettempdir()
        for rank, rec in sorted(run.ranks.items()):
            if rec.pid:
                out.pids[rank] = rec.pid
            if rec.end and rec.end.get("why") == "limit":
                out.stopped = True
            for path in rec.writes:
                shown = self._shown(path)
                if shown is not None:
                    out.writers.setdefault(shown, set()).add(rank)
                elif not path.startswith(NOT_WATCHED + (temp + os.sep,)) and path not in out.outside:
                    out.outside.append(path)
        return out

    def _shown(self, path: str) -> Optional[str]:
        for candidate in (path, os.path.realpath(path)):
            p = Path(candidate)
            for r in self.roots:
                if p == r.path:
                    return _join(r.label, "")
                if r.path in p.parents:
                    rel = p.relative_to(r.path).as_posix()
                    if any(part in SKIP_DIRS for part in rel.split("/")):
                        return None
                    return _join(r.label, rel)
        return None


def _join(label: str, rel: str) -> str:
    if not label:
        return rel
    return f"{label}/{rel}" if rel else label


# --------------------------------------------------------------------------- names

_TB = re.compile(r"^events\.out\.tfevents\.\d+(\.\d+)?\..+$")
_DIGITS = re.compile(r"\d+")


def is_tensorboard(path: str) -> bool:
    """A TensorBoard event file, or the group pattern of such files."""
    name = path.rsplit("/", 1)[-1]
    return name == "events.out.tfevents.*" or bool(_TB.match(name))


def pattern(path: str) -> str:
    """The name with what changes from run to run or process to process (numbers:
    times, pids, ranks) replaced: TensorBoard event files become
    ``events.out.tfevents.*``, every other run of digits ``<n>``."""
    folder, _, name = path.rpartition("/")
    name = "events.out.tfevents.*" if _TB.match(name) else _DIGITS.sub("<n>", name)
    folder = _DIGITS.sub("<n>", folder)
    return f"{folder}/{name}" if folder else name


def _pids_in_names(names: Sequence[str], pids: Dict[int, int]) -> List[int]:
    """Ranks whose pid appears as a number in one of the names."""
    by_pid = {str(pid): rank for rank, pid in pids.items()}
    ranks = set()
    for n in names:
        for d in _DIGITS.findall(n.rsplit("/", 1)[-1]):
            if d in by_pid:
                ranks.add(by_pid[d])
    return sorted(ranks)


# --------------------------------------------------------------------------- checkpoints

_LEGACY_MAGIC = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19."  # torch's pre-1.6 format
_ST_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
    "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
}


@dataclass(frozen=True)
class Spec:
    """A tensor as compared: its shape and dtype, not its values."""

    shape: Tuple[int, ...]
    dtype: str

    def __str__(self) -> str:
        return f"{self.dtype}{list(self.shape)}"


def kind_of(path: Path) -> str:
    """'torch', 'safetensors', 'tensorboard' or 'file', from the name and first bytes."""
    if is_tensorboard(path.name):
        return "tensorboard"
    if path.suffix == ".safetensors":
        return "safetensors"
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(_LEGACY_MAGIC))
        if head.startswith(_LEGACY_MAGIC):
            return "torch"
        if head[:4] == b"PK\x03\x04" and zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                if any(n == "data.pkl" or n.endswith("/data.pkl") for n in z.namelist()):
                    return "torch"
    except (OSError, zipfile.BadZipFile):
        pass
    return "file"


def load_structure(path: Path, kind: str) -> Tuple[Any, Optional[str]]:
    """The checkpoint's nested structure with tensors as :class:`Spec` (None and a reason
    when it cannot be read safely)."""
    if kind == "safetensors":
        try:
            with open(path, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                if n > 100 << 20:
                    return None, "safetensors header too large"
                header = json.loads(fh.read(n))
            return {k: Spec(tuple(v["shape"]), _ST_DTYPES.get(v["dtype"], v["dtype"].lower()))
                    for k, v in header.items() if k != "__metadata__"}, None
        except (OSError, ValueError, KeyError, TypeError, struct.error) as e:
            return None, f"unreadable safetensors header ({type(e).__name__})"
    import torch

    obj = None
    for mmap in (True, False):  # mmap: the tensors' bytes are not read (zip format only)
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
            break
        except Exception as e:  # noqa: BLE001 - any failure means: not compared
            err = e
    else:
        return None, f"torch.load(weights_only=True) refused it: {_first_line(str(err))}"
    return _specs(obj, torch, 0), None


def _specs(obj: Any, torch, depth: int) -> Any:
    if isinstance(obj, torch.Tensor):
        return Spec(tuple(obj.shape), str(obj.dtype).replace("torch.", ""))
    if depth > 20:
        return type(obj).__name__
    if isinstance(obj, dict):
        return {k: _specs(v, torch, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_specs(v, torch, depth + 1) for v in obj]
    return type(obj).__name__  # a value: its type is compared, not the value


def _first_line(s: str) -> str:
    lines = [x for x in s.strip().splitlines() if x.strip()]
    return (lines[0] if lines else "").strip()[:160]


def _key_path(path: Tuple) -> str:
    return "".join(f"[{k!r}]" for k in path)


def _prefix(orig_keys: List[Any], mig_keys: List[Any]) -> Optional[Tuple[str, str]]:
    """('gained'|'lost', prefix) when one key set is the other with a prefix such as
    ``module.`` added to every key."""
    if not orig_keys or not mig_keys or not all(isinstance(k, str) for k in orig_keys + mig_keys):
        return None
    for longer, shorter, how in ((mig_keys, orig_keys, "gained"), (orig_keys, mig_keys, "lost")):
        common = os.path.commonprefix(longer)
        cuts = [i + 1 for i, c in enumerate(common) if c == "."]
        for cut in cuts:  # shortest prefix first: 'module.' before 'module.net.'
            p = common[:cut]
            if {k[cut:] for k in longer} == set(shorter) and len(longer) == len(shorter):
                return how, p
    return None


def compare_structure(a: Any, b: Any, path: Tuple = (), out: Optional[List[Dict[str, Any]]] = None) -> List[Dict[str, Any]]:
    """Differences between two checkpoint structures (original ``a``, migration ``b``)."""
    out = [] if out is None else out
    if isinstance(a, dict) and isinstance(b, dict):
        ka, kb = list(a), list(b)
        if set(ka) == set(kb):
            for k in ka:
                compare_structure(a[k], b[k], path + (k,), out)
            return out
        pre = _prefix(ka, kb)
        if pre is not None:
            how, p = pre
            out.append({"what": "prefix", "path": path, "how": how, "prefix": p,
                        "keys": (kb if how == "gained" else ka)[:MAX_LISTED], "count": len(ka)})
            mapping = {k: p + k for k in ka} if how == "gained" else {k: k[len(p):] for k in ka}
            for k in ka:
                compare_structure(a[k], b[mapping[k]], path + (k,), out)
            return out
        only_a = [k for k in ka if k not in b]
        only_b = [k for k in kb if k not in a]
        out.append({"what": "keys", "path": path, "only_original": only_a, "only_migrated": only_b})
        for k in ka:
            if k in b:
                compare_structure(a[k], b[k], path + (k,), out)
        return out
    if isinstance(a, Spec) and isinstance(b, Spec):
        if a.shape != b.shape:
            out.append({"what": "shape", "path": path, "original": list(a.shape), "migrated": list(b.shape)})
        if a.dtype != b.dtype:
            out.append({"what": "dtype", "path": path, "original": a.dtype, "migrated": b.dtype})
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append({"what": "length", "path": path, "original": len(a), "migrated": len(b)})
        for i, (x, y) in enumerate(zip(a, b)):
            compare_structure(x, y, path + (i,), out)
        return out
    ta = "tensor" if isinstance(a, Spec) else ("dict" if isinstance(a, dict) else ("list" if isinstance(a, list) else a))
    tb = "tensor" if isinstance(b, Spec) else ("dict" if isinstance(b, dict) else ("list" if isinstance(b, list) else b))
    if ta != tb:
        out.append({"what": "type", "path": path, "original": ta, "migrated": tb})
    return out


# --------------------------------------------------------------------------- comparison


class _Report:
    def __init__(self) -> None:
        self.files: List[Dict[str, Any]] = []
        self.differences: List[Dict[str, Any]] = []
        self.notes: List[str] = []
        self.shares: Dict[str, List[str]] = {}  # note -> files: a saved tensor that is a rank's share of a batch

    def share(self, path: str, note: str) -> None:
        """A note that may hold for several files (a batch saved every epoch): one note listing them."""
        paths = self.shares.setdefault(note, [])
        if path not in paths:
            paths.append(path)

    def add(self, path: str, kind: str, severity: str, message: str, advice: str) -> None:
        """``message`` names the file as ``{path}``: the same finding in several files
        (a checkpoint per epoch) becomes one difference that lists them."""
        for d in self.differences:
            if (d["kind"], d["severity"], d["template"], d["advice"]) == (kind, severity, message, advice):
                d["paths"].append(path)
                return
        self.differences.append({"paths": [path], "kind": kind, "severity": severity, "template": message, "advice": advice})

    def finished(self) -> List[Dict[str, Any]]:
        out = []
        for d in self.differences:
            paths = d["paths"]
            shown = ", ".join(paths[:MAX_LISTED]) + (f" and {len(paths) - MAX_LISTED} more" if len(paths) > MAX_LISTED else "")
            out.append({"path": paths[0], "paths": paths, "kind": d["kind"], "severity": d["severity"],
                        "message": d["template"].replace("{path}", shown), "advice": d["advice"]})
        return out


ADVICE_NO_RANK = (
    "the write runs on no rank: guard it with `if dist.get_rank() == 0:`, and check that rank 0 reaches it; a "
    "rank read from a `--local_rank` argument stays at its default under torchrun, which sets the LOCAL_RANK "
    "environment variable instead"
)
ADVICE_RANK0 = (
    "only rank 0 should write it: put the write under `if dist.get_rank() == 0:` "
    "(and `dist.barrier()` before other ranks read it)"
)


def compare(orig: RunOutputs, mig: RunOutputs, world: int, dp_in_original: bool, steps: int = 0) -> Dict[str, Any]:
    """The ``outputs`` section: files, differences (each with a severity and advice), notes."""
    rep = _Report()
    o_files, m_files = orig.files, mig.files
    groups: Dict[str, Tuple[List[str], List[str]]] = {}
    for p in sorted(o_files):
        groups.setdefault(pattern(p), ([], []))[0].append(p)
    for p in sorted(m_files):
        groups.setdefault(pattern(p), ([], []))[1].append(p)

    # within a group: the same names first, then names that differ only in numbers
    pairs: List[Tuple[str, str, str]] = []  # (shown, original, migrated)
    for pat, (os_, ms) in sorted(groups.items()):
        same = [p for p in os_ if p in m_files]
        pairs.extend((p, p, p) for p in same)
        if len(os_) == len(ms):
            left_o, left_m = [p for p in os_ if p not in same], [p for p in ms if p not in same]
            pairs.extend((pat, a, b) for a, b in zip(left_o, left_m))
        else:
            _count(rep, pat, os_, ms, orig, mig, world)

    for shown, a, b in pairs:
        _one(rep, shown, a, b, orig, mig, world, dp_in_original)

    # written by several ranks
    for p, ranks in sorted(mig.writers.items()):
        if len(ranks) > 1 and p in m_files and not any(p in d["paths"] and d["kind"] == "writers" for d in rep.differences):
            size = ""
            if p in o_files and o_files[p]:
                size = f"; {m_files[p]} bytes against the original's {o_files[p]}"
            rep.add(p, "writers", "problem", f"{{path}} is written by every rank ({_ranks(ranks)}){size}", ADVICE_RANK0)

    # deletions
    for p in sorted(orig.deleted ^ mig.deleted):
        who = "original" if p in orig.deleted else "migration"
        other = "migration" if who == "original" else "original"
        rep.add(p, "deleted", "warning", f"the {who} deletes {{path}}, the {other} does not",
                "check that the clean-up runs on the rank that should do it (once, on rank 0)")

    if orig.stopped and mig.stopped:
        rep.notes.append(
            f"both runs stopped after {steps} steps (--steps): what the scripts write after that point "
            "(a final checkpoint, results) was written by neither and is not compared; --steps 0 runs them to the end"
        )
    for run in (orig, mig):
        for label in run.incomplete:
            rep.notes.append(f"{label}: more than {MAX_ENTRIES} entries in the {run.role} run: not compared")
    shared = [r for r in orig.roots if r != "." and r in mig.roots]
    if shared:
        rep.notes.append(
            "folders named in the arguments, shared by both runs (each run's changes there are compared; "
            "each run also sees what the runs before it left there): " + ", ".join(shared)
        )
    outside = sorted(set(orig.outside) | set(mig.outside))
    if outside:
        more = f" and {len(outside) - MAX_LISTED} more" if len(outside) > MAX_LISTED else ""
        rep.notes.append("written outside the compared folders, not compared: " + ", ".join(outside[:MAX_LISTED]) + more)

    for note, paths in rep.shares.items():
        shown = ", ".join(paths[:MAX_LISTED]) + (f" and {len(paths) - MAX_LISTED} more" if len(paths) > MAX_LISTED else "")
        rep.notes.insert(0, note.replace("{path}", shown))
    differences = rep.finished()
    return {
        "equal": not differences,
        "files": rep.files,
        "differences": differences,
        "notes": rep.notes,
        "roots": sorted(set(orig.roots) | set(mig.roots)),
        "summary": summary_line(rep.files, differences),
    }


def _ranks(ranks) -> str:
    r = sorted(ranks)
    return "rank " + str(r[0]) if len(r) == 1 else "ranks " + ", ".join(map(str, r[:-1])) + f" and {r[-1]}"


def _count(rep: _Report, pat: str, os_: List[str], ms: List[str], orig: RunOutputs, mig: RunOutputs, world: int) -> None:
    """A group of names (equal up to numbers) with a different number of files on each side."""
    tb = is_tensorboard(pat)
    folder = pat.rpartition("/")[0] or "."
    what = "TensorBoard event files" if tb else f"files named {pat}"
    entry = {
        "path": pat,
        "kind": "tensorboard" if tb else "file",
        "original": {"files": len(os_), "bytes": sum(orig.files[p] for p in os_)},
        "migrated": {"files": len(ms), "bytes": sum(mig.files[p] for p in ms)},
        "status": "differs",
    }
    rep.files.append(entry)
    if not ms:
        entry["status"] = "missing"
        names = ", ".join(os_[:MAX_LISTED])
        rep.add(pat, "missing", "problem",
                f"the migration does not write {names if len(os_) == 1 else what + ' (' + names + ')'}; the original does",
                ADVICE_NO_RANK)
        return
    if not os_:
        entry["status"] = "extra"
        rep.add(pat, "extra", "warning",
                f"only the migration writes {what if len(ms) > 1 else ms[0]} ({len(ms)} file{'s' if len(ms) > 1 else ''})",
                "if these are per-rank files, write them on rank 0 only; if they are new on purpose (a rendezvous "
                "file, say), nothing to do")
        return
    if len(ms) > len(os_):
        carriers = _pids_in_names(ms, mig.pids)
        why = []
        if len(ms) == len(os_) * world:
            why.append(f"one per process of {world}")
        if len(carriers) > 1:
            why.append(f"the names carry the pids of {_ranks(carriers)}")
        if tb:
            advice = ("only rank 0 should write: create the SummaryWriter under `if dist.get_rank() == 0:` "
                      "(and guard its add_scalar/close calls, or give the other ranks `None`)")
        else:
            advice = ("one per process: write it on rank 0 only (`if dist.get_rank() == 0:`); if per-rank files are "
                      "intended, name them by rank, not by process id")
        rep.add(pat, "count", "problem",
                f"the migration writes {len(ms)} {what} in {folder}/, the original {len(os_)}"
                + (f" ({'; '.join(why)})" if why else ""), advice)
        return
    rep.add(pat, "count", "problem",
            f"the migration writes {len(ms)} of the original's {len(os_)} {what} in {folder}/", ADVICE_NO_RANK)


def _one(rep: _Report, shown: str, a: str, b: str, orig: RunOutputs, mig: RunOutputs, world: int, dp_in_original: bool) -> None:
    """One file on each side (the same path, or names that differ only in numbers)."""
    sa, sb = orig.files[a], mig.files[b]
    kind = kind_of(mig.where[b])
    if kind == "file":
        kind = kind_of(orig.where[a])
    entry: Dict[str, Any] = {
        "path": shown,
        "kind": kind,
        "original": {"files": 1, "bytes": sa},
        "migrated": {"files": 1, "bytes": sb},
        "status": "equal",
    }
    if a != b:
        entry["names"] = [a, b]
    rep.files.append(entry)
    ranks = mig.writers.get(b, set())
    if len(ranks) > 1:
        entry["status"] = "differs"
        size = f"; {sb} bytes against the original's {sa}" if sb != sa else ""
        rep.add(b, "writers", "problem", f"{{path}} is written by every rank ({_ranks(ranks)}){size}", ADVICE_RANK0)
        return
    if kind in ("torch", "safetensors"):
        sta, why_a = load_structure(orig.where[a], kind)
        stb, why_b = load_structure(mig.where[b], kind)
        if sta is None or stb is None:
            rep.notes.append(f"{shown}: {why_a or why_b}; compared by size only")
        else:
            entry["compared"] = "keys, shapes and dtypes"
            diffs = compare_structure(sta, stb)
            share = _batch_share(diffs, world)
            if share is not None:
                entry["status"] = "share"
                who = f"rank {min(ranks)}'s" if len(ranks) == 1 else "one rank's"
                o, m = share
                rep.share(shown, f"{{path}}: the saved tensor is {who} share of a batch, not the whole batch "
                                 f"(shape {m} in the migration, {o} in the original: 1/{world} of dimension 0); "
                                 "under DDP each rank holds its part of the global batch; gather it "
                                 "(`dist.all_gather`) before saving if the whole batch is wanted")
                return
            for d in diffs:
                entry["status"] = "differs"
                _checkpoint_difference(rep, shown, d, dp_in_original)
            return
    if sa == sb:
        return
    entry["status"] = "differs"
    if sa and not sb:
        rep.add(shown, "size", "problem", f"{{path}} is empty in the migration ({sa} bytes in the original)",
                "a rank truncates it after another wrote it, or the write no longer runs: " + ADVICE_RANK0)
    elif sa and world > 1 and abs(sb / sa - world) <= 0.15 * world and not ranks:
        rep.add(shown, "size", "problem",
                f"{{path}} is about {world} times the original's size ({sb} bytes against {sa}): does every rank write to it?",
                ADVICE_RANK0)
    else:
        rep.add(shown, "size", "warning", f"{{path}}: {sb} bytes in the migration, {sa} in the original",
                "if the content depends on the run (times, float formatting), nothing to do; otherwise compare the "
                "two files in the scratch folder (--workdir keeps it)")


def _batch_share(diffs: List[Dict[str, Any]], world: int) -> Optional[Tuple[List[int], List[int]]]:
    """(original shape, migrated shape) when the only difference is that the saved object
    is a plain tensor (not a state_dict or a checkpoint entry) whose dimension 0 is the
    original's divided by the world size, every other dimension equal: a rank's share of a
    batch (DCGAN's ``torch.save(real_cpu, ...)``), which is how DDP splits the batch."""
    if world < 2 or len(diffs) != 1:
        return None
    d = diffs[0]
    if d["what"] != "shape" or d["path"] != ():
        return None
    o, m = list(d["original"]), list(d["migrated"])
    if len(o) != len(m) or not o or o[1:] != m[1:] or m[0] * world != o[0]:
        return None
    return o, m


def _checkpoint_difference(rep: _Report, shown: str, d: Dict[str, Any], dp_in_original: bool) -> None:
    where = _key_path(d["path"])
    keys_of = f"the keys under {where}" if where else "its keys"
    at = f"{where} " if where else "the saved object "
    what = d["what"]
    if what == "prefix":
        p, how = d["prefix"], d["how"]
        keys = ", ".join(map(str, d["keys"][:3]))
        msg = f"{{path}}: {keys_of} {how} the `{p}` prefix ({keys}{', ...' if d['count'] > 3 else ''}; {d['count']} keys)"
        if how == "gained" and p == "module." and not dp_in_original:
            rep.add(shown, "module_prefix", "warning",
                    msg + "; the original ran without DataParallel here, so its keys have none",
                    "DataParallel adds the same `module.` where the original wraps the model (on GPUs), so the formats "
                    "agree there; to save the same keys on every device, save `model.module.state_dict()`")
        elif how == "gained":
            rep.add(shown, "module_prefix", "problem", msg,
                    "the checkpoint now holds the DDP wrapper's state_dict: save `model.module.state_dict()` "
                    "so that it loads into the bare model as before")
        else:
            rep.add(shown, "module_prefix", "problem", msg,
                    "code that loads these checkpoints into a DataParallel model expects the prefix: save the DDP "
                    "model's `model.state_dict()` to keep it, or update the loading code (strip or add `module.`)")
        return
    if what == "keys":
        parts = []
        if d["only_original"]:
            parts.append("only in the original: " + ", ".join(map(str, d["only_original"][:MAX_LISTED])))
        if d["only_migrated"]:
            parts.append("only in the migration: " + ", ".join(map(str, d["only_migrated"][:MAX_LISTED])))
        rep.add(shown, "keys", "problem", f"{{path}}: {keys_of} differ ({'; '.join(parts)})",
                "the migration saves a different object (the wrapper instead of the model, a dropped optimizer "
                "or scheduler state): save what the original saved")
    elif what in ("shape", "length"):
        rep.add(shown, what, "problem",
                f"{{path}}: {at}has {what} {d['original']} in the original, {d['migrated']} in the migration",
                "a size that depends on the world size or on the per-process batch ends up in the checkpoint: "
                "derive it from the global values")
    elif what == "dtype":
        rep.add(shown, "dtype", "problem",
                f"{{path}}: {at}is {d['original']} in the original, {d['migrated']} in the migration",
                "the migration changes the precision of what it saves (autocast, .half() or a default dtype set on "
                "some path): save in the original's dtype")
    else:
        rep.add(shown, "type", "problem",
                f"{{path}}: {at}is {d['original']} in the original, {d['migrated']} in the migration",
                "the migration saves a different kind of object there: save what the original saved")


def summary_line(files: List[Dict[str, Any]], differences: List[Dict[str, Any]]) -> str:
    """One line for the report: 'equal (...)', 'nothing written', or the findings."""
    if not files and not differences:
        return "neither run wrote a file (nothing to compare)"

    def listed(names: List[str]) -> str:
        return ", ".join(names[:MAX_LISTED]) + (f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else "")

    def shown(f: Dict[str, Any]) -> str:
        if f["status"] == "share":
            return f["path"] + " (a rank's share of the batch: see notes)"
        return f["path"] + (" (keys, shapes, dtypes)" if f.get("compared") else "")

    if not differences:
        names = [shown(f) for f in files]
        return f"equal ({len(files)} file{'s' if len(files) != 1 else ''}: {listed(names)})"
    problems = sum(d["severity"] == "problem" for d in differences)
    warnings = len(differences) - problems
    parts = []
    if problems:
        parts.append(f"{problems} problem{'s' if problems > 1 else ''}")
    if warnings:
        parts.append(f"{warnings} warning{'s' if warnings > 1 else ''}")
    differing = []
    for d in differences:
        differing.extend(p for p in d["paths"] if p not in differing)
    equal = [f["path"] for f in files if f["status"] in ("equal", "share") and f["path"] not in differing]
    tail = f"; equal: {listed(equal)}" if equal else ""
    return f"{' and '.join(parts)} ({listed(differing)}){tail}"
