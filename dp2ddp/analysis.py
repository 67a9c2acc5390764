"""Shared read-only analysis of one module: metadata, name resolution and structure.

Transforms (``dp2ddp.codemods``) and lint rules (``dp2ddp.rules``) receive an
:class:`Analysis` and resolve names through LibCST metadata
(``QualifiedNameProvider`` / ``ScopeProvider``), never by spelling.
"""

from __future__ import annotations

import ast
import re
from functools import cached_property
from typing import Dict, Iterable, Iterator, List, Optional, Set, Tuple, Type

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider, ScopeProvider
from libcst.metadata.position_provider import PositionProvidingCodegenState

DP_NAMES = frozenset(
    {
        "torch.nn.DataParallel",
        "torch.nn.parallel.DataParallel",
        "torch.nn.parallel.data_parallel.DataParallel",
    }
)
DDP_NAMES = frozenset(
    {
        "torch.nn.parallel.DistributedDataParallel",
        "torch.nn.DistributedDataParallel",
        "torch.nn.parallel.distributed.DistributedDataParallel",
    }
)
DATALOADER_NAMES = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})
DISTRIBUTED_SAMPLER_NAMES = frozenset(
    {"torch.utils.data.DistributedSampler", "torch.utils.data.distributed.DistributedSampler"}
)

BLOCK_OWNERS = (
    cst.FunctionDef,
    cst.ClassDef,
    cst.For,
    cst.While,
    cst.With,
    cst.Try,
    cst.If,
    cst.Else,
    cst.ExceptHandler,
    cst.Finally,
)


def code(node: cst.CSTNode) -> str:
    """Source text of an expression (normalised through a throw-away module)."""
    return cst.Module(body=[]).code_for_node(node)


class Analysis:
    """Metadata and structural helpers over ``wrapper.module``."""

    def __init__(
        self, wrapper: MetadataWrapper, path: str = "<string>", tree: Optional[ast.Module] = None, text: Optional[str] = None
    ) -> None:
        """``tree``: Python's ``ast`` of a text with the same lines as the module's, and
        ``text``: the module's text (when the caller has them), so that positions are
        computed one top-level statement at a time instead of for the whole module
        (:meth:`range_of`)."""
        self.wrapper = wrapper
        self._tree = tree if text is not None else None
        self._text = text
        self._line_offsets: Optional[List[int]] = None
        self._ranges: Dict[cst.CSTNode, CodeRange] = {}
        self._starts: Optional[Dict[cst.CSTNode, int]] = None
        self._placed: Set[cst.CSTNode] = set()
        self.path = path
        self.module: cst.Module = wrapper.module
        # QualifiedNameProvider is one more walk of the whole tree that stores, for every
        # node, ``scope.get_qualified_names_for(node)`` to be computed on demand; asking the
        # scope directly for the few nodes the rules look at gives the same names.
        self._scopes = wrapper.resolve(ScopeProvider)
        self._qnames: Dict[cst.CSTNode, Set[str]] = {}
        self.cache: Dict[str, object] = {}  # for transforms to share derived facts
        self._by_type: Dict[tuple, List[cst.CSTNode]] = {}

    @classmethod
    def from_module(
        cls, module: cst.Module, path: str = "<string>", tree: Optional[ast.Module] = None, text: Optional[str] = None
    ) -> "Analysis":
        return cls(MetadataWrapper(module, unsafe_skip_copy=True), path, tree, text)

    # ------------------------------------------------------------------ names
    def qnames(self, node: cst.CSTNode) -> Set[str]:
        """What ``QualifiedNameProvider`` gives for ``node``, by name."""
        out = self._qnames.get(node)
        if out is None:
            scope = _unlazy(self._scopes.get(node))
            out = self._qnames[node] = {q.name for q in scope.get_qualified_names_for(node)} if scope else set()
        return out

    def is_name(self, node: cst.CSTNode, names: Iterable[str]) -> bool:
        names = names if isinstance(names, (set, frozenset)) else set(names)
        return bool(self.qnames(node) & names)

    def call_is(self, node: cst.CSTNode, names: Iterable[str]) -> bool:
        return isinstance(node, cst.Call) and self.is_name(node.func, names)

    def calls(self, names: Iterable[str]) -> List[cst.Call]:
        names = frozenset(names)
        return [n for n in self.nodes_of(cst.Call) if self.is_name(n.func, names)]

    def refs(self, names: Iterable[str]) -> List[cst.CSTNode]:
        """Name/Attribute nodes that resolve to one of ``names`` (outermost only)."""
        names = frozenset(names)
        out = []
        for n in self.nodes_of(cst.Name, cst.Attribute):
            if self.is_name(n, names):
                parent = self.parent(n)
                if isinstance(parent, cst.Attribute) and parent.value is n and self.is_name(parent, names):
                    continue
                out.append(n)
        return out

    @cached_property
    def all_identifiers(self) -> Set[str]:
        """Every variable-like name the module mentions (attribute names and keyword
        argument names excluded: ``args.local_rank`` does not take ``local_rank``)."""
        out = set()
        for n in self.nodes_of(cst.Name):
            parent = self.parent(n)
            if isinstance(parent, cst.Attribute) and parent.attr is n:
                continue
            if isinstance(parent, cst.Arg) and parent.keyword is n:
                continue
            out.add(n.value)
        return out

    def scope_of(self, node: cst.CSTNode):
        return _unlazy(self._scopes.get(node))

    # ------------------------------------------------------------------ structure
    @cached_property
    def _all_nodes(self) -> List[cst.CSTNode]:
        return self._walk[0]

    @cached_property
    def _parents(self) -> Dict[cst.CSTNode, cst.CSTNode]:
        return self._walk[1]

    @cached_property
    def _walk(self):
        """Every node in pre-order, and each node's parent, from one walk of the tree."""
        nodes: List[cst.CSTNode] = []
        parents: Dict[cst.CSTNode, cst.CSTNode] = {}
        stack = [self.module]
        while stack:
            node = stack.pop()
            nodes.append(node)
            children = node.children
            for child in children:
                parents[child] = node
            stack.extend(reversed(children))
        return nodes, parents

    def nodes_of(self, *types: Type[cst.CSTNode]) -> List[cst.CSTNode]:
        key = types
        cached = self._by_type.get(key)
        if cached is None:
            cached = self._by_type[key] = [n for n in self._all_nodes if isinstance(n, types)]
        return cached

    def parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return self._parents.get(node)

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        p = self.parent(node)
        while p is not None:
            yield p
            p = self.parent(p)

    @cached_property
    def _positions(self):
        # only resolved when a position is really asked for (a finding is reported)
        return self.wrapper.resolve(PositionProvider)

    def position(self, node: cst.CSTNode) -> Tuple[int, int]:
        pos = self.range_of(node).start
        return pos.line, pos.column

    def range_of(self, node: cst.CSTNode) -> CodeRange:
        """What ``PositionProvider`` gives for ``node``. With the ``ast`` of the same lines,
        only the top-level statement that holds ``node`` is generated (LibCST's own
        position-recording code generation, started on that statement's first line, which
        ``ast`` knows): a finding in a 10,000-line module costs its statement, not the module."""
        got = self._ranges.get(node)
        if got is not None:
            return got
        top = node
        parent = self.parent(top)
        while parent is not None and parent is not self.module:
            top, parent = parent, self.parent(parent)
        starts = self._statement_starts() if parent is self.module else None
        if starts is None or top not in starts or top in self._placed:
            return _unlazy(self._positions[node])
        self._placed.add(top)
        ranges: Dict[cst.CSTNode, CodeRange] = {}
        state = PositionProvidingCodegenState(
            default_indent=self.module.default_indent,
            default_newline=self.module.default_newline,
            provider=_Ranges(ranges),
        )
        state.line = starts[top]
        top._codegen(state)
        # the statement's code must be the text on those lines: ast's line for it can be
        # later than LibCST's start (``@(`` / ``@\`` decorators, a lone ``\`` line before
        # it); then the whole module's positions decide
        if not self._text_at(starts[top], "".join(state.tokens)):
            return _unlazy(self._positions[node])
        self._ranges.update(ranges)
        return self._ranges[node]

    def _offsets(self) -> List[int]:
        """Where each line of the module's text starts, lines cut as LibCST counts them
        (``str.splitlines`` also cuts at ``\x0c``, ``\u2028``, ...)."""
        if self._line_offsets is None:
            self._line_offsets = [0] + [m.end() for m in _NEWLINE.finditer(self._text)]
        return self._line_offsets

    def _text_at(self, line: int, code: str) -> bool:
        """The module's text, from the start of ``line``, begins with ``code``."""
        offsets = self._offsets()
        return 0 < line <= len(offsets) and self._text.startswith(code, offsets[line - 1])

    def line_text(self, line: int) -> str:
        """The text of ``line`` (1-based, without its line break; ``""`` past the end).
        Needs the ``text`` the analysis was made with."""
        offsets = self._offsets()
        if not 0 < line <= len(offsets):
            return ""
        end = offsets[line] if line < len(offsets) else len(self._text)
        return self._text[offsets[line - 1] : end].rstrip("\r\n")

    def _statement_starts(self) -> Optional[Dict[cst.CSTNode, int]]:
        """The line where the code of each top-level statement begins (its leading blank
        and comment lines included), from ``ast``; ``None`` if the two trees disagree."""
        if self._starts is None and self._tree is not None:
            self._starts = _statement_starts(self.module, self._tree) or {}
        return self._starts or None

    def statement_of(self, node: cst.CSTNode) -> Optional[cst.BaseStatement]:
        """The statement (a child of a block body) that contains ``node``."""
        cur: Optional[cst.CSTNode] = node
        while cur is not None:
            parent = self.parent(cur)
            if isinstance(cur, cst.BaseStatement) and isinstance(parent, (cst.Module, cst.IndentedBlock)):
                return cur
            if isinstance(cur, cst.BaseStatement) and isinstance(parent, cst.SimpleStatementSuite):
                return None
            cur = parent
        return None

    def block_of(self, stmt: cst.CSTNode):
        parent = self.parent(stmt)
        return parent if isinstance(parent, (cst.Module, cst.IndentedBlock)) else None

    def siblings_after(self, stmt: cst.CSTNode) -> List[cst.BaseStatement]:
        block = self.block_of(stmt)
        if block is None:
            return []
        body = list(block.body)
        return body[body.index(stmt) + 1 :]

    def block_owner(self, stmt: cst.CSTNode) -> Optional[cst.CSTNode]:
        """The compound statement (or Module) whose body holds ``stmt``."""
        block = self.block_of(stmt)
        if isinstance(block, cst.Module):
            return block
        return self.parent(block) if block is not None else None

    def enclosing_function(self, node: cst.CSTNode) -> Optional[cst.FunctionDef]:
        for a in self.ancestors(node):
            if isinstance(a, cst.FunctionDef):
                return a
            if isinstance(a, cst.Lambda):
                return None
        return None

    def enclosing_class(self, node: cst.CSTNode) -> Optional[cst.ClassDef]:
        for a in self.ancestors(node):
            if isinstance(a, cst.ClassDef):
                return a
        return None

    def is_method(self, func: cst.FunctionDef) -> bool:
        parent = self.parent(func)
        return isinstance(parent, cst.IndentedBlock) and isinstance(self.parent(parent), cst.ClassDef)

    def class_is_module(self, cls: cst.ClassDef) -> bool:
        for base in cls.bases:
            if self.is_name(base.value, {"torch.nn.Module", "torch.nn.modules.module.Module"}):
                return True
        return False

    def enclosing_ifs(self, stmt: cst.CSTNode) -> List[cst.If]:
        """The chain of ``if`` statements around ``stmt`` inside its function/loop body,
        innermost first. Stops at the first owner that is not an ``if``/``else``."""
        out: List[cst.If] = []
        cur = stmt
        while True:
            owner = self.block_owner(cur)
            if isinstance(owner, cst.Else):
                owner = self.parent(owner)
            if isinstance(owner, cst.If):
                # climb elif chains to the statement in the body
                top = owner
                while isinstance(self.parent(top), cst.If) and self.parent(top).orelse is top:
                    top = self.parent(top)
                out.append(top)
                cur = top
                continue
            return out

    # ------------------------------------------------------------------ module facts
    @cached_property
    def main_guard(self) -> Optional[cst.If]:
        for stmt in self.module.body:
            if isinstance(stmt, cst.If) and _is_main_test(stmt.test):
                return stmt
        return None

    @cached_property
    def module_functions(self) -> Dict[str, cst.FunctionDef]:
        return {s.name.value: s for s in self.module.body if isinstance(s, cst.FunctionDef)}

    def methods(self, cls: cst.ClassDef) -> Dict[str, cst.FunctionDef]:
        body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else ()
        return {s.name.value: s for s in body if isinstance(s, cst.FunctionDef)}

    @cached_property
    def top_import_end(self) -> Optional[cst.BaseStatement]:
        """The last statement of the import section at the top of the module."""
        last = None
        for stmt in self.module.body:
            if isinstance(stmt, cst.SimpleStatementLine) and all(
                isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body
            ):
                last = stmt
                continue
            if last is None and _is_docstring(stmt):
                continue
            if last is None and isinstance(stmt, (cst.If, cst.Try)) and _only_imports(stmt):
                last = stmt
                continue
            if last is not None and isinstance(stmt, (cst.Try, cst.If)) and _only_imports(stmt):
                last = stmt
                continue
            break
        return last

    def function_body_start(self, func: cst.FunctionDef) -> Optional[cst.BaseStatement]:
        """The first statement of ``func`` after its docstring."""
        if not isinstance(func.body, cst.IndentedBlock):
            return None
        body = list(func.body.body)
        if body and _is_docstring(body[0]):
            body = body[1:]
        return body[0] if body else None

    def calls_in(self, node: cst.CSTNode) -> List[cst.Call]:
        out: List[cst.Call] = []

        class _V(cst.CSTVisitor):
            def visit_Call(self, n: cst.Call) -> None:
                out.append(n)

        node.visit(_V())
        return out

    def function_reach(self, func: cst.FunctionDef) -> Set[cst.FunctionDef]:
        """Module-level functions and same-class methods reachable from ``func`` by calls."""
        seen: Set[cst.FunctionDef] = set()
        todo = [func]
        while todo:
            f = todo.pop()
            if f in seen:
                continue
            seen.add(f)
            cls = self.enclosing_class(f)
            for call in self.calls_in(f):
                target = self.resolve_call_target(call, cls)
                if target is not None:
                    todo.append(target)
        return seen

    def resolve_call_target(self, call: cst.Call, cls: Optional[cst.ClassDef] = None) -> Optional[cst.FunctionDef]:
        fn = call.func
        if isinstance(fn, cst.Name):
            return self.module_functions.get(fn.value)
        if (
            cls is not None
            and isinstance(fn, cst.Attribute)
            and isinstance(fn.value, cst.Name)
            and fn.value.value == "self"
        ):
            return self.methods(cls).get(fn.attr.value)
        return None

    def contains(self, outer: cst.CSTNode, inner: cst.CSTNode) -> bool:
        if outer is inner:
            return True
        return any(a is outer for a in self.ancestors(inner))


_NEWLINE = re.compile(r"\r\n?|\n")  # lines as LibCST counts them


class _Ranges:
    """Where ``PositionProvidingCodegenState`` records the ranges it computes."""

    __slots__ = ("_computed",)

    def __init__(self, computed: Dict[cst.CSTNode, CodeRange]) -> None:
        self._computed = computed


def _statement_starts(module: cst.Module, tree: ast.Module) -> Optional[Dict[cst.CSTNode, int]]:
    out: Dict[cst.CSTNode, int] = {}
    body = tree.body
    k = 0
    for stmt in module.body:
        if k >= len(body):
            return None
        a = body[k]
        line = min([a.lineno] + [d.lineno for d in getattr(a, "decorator_list", ())])
        lead = len(stmt.leading_lines)
        decorators = getattr(stmt, "decorators", ())
        if decorators:
            lead += len(decorators[0].leading_lines)
        if isinstance(stmt, cst.SimpleStatementLine):
            k += len(stmt.body)
        else:
            if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) != isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
                return None
            k += 1
        out[stmt] = line - lead
    return out if k == len(body) else None


def _unlazy(value):
    """LibCST may store metadata values as lazy thunks; force them."""
    if value is not None and type(value).__name__ == "LazyValue":
        return value()
    return value


def _is_docstring(stmt: cst.CSTNode) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def _only_imports(stmt: cst.CSTNode) -> bool:
    found = []

    class _V(cst.CSTVisitor):
        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
            for s in node.body:
                found.append(isinstance(s, (cst.Import, cst.ImportFrom, cst.Pass)))

    stmt.visit(_V())
    return bool(found) and all(found)


def _is_main_test(test: cst.BaseExpression) -> bool:
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    comp = test.comparisons[0]
    if not isinstance(comp.operator, cst.Equal):
        return False
    sides = [test.left, comp.comparator]
    names = [s for s in sides if isinstance(s, cst.Name) and s.value == "__name__"]
    strs = [s for s in sides if isinstance(s, cst.SimpleString) and s.evaluated_value == "__main__"]
    return bool(names) and bool(strs)


def is_docstring(stmt: cst.CSTNode) -> bool:
    return _is_docstring(stmt)
