"""The semantic model of one module, built once from Python's ``ast``.

Every rule of `dp2ddp check` and every transform of `dp2ddp rewrite` reads the module
through this model instead of walking a tree of its own (ruff's shape):

* one walk records every node's parent, the nodes of each type in source order, the
  scopes (module, class, function, lambda, comprehension) and every binding in them;
* names resolve to *qualified names* through imports, aliases and scopes:
  ``nn.DataParallel``, ``torch.nn.parallel.DataParallel`` and ``DP`` after
  ``from torch.nn import DataParallel as DP`` are all ``torch.nn.DataParallel``,
  while a parameter or local variable called ``DP`` is not;
* a name that nothing binds in a module with a star import is *unresolved*, a recorded
  state (``maybe_star``), not a silent miss.

Positions: ``ast`` columns are UTF-8 byte offsets; :meth:`SemanticModel.position` turns
them into character columns, as editors and LibCST count them.

This module assembles :class:`SemanticModel` from the parts that hold each job:

* :mod:`~dp2ddp.model.scopes` — scopes and bindings, and the one walk that records them
  with every node's parent and the nodes by type;
* :mod:`~dp2ddp.model.structure` — parents, enclosing statements, blocks, functions,
  classes and loops around a node; the module's top-level facts;
* :mod:`~dp2ddp.model.qualnames` — names to qualified names, and the searches by them;
* :mod:`~dp2ddp.model.calls` — calls between the module's functions;
* :mod:`~dp2ddp.model.positions` — the source text: decoding, lines, character positions;
* :mod:`~dp2ddp.model.syntax` — node kinds and one-node helpers that need no model;
* :mod:`~dp2ddp.model.module_files` and :mod:`~dp2ddp.model.project_defs` — the project's
  modules beside the script (star-import exports, the defs a script calls).

The distributed facts (wraps, loaders, rank guards, writers, collectives, epoch loops)
live in the other modules of :mod:`dp2ddp.model` and are computed on first use.
"""

from __future__ import annotations

import ast
from typing import Dict, List, Optional, Set, Union

from dp2ddp.model.calls import Calls
from dp2ddp.model.positions import Positions, decode
from dp2ddp.model.qualnames import QualifiedNames
from dp2ddp.model.scopes import Scope, ScopeBuilder
from dp2ddp.model.structure import Structure


class SemanticModel(Structure, QualifiedNames, Positions, Calls):
    """The model of one module. Build it with :func:`build` (or ``SemanticModel(tree, text)``)."""

    def __init__(self, tree: ast.Module, text: str, path: str = "<string>") -> None:
        self.tree = tree
        self.text = text
        self.path = path
        self._lines: Optional[List[str]] = None
        self.parents: Dict[ast.AST, ast.AST] = {}
        self.scopes: Dict[ast.AST, Scope] = {}  # scope node -> scope
        self._scope_of_node: Dict[ast.AST, Scope] = {}  # Name/arg/... -> the scope it is evaluated in
        self._by_type: Dict[type, List[ast.AST]] = {}
        self._sorted: Set[type] = set()
        self.star_imports: List[ast.ImportFrom] = []
        self.cache: Dict[str, object] = {}  # derived facts, see the fact modules of dp2ddp.model
        ScopeBuilder(self).run()

    def release(self) -> None:
        """Drop what the model holds, for a caller that is done with it: its scopes and
        bindings refer to each other (a reference cycle that keeps the whole tree alive
        until the cyclic garbage collector runs); after this, reference counting frees it
        at once (`dp2ddp check` runs with the collector off). The model is unusable after."""
        for scope in self.scopes.values():
            scope.bindings.clear()
        self.scopes.clear()
        self._scope_of_node.clear()
        self.parents.clear()
        self._by_type.clear()
        self.cache.clear()
        for key in [k for k, v in vars(self).items() if isinstance(v, (dict, list, set, frozenset))]:
            if key not in ("scopes", "_scope_of_node", "parents", "_by_type", "cache"):
                self.__dict__.pop(key, None)


def build(source: Union[str, bytes], path: str = "<string>") -> SemanticModel:
    """Parse ``source`` and build its model (raises ``SyntaxError`` as ``ast.parse`` does)."""
    if isinstance(source, bytes):
        text = decode(source)
    else:
        text = source
    tree = ast.parse(text, filename=path, type_comments=False)
    return SemanticModel(tree, text, path)
