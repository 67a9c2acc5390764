"""dp2ddp.model.rank_alike.per_process_path: a path each process names for itself."""

from __future__ import annotations

import ast

from dp2ddp.model import flow
from dp2ddp.model.core import build
from dp2ddp.model.rank_alike import per_process_path


def _last_save_path(m):
    call = [c for c in m.nodes(ast.Call) if m.source(c.func) == "torch.save"][-1]
    return call.args[1]


def test_a_temporary_folder_behind_joins_is_found() -> None:
    m = build("import os, tempfile, torch\nd = tempfile.mkdtemp()\np = os.path.join(d, 'w.pt')\ntorch.save(1, p)\n")
    got = per_process_path(m, _last_save_path(m))
    assert got is not None and m.source(got) == "tempfile.mkdtemp()"


def test_a_path_rebuilt_from_itself_on_many_branches_is_walked_once_per_expression(monkeypatch) -> None:
    """``path = os.path.join(path, x)`` under 24 tests: every binding is an origin of every later
    one. Walked as a tree this took exponential time (a survey of real repositories hung in
    it); each expression is now followed once, so the origins asked for stay few."""
    lines = ["import os, torch", "path = 'out'"]
    for i in range(24):
        lines += [f"if len(path) > {i}:", f"    path = os.path.join(path, 'p{i}')"]
    lines.append("torch.save(1, path)")
    m = build("\n".join(lines) + "\n")
    asked = []
    real = flow.origins

    def counting(model, node, *a, **k):
        asked.append(node)
        return real(model, node, *a, **k)

    monkeypatch.setattr(flow, "origins", counting)
    assert per_process_path(m, _last_save_path(m)) is None
    assert len(asked) < 200, len(asked)
