"""Where a mixed script's per-process batch can be made the DataParallel run's global batch.

A mixed script (pytorch/examples imagenet, SimCLR's ``--nodes``) has its own distributed
path, and there its ``DistributedSampler`` loader reads ``batch_size`` per process. The
DataParallel path read the same value as the global batch. Under torchrun the migration
runs the script's own path, so the value must be divided by the world size once, where
the process group starts, before the loader reads it:

* the process group is started by one ``init_process_group`` statement of the loader's own
  function, before the loader, that runs whenever torchrun started the process (under no
  ``if`` but the tests that switch the distributed path on, which the mixed migration makes
  true under torchrun; in no loop, no ``try``);
* every other store of the value either runs before that statement (in the function, or at
  module level, at import) or is the script's own scaling on a path of its own (imagenet's
  ``args.batch_size = int(args.batch_size / ngpus_per_node)`` under ``if args.gpu is not
  None:``), which is then kept off under torchrun so the value is divided once;
* the name that holds the value (``args``) is not bound again between the two.

:func:`division_site` answers with the plan, or with the reason it cannot.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Union

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.names import INIT


@dataclass
class Division:
    init: ast.stmt  # the statement that starts the process group; the division goes right after it
    scalings: List[ast.stmt] = field(default_factory=list)  # the script's own scaling on paths of its own: off under torchrun


def division_site(m: SemanticModel, loader_call: ast.Call, value: ast.AST,
                  conditional: Callable[[ast.AST], bool]) -> Union[Division, str]:
    """The plan that divides ``value`` (``args.batch_size``, what the loader reads per
    process) once under torchrun, or why there is none. ``conditional(node)``: the node runs
    only on some paths of its function under torchrun (a test other than the switches)."""
    func = m.enclosing_function(loader_call)
    text = m.source(value)
    inits = [c for c in m.calls(INIT) if m.enclosing_function(c) is func and c.lineno < loader_call.lineno]
    if len(inits) != 1:
        return ("its process group is not started in the function that builds the loader, before it" if not inits
                else "its function starts a process group in more than one place")
    init = m.statement_of(inits[0])
    # the ifs around it are the tests that switch the distributed path on, which the mixed
    # migration makes true under torchrun (or refuses: mixed.detect_mode)
    if (not (isinstance(init, ast.Expr) and init.value is inits[0]) or m.enclosing_loops(init)
            or any(not isinstance(a, ast.If) for a, where in m.branches(init) if where != "test")):
        return f"the process group is started on some paths only (line {inits[0].lineno})"
    root = value
    while isinstance(root, ast.Attribute):
        root = root.value
    if not isinstance(root, ast.Name):
        return f"`{text}` is not a name or an attribute of one"
    scalings: List[ast.stmt] = []
    for node in m.nodes(ast.Assign, ast.AugAssign, ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        sources = {m.source(t) for t in targets for t in _stored(t)}
        where = m.enclosing_function(node)
        if root.id in sources and where is func and init.lineno < node.lineno < loader_call.lineno:
            return f"`{root.id}` is bound again (line {node.lineno}) between the process group's start and the loader"
        if text not in sources:
            continue
        if (where is func and node.lineno < init.lineno) or where is None:
            continue  # runs before the division
        if _scales(node) and conditional(node):
            scalings.append(node)
            continue
        return f"`{text}` is set again at line {node.lineno}, where dp2ddp cannot show it runs before the division"
    return Division(init, scalings)


def _scales(node: ast.AST) -> bool:
    if isinstance(node, ast.AugAssign):
        return isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mult))
    value: Optional[ast.AST] = getattr(node, "value", None)
    return value is not None and any(isinstance(b, ast.BinOp) and isinstance(b.op, (ast.Div, ast.FloorDiv, ast.Mult)) for b in ast.walk(value))


def _stored(target: ast.AST) -> List[ast.AST]:
    """What an assignment target stores to: itself, or each element of a tuple or list."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return [t for e in target.elts for t in _stored(e)]
    return [target.value if isinstance(target, ast.Starred) else target]
