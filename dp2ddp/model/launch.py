"""Process launches a script makes itself: ``mp.spawn(fn, args=(...), nprocs=n)`` (also
``fn=``, a positional ``args``), read once here for every rule and transform that asks.

A spawned worker ``fn(i, *args)`` receives the process index first, then the ``args``
tuple in order: :func:`spawn_argument` maps a parameter of the worker to the expression
the spawn passes for it, ``None`` where the source does not tell (a tuple built elsewhere).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import List, Optional, Tuple

from dp2ddp.model.call_args import SPAWN_PARAMS, argument
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.names import SPAWN


@dataclass
class Spawn:
    call: ast.Call
    fn: Optional[ast.AST]  # the worker expression (``fn`` positional or keyword)
    target: Optional[ast.AST]  # the worker's ``def`` in this module, if it is one
    args: Optional[ast.AST]  # the ``args`` expression (positional second or keyword)


def spawns(m: SemanticModel) -> List[Spawn]:
    got = m.cache.get("launch:spawns")
    if got is None:
        got = []
        for call in m.calls(SPAWN):
            fn = argument(call, SPAWN_PARAMS, "fn")
            args = argument(call, SPAWN_PARAMS, "args")
            target = m.module_functions.get(fn.id) if isinstance(fn, ast.Name) else None
            got.append(Spawn(call, fn, target, args))
        m.cache["launch:spawns"] = got
    return got  # type: ignore[return-value]


def spawns_of(m: SemanticModel, func: ast.AST) -> List[Spawn]:
    """The spawns whose worker is ``func``."""
    return [s for s in spawns(m) if s.target is func]


def spawn_parameters(m: SemanticModel, spawn: Spawn, target: Optional[ast.AST] = None) -> Optional[List[Tuple[Optional[str], ast.AST]]]:
    """The elements of a literal ``args`` tuple in order, each with the parameter of the
    worker (``target``, else ``spawn.target``) it lands in: the element ``i`` is the
    parameter ``i + 1`` (the first is the process index), ``None`` past the worker's
    parameters. ``None`` where the tuple is not literal or the worker is unknown."""
    target = target if target is not None else spawn.target
    if target is None or not isinstance(spawn.args, ast.Tuple):
        return None
    params = m.params(target)
    return [(params[i + 1] if i + 1 < len(params) else None, el) for i, el in enumerate(spawn.args.elts)]


def spawn_argument(m: SemanticModel, spawn: Spawn, param: str) -> Optional[ast.AST]:
    """What ``spawn`` passes its worker for ``param`` (the first parameter is the process
    index, which no expression passes): an element of a literal ``args`` tuple."""
    for name, el in spawn_parameters(m, spawn) or ():
        if name == param:
            return None if isinstance(el, ast.Starred) else el
    return None


def inits_elsewhere(m: SemanticModel) -> List[Tuple[ast.Call, str, int]]:
    """Calls of this script into its project's modules that start the process group there
    (KAIR's ``if opt['dist']: init_dist('pytorch')`` -> ``utils/utils_dist.py``:
    ``dist.init_process_group(...)``), up to three modules down: ``(call, module, line of
    the init_process_group)``. A script with its own distributed path started that way."""
    from dp2ddp.model.names import INIT
    from dp2ddp.model.project_defs import project_calls, reach_across

    got = m.cache.get("launch:inits_elsewhere")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[Tuple[ast.Call, str, int]] = []
    for call, (pm, node, rel) in project_calls(m):
        found = [(path, c.lineno) for mod, fn, path in reach_across(pm, node, rel)
                 for c in mod.calls(INIT) if mod.contains(fn, c)]
        if found:
            out.append((call, *min(found)))
    m.cache["launch:inits_elsewhere"] = out
    return out
