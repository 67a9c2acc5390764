"""The outputs report being built (:class:`Report`): differences that several files share
become one, notes, files not compared; and the advice texts more than one comparison
gives."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple


class Report:
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


MAX_LISTED = 4  # examples per message


ADVICE_NO_RANK = (
    "the write runs on no rank: guard it with `if dist.get_rank() == 0:`, and check that rank 0 reaches it; a "
    "rank read from a `--local_rank` argument stays at its default under torchrun, which sets the LOCAL_RANK "
    "environment variable instead"
)


ADVICE_RANK0 = (
    "only rank 0 should write it: put the write under `if dist.get_rank() == 0:` "
    "(and `dist.barrier()` before other ranks read it)"
)
