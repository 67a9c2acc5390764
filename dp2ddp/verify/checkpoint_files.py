"""Checkpoint files, read: the classes a pickle references (:func:`pickle_refs`), a
safetensors file's structure, both runs' checkpoints loaded in a fresh Python without a
process group or dp2ddp (:func:`load_checkpoints`, ``ckpt_load.py``), and the differences
between two structures (:func:`compare_structure`: keys, shapes, dtypes, a ``module.``
prefix gained or lost)."""

from __future__ import annotations

import io
import json
import os
import pickletools
import re
import shlex
import struct
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

from dp2ddp.verify.file_kinds import ST_DTYPES
from dp2ddp.verify.output_report import MAX_LISTED
from dp2ddp.verify.run_files import RunOutputs


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
        return {k: Spec(tuple(v["shape"]), ST_DTYPES.get(v["dtype"], v["dtype"].lower()))
                for k, v in header.items() if k != "__metadata__"}, None
    except (OSError, ValueError, KeyError, TypeError, struct.error) as e:
        return None, f"unreadable safetensors header ({type(e).__name__})"


_NPY_MAGIC = b"\x93NUMPY"
_NPY_KINDS = {"f": "float", "i": "int", "u": "uint", "b": "bool", "c": "complex"}


def _npy_header(fh) -> Spec:
    """The shape and dtype a ``.npy`` stream's header declares (NumPy's format, versions 1
    to 3), read without NumPy and without the data."""
    import ast

    if fh.read(6) != _NPY_MAGIC:
        raise ValueError("not a .npy file")
    major = fh.read(2)[0]
    (n,) = struct.unpack("<H" if major == 1 else "<I", fh.read(2 if major == 1 else 4))
    header = ast.literal_eval(fh.read(n).decode("latin1"))
    descr = header["descr"]
    if isinstance(descr, str) and len(descr) >= 3 and descr[1] in _NPY_KINDS and descr[2:].isdigit():
        bits = int(descr[2:]) * 8
        dtype = "bool" if descr[1] == "b" else f"{_NPY_KINDS[descr[1]]}{bits}"
    else:
        dtype = str(descr)  # a record, string or object dtype: compared as NumPy spells it
    return Spec(tuple(int(d) for d in header["shape"]), dtype)


def numpy_structure(path: Path) -> Tuple[Any, Optional[str]]:
    """A ``.npy`` file's array, or a ``.npz`` file's arrays by name, as :class:`Spec`s
    (shape and dtype from their headers; the data is not read)."""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                found = {}
                for name in z.namelist():
                    if name.endswith(".npy"):
                        with z.open(name) as fh:
                            found[name[:-4]] = _npy_header(fh)
                return found, None
        with open(path, "rb") as fh:
            return _npy_header(fh), None
    except (OSError, ValueError, KeyError, TypeError, IndexError, SyntaxError, struct.error, zipfile.BadZipFile) as e:
        return None, f"unreadable NumPy header ({type(e).__name__})"


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


def first_line(s: str, limit: int = 0) -> str:
    """The first non-blank line of a message, without terminal colour codes (``limit``:
    at most that many characters)."""
    lines = [x for x in strip_ansi(s).strip().splitlines() if x.strip()]
    line = (lines[0] if lines else "").strip()
    return line[:limit] if limit else line


def key_path(path: Tuple) -> str:
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


def plain(node: Any) -> Any:
    """A JSON document's structure: dicts and lists kept, every other value by its type."""
    if isinstance(node, dict):
        return {k: plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [plain(v) for v in node]
    return {bool: "bool", int: "number", float: "number", str: "string", type(None): "null"}.get(type(node), "value")
