"""What the runs leave behind: the files each run created or changed, compared as a user
would use them.

A migration can train identically and still change its outputs: a checkpoint that pickles
the DistributedDataParallel wrapper (it loads nowhere without a process group), keys that
gained DDP's ``module.`` prefix, one TensorBoard event file per rank, a log every rank
appends to, a file no rank writes any more. Each run works in a copy of the project of its
own, so what it wrote is the difference between a snapshot of that copy before and after
the run (relative paths, sizes, modification times; links to the user's files are not
outputs). Folders named in the script's arguments that lie outside it (``--out-dir
/abs/path``) are watched the same way, just before and after each run.

Every file is classified -- checkpoint, text, event file, image, JSON, CSV or other -- and
compared by what it holds:

* checkpoints are loaded by both sides in a fresh Python, without a process group or
  dp2ddp (``ckpt_load.py``), the way the project's own code would load them; a pickle that
  references ``DistributedDataParallel`` or fails to load where the original's loads is a
  problem naming the line that saved it. Keys, shapes and dtypes are compared, and the
  values where both runs saved at the same step and the noise envelope's run (the original
  again, each batch in chunks) saved too: it says how far float noise alone moves them;
* text files by their lines, JSON by its structure, CSV by header and rows, images by their
  dimensions; event files by their count; anything else is listed as not compared.

Names that differ only in numbers (times, process ids: TensorBoard's
``events.out.tfevents.<time>.<host>.<pid>``, ``rank0.log``) are grouped, so one event
file on each side is equal and two against one is a finding. Which rank wrote a file, and
the line that opened or saved it, come from the probe.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import pickletools
import re
import shlex
import struct
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

SKIP_DIRS = {"__pycache__"}  # bytecode of imported local modules: both runs write it
MAX_ENTRIES = 20000  # per watched folder; beyond it the folder is not compared
MAX_LISTED = 4  # examples per message
NOT_WATCHED = ("/dev", "/proc", "/sys")
ENVELOPE_FACTOR = 10.0  # a value may differ this many times the envelope's difference ...
VALUE_FLOOR = 1e-6  # ... or this much (relative), whichever is larger

Stat = Tuple[int, int]  # size, mtime_ns


def snapshot(root: Path) -> Tuple[Dict[str, Stat], bool]:
    """``relative path -> (size, mtime_ns)`` for every file under ``root`` (``""`` when
    ``root`` is a file), and whether the walk was complete. Symbolic links are never
    followed; links that point out of ``root`` (the run's links to the user's files) are
    not the run's files and are left out."""
    out: Dict[str, Stat] = {}
    try:
        st = root.lstat()
    except OSError:
        return out, True
    if not root.is_dir() or root.is_symlink():
        out[""] = (st.st_size, st.st_mtime_ns)
        return out, True
    base = str(root) + os.sep
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
                if e.is_symlink():
                    target = os.path.normpath(os.path.join(folder, os.readlink(e.path)))
                    if not target.startswith(base):
                        continue  # a link to the user's file or folder
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


def named_paths(args: Sequence[str], cwd: Path, inside: Optional[Path] = None) -> List[Path]:
    """Paths in the script's arguments that resolve outside the run's copy of the project
    (``inside``, default ``cwd``): absolute ones, ``~`` ones and ones that climb out with
    ``..``, as plain arguments or as ``--opt=value``. Kept: existing paths, and new ones
    whose parent folder exists."""
    inside = inside or cwd
    out: List[Path] = []
    for a in args:
        v = a.split("=", 1)[1] if a.startswith("-") and "=" in a else a
        if not v or v.startswith("-"):
            continue
        if not (os.path.isabs(v) or v.startswith("~") or ".." in Path(v).parts):
            continue
        p = Path(os.path.normpath(cwd / os.path.expanduser(v)))
        if p == inside or inside in p.parents or p.parent == p:
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
    label: str  # "" for the run's own copy of the project, else the path as shown
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
    sites: Dict[str, str] = field(default_factory=dict)  # displayed path -> "file.py:line" that opened or saved it
    steps: Dict[str, int] = field(default_factory=dict)  # displayed path -> step of its last write
    outside: List[str] = field(default_factory=list)  # written outside every watched folder
    incomplete: List[str] = field(default_factory=list)
    pids: Dict[int, int] = field(default_factory=dict)  # rank -> pid
    stopped: bool = False  # stopped by verify after --steps steps
    roots: List[str] = field(default_factory=list)
    cwd: Optional[Path] = None  # where the run started
    syspath: List[str] = field(default_factory=list)  # what the project's own code would import from
    work: Optional[Path] = None  # where verify may put what it derives (flattened checkpoints)


class Watch:
    """Snapshots of one run's copy of the project (``root``) and of the folders its
    arguments name, taken just before the run; :meth:`after` diffs them once it has ended.
    Paths are shown relative to the folder the run starts in (``cwd``)."""

    def __init__(self, root: Path, args: Sequence[str], cwd: Optional[Path] = None, syspath: Sequence[str] = ()) -> None:
        self.cwd = cwd or root
        self.base = root
        self.syspath = [str(p) for p in syspath] or [str(self.cwd), str(root)]
        self.roots = [Root("", root)] + [Root(str(p), p) for p in named_paths(args, self.cwd, root)]
        for r in self.roots:
            r.before, r.complete = snapshot(r.path)

    def show(self, r: Root, rel: str) -> str:
        if r.label:
            return _join(r.label, rel)
        shown = os.path.relpath(r.path / rel, self.cwd) if rel else "."
        return Path(shown).as_posix()

    def after(self, run, work: Optional[Path] = None) -> RunOutputs:
        out = RunOutputs(role=run.role, cwd=self.cwd, syspath=self.syspath, work=work)
        out.roots = [r.label or "." for r in self.roots]
        for r in self.roots:
            now, complete = snapshot(r.path)
            if not (complete and r.complete):
                out.incomplete.append(r.label or ".")
                continue
            for rel, st in now.items():
                shown = self.show(r, rel)
                old = r.before.get(rel)
                if old is None or old != st:
                    out.files[shown] = st[0]
                    out.where[shown] = r.path / rel if rel else r.path
                    if old is None:
                        out.created.add(shown)
            out.deleted.update(self.show(r, rel) for rel in r.before if rel not in now)
        temp = tempfile.gettempdir()
        for rank, rec in sorted(run.ranks.items(), reverse=True):  # the lowest rank's site wins
            if rec.pid:
                out.pids[rank] = rec.pid
            if rec.end and rec.end.get("why") == "limit":
                out.stopped = True
            for path in rec.writes:
                shown = self._shown(path)
                if shown is not None:
                    out.writers.setdefault(shown, set()).add(rank)
                    site = (rec.write_sites or {}).get(path)
                    if site:
                        out.sites[shown] = self.site(site)
                    if path in (rec.write_steps or {}):
                        out.steps[shown] = rec.write_steps[path]
                elif not path.startswith(NOT_WATCHED + (temp + os.sep,)) and path not in out.outside:
                    out.outside.append(path)
        return out

    def site(self, site) -> str:
        """``file.py:line`` of a probe site, the file relative to the project's copy."""
        path, line = site
        p = Path(path)
        name = p.relative_to(self.base).as_posix() if p == self.base or self.base in p.parents else p.name
        return f"{name}:{line}"

    def _shown(self, path: str) -> Optional[str]:
        for candidate in (path, os.path.realpath(path)):
            p = Path(candidate)
            for r in self.roots:
                if p == r.path:
                    return self.show(r, "")
                if r.path in p.parents:
                    rel = p.relative_to(r.path).as_posix()
                    if any(part in SKIP_DIRS for part in rel.split("/")):
                        return None
                    return self.show(r, rel)
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


# --------------------------------------------------------------------------- kinds

_LEGACY_MAGIC = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19."  # torch's pre-1.6 format
_ST_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
    "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
}
IMAGES = {".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp", ".tif", ".tiff"}
TEXTS = {".log", ".txt", ".out", ".err", ".md", ".yaml", ".yml", ".cfg", ".ini", ".jsonl", ".tsv"}
KINDS = ("checkpoint", "text", "events", "image", "json", "csv", "other")


def kind_of(path: Path) -> str:
    """What a file is, from its name and first bytes: ``checkpoint`` (torch.save's formats,
    ``.safetensors``), ``events`` (TensorBoard), ``image``, ``json``, ``csv``, ``text`` or
    ``other``."""
    if is_tensorboard(path.name):
        return "events"
    suffix = path.suffix.lower()
    if suffix == ".safetensors" or torch_format(path):
        return "checkpoint"
    if suffix in IMAGES:
        return "image"
    if suffix == ".json":
        return "json"
    if suffix == ".csv":
        return "csv"
    if suffix in TEXTS:
        return "text"
    try:
        with open(path, "rb") as fh:
            head = fh.read(8192)
    except OSError:
        return "other"
    if b"\0" in head:
        return "other"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 4:  # not a character cut at the end of the sample
            return "other"
    return "text"


def torch_format(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(_LEGACY_MAGIC))
        if head.startswith(_LEGACY_MAGIC):
            return True
        if head[:4] == b"PK\x03\x04" and zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                return any(n == "data.pkl" or n.endswith("/data.pkl") for n in z.namelist())
    except (OSError, zipfile.BadZipFile):
        pass
    return False


# --------------------------------------------------------------------------- checkpoints


@dataclass(frozen=True)
class Spec:
    """A tensor as compared: its shape and dtype, not its values."""

    shape: Tuple[int, ...]
    dtype: str

    def __str__(self) -> str:
        return f"{self.dtype}{list(self.shape)}"


DDP_REF = "torch.nn.parallel.distributed.DistributedDataParallel"


def pickle_refs(path: Path) -> Set[str]:
    """The classes and functions a torch checkpoint's pickle refers to (``module.name``), read
    from its opcodes without unpickling anything."""
    refs: Set[str] = set()
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                name = next(n for n in z.namelist() if n == "data.pkl" or n.endswith("/data.pkl"))
                _refs(io.BytesIO(z.read(name)), refs)
        else:
            with open(path, "rb") as fh:
                for _ in range(4):  # the legacy format: magic, protocol, sys info, the object
                    _refs(fh, refs)
    except Exception:  # noqa: BLE001 - what could be read is what we know
        pass
    return refs


def _refs(stream, refs: Set[str]) -> None:
    strings: List[Any] = []
    memo: Dict[int, Any] = {}
    for op, arg, _ in pickletools.genops(stream):
        name = op.name
        if name in ("GLOBAL", "INST"):
            module, _, attr = str(arg).partition(" ")
            refs.add(f"{module}.{attr}")
        elif name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
            strings.append(arg)
        elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
            memo[int(arg)] = strings[-1] if strings else None
        elif name == "MEMOIZE":
            memo[len(memo)] = strings[-1] if strings else None
        elif name in ("BINGET", "LONG_BINGET", "GET"):
            strings.append(memo.get(int(arg)))
        elif name == "STACK_GLOBAL" and len(strings) >= 2:
            module, attr = strings[-2], strings[-1]
            if isinstance(module, str) and isinstance(attr, str):
                refs.add(f"{module}.{attr}")


def safetensors_structure(path: Path) -> Tuple[Any, Optional[str]]:
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


def decode(node: Any) -> Any:
    """A structure from ckpt_load.py's JSON: dicts, lists, :class:`Spec` for tensors, a
    pickled module as its state_dict, and type names for other values."""
    if "t" in node:
        shape, dtype = node["t"]
        return Spec(tuple(shape), dtype)
    if "m" in node:
        return decode(node["s"])
    if "d" in node:
        return {k: decode(v) for k, v in node["d"]}
    if "l" in node:
        return [decode(v) for v in node["l"]]
    return node.get("v", "?")


LOADER = Path(__file__).resolve().parent / "ckpt_load.py"


def load_checkpoints(jobs: Dict[str, Tuple[RunOutputs, List[Tuple[Path, Optional[Path], str]]]],
                     timeout: float = 600.0) -> Dict[str, Dict[str, Dict[str, Any]]]:
    """Load each run's checkpoints in a fresh Python of its own (ckpt_load.py, concurrently):
    ``{role: {path: result}}``. ``jobs``: role -> (its outputs, [(file, flat file or None,
    mode)])."""
    procs = {}
    results: Dict[str, Dict[str, Dict[str, Any]]] = {}
    tmp = tempfile.mkdtemp(prefix="dp2ddp-ckpt-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DP2DDP_VERIFY") and k != "PYTHONPATH"}
    from dp2ddp.verify.runner import LAUNCHER_VAR

    launcher = shlex.split(os.environ.get(LAUNCHER_VAR, ""))  # dp2ddp's tests: see runner.py
    try:
        for role, (run, files) in jobs.items():
            if not files:
                continue
            spec = Path(tmp) / f"{role}.json"
            spec.write_text(json.dumps({
                "path": run.syspath, "cwd": str(run.cwd) if run.cwd else None,
                "files": [{"path": str(p), "flat": str(f) if f else None, "mode": m} for p, f, m in files],
            }))
            procs[role] = subprocess.Popen(
                [*launcher, sys.executable, "-I", str(LOADER), str(spec)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL, env=env, text=True, cwd=str(run.cwd) if run.cwd else None)
        for role, p in procs.items():
            try:
                out, err = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
            got = {}
            for line in out.splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                got[rec["path"]] = rec
            if p.returncode and not got:
                msg = strip_ansi(err).strip().splitlines()
                got = {str(f): {"load": "failed", "errors": {"loader": msg[-1] if msg else f"exit code {p.returncode}"}}
                       for f, _, _ in jobs[role][1]}
            results[role] = got
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return results


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def _first_line(s: str) -> str:
    lines = [x for x in strip_ansi(s).strip().splitlines() if x.strip()]
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
                        "original_keys": ka[:MAX_LISTED], "migrated_keys": kb[:MAX_LISTED],
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


def _plain(node: Any) -> Any:
    """A JSON document's structure: dicts and lists kept, every other value by its type."""
    if isinstance(node, dict):
        return {k: _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return {bool: "bool", int: "number", float: "number", str: "string", type(None): "null"}.get(type(node), "value")


# --------------------------------------------------------------------------- comparison


class _Report:
    unjudged: Optional[str] = None  # why checkpoint values beyond the envelope are not judged
    unjudged_files: Dict[Optional[str], List[Tuple[str, str, float, float]]]  # line -> (file, tensor, diff, envelope's)
    batches: List[int] = []  # the original's samples per step
    world: int = 1
    decided: Optional[str] = None  # why a metric-decided write (a best checkpoint) may legitimately differ

    def __init__(self) -> None:
        self.files: List[Dict[str, Any]] = []
        self.differences: List[Dict[str, Any]] = []
        self.notes: List[str] = []
        self.shares: Dict[str, List[str]] = {}  # note -> files: a saved tensor that is a rank's share of a batch
        self.not_compared: Dict[str, List[str]] = {}  # why -> files
        self.unjudged_files = {}

    def share(self, path: str, note: str) -> None:
        """A note that may hold for several files (a batch saved every epoch): one note listing them."""
        paths = self.shares.setdefault(note, [])
        if path not in paths:
            paths.append(path)

    def add(self, path: str, kind: str, severity: str, message: str, advice: str, line: Optional[str] = None) -> None:
        """``message`` names the file as ``{path}``: the same finding in several files
        (a checkpoint per epoch) becomes one difference that lists them."""
        for d in self.differences:
            if (d["kind"], d["severity"], d["template"], d["advice"], d["line"]) == (kind, severity, message, advice, line):
                d["paths"].append(path)
                return
        self.differences.append({"paths": [path], "kind": kind, "severity": severity, "template": message,
                                 "advice": advice, "line": line})

    def finished(self) -> List[Dict[str, Any]]:
        out = []
        for d in self.differences:
            paths = d["paths"]
            shown = ", ".join(paths[:MAX_LISTED]) + (f" and {len(paths) - MAX_LISTED} more" if len(paths) > MAX_LISTED else "")
            message = d["template"].replace("{path}", shown)
            if d["line"]:
                message += f" (written at {d['line']})"
            item = {"path": paths[0], "paths": paths, "kind": d["kind"], "severity": d["severity"],
                    "message": message, "advice": d["advice"]}
            if d["line"]:
                item["line"] = d["line"]
            out.append(item)
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


def compare(orig: RunOutputs, mig: RunOutputs, world: int, dp_in_original: bool, steps: int = 0,
            envelope: Optional[RunOutputs] = None, values: bool = True,
            loader: Optional[Callable[..., Dict[str, Dict[str, Dict[str, Any]]]]] = None,
            split: bool = True, stochastic: Sequence[str] = (), batches: Sequence[int] = (),
            readers: Sequence[Any] = ()) -> Dict[str, Any]:
    """The ``outputs`` section: files, differences (each with a severity, advice and the line
    that wrote the file where the probe saw it), notes.

    ``split``: the envelope run split its batches into world-size chunks (a DataParallel
    forward ran in it); ``stochastic``: the model's per-process kinds (``batchnorm``,
    ``dropout``); without the split the envelope measures neither, and checkpoint values
    that differ beyond it are reported as not judged (a warning), not as a problem.
    ``batches``: the original's samples per step, for images of a rank's share of a batch."""
    rep = _Report()
    rep.unjudged = unjudged_reason(world, split, stochastic) if envelope is not None and values else None
    kinds = [k for k in ("batchnorm", "dropout", "random") if k in stochastic]
    rep.decided = (" and ".join({"batchnorm": "BatchNorm", "dropout": "dropout", "random": "random draws in the step"}[k] for k in kinds)
                   if kinds and values else None)
    rep.batches = sorted({int(b) for b in batches if b})
    rep.world = world
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

    checkpoints = []
    for shown, a, b in pairs:
        entry = _one(rep, shown, a, b, orig, mig, world)
        if entry is not None:
            checkpoints.append(entry)
    if checkpoints:
        _checkpoints(rep, checkpoints, orig, mig, envelope if values else None, world, dp_in_original,
                     loader or load_checkpoints, readers)
        if envelope is not None and not values:
            rep.notes.append("checkpoint values not compared: the losses already differ")

    # written by several ranks
    for p, ranks in sorted(mig.writers.items()):
        if len(ranks) > 1 and p in m_files and not any(p in d["paths"] and d["kind"] == "writers" for d in rep.differences):
            rep.add(p, "writers", "problem", f"{{path}} is written by every rank ({_ranks(ranks)}){_lines(orig, mig, p, p)}",
                    ADVICE_RANK0, mig.sites.get(p))

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
    for why, paths in rep.not_compared.items():
        rep.notes.append(f"not compared ({why}): " + ", ".join(paths[:MAX_LISTED])
                         + (f" and {len(paths) - MAX_LISTED} more" if len(paths) > MAX_LISTED else ""))

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


def unjudged_reason(world: int, split: bool, stochastic: Sequence[str]) -> Optional[str]:
    """Why the envelope cannot judge checkpoint values (None when it can): the model
    computes something per process that the envelope run does not reproduce.

    Without the split (the original ran no DataParallel forward on this machine, so the
    envelope run perturbed the gradients instead) it measures neither BatchNorm statistics
    nor dropout masks. With the split it still does not hold DDP's: DataParallel's chunks
    are contiguous slices of the whole batch, a rank's share is whatever its sampler or
    loaders hand it (a DistributedSampler strides over the dataset, a batch assembled from
    several loaders holds a part of each), so the statistics each BatchNorm normalises
    with differ; the chunks update the running statistics once each, one after the other,
    where DDP keeps rank 0's (its buffers are broadcast); and the chunks' dropout masks
    come from one random stream in turn, each rank's from its own. The losses, compared as
    a moving average, and the replicas' hashes still judge the training."""
    kinds = [k for k in ("batchnorm", "dropout", "random") if k in stochastic]
    if not kinds:
        return None
    what = {
        "batchnorm": f"BatchNorm normalises each rank's 1/{world} of the batch and keeps running statistics from it "
                     f"(as DataParallel does over {world} GPUs), the original's the whole batch",
        "dropout": "dropout draws each rank's masks from that process's own random stream",
        "random": "the training step draws random numbers (a permutation, noise), each rank from its own stream, "
                  "where the original drew the whole batch's at once",
    }
    if not split:
        return ("; ".join(what[k] for k in kinds)
                + f"; the envelope run could not measure that: the original ran no DataParallel forward on this machine "
                  f"(a script that wraps the model only on GPUs), so its batches could not be split into {world} chunks "
                  "as DataParallel splits them, and a gradient perturbation per step was measured instead")
    chunked = {
        "batchnorm": f"BatchNorm normalises each rank's share of the batch, as its sampler or loaders hand it out, "
                     f"and DDP keeps rank 0's running statistics (its buffers are broadcast); the envelope run's "
                     f"{world} chunks are contiguous slices of the whole batch, each updating the running statistics "
                     "in turn",
        "dropout": "dropout draws each rank's masks from that process's own random stream, the envelope run's chunks "
                   "theirs from one stream in turn",
        "random": what["random"],
    }
    return ("; ".join(chunked[k] for k in kinds)
            + f"; so the envelope run (the original with each batch split into {world} chunks by DataParallel) measures "
              "float noise, not these per-process differences")


def grid_share(za: Tuple[int, int], zb: Tuple[int, int], batches: Sequence[int], world: int) -> Optional[Tuple[int, int]]:
    """(images in the original's grid, in the migration's) when the two images are grids of
    the same tiles (``torchvision.utils.make_grid``/``save_image``: ``nrow`` per row,
    ``padding`` pixels around each) holding a whole batch of the original (one of
    ``batches``, its samples per step) and 1/world of it: the migration drew the batch
    rank 0 holds, its share of the global batch."""
    if world < 2 or za == zb:
        return None
    (wo, ho), (wm, hm) = za, zb
    for n in batches:
        if n < world or n % world:
            continue
        m = n // world
        for pad in range(0, 17):
            for nrow in range(1, n + 1):
                xo = min(nrow, n)
                yo = -(-n // xo)
                if (wo - pad) % xo or (ho - pad) % yo:
                    continue
                cw, ch = (wo - pad) // xo, (ho - pad) // yo
                if cw - pad < 2 or ch - pad < 2:
                    continue
                xm = min(nrow, m)
                ym = -(-m // xm)
                if (xm * cw + pad, ym * ch + pad) == (wm, hm) or (m == 1 and (cw - pad, ch - pad) == (wm, hm)):
                    return n, m
                if xo == n:
                    break  # a larger nrow draws the same grid
    return None


def _ranks(ranks) -> str:
    r = sorted(ranks)
    return "rank " + str(r[0]) if len(r) == 1 else "ranks " + ", ".join(map(str, r[:-1])) + f" and {r[-1]}"


def line_count(path: Optional[Path]) -> Optional[int]:
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def _lines(orig: RunOutputs, mig: RunOutputs, a: Optional[str], b: str) -> str:
    """'; 4 lines against the original's 2' for text files, else the sizes."""
    mb = mig.where.get(b)
    oa = orig.where.get(a) if a else None
    if mb is not None and kind_of(mb) in ("text", "csv"):
        lm, lo = line_count(mb), line_count(oa)
        if lo is not None and lm is not None:
            return f": {lm} lines against the original's {lo}"
        return f": {lm} lines" if lm is not None else ""
    if a and a in orig.files and orig.files[a] and b in mig.files:
        return f"; {mig.files[b]} bytes against the original's {orig.files[a]}"
    return ""


def _count(rep: _Report, pat: str, os_: List[str], ms: List[str], orig: RunOutputs, mig: RunOutputs, world: int) -> None:
    """A group of names (equal up to numbers) with a different number of files on each side."""
    tb = is_tensorboard(pat)
    folder = pat.rpartition("/")[0] or "."
    what = "TensorBoard event files" if tb else f"files named {pat}"
    sample = (mig.where.get(ms[0]) if ms else None) or (orig.where.get(os_[0]) if os_ else None)
    entry = {
        "path": pat,
        "kind": "events" if tb else (kind_of(sample) if sample else "other"),
        "original": {"files": len(os_), "bytes": sum(orig.files[p] for p in os_)},
        "migrated": {"files": len(ms), "bytes": sum(mig.files[p] for p in ms)},
        "status": "differs",
    }
    rep.files.append(entry)
    line = next((mig.sites[p] for p in ms if p in mig.sites), None)
    if not ms:
        entry["status"] = "missing"
        names = ", ".join(os_[:MAX_LISTED])
        written = next((orig.sites[p] for p in os_ if p in orig.sites), None)
        # the same line of the original wrote other files that the migration writes too: that
        # write runs on a rank, and this file was one call's decision (`if is_best:`)
        reached = sorted(p for p, site in orig.sites.items()
                         if written and site == written and p not in os_ and p in mig.files)
        if rep.decided and reached:
            entry["status"] = "not judged"
            rep.add(pat, "missing", "warning",
                    f"the migration does not write {names if len(os_) == 1 else what + ' (' + names + ')'}; the original "
                    f"does, at {written}, where the migration writes {', '.join(reached[:MAX_LISTED])} too: the line "
                    f"runs on a rank, and this file was one call's decision (a best checkpoint, `if is_best:`), which "
                    f"a metric of a model with {rep.decided} decides; per-rank {rep.decided} moves such a metric "
                    "legitimately (the losses agree as a moving average), so its absence is not judged",
                    "check that the condition of this write (a best accuracy, say) is computed the same way on rank 0 "
                    "as in the original, from the whole evaluation set", None)
            return
        rep.add(pat, "missing", "problem",
                f"the migration does not write {names if len(os_) == 1 else what + ' (' + names + ')'}; the original does"
                + (f", at {written}" if written else ""), ADVICE_NO_RANK)
        return
    if not os_:
        entry["status"] = "extra"
        rep.add(pat, "extra", "warning",
                f"only the migration writes {what if len(ms) > 1 else ms[0]} ({len(ms)} file{'s' if len(ms) > 1 else ''})",
                "if these are per-rank files, write them on rank 0 only; if they are new on purpose (a rendezvous "
                "file, say), nothing to do", line)
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
                + (f" ({'; '.join(why)})" if why else ""), advice, line)
        return
    rep.add(pat, "count", "problem",
            f"the migration writes {len(ms)} of the original's {len(os_)} {what} in {folder}/", ADVICE_NO_RANK, line)


def _one(rep: _Report, shown: str, a: str, b: str, orig: RunOutputs, mig: RunOutputs, world: int) -> Optional[Dict[str, Any]]:
    """One file on each side (the same path, or names that differ only in numbers); a
    checkpoint is returned, to be loaded with the others."""
    sa, sb = orig.files[a], mig.files[b]
    kind = kind_of(mig.where[b])
    ko = kind_of(orig.where[a])
    if kind != ko and kind in ("text", "other") and ko not in ("text", "other"):
        kind = ko  # the original's says more (a checkpoint the migration garbled stays a checkpoint)
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
        rep.add(b, "writers", "problem", f"{{path}} is written by every rank ({_ranks(ranks)}){_lines(orig, mig, a, b)}",
                ADVICE_RANK0, mig.sites.get(b))
        return None
    if kind == "checkpoint":
        entry["_a"], entry["_b"], entry["_ranks"] = a, b, ranks
        return entry
    if kind == "text":
        _text(rep, entry, shown, a, b, orig, mig, world)
    elif kind == "json":
        _json(rep, entry, shown, a, b, orig, mig, world)
    elif kind == "csv":
        _csv(rep, entry, shown, a, b, orig, mig, world)
    elif kind == "image":
        _image(rep, entry, shown, a, b, orig, mig, ranks)
    elif kind == "events":
        entry["compared"] = "count"  # one on each side; their records are not read
    else:
        entry["status"] = "not compared"
        rep.not_compared.setdefault("a kind verify does not read", []).append(shown)
    return None


def _text(rep, entry, shown, a, b, orig, mig, world) -> None:
    lo, lm = line_count(orig.where[a]), line_count(mig.where[b])
    entry["compared"] = "lines"
    entry["original"]["lines"], entry["migrated"]["lines"] = lo, lm
    if lo == lm:
        return
    entry["status"] = "differs"
    line = mig.sites.get(b)
    if lo and not lm:
        rep.add(shown, "lines", "problem", f"{{path}} is empty in the migration ({lo} lines in the original)",
                "a rank truncates it after another wrote it, or the write no longer runs: " + ADVICE_RANK0, line)
    elif lo and world > 1 and lm == lo * world:
        rep.add(shown, "lines", "problem",
                f"{{path}} has {world} times the original's lines ({lm} against {lo}): does every rank write to it?",
                ADVICE_RANK0, line)
    else:
        rep.add(shown, "lines", "warning", f"{{path}}: {lm} lines in the migration, {lo} in the original",
                "if the lines depend on the run (times, progress output), nothing to do; otherwise compare the "
                "two files in the scratch folder (--workdir keeps it)", line)


def _json(rep, entry, shown, a, b, orig, mig, world) -> None:
    try:
        da = json.loads(Path(orig.where[a]).read_text())
        db = json.loads(Path(mig.where[b]).read_text())
    except (OSError, ValueError) as e:
        entry["status"] = "not compared"
        rep.not_compared.setdefault(f"not valid JSON: {type(e).__name__}", []).append(shown)
        return
    entry["compared"] = "structure"
    diffs = compare_structure(_plain(da), _plain(db))
    for d in diffs:
        entry["status"] = "differs"
        _structure_difference(rep, shown, d, mig.sites.get(b), "JSON")


def _csv(rep, entry, shown, a, b, orig, mig, world) -> None:
    try:
        ra = list(csv.reader(io.StringIO(Path(orig.where[a]).read_text())))
        rb = list(csv.reader(io.StringIO(Path(mig.where[b]).read_text())))
    except (OSError, ValueError, csv.Error):
        entry["status"] = "not compared"
        rep.not_compared.setdefault("unreadable CSV", []).append(shown)
        return
    entry["compared"] = "header and rows"
    line = mig.sites.get(b)
    if ra[:1] != rb[:1] and not (_numbers(ra[:1]) and _numbers(rb[:1])):  # a first row of numbers is data, not a header
        entry["status"] = "differs"
        rep.add(shown, "header", "problem", f"{{path}}: its header differs ({', '.join((rb or [[]])[0][:MAX_LISTED])} "
                f"against the original's {', '.join((ra or [[]])[0][:MAX_LISTED])})",
                "the migration writes different columns: write what the original wrote", line)
    elif len(ra) != len(rb):
        entry["status"] = "differs"
        body_a, body_b = max(0, len(ra) - 1), max(0, len(rb) - 1)
        severe = world > 1 and body_a and body_b == body_a * world
        rep.add(shown, "rows", "problem" if severe else "warning",
                f"{{path}}: {body_b} rows in the migration, {body_a} in the original"
                + (": does every rank append to it?" if severe else ""),
                ADVICE_RANK0 if severe else "rows that depend on the run are no finding; otherwise compare the files", line)


def _numbers(rows) -> bool:
    """A CSV row (a list of one row) whose every cell is a number: values of the run (a
    loss log without a header), which differ as the run's values may, not columns."""
    if not rows or not rows[0]:
        return False
    try:
        [float(c) for c in rows[0] if c.strip()]
    except ValueError:
        return False
    return any(c.strip() for c in rows[0])


def image_size(path: Path) -> Optional[Tuple[int, int]]:
    """(width, height) of a PNG, GIF, BMP or JPEG file, from its header."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64 * 1024)
    except OSError:
        return None
    if head[:8] == b"\x89PNG\r\n\x1a\n" and len(head) >= 24:
        return struct.unpack(">II", head[16:24])
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return struct.unpack("<HH", head[6:10])
    if head[:2] == b"BM" and len(head) >= 26:
        w, h = struct.unpack("<ii", head[18:26])
        return w, abs(h)
    if head[:2] == b"\xff\xd8":
        i = 2
        while i + 9 < len(head):
            if head[i] != 0xFF:
                i += 1
                continue
            marker = head[i + 1]
            if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF):
                h, w = struct.unpack(">HH", head[i + 5:i + 9])
                return w, h
            (length,) = struct.unpack(">H", head[i + 2:i + 4])
            i += 2 + length
    return None


def _image(rep, entry, shown, a, b, orig, mig, ranks=()) -> None:
    za, zb = image_size(orig.where[a]), image_size(mig.where[b])
    if za is None or zb is None:
        entry["status"] = "not compared"
        rep.not_compared.setdefault("an image format verify does not read", []).append(shown)
        return
    entry["compared"] = "dimensions"
    share = grid_share(za, zb, rep.batches, rep.world) if za != zb else None
    if share is not None:
        # a grid of the batch a rank holds (DCGAN's save_image(real_cpu)): the per-process
        # batch, like a saved tensor that is a rank's share; reported, not failed
        entry["status"] = "share"
        n, m = share
        who = f"rank {min(ranks)}'s" if len(ranks) == 1 else "one rank's"
        rep.add(shown, "dimensions", "warning",
                f"{{path}} is {zb[0]}x{zb[1]} in the migration, {za[0]}x{za[1]} in the original: a grid of {m} images "
                f"where the original's has {n}, {who} share of a batch of {n} (under DDP each rank holds 1/{rep.world} "
                "of the global batch)",
                "if the whole batch is wanted in the image, gather it (`dist.all_gather`) before drawing it",
                mig.sites.get(b))
        return
    if za != zb:
        entry["status"] = "differs"
        rep.add(shown, "dimensions", "problem",
                f"{{path}} is {zb[0]}x{zb[1]} in the migration, {za[0]}x{za[1]} in the original",
                "an image of one rank's share of a batch is smaller than the original's: gather the batch "
                "(`dist.all_gather`) before drawing it", mig.sites.get(b))


def _checkpoints(rep: _Report, entries: List[Dict[str, Any]], orig: RunOutputs, mig: RunOutputs,
                 envelope: Optional[RunOutputs], world: int, dp_in_original: bool, loader, readers: Sequence[Any] = ()) -> None:
    """Load every checkpoint of both runs (and of the envelope's run, for the values) the way
    the project's own code would, then compare them."""
    flat_dir = (mig.work or Path(tempfile.gettempdir())) / "flat"
    values = envelope is not None
    jobs: Dict[str, Tuple[RunOutputs, List[Tuple[Path, Optional[Path], str]]]] = {"original": (orig, []), "migrated": (mig, [])}
    if values:
        jobs["envelope"] = (envelope, [])
        flat_dir.mkdir(parents=True, exist_ok=True)
    parity = {}
    for i, e in enumerate(entries):
        a, b = e["_a"], e["_b"]
        same_step = values and a in orig.steps and orig.steps.get(a) == mig.steps.get(b) and a in envelope.files
        parity[i] = same_step
        for role, run, name in (("original", orig, a), ("migrated", mig, b)):
            if run.where[name].suffix == ".safetensors":
                continue
            jobs[role][1].append((run.where[name], flat_dir / f"{role}-{i}.pt" if same_step else None, "default"))
        if same_step and envelope.where[a].suffix != ".safetensors":
            jobs["envelope"][1].append((envelope.where[a], flat_dir / f"envelope-{i}.pt", "default"))
    loaded = loader(jobs)
    for i, e in enumerate(entries):
        a, b = e.pop("_a"), e.pop("_b")
        ranks = e.pop("_ranks")
        pa, pb = orig.where[a], mig.where[b]
        shown = e["path"]
        line = mig.sites.get(b)
        e["format"] = "safetensors" if pb.suffix == ".safetensors" else "torch"
        if e["format"] == "safetensors":
            sta, why_a = safetensors_structure(pa)
            stb, why_b = safetensors_structure(pb)
            if sta is None or stb is None:
                e["status"] = "not compared"
                rep.not_compared.setdefault(why_a or why_b or "unreadable", []).append(shown)
                continue
            e["compared"] = "keys, shapes and dtypes"
            _structure_findings(rep, e, shown, compare_structure(sta, stb), dp_in_original, world, ranks, line, readers)
            continue
        ra = loaded.get("original", {}).get(str(pa), {"load": "failed", "errors": {"loader": "not loaded"}})
        rb = loaded.get("migrated", {}).get(str(pb), {"load": "failed", "errors": {"loader": "not loaded"}})
        refs_b = pickle_refs(pb)
        refs_a = pickle_refs(pa)
        e["original"]["load"], e["migrated"]["load"] = ra["load"], rb["load"]
        if DDP_REF in refs_b and DDP_REF not in refs_a:
            e["status"] = "differs"
            rep.add(shown, "wrapper", "problem",
                    "{path} pickles the DistributedDataParallel wrapper"
                    + (f" (saved at {line})" if line else "")
                    + ": it loads only where a process group exists, not in the project's own scripts"
                    + (f" ({_error(rb)})" if rb["load"] == "failed" else ""),
                    "save the model itself, as the original did: `model.module` (or `model.module.state_dict()`) "
                    "instead of the DDP-wrapped `model`", None)
            continue
        if ra["load"] != "failed" and rb["load"] == "failed":
            e["status"] = "differs"
            rep.add(shown, "load", "problem",
                    "{path} does not load in a fresh Python without a process group, where the original's does"
                    + (f" (saved at {line})" if line else "") + f": {_error(rb)}",
                    "save what the original saved (plain tensors or state_dicts, no distributed objects)", None)
            continue
        if ra["load"] == "default" and rb["load"] == "full":
            e["status"] = "differs"
            rep.add(shown, "load", "problem",
                    "{path} needs torch.load(weights_only=False), the original's loads with torch.load's defaults"
                    + (f" (saved at {line})" if line else "") + f": {_error(rb, 'default')}",
                    "save tensors and state_dicts as the original did, not whole objects", None)
            continue
        if ra["load"] == "failed":
            e["status"] = "not compared"
            rep.not_compared.setdefault(f"the original's does not load in a fresh Python either: {_error(ra)}", []).append(shown)
            continue
        if "structure" not in ra or "structure" not in rb:
            e["status"] = "not compared"
            rep.not_compared.setdefault("its structure could not be read", []).append(shown)
            continue
        e["compared"] = "keys, shapes and dtypes" + (" (loaded with weights_only=False, as the original's must be)"
                                                     if ra["load"] == "full" else "")
        diffs = compare_structure(decode(ra["structure"]), decode(rb["structure"]))
        _structure_findings(rep, e, shown, diffs, dp_in_original, world, ranks, line, readers)
        if parity.get(i) and e["status"] == "equal":
            env = loaded.get("envelope", {}).get(str(envelope.where[a]), {})
            _values(rep, e, shown, ra.get("flat"), rb.get("flat"), env.get("flat"), line, rep.unjudged)
    for line, found in rep.unjudged_files.items():
        shown, k, dm, de = max(found, key=lambda x: x[2] / max(x[3], 1e-300))
        in_file = f" of {shown}" if len(found) > 1 else ""
        for path, *_ in found:
            rep.add(path, "values", "warning",
                    f"{{path}}: values not judged: they differ by more than the noise envelope allows (worst: {k}{in_file}, "
                    f"relative difference {dm:.3g}, the envelope's {de:.3g}), and the envelope cannot tell whether that is "
                    f"legitimate: {rep.unjudged}",
                    "nothing to change for this alone: the losses are compared above; to have these values judged "
                    "against DataParallel's own split, run verify where the original wraps DataParallel (on GPUs)", line)


def _error(r: Dict[str, Any], mode: Optional[str] = None) -> str:
    errors = r.get("errors") or {}
    text = errors.get(mode) if mode else (errors.get("full") or errors.get("default") or errors.get("loader"))
    return strip_ansi(text or "it fails to load")


def _structure_findings(rep, entry, shown, diffs, dp_in_original, world, ranks, line, readers=()) -> None:
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
        _structure_difference(rep, shown, d, line, "checkpoint", dp_in_original, readers)


def _values(rep, entry, shown, fa, fb, fe, line, unjudged: Optional[str] = None) -> None:
    """The tensors of both checkpoints (saved at the same step) against the envelope's: each
    may differ by ENVELOPE_FACTOR times what float noise alone made of it, or VALUE_FLOOR.
    With ``unjudged`` (why the envelope cannot measure what differs per process), a tensor
    beyond that is a warning saying so, not a problem."""
    if not (fa and fb and fe):
        return
    try:
        import torch

        ta = torch.load(fa, weights_only=True)
        tb = torch.load(fb, weights_only=True)
        te = torch.load(fe, weights_only=True)
    except Exception:  # noqa: BLE001
        return
    norm = re.compile(r"(^|/)module\.")
    tb = {norm.sub(r"\1", k): v for k, v in tb.items()}
    ta = {norm.sub(r"\1", k): v for k, v in ta.items()}
    te = {norm.sub(r"\1", k): v for k, v in te.items()}
    worst, where = 0.0, None
    for k, x in ta.items():
        y, z = tb.get(k), te.get(k)
        if y is None or z is None or x.shape != y.shape or x.shape != z.shape or not x.is_floating_point():
            continue
        dm, de = _reldiff(x, y, torch), _reldiff(x, z, torch)
        allowed = max(VALUE_FLOOR, ENVELOPE_FACTOR * de)
        ratio = dm / allowed
        if ratio > worst:
            worst, where = ratio, (k, dm, de)
    entry["compared"] += ", values"
    entry["values"] = {"worst_ratio": worst, "tensor": where[0] if where else None,
                       "difference": where[1] if where else 0.0, "envelope": where[2] if where else 0.0}
    if worst > 1 and where and unjudged:
        entry["status"] = "not judged"
        entry["values"]["judged"] = False
        rep.unjudged_files.setdefault(line, []).append((shown,) + where)  # one finding per line that saved them
        return
    if worst > 1 and where:
        entry["status"] = "differs"
        k, dm, de = where
        rep.add(shown, "values", "problem",
                f"{{path}}: its values differ beyond float noise ({k}: relative difference {dm:.3g}, the noise "
                f"envelope's {de:.3g}, {ENVELOPE_FACTOR:g}x allowed)",
                "the migration saves a different state at the same step: save after the same step, from the "
                "synchronised model (`model.module`)", line)


def _reldiff(x, y, torch) -> float:
    x, y = x.double(), y.double()
    num = float(torch.linalg.vector_norm(x - y))
    den = max(float(torch.linalg.vector_norm(x)), float(torch.linalg.vector_norm(y)), 1e-30)
    return num / den if math.isfinite(num) else math.inf


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


def _structure_difference(rep: _Report, shown: str, d: Dict[str, Any], line: Optional[str], what_file: str = "checkpoint",
                          dp_in_original: bool = True, readers: Sequence[Any] = ()) -> None:
    from dp2ddp.verify.advice import module_prefix

    where = _key_path(d["path"])
    keys_of = f"the keys under {where}" if where else "its keys"
    at = f"{where} " if where else "the saved object "
    what = d["what"]
    if what == "prefix":
        severity, message, advice = module_prefix(d, keys_of, dp_in_original, readers)
        rep.add(shown, "module_prefix", severity, message, advice, line)
        return
    if what == "keys":
        parts = []
        if d["only_original"]:
            parts.append("only in the original: " + ", ".join(map(str, d["only_original"][:MAX_LISTED])))
        if d["only_migrated"]:
            parts.append("only in the migration: " + ", ".join(map(str, d["only_migrated"][:MAX_LISTED])))
        rep.add(shown, "keys", "problem", f"{{path}}: {keys_of} differ ({'; '.join(parts)})",
                "the migration saves a different object (the wrapper instead of the model, a dropped optimizer "
                "or scheduler state): save what the original saved", line)
    elif what in ("shape", "length"):
        rep.add(shown, what, "problem",
                f"{{path}}: {at}has {what} {d['original']} in the original, {d['migrated']} in the migration",
                "a size that depends on the world size or on the per-process batch ends up in the "
                f"{what_file}: derive it from the global values", line)
    elif what == "dtype":
        rep.add(shown, "dtype", "problem",
                f"{{path}}: {at}is {d['original']} in the original, {d['migrated']} in the migration",
                "the migration changes the precision of what it saves (autocast, .half() or a default dtype set on "
                "some path): save in the original's dtype", line)
    else:
        rep.add(shown, "type", "problem",
                f"{{path}}: {at}is {d['original']} in the original, {d['migrated']} in the migration",
                "the migration saves a different kind of object there: save what the original saved", line)


def summary_line(files: List[Dict[str, Any]], differences: List[Dict[str, Any]]) -> str:
    """One line for the report: 'equal (...)', 'nothing written', or the findings."""
    if not files and not differences:
        return "neither run wrote a file (nothing to compare)"

    def listed(names: List[str]) -> str:
        return ", ".join(names[:MAX_LISTED]) + (f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else "")

    def shown(f: Dict[str, Any]) -> str:
        if f["status"] == "share":
            return f["path"] + " (a rank's share of the batch: see notes)"
        if f["status"] == "not compared":
            return f["path"] + " (not compared)"
        return f["path"] + (f" ({f['compared']})" if f.get("compared") else "")

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
