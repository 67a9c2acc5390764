"""Functions that write a file only where it is missing: a cache.

A data processor of the BERT fine-tuning era builds its examples once and keeps them::

    if cached_file.exists():
        examples = torch.load(cached_file)
    else:
        examples = [...]
        torch.save(examples, cached_file)
    return examples

Every rank needs the result. Run on rank 0 first, then on the other ranks (a barrier
between: the pattern of HF's own examples), the other ranks find rank 0's file and only
read it: nobody writes it twice, and nobody reads it while it is written.
:func:`writes_when_missing` says whether every write of a function is such a write.
"""

from __future__ import annotations

import ast
from typing import Optional

from dp2ddp.model.call_args import argument
from dp2ddp.model.core import SemanticModel

# tests that a path names an existing file (or any entry): ``os.path.exists(p)``, ``p.exists()``
_EXISTS = frozenset({"os.path.exists", "os.path.isfile", "os.path.lexists"})
_PATH_METHODS = frozenset({"exists", "is_file"})
# what a cache write is: a torch.save, a pickle dump, a file opened for writing
_KINDS = ("save", "open")


def writes_when_missing(pm: SemanticModel, func: ast.AST, writes) -> bool:
    """Every write of ``func`` (its own: ``torch.save``, ``pickle.dump``, ``open(p, "w")``)
    writes a path that a test of the same function has just found missing: the write is in
    the ``else`` of ``if exists(p):`` or in the body of ``if not exists(p):``, ``p`` being the
    same name (or ``self.`` attribute) in the test and the write, bound nowhere in between;
    nothing else is written, made or removed. At least one write. ``writes``: the module's
    writes (:func:`dp2ddp.model.writers.writers`; passed in: that module reads this one)."""
    found = False
    for w in writes:
        if not pm.contains(func, w.call) or w.kind in ("print", "tqdm"):
            continue
        if _into_a_guarded_handle(pm, w):
            continue  # ``pickle.dump(x, f)`` into ``with open(p, "wb") as f``: the open is the write
        if w.kind not in _KINDS or w.path is None or not _guarded(pm, func, w.call, w.path):
            return False
        found = True
    return found


def _into_a_guarded_handle(pm: SemanticModel, w) -> bool:
    """A save into a handle ``with open(...) as f`` made: the ``open`` is judged itself."""
    from dp2ddp.model.names import OPEN

    if w.kind != "save" or not isinstance(w.path, ast.Name):
        return False
    _, bindings = pm.lookup(w.path.id, pm.scope_of(w.path))
    if len(bindings) != 1 or bindings[0].kind != "with":
        return False
    made = getattr(bindings[0].node, "context_expr", None)
    return isinstance(made, ast.Call) and bool(pm.qualified_names(made.func) & OPEN)


def _guarded(pm: SemanticModel, func: ast.AST, call: ast.Call, path: ast.AST) -> bool:
    text = _plain(path)
    if text is None:
        return False
    child, node = call, pm.parent(call)
    while node is not None and node is not func:
        if isinstance(node, ast.If):
            tested = _tested_path(pm, node.test)
            if tested is not None and tested[0] == text and (
                    (not tested[1] and _within(child, node.orelse)) or (tested[1] and _within(child, node.body))):
                return not _rebound(pm, func, path, node, call)
        child, node = node, pm.parent(node)
    return False


def _within(child: ast.AST, block) -> bool:
    return any(child is s for s in block)


def _plain(e: Optional[ast.AST]) -> Optional[str]:
    """``p`` or ``self.p``: a path a test and a write can be told to share."""
    if isinstance(e, ast.Name):
        return e.id
    if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
        return f"self.{e.attr}"
    return None


def _tested_path(pm: SemanticModel, test: ast.AST):
    """(the path, negated) of ``exists(p)`` / ``not exists(p)``; else ``None``."""
    negated = False
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        negated, test = True, test.operand
    if not isinstance(test, ast.Call) or test.keywords:
        return None
    f = test.func
    if pm.qualified_names(f) & _EXISTS and len(test.args) == 1:
        text = _plain(argument(test, ("path",), "path"))
    elif isinstance(f, ast.Attribute) and f.attr in _PATH_METHODS and not test.args:
        text = _plain(f.value)
    else:
        return None
    return (text, negated) if text is not None else None


def _rebound(pm: SemanticModel, func: ast.AST, path: ast.AST, test: ast.If, call: ast.Call) -> bool:
    """The path's name is stored between the test and the write (or anywhere in the
    function, for a ``self.`` attribute)."""
    for n in ast.walk(func):
        if isinstance(path, ast.Name) and isinstance(n, ast.Name) and n.id == path.id and isinstance(n.ctx, ast.Store):
            if test.lineno <= n.lineno <= call.lineno:
                return True
        if (isinstance(path, ast.Attribute) and isinstance(n, ast.Attribute) and n.attr == path.attr
                and isinstance(n.ctx, ast.Store)):
            return True
    return False
