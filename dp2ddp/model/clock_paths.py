"""Files the script names by the clock and reads the name of again after writing them.

``model_path = os.path.join(ckpt_dir, f"{name}_{datetime.now().strftime('%m%d%H%M%S')}.pth")``,
``torch.save(state, model_path)``, then ``args.eval_from = model_path; linear_eval(args)``
(SimSiam). Under DDP the write runs on rank 0 alone, but every rank computes the name from
its own clock: a rank that reads the name afterwards (to load the file, to hand it on) may
hold another second's name, and load a file nobody wrote. A name only printed or written
into a file (on rank 0, with the write) is no such read. :func:`clock_named_reads` finds
them, for the writers' migration to refuse (DDP110).
"""

from __future__ import annotations

import ast
from typing import List, NamedTuple, Optional

from dp2ddp.model.core import SemanticModel

CLOCK = frozenset({
    "datetime.datetime.now", "datetime.datetime.today", "datetime.datetime.utcnow", "datetime.date.today",
    "time.time", "time.strftime", "time.localtime", "time.gmtime", "time.ctime", "time.asctime", "time.time_ns",
    "uuid.uuid1", "uuid.uuid4",
})
# what reads a name without using it as a path: shown, or written as text
_SHOWN = frozenset({"builtins.print", "builtins.str", "builtins.repr"})
_SHOWN_METHODS = frozenset({"info", "debug", "warning", "write", "format", "log", "set_description", "set_postfix"})


class ClockRead(NamedTuple):
    write: ast.Call  # the write of the file
    name: ast.Name  # the name it is written under
    clock: ast.Call  # the clock read the name comes from
    read: ast.Name  # a read of the name after the write


def clock_of(m: SemanticModel, e: ast.AST, depth: int = 0) -> Optional[ast.Call]:
    """The clock read ``e`` is computed from: in it, or in what its names are bound to in
    its function (two bindings deep)."""
    for n in ast.walk(e):
        if isinstance(n, ast.Call) and m.is_name(n.func, CLOCK):
            return n
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and depth < 2:
            for b in m.bindings_of(n):
                if b.kind == "assign" and b.value is not None:
                    got = clock_of(m, b.value, depth + 1)
                    if got is not None:
                        return got
    return None


def _shown(m: SemanticModel, read: ast.Name) -> bool:
    """``print(f"saved to {path}")``, ``f.write(path)``, ``logger.info(...)``: the name shown."""
    for a in m.ancestors(read):
        if isinstance(a, ast.stmt):
            return False
        if isinstance(a, ast.Call) and (m.is_name(a.func, _SHOWN) or (isinstance(a.func, ast.Attribute) and a.func.attr in _SHOWN_METHODS)):
            return True
    return False


def clock_named_reads(m: SemanticModel) -> List[ClockRead]:
    """Each file the script writes (a save, or a file opened for writing) under a name it
    binds from the clock, with the first read of that name after the write that is not only
    shown (see the module docstring)."""
    from dp2ddp.model.writers import writers

    got = m.cache.get("clock_paths")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[ClockRead] = []
    for w in writers(m):
        if w.kind not in ("save", "open") or not isinstance(w.path, ast.Name):
            continue
        clock = clock_of(m, w.path)
        if clock is None:
            continue
        bindings = m.bindings_of(w.path)
        stmt = m.statement_of(w.call)
        end = (stmt.end_lineno or stmt.lineno, stmt.end_col_offset or 0) if stmt is not None else (w.call.lineno, 0)
        later = sorted((n for n in m.nodes(ast.Name) if n.id == w.path.id and isinstance(n.ctx, ast.Load)
                        and m.bindings_of(n) is bindings and (n.lineno, n.col_offset) > end and not _shown(m, n)),
                       key=lambda n: (n.lineno, n.col_offset))
        if later:
            out.append(ClockRead(w.call, w.path, clock, later[0]))
    m.cache["clock_paths"] = out
    return out
