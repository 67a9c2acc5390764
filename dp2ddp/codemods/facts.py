"""Facts one transform provides and another needs, typed: no string keys.

A transform module declares ``NEEDS = (FactClass, ...)`` and ``PROVIDES = (FactClass, ...)``
beside its ``propose(ctx)``; :mod:`dp2ddp.codemods` orders the transforms so that every
provider runs before the transforms that need its facts, and fails at import when a
needed fact has no provider. At run time ``ctx.provide(fact)`` records a fact and
``ctx.need(FactClass)`` reads it; reading a fact nobody provided yet raises
:class:`MissingFact` (a bug in the order, never a user's error).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Set, Tuple

if TYPE_CHECKING:  # pragma: no cover
    from dp2ddp.model.collectives import VarKey
    from dp2ddp.model.loaders import Loader


class MissingFact(RuntimeError):
    pass


@dataclass
class Wrappers:
    """What :mod:`wrap_ddp` decided: the variables bound to the DDP wrapper (``seeds``, where
    the wraps are assigned; ``keys``, followed through returns and parameters) and those
    whose wrap only existed with several devices in the original (``guarded``)."""

    seeds: Set["VarKey"] = field(default_factory=set)
    keys: Set["VarKey"] = field(default_factory=set)
    guarded: Set["VarKey"] = field(default_factory=set)


@dataclass
class OwnSamplers:
    """Training loaders that the script's own ``DistributedSampler`` shards (a mixed
    script): their epoch loops need ``set_epoch`` (:mod:`set_epoch`)."""

    loaders: List["Loader"] = field(default_factory=list)


@dataclass
class ShardHelper:
    """The names :mod:`shard_loaders` gave its helper in this script (empty: none written)
    and the script's loaders it sharded (their epoch loops tell ``ShardedBatches`` the
    epoch: :mod:`set_epoch`, so a run resumed at epoch k draws epoch k's order). With
    ``--shard-eval``, ``evaluation`` holds the evaluation loaders it left whole, for
    :mod:`shard_eval` to decide loop by loop."""

    names: Dict[str, str] = field(default_factory=dict)
    loaders: List["Loader"] = field(default_factory=list)
    evaluation: List["Loader"] = field(default_factory=list)


@dataclass
class GatherHelper:
    """The name :mod:`in_batch_loss` gave ``GatherBatch`` (the autograd all-gather written
    once into the script; empty: not written yet). :mod:`init_forward` writes it through
    the same function when a first-batch initialisation needs the global batch."""

    name: str = ""


@dataclass
class GuardedWriters:
    """What :mod:`rank_writers` decided about writer objects (SummaryWriter, writer-like
    helpers, a project's logger class): the variables that hold one made on rank 0 only,
    whose uses as statements :mod:`rank_zero` guards (``keys``); the creations it found
    outside the script's own SummaryWriter calls (``made``); and the SummaryWriters left on
    every rank, with why (``bad``)."""

    keys: Set["VarKey"] = field(default_factory=set)
    made: List[object] = field(default_factory=list)
    bad: List[Tuple[object, str]] = field(default_factory=list)


def order(transforms: List[Tuple[str, tuple, tuple]]) -> List[str]:
    """Transform names ``(name, needs, provides)`` ordered so providers come first; the
    written order decides among the rest. Raises ``MissingFact`` for a need no transform
    provides and ``ValueError`` for a cycle."""
    provided = {}
    for name, _needs, provides in transforms:
        for p in provides:
            provided[p] = name
    for name, needs, _ in transforms:
        for n in needs:
            if n not in provided:
                raise MissingFact(f"transform {name} needs {n.__name__}, which no transform provides")
    done: List[str] = []
    pending = list(transforms)
    while pending:
        for i, (name, needs, _) in enumerate(pending):
            if all(provided[n] in done for n in needs):
                done.append(name)
                del pending[i]
                break
        else:
            raise ValueError("transforms need each other's facts in a cycle: " + ", ".join(n for n, _, _ in pending))
    return done
