"""Losses whose scale depends on how the batch is split.

A ``reduction="sum"`` loss (a ``torch.nn`` loss class or functional) adds up over the
samples a process sees. DataParallel computes it over the whole batch; under DDP each
process sums its share and the gradients are *averaged* across processes, so every step
is 1/world_size of DataParallel's.
"""

from __future__ import annotations

import ast
from typing import List

from dp2ddp.model.core import SemanticModel, kwarg


def sum_reductions(m: SemanticModel) -> List[ast.keyword]:
    """The ``reduction="sum"`` arguments of ``torch.nn`` losses."""
    got = m.cache.get("losses:sum")
    if got is None:
        got = []
        for call in m.nodes(ast.Call):
            arg = kwarg(call, "reduction")
            if arg is not None and isinstance(arg.value, ast.Constant) and arg.value.value == "sum":
                if any(q.startswith("torch.nn.") for q in m.qualified_names(call.func)):
                    got.append(arg)
        m.cache["losses:sum"] = got
    return got  # type: ignore[return-value]
