"""From the model's ``ast`` nodes to the LibCST nodes an edit needs.

Detection runs on the semantic model (Python's ``ast``); only code that is edited needs
LibCST. The two trees agree on positions: LibCST's ``PositionProvider`` gives a node the
same start and end as ``ast`` does (parentheses excluded by both), columns counted in
characters instead of UTF-8 bytes. A node is found by its type and range inside its
top-level statement, whose positions are computed on demand through the public API (a
one-statement module, so a finding in a 5,000-line script costs its statement).
"""

from __future__ import annotations

import ast
from typing import Dict, List, Optional, Tuple

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from dp2ddp.model.core import SemanticModel

# ast type -> the LibCST types that may stand for it
_KINDS: Dict[type, Tuple[type, ...]] = {
    ast.Name: (cst.Name,),
    ast.Attribute: (cst.Attribute,),
    ast.Call: (cst.Call,),
    ast.Subscript: (cst.Subscript,),
    ast.Constant: (cst.SimpleString, cst.ConcatenatedString, cst.Integer, cst.Float, cst.Imaginary, cst.Name, cst.Ellipsis),
    ast.JoinedStr: (cst.FormattedString, cst.ConcatenatedString),
    ast.keyword: (cst.Arg,),
    ast.Starred: (cst.Arg, cst.StarredElement),
    ast.BinOp: (cst.BinaryOperation,),
    ast.BoolOp: (cst.BooleanOperation,),
    ast.UnaryOp: (cst.UnaryOperation,),
    ast.Compare: (cst.Comparison,),
    ast.IfExp: (cst.IfExp,),
    ast.Tuple: (cst.Tuple,),
    ast.List: (cst.List,),
    ast.Dict: (cst.Dict,),
    ast.Set: (cst.Set,),
    ast.Lambda: (cst.Lambda,),
    ast.Await: (cst.Await,),
    ast.NamedExpr: (cst.NamedExpr,),
    ast.ListComp: (cst.ListComp,),
    ast.SetComp: (cst.SetComp,),
    ast.DictComp: (cst.DictComp,),
    ast.GeneratorExp: (cst.GeneratorExp,),
    ast.Assign: (cst.Assign,),
    ast.AugAssign: (cst.AugAssign,),
    ast.AnnAssign: (cst.AnnAssign,),
    ast.Expr: (cst.Expr,),
    ast.Return: (cst.Return,),
    ast.Pass: (cst.Pass,),
    ast.Break: (cst.Break,),
    ast.Continue: (cst.Continue,),
    ast.Raise: (cst.Raise,),
    ast.Assert: (cst.Assert,),
    ast.Delete: (cst.Del,),
    ast.Global: (cst.Global,),
    ast.Nonlocal: (cst.Nonlocal,),
    ast.Import: (cst.Import,),
    ast.ImportFrom: (cst.ImportFrom,),
    ast.If: (cst.If,),
    ast.For: (cst.For,),
    ast.AsyncFor: (cst.For,),
    ast.While: (cst.While,),
    ast.With: (cst.With,),
    ast.AsyncWith: (cst.With,),
    ast.Try: (cst.Try,),
    ast.FunctionDef: (cst.FunctionDef,),
    ast.AsyncFunctionDef: (cst.FunctionDef,),
    ast.ClassDef: (cst.ClassDef,),
}
if hasattr(ast, "TryStar"):
    _KINDS[ast.TryStar] = (cst.TryStar,)

_SMALL = (
    ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Return, ast.Pass, ast.Break, ast.Continue, ast.Raise,
    ast.Assert, ast.Delete, ast.Global, ast.Nonlocal, ast.Import, ast.ImportFrom,
)


class BridgeError(Exception):
    """The two trees disagree about a node (never expected; the caller refuses the file)."""


class Bridge:
    def __init__(self, model: SemanticModel, module: cst.Module) -> None:
        self.model = model
        self.module = module
        self._tops: Optional[Dict[ast.AST, Tuple[cst.CSTNode, int]]] = None
        self._index: Dict[cst.CSTNode, Dict[tuple, List[cst.CSTNode]]] = {}
        self._parents: Dict[cst.CSTNode, cst.CSTNode] = {}

    # --------------------------------------------------------------- top-level statements
    def _top_map(self) -> Dict[ast.AST, Tuple[cst.CSTNode, int]]:
        """ast top-level statement -> (LibCST top-level statement, the line it starts on)."""
        if self._tops is None:
            out: Dict[ast.AST, Tuple[cst.CSTNode, int]] = {}
            body = self.model.tree.body
            k = 0
            for stmt in self.module.body:
                if k >= len(body):
                    raise BridgeError("the module has more statements than Python sees")
                a = body[k]
                first = min([a.lineno] + [d.lineno for d in getattr(a, "decorator_list", ())])
                if isinstance(stmt, cst.SimpleStatementLine):
                    n = len(stmt.body)
                    for j in range(n):
                        out[body[k + j]] = (stmt, first)
                    k += n
                else:
                    out[a] = (stmt, first)
                    k += 1
            if k != len(body):
                raise BridgeError("the module has fewer statements than Python sees")
            self._tops = out
        return self._tops

    def top(self, node: ast.AST) -> cst.CSTNode:
        top = self.model.top_statement(node)
        if top is None:
            raise BridgeError("node outside any statement")
        return self._top_map()[top][0]

    def _positions(self, top: cst.CSTNode, first_line: int) -> Dict[tuple, List[cst.CSTNode]]:
        got = self._index.get(top)
        if got is not None:
            return got
        sub = cst.Module(body=[top], header=[], footer=[], encoding=self.module.encoding,
                         default_indent=self.module.default_indent, default_newline=self.module.default_newline,
                         has_trailing_newline=True)
        wrapper = MetadataWrapper(sub, unsafe_skip_copy=True)
        positions = wrapper.resolve(PositionProvider)
        # the statement's own code starts after its leading blank/comment lines
        lead = len(getattr(top, "leading_lines", ()))
        decorators = getattr(top, "decorators", ())
        if decorators:
            lead += len(decorators[0].leading_lines)
        shift = first_line - (1 + lead)
        index: Dict[tuple, List[cst.CSTNode]] = {}
        for node, rng in positions.items():
            key = (rng.start.line + shift, rng.start.column, rng.end.line + shift, rng.end.column)
            index.setdefault(key, []).append(node)
            for child in node.children:
                self._parents[child] = node
        self._index[top] = index
        return index

    # --------------------------------------------------------------- nodes
    def cst(self, node: ast.AST) -> cst.CSTNode:
        """The LibCST node that stands for ``node``."""
        top_ast = self.model.top_statement(node)
        if top_ast is None:
            raise BridgeError("node outside any statement")
        top, first = self._top_map()[top_ast]
        index = self._positions(top, first)
        line, col = self.model.position(node)
        end_line, end_col = self.model.end_position(node)
        kinds = _KINDS.get(type(node))
        if kinds is None:
            raise BridgeError(f"no LibCST counterpart for {type(node).__name__}")
        for cand in index.get((line, col, end_line, end_col), ()):
            if isinstance(cand, kinds):
                if isinstance(node, ast.Starred) and isinstance(cand, cst.Arg) and not cand.star:
                    continue
                return cand
        if isinstance(node, (ast.Tuple, ast.GeneratorExp)):
            # ast's range of a parenthesized tuple/generator includes the parentheses,
            # LibCST's does not: the widest node of the kind inside the range
            best, span = None, None
            for key, cands in index.items():
                if (key[0], key[1]) >= (line, col) and (key[2], key[3]) <= (end_line, end_col):
                    for cand in cands:
                        if isinstance(cand, kinds):
                            s = (key[0], key[1], -key[2], -key[3])
                            if span is None or s < span:
                                best, span = cand, s
            if best is not None:
                return best
        if isinstance(node, ast.keyword):
            # ``**kw`` has no name: the Arg starts at the stars
            for key, cands in index.items():
                if key[2:] == (end_line, end_col):
                    for cand in cands:
                        if isinstance(cand, cst.Arg) and cand.star == "**":
                            return cand
        raise BridgeError(f"{self.model.path}:{line}:{col + 1}: no LibCST node for {type(node).__name__}")

    def statement(self, stmt: ast.stmt) -> cst.CSTNode:
        """The LibCST statement for an ``ast`` statement: a compound statement itself; for a
        simple statement its ``SimpleStatementLine`` when the line holds only it, else the
        small statement (which can only be replaced or removed, not guarded)."""
        small = self.cst(stmt)
        if isinstance(stmt, _SMALL):
            line = self.parent(small)
            if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
                return line
            return small
        return small

    def parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return self._parents.get(node)

    def alone_on_line(self, stmt: ast.stmt) -> bool:
        """A simple statement that is the only one on its line (``a; b`` is not), or a compound one."""
        if not isinstance(stmt, _SMALL):
            return True
        return isinstance(self.statement(stmt), cst.SimpleStatementLine)

    def ancestors(self, node: cst.CSTNode):
        """For :func:`dp2ddp.engine.apply_edits`: the path to ``node`` from the module."""
        p = self._parents.get(node)
        while p is not None:
            yield p
            p = self._parents.get(p)
        yield self.module
