"""What `verify` was asked to judge by (:class:`Options`): steps, warm-up, tolerances, the
speed-up wanted, the hang timeout, the user's folders, processes and nodes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional


@dataclass
class Options:
    steps: int
    warmup: int
    rtol: float
    stochastic_rtol: float
    min_speedup: float
    timeout: float
    user_dirs: List[str]
    nproc: int
    nnodes: int
    migrated: Optional[str] = None  # the migrated script, read for what a failure points at
