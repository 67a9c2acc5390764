"""What an output file is, by its name and its first bytes: the kind it is compared as
(:func:`kind_of`: checkpoint, text, event file, image, JSON, CSV or other), and the
pattern that groups names differing only in numbers (:func:`pattern`: times, process ids,
ranks)."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path
from typing import Dict, List, Sequence


_TB = re.compile(r"^events\.out\.tfevents\.\d+(\.\d+)?\..+$")


# a run of digits, with the numbers a name adds to it (``run_archived_185935_1``: a clock and the
# suffix that keeps a second archive of the same second apart)
_DIGITS = re.compile(r"\d+(?:[_.-]\d+)*")
_NUMBER = re.compile(r"\d+")


def is_tensorboard(path: str) -> bool:
    """A TensorBoard event file, or the group pattern of such files."""
    name = path.rsplit("/", 1)[-1]
    return name == "events.out.tfevents.*" or bool(_TB.match(name))


def pattern(path: str) -> str:
    """The name with what changes from run to run or process to process (numbers:
    times, pids, ranks) replaced: TensorBoard event files become
    ``events.out.tfevents.*``, every other run of digits ``<n>`` (numbers joined by ``_``, ``.``
    or ``-`` as one: ``run_archived_185935_1`` and ``run_archived_185936`` are one pattern)."""
    folder, _, name = path.rpartition("/")
    name = "events.out.tfevents.*" if _TB.match(name) else _DIGITS.sub("<n>", name)
    folder = _DIGITS.sub("<n>", folder)
    return f"{folder}/{name}" if folder else name


def pids_in_names(names: Sequence[str], pids: Dict[int, int]) -> List[int]:
    """Ranks whose pid appears as a number in one of the names."""
    by_pid = {str(pid): rank for rank, pid in pids.items()}
    ranks = set()
    for n in names:
        for d in _NUMBER.findall(n.rsplit("/", 1)[-1]):
            if d in by_pid:
                ranks.add(by_pid[d])
    return sorted(ranks)


_LEGACY_MAGIC = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19."  # torch's pre-1.6 format


ST_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
    "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
}


IMAGES = {".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp", ".tif", ".tiff"}


TEXTS = {".log", ".txt", ".out", ".err", ".md", ".yaml", ".yml", ".cfg", ".ini", ".jsonl", ".tsv"}


KINDS = ("checkpoint", "array", "text", "events", "image", "json", "csv", "other")


ARRAYS = {".npy", ".npz"}  # NumPy's np.save / np.savez


def kind_of(path: Path) -> str:
    """What a file is, from its name and first bytes: ``checkpoint`` (torch.save's formats,
    ``.safetensors``), ``array`` (NumPy's ``.npy``/``.npz``), ``events`` (TensorBoard),
    ``image``, ``json``, ``csv``, ``text`` or ``other``."""
    if is_tensorboard(path.name):
        return "events"
    suffix = path.suffix.lower()
    if suffix == ".safetensors" or torch_format(path):
        return "checkpoint"
    if suffix in ARRAYS:
        return "array"
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
