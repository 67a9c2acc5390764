"""Output files other than checkpoints compared by what they hold: text by its lines, JSON
by its structure, CSV by header and rows, images by their dimensions (an image of a rank's
share of a batch: :func:`grid_share`)."""

from __future__ import annotations

import csv
import io
import json
import re
import struct
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

from dp2ddp.verify.checkpoint_diffs import structure_difference
from dp2ddp.verify.checkpoint_files import compare_structure, plain
from dp2ddp.verify.output_report import ADVICE_RANK0, MAX_LISTED


def compare_text(rep, entry, shown, a, b, orig, mig, world) -> None:
    lo, lm = line_count(orig.where[a]), line_count(mig.where[b])
    entry["compared"] = "lines"
    entry["original"]["lines"], entry["migrated"]["lines"] = lo, lm
    if lo == lm:
        changed = changed_lines(orig.where[a], mig.where[b])
        if changed:
            entry["changed_lines"] = changed  # shown in the summary, not judged: times and the run's values
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


def compare_json(rep, entry, shown, a, b, orig, mig, world) -> None:
    try:
        da = json.loads(Path(orig.where[a]).read_text())
        db = json.loads(Path(mig.where[b]).read_text())
    except (OSError, ValueError) as e:
        entry["status"] = "not compared"
        rep.not_compared.setdefault(f"not valid JSON: {type(e).__name__}", []).append(shown)
        return
    entry["compared"] = "structure"
    diffs = compare_structure(plain(da), plain(db))
    for d in diffs:
        entry["status"] = "differs"
        structure_difference(rep, shown, d, mig.sites.get(b), "JSON")


def compare_csv(rep, entry, shown, a, b, orig, mig, world) -> None:
    try:
        ra = list(csv.reader(io.StringIO(Path(orig.where[a]).read_text())))
        rb = list(csv.reader(io.StringIO(Path(mig.where[b]).read_text())))
    except (OSError, ValueError, csv.Error):
        entry["status"] = "not compared"
        rep.not_compared.setdefault("unreadable CSV", []).append(shown)
        return
    entry["compared"] = "header and rows"
    line = mig.sites.get(b)
    if ra[:1] != rb[:1] and (_header(ra[:1]) or _header(rb[:1])):  # a first row holding numbers is data, not a header
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


_PUNCT = "()[]{}:;,=%/|<>"


def _header(rows) -> bool:
    """A CSV's first row (a list of one row) is a header: names only, no cell holding a
    number among its words. A row of numbers (a loss log without a header) or of log lines
    (``Epoch: [0][0/2]  lr: 0.00100  Time 5.678 (5.678)``, temporal-shift-module's log.csv)
    is the run's values, which differ as a run's values and times may, not columns."""
    if not rows or not any(c.strip() for c in rows[0]):
        return False
    for cell in rows[0]:
        for word in cell.split():
            for part in re.split(r"[" + re.escape(_PUNCT) + r"]+", word):
                try:
                    float(part)
                except ValueError:
                    continue
                return False
    return True


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


def compare_image(rep, entry, shown, a, b, orig, mig, ranks=()) -> None:
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


_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_TEXT_READ = 4 << 20


def changed_lines(pa: Path, pb: Path) -> Optional[Dict[str, int]]:
    """How many lines of two texts of the same length differ only in their numbers, and how
    many in their words too (``{"numbers": n, "text": m}``), or None where none differs or
    a file is too large to read whole. Not a finding: a log's numbers are times and the
    run's values; the summary shows the count, so an "equal" text is not read as equal
    numbers."""
    try:
        if pa.stat().st_size > _TEXT_READ or pb.stat().st_size > _TEXT_READ:
            return None
        la = pa.read_bytes().decode("utf-8", "replace").splitlines()
        lb = pb.read_bytes().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    numbers = text = 0
    for x, y in zip(la, lb):
        if x == y:
            continue
        if _NUMBER.sub("0", x) == _NUMBER.sub("0", y):
            numbers += 1
        else:
            text += 1
    return {"numbers": numbers, "text": text} if numbers or text else None


def line_count(path: Optional[Path]) -> Optional[int]:
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
