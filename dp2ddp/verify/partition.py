"""The data partition, proven from what each process actually served.

The probe records, for every pass of every DataLoader, the dataset indices its index
sampler handed out in that process (a bitset of the dataset, the number served, the number
served again, the first indices and a CRC of their order), whatever shards the data:
``DistributedSampler``, dp2ddp's ``ShardedBatches``, a custom sampler, or nothing. For each
training loader (one that fed an optimizer step), epoch by epoch:

* **disjoint shards**: no sample served by two ranks, beyond padding; every rank serving
  (nearly) the whole epoch is an unsharded loader -- N times the work;
* **the union is the original's epoch**: no sample lost, none added (the original's pass of
  the same loader, in the run that iterated the same order);
* **padding**: the extra servings a sharding needs to give every rank the same number
  (``DistributedSampler`` pads the epoch, ``ShardedBatches`` each batch) are counted and
  reported, not blamed: at most ``world - 1`` per batch that does not divide, plus
  ``world - 1``;
* **a new order each epoch** where the original reshuffles: a rank whose second epoch
  starts as its first did replays the permutation (``set_epoch`` not called).
"""

from __future__ import annotations

import base64
import os
import re
import zlib
from pathlib import Path
from typing import Any, Dict, List, Optional

MAX_EXAMPLES = 5
ALL = 0.98  # a rank that served this share of the epoch served "all" of it
SAME = 0.9  # ranks whose served samples overlap this much serve the same data


def bits(rec: Dict[str, Any]) -> Optional[int]:
    """The pass's bitset as a Python int (bit i: index i served)."""
    if "_set" in rec:
        return rec["_set"]  # a stream's pass, its samples numbered by content (_streams)
    text = rec.get("bits")
    if not text:
        return None
    return int.from_bytes(zlib.decompress(base64.b64decode(text)), "little")


def examples(x: int, limit: int = MAX_EXAMPLES) -> List[int]:
    out, i = [], 0
    while x and len(out) < limit:
        low = x & -x
        i = low.bit_length() - 1
        out.append(i)
        x ^= low
    return out


def _ranks(ranks: List[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) == 2:
        return f"rank {ranks[0]} and rank {ranks[1]}"
    return "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


def _n(x: int) -> str:
    return f"{x:,}"


_ASSIGN = re.compile(r"^\s*(?:self\.)?([A-Za-z_][\w.]*)\s*(?::[^=]+)?=(?!=)")


def loader_name(site: Optional[List[Any]]) -> Optional[str]:
    """The variable a loader was assigned to at its construction site, if the line (or the
    statement it continues) says so."""
    if not site:
        return None
    path, line = site
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return None
    i = line - 1  # the line the constructor call starts on
    while 0 <= i < len(lines) and i > line - 7:
        m = _ASSIGN.match(lines[i])
        if m:
            return m.group(1)
        # the call may be an argument of a statement begun above: train_loader = shard_loader(\n DataLoader(...))
        if i == 0 or not lines[i - 1].rstrip().endswith(("(", ",", "[", "\\", "=")):
            break
        i -= 1
    return None


def describe(site: Optional[List[Any]], root: Optional[Path]) -> str:
    """'`train_loader` (train_ddp.py:61)' or 'the loader built at train_ddp.py:61'."""
    if not site:
        return "a loader"
    where = show_site(site, root)
    name = loader_name(site)
    return f"`{name}` ({where})" if name else f"the loader built at {where}"


def show_site(site: List[Any], root: Optional[Path]) -> str:
    path, line = site
    p = Path(path)
    if root is not None and (root in p.parents):
        return f"{p.relative_to(root).as_posix()}:{line}"
    return f"{os.path.basename(path)}:{line}"


def training_loaders(run) -> List[Dict[int, List[Dict[str, Any]]]]:
    """Per training loader (in the order they first fed a step), per rank, its passes in
    order. The keys differ from process to process: loader i is each rank's i-th."""
    ranks = sorted(run.ranks.values(), key=lambda r: r.rank)
    per_rank = []
    for r in ranks:
        trained = list((r.end or {}).get("trained") or [])
        passes: Dict[Any, List[Dict[str, Any]]] = {}
        for p in r.passes:
            if "error" not in p:
                passes.setdefault(p["key"], []).append(p)
        per_rank.append((r.rank, [sorted(passes.get(k, []), key=lambda p: p["k"]) for k in trained]))
    count = min((len(ls) for _, ls in per_rank), default=0)
    return [{rank: ls[i] for rank, ls in per_rank} for i in range(count)]


def analyze(orig, mig, world: int) -> Dict[str, Any]:
    """The data section of the report: per training loader, epoch by epoch, what the ranks
    served against the original; problems and notes."""
    out: Dict[str, Any] = {"loaders": [], "problems": [], "notes": [], "unsharded": False}
    if world < 2:
        return out
    mig_loaders = training_loaders(mig)
    orig_loaders = training_loaders(orig)
    if not mig_loaders:
        if any(r.passes for r in mig.ranks.values()) and all(r.end for r in mig.ranks.values()):
            out["notes"].append("data: no DataLoader fed an optimizer step: the partition of the data is not checked")
        return out
    root = getattr(mig, "root", None)
    used = set()
    for i, ranks in enumerate(mig_loaders):
        first = ranks[min(ranks)][0] if ranks[min(ranks)] else None
        if first is None:
            continue
        o = _match(orig_loaders, used, i, first.get("n"))
        section = _loader(ranks, o, world, root, out)
        out["loaders"].append(section)
    for ev in _evidence(mig):
        out["notes"].append(ev)
    return out


def _match(orig_loaders, used, i, n) -> Optional[List[Dict[str, Any]]]:
    """The original's training loader that corresponds to the migration's i-th: the i-th,
    if its dataset has the same length, else the first unused one that has."""
    cands = list(range(len(orig_loaders)))
    order = [i] + [j for j in cands if j != i] if i < len(orig_loaders) else cands
    for j in order:
        if j in used:
            continue
        passes = orig_loaders[j].get(0, [])
        if passes and passes[0].get("n") == n:
            used.add(j)
            return passes
    return None


def _loader(ranks: Dict[int, List[Dict[str, Any]]], orig: Optional[List[Dict[str, Any]]], world: int,
            root: Optional[Path], out: Dict[str, Any]) -> Dict[str, Any]:
    rank_ids = sorted(ranks)
    first = ranks[rank_ids[0]][0]
    site = first.get("site")
    who = describe(site, root)
    kind = first.get("kind")
    section: Dict[str, Any] = {"loader": who, "site": show_site(site, root) if site else None, "sampler": kind,
                               "n": first.get("n"), "epochs": []}
    problems, notes = out["problems"], out["notes"]
    if first.get("iterable"):
        numbered = _streams(ranks, orig, rank_ids)
        if numbered is None:
            notes.append(f"data: {who} iterates an IterableDataset: which samples each rank read is not recorded, "
                         "the partition is not checked")
            section["checked"] = False
            return section
        ranks, orig = numbered
        section["stream"] = True  # samples told apart by their content (fingerprints of their bytes)
    if first.get("unrecorded") or any("bits" not in p for p in (ranks[r][0] for r in rank_ids)):
        notes.append(f"data: {who}: the indices served were not recorded (not integers, or too many): "
                     "the partition is not checked")
        section["checked"] = False
        return section
    epochs = min(len(ranks[r]) for r in rank_ids)
    reported = False
    for k in range(min(epochs, 2)):
        passes = [ranks[r][k] for r in rank_ids]
        if any("bits" not in p for p in passes):
            break
        o = orig[k] if orig and k < len(orig) and "bits" in orig[k] else None
        ep = _epoch(k, passes, rank_ids, o, world, who, problems, notes, section, reported)
        reported = reported or ep.get("reported", False)
        section["epochs"].append(ep)
        if ep.get("unsharded"):
            out["unsharded"] = True
    # a new order each epoch, where the original reshuffles
    if section.get("stream"):
        section["order"] = "a stream: its order is the dataset's own"
    elif epochs >= 2:
        _order(ranks, rank_ids, orig, who, kind, problems, section)
    elif ranks[rank_ids[0]]:
        section["order"] = "one epoch seen"
        size = (f"{first.get('len')} batches an epoch" if first.get("len") is not None
                else "its batch sampler has no length: it repeats forever")
        notes.append(f"data: only one epoch of {who} was seen ({size}): whether each "
                     "epoch has a new order is not checked (raise --steps or --max-steps)")
    section["checked"] = True
    return section


def _epoch(k, passes, rank_ids, o, world, who, problems, notes, section, reported) -> Dict[str, Any]:
    sets = [bits(p) or 0 for p in passes]
    served = [int(p.get("served") or 0) for p in passes]
    unique = [int(p.get("unique") or 0) for p in passes]
    complete = all(p.get("complete") for p in passes)
    union = 0
    for s in sets:
        union |= s
    total = union.bit_count()
    extra = sum(served) - total
    ep: Dict[str, Any] = {"epoch": k, "complete": complete, "served": served, "union": total, "extra_servings": extra}
    epoch_name = f"epoch {k}" + ("" if complete else " (partial: the run stopped in it)")
    o_set = bits(o) if o else None
    o_complete = bool(o and o.get("complete"))
    base = (o_set.bit_count() if o_set is not None and o_complete else None) or passes[0].get("n") or total
    ep["original"] = o_set.bit_count() if o_set is not None else None
    # every rank serving the whole epoch (or, in a partial one, the same samples)
    same = all(u >= ALL * base for u in unique) if complete else _same(sets, unique)
    if same and len(passes) > 1 and total:
        ep["unsharded"] = True
        ranks = _ranks(rank_ids)
        if complete:
            msg = (f"{ranks} each served all {_n(min(unique))} samples of {who} in {epoch_name}: the loader is not "
                   "sharded, every rank does the whole epoch's work")
        else:
            msg = (f"{ranks} served the same {_n(min(unique))} samples of {who} in {epoch_name}: the loader is not "
                   "sharded, every rank does the whole epoch's work")
        if not reported:
            problems.append(msg)
            problems.append("  advice: give each rank its share: a DistributedSampler (and `set_epoch(epoch)` at every "
                            "epoch) or dp2ddp rewrite's `shard_loader(...)`; then the per-rank batch is the original's "
                            "divided by the world size")
            ep["reported"] = True
        return ep
    # padding: what equal shares need, and no more; plus what the original's own sampler
    # served again (a sampler that draws with replacement, a balanced sampler)
    allowance = _padding(o, world, passes)
    ep["padding_allowed"] = allowance
    own = _own_repeats(o)
    if own:
        ep["original_repeats"] = own
    if extra > allowance + own:
        ep["duplicated"] = extra
        share = extra / max(1, sum(served))
        problems.append(f"{who}: {_n(extra)} samples were served more than once in {epoch_name} ({share:.0%} of the "
                        f"work is duplicated; equal shares need at most {allowance} repeats)")
        problems.append("  advice: give each rank a disjoint share of the epoch (DistributedSampler, or "
                        "dp2ddp rewrite's `shard_loader(...)`), not its own copy of the data")
    elif extra > 0 and own:
        ep["repeats"] = extra
        notes.append(f"data: {who}, {epoch_name}: {_n(extra)} sample{'s' if extra > 1 else ''} served more than once, as the "
                     f"original's own sampler serves them ({_n(own)} repeats in its pass: it draws with replacement), "
                     "not duplicated work")
    elif extra > 0:
        ep["padding"] = extra
        notes.append(f"data: {who}, {epoch_name}: {_n(extra)} sample{'s' if extra > 1 else ''} served twice as padding "
                     f"(equal shares for {world} ranks), not duplicated work")
    # lost and added samples, against the original's epoch
    if o_set is not None and complete and o_complete:
        lost = o_set & ~union
        added = union & ~o_set
        ep["lost"], ep["added"] = lost.bit_count(), added.bit_count()
        if lost:
            which = ("told apart by their content" if section.get("stream") else
                     f"indices {', '.join(map(str, examples(lost)))}{', ...' if lost.bit_count() > MAX_EXAMPLES else ''}")
            problems.append(f"{who}: {_n(lost.bit_count())} of the original's {_n(o_set.bit_count())} samples of "
                            f"{epoch_name} were served by no rank ({which})")
            problems.append("  advice: every sample of the epoch should reach one rank: check drop_last, the "
                            "sampler's num_replicas and rank, and a dataset split by rank")
        if added:
            which = ("told apart by their content" if section.get("stream") else
                     f"indices {', '.join(map(str, examples(added)))}{', ...' if added.bit_count() > MAX_EXAMPLES else ''}")
            problems.append(f"{who}: {_n(added.bit_count())} samples were served in {epoch_name} that the original's "
                            f"epoch does not hold ({which})")
            problems.append("  advice: the migration's loader covers other samples than the original's (drop_last, "
                            "a subset, another split): make its epoch the original's")
    elif k == 0 and not complete:
        ep["coverage"] = "partial epoch: lost samples are not checked"
    return ep


def _prints(rec: Dict[str, Any]) -> Optional[List[int]]:
    text = rec.get("prints")
    if not text:
        return None
    import array

    a = array.array("q")
    a.frombytes(zlib.decompress(base64.b64decode(text)))
    return a.tolist()


def _streams(ranks: Dict[int, List[Dict[str, Any]]], orig: Optional[List[Dict[str, Any]]], rank_ids: List[int]):
    """A stream's passes with their samples numbered by content: pass k of every rank and of
    the original, each fingerprint (the probe's, of the sample's bytes) given one number, so
    that the bitset analysis of map-style loaders applies (disjoint, the original's epoch,
    padding). ``None`` where a rank's passes carry no fingerprints."""
    epochs = min(len(ranks[r]) for r in rank_ids)
    new_ranks: Dict[int, List[Dict[str, Any]]] = {r: [] for r in rank_ids}
    new_orig: List[Dict[str, Any]] = []
    for k in range(epochs):
        got = {r: _prints(ranks[r][k]) for r in rank_ids}
        if any(v is None for v in got.values()):
            break
        o = orig[k] if orig and k < len(orig) else None
        o_prints = _prints(o) if o else None
        numbers: Dict[int, int] = {}
        for seq in [o_prints or []] + [got[r] for r in rank_ids]:
            for x in seq:
                numbers.setdefault(x, len(numbers))

        def numbered(rec, seq):
            found = 0
            for x in seq:
                found |= 1 << numbers[x]
            out = dict(rec, _set=found, bits="", served=len(seq), unique=found.bit_count(), n=len(numbers))
            return out

        for r in rank_ids:
            new_ranks[r].append(numbered(ranks[r][k], got[r]))
        if o is not None and o_prints is not None:
            new_orig.append(numbered(o, o_prints))
    if not new_ranks[rank_ids[0]]:
        return None
    return new_ranks, (new_orig or None)


def _same(sets: List[int], unique: List[int]) -> bool:
    """In a partial epoch: do the ranks serve (nearly) the same samples?"""
    if len(sets) < 2 or not min(unique):
        return False
    for s in sets[1:]:
        if (sets[0] & s).bit_count() < SAME * min(unique):
            return False
    return True


def _own_repeats(o: Optional[Dict[str, Any]]) -> int:
    """The servings of the original's pass beyond its distinct samples: a sampler that draws
    with replacement (``WeightedRandomSampler``, a class-balanced batch sampler) serves
    samples again by itself, and a sharding of its batches repeats them as it does."""
    if not o:
        return 0
    served, unique = int(o.get("served") or 0), int(o.get("unique") or 0)
    return max(0, served - unique) if unique else 0


def _padding(o: Optional[Dict[str, Any]], world: int, passes: List[Dict[str, Any]]) -> int:
    """The most repeats a correct sharding needs in one epoch: ``world - 1`` to even out the
    epoch (DistributedSampler), plus, where batches are split (ShardedBatches), ``-len(b) %
    world`` for each of the original's batches."""
    if o and o.get("batches"):
        b, served = int(o["batches"]), int(o.get("served") or 0)
        size = -(-served // b)
        last = served - size * (b - 1)
        return (world - 1) + (b - 1) * ((-size) % world) + ((-last) % world)
    return (world - 1) * (1 + max(int(p.get("batches") or 0) for p in passes))


def _order(ranks, rank_ids, orig, who, kind, problems, section) -> None:
    """Does each epoch begin in a new order, where the original's does?"""
    reshuffles = None
    if orig and len(orig) >= 2:
        reshuffles = _differs(orig[0].get("head") or [], orig[1].get("head") or [])
    replay = [r for r in rank_ids if not _differs(ranks[r][0].get("head") or [], ranks[r][1].get("head") or [])]
    compared = sum(min(len(ranks[r][0].get("head") or []), len(ranks[r][1].get("head") or [])) for r in rank_ids)
    # a missing reshuffle replays on every rank (they all run one sampler's code); one rank's
    # few first samples may come back by chance (1 sample a rank a batch: 1 chance in the
    # epoch's size), and a handful of samples in all cannot tell the two apart
    if replay and (len(replay) < len(rank_ids) or compared < _ORDER_EVIDENCE):
        section["order"] = "too few samples to tell" if compared < _ORDER_EVIDENCE else "new each epoch"
        section["original_reshuffles"] = reshuffles
        return
    section["order"] = "replayed" if replay else "new each epoch"
    section["original_reshuffles"] = reshuffles
    if replay and reshuffles:
        on = "every rank"
        if kind == "DistributedSampler":
            why = f"`set_epoch` is not called for {who}"
            advice = "call `loader.sampler.set_epoch(epoch)` at the start of every epoch"
        else:
            why = f"the order of {who} does not change from epoch to epoch while the original's does"
            advice = "draw a new order every epoch (DistributedSampler with `set_epoch(epoch)`, or dp2ddp's `shard_loader`)"
        problems.append(f"epoch 1 replays epoch 0 on {on} (the original reshuffles): {why}")
        problems.append(f"  advice: {advice}")


_ORDER_EVIDENCE = 4  # first samples compared over all ranks before a replay is judged


def _differs(a: List[int], b: List[int]) -> bool:
    n = min(len(a), len(b))
    if n == 0:
        return True  # nothing to compare: not a replay
    return a[:n] != b[:n]


def _evidence(mig) -> List[str]:
    """What the first migrated run's step bound said about the evidence."""
    r = next((r for _, r in sorted(mig.ranks.items()) if r.evidence), None)
    if r is None:
        return []
    ev = r.evidence[-1]
    end = r.end or {}
    if ev.get("why") == "epoch too long":
        return [f"data: the training loader's epoch takes {ev['need'] - 1} steps, more than --max-steps "
                f"{ev['bound']}: the runs stopped at --steps {ev['stop']}, within the first epoch (the partition is "
                "checked on it; the order between epochs is not)"]
    if ev.get("need") and ev.get("stop") == ev["need"] and end.get("why") == "limit":
        return [f"data: the runs went on to step {ev['stop']}, past --steps, until the training loader began its "
                "second epoch, and stopped there, an epoch early, once the evidence was in"]
    return []


def summary(section: Dict[str, Any]) -> str:
    """One line for a training loader: what was proven of its data, epoch by epoch."""
    if not section.get("checked"):
        return f"{section['loader']}: not checked (see notes)"
    eps = section.get("epochs") or []
    parts = []
    for e in eps:
        if e.get("unsharded"):
            parts.append(f"epoch {e['epoch']}: not sharded")
            continue
        bits = [f"{'+'.join(str(x) for x in e['served'])} served"]
        if e.get("duplicated"):
            bits.append(f"{e['duplicated']} repeated")
        elif e.get("padding"):
            bits.append(f"{e['padding']} padding")
        else:
            bits.append("disjoint")
        if e.get("lost") == 0 and e.get("added") == 0:
            bits.append("the original's epoch exactly")
        elif e.get("lost") or e.get("added"):
            bits.append(f"{e.get('lost', 0)} lost, {e.get('added', 0)} added")
        elif not e.get("complete"):
            bits.append("partial")
        parts.append(f"epoch {e['epoch']}: " + ", ".join(bits))
    order = section.get("order")
    tail = {"new each epoch": "a new order each epoch", "replayed": "epoch 1 replays epoch 0",
            "one epoch seen": "one epoch seen",
            "too few samples to tell": "too few samples an epoch to tell whether the order changes"}.get(order, "")
    if order == "replayed" and section.get("original_reshuffles") is False:
        tail += ", as the original's does (it keeps one order)"
    return f"{section['loader']}: " + "; ".join(parts) + (f"; {tail}" if tail else "")
