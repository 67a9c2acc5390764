"""One engine applies what the rules and transforms propose.

A rule (for `check`) or a transform (for `rewrite`) inspects the *original* tree and
reports :class:`Finding` objects: ``(node, code, message, fix)``. A fix is a list of
primitive :class:`Edit` objects against nodes of that original tree. This module applies
any set of fixes to the tree in one pass, so `check --fix`, `rewrite` and the pre-commit
hook all share the same logic and the same guarantees:

* edits are keyed by node identity, never by text;
* everything the edits do not touch is left byte-for-byte as it was;
* imports are only added / removed through LibCST's ``AddImportsVisitor`` and
  ``RemoveImportsVisitor``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import libcst as cst
from libcst.metadata import MetadataWrapper

NodeOrFn = Union[cst.CSTNode, cst.RemovalSentinel, Callable[[cst.CSTNode], cst.CSTNode]]


# --------------------------------------------------------------------------- edits


@dataclass(frozen=True)
class Replace:
    """Replace ``node`` by ``new`` (a node, ``cst.RemoveFromParent()``, or a function of the
    already-updated node, so that edits inside ``node`` are kept)."""

    node: cst.CSTNode
    new: NodeOrFn


@dataclass(frozen=True)
class Hoist:
    """Move the expression ``node`` out of its statement ``stmt`` into ``name = <node>``
    right before that statement (with every edit made inside the expression, and the
    statement's leading comments), leaving ``name`` in its place."""

    node: cst.CSTNode
    stmt: cst.CSTNode
    name: str


@dataclass(frozen=True)
class InsertBefore:
    stmt: cst.CSTNode  # a BaseStatement in a body
    stmts: Tuple[cst.BaseStatement, ...]


@dataclass(frozen=True)
class InsertAfter:
    stmt: cst.CSTNode
    stmts: Tuple[cst.BaseStatement, ...]


@dataclass(frozen=True)
class Remove:
    """Remove a statement; a block left empty gets ``pass``. Comments on the lines above it
    stay: they move to the statement after it (or to the block's end)."""

    stmt: cst.CSTNode


@dataclass(frozen=True)
class Guard:
    """Put consecutive sibling statements ``stmts`` under ``if <test>:``."""

    stmts: Tuple[cst.CSTNode, ...]
    test: cst.BaseExpression


@dataclass(frozen=True)
class Enclose:
    """Put consecutive sibling statements ``stmts`` in the body of ``block`` (a compound
    statement such as a ``with``, whose own body is replaced). The leading comments of the
    first statement move above ``block``; ``block``'s own leading lines follow them.
    Encloses and guards may nest: the smaller is applied first."""

    stmts: Tuple[cst.CSTNode, ...]
    block: cst.BaseCompoundStatement


@dataclass(frozen=True)
class AddImport:
    module: str
    obj: Optional[str] = None
    asname: Optional[str] = None


@dataclass(frozen=True)
class RemoveImportIfUnused:
    module: str
    obj: Optional[str] = None
    asname: Optional[str] = None


Edit = Union[Replace, Hoist, InsertBefore, InsertAfter, Remove, Guard, Enclose, AddImport, RemoveImportIfUnused]


# Finding and Fix live in dp2ddp.findings (no LibCST there: `check` detects without it)
from dp2ddp.findings import Finding, Fix, build_fixes  # noqa: E402,F401


# --------------------------------------------------------------------------- applying


class OverlappingEdits(RuntimeError):
    """Two edits of one migration overlap in a way that would lose one of them: a bug of
    dp2ddp (an edit must build its replacement from the updated node), never written."""


def _code(node: cst.CSTNode) -> str:
    text = cst.Module(body=[]).code_for_node(node).strip().splitlines()
    first = text[0] if text else ""
    return first if len(first) <= 60 else first[:57] + "..."


class _Applier(cst.CSTTransformer):
    def __init__(self, edits: Sequence[Edit], on_path: Optional[set] = None, keep: frozenset = frozenset()) -> None:
        super().__init__()
        self.keep = keep  # comment texts above removed statements that no other edit carries along
        # nodes that contain an edit target: subtrees outside it are not walked at all
        self.on_path = on_path
        self.replace: Dict[cst.CSTNode, List[NodeOrFn]] = {}
        self.before: Dict[cst.CSTNode, List[cst.BaseStatement]] = {}
        self.after: Dict[cst.CSTNode, List[cst.BaseStatement]] = {}
        self.remove: set = set()
        self.became: Dict[cst.CSTNode, object] = {}  # a statement whose comments a Remove moves -> what it became
        self.hoists: Dict[cst.CSTNode, Hoist] = {}
        self.hoisted: Dict[cst.CSTNode, List[Hoist]] = {}  # statement -> its hoists, in source order
        self.taken: Dict[Hoist, cst.BaseExpression] = {}
        self.guards: List[Union[Guard, Enclose]] = []
        self.guard_members: Dict[cst.CSTNode, Union[Guard, Enclose]] = {}
        # original statement -> the objects it became in the updated tree
        self.results: Dict[cst.CSTNode, List[cst.CSTNode]] = {}
        self.placed: set = set()  # ids of the guards and encloses put around their statements
        for e in edits:
            if isinstance(e, Replace):
                self.replace.setdefault(e.node, []).append(e.new)
            elif isinstance(e, InsertBefore):
                self.before.setdefault(e.stmt, []).extend(e.stmts)
            elif isinstance(e, InsertAfter):
                self.after.setdefault(e.stmt, []).extend(e.stmts)
            elif isinstance(e, Remove):
                self.remove.add(e.stmt)
            elif isinstance(e, Hoist):
                self.hoists[e.node] = e
                self.hoisted.setdefault(e.stmt, []).append(e)
            elif isinstance(e, Guard):
                held = {id(g): g for g in (self.guard_members.get(s) for s in e.stmts) if g is not None}
                if held:
                    # overlapping guards: one that holds the other wins (the writes of a run
                    # guarded whole stay under it); two that only overlap would lose a statement
                    if all(set(g.stmts) <= set(e.stmts) for g in held.values()):
                        for g in held.values():
                            self.guards.remove(g)  # type: ignore[arg-type]
                            for s in g.stmts:
                                del self.guard_members[s]
                    elif any(set(e.stmts) <= set(g.stmts) for g in held.values()):
                        continue
                    else:
                        raise OverlappingEdits(f"two guards overlap at `{_code(e.stmts[0])}`, neither holding the other")
                self.guards.append(e)
                for s in e.stmts:
                    self.guard_members[s] = e
        # an Enclose may hold statements that a Guard (or a smaller Enclose) groups: those
        # are applied first, and the Enclose takes the block they became
        self.enclosing: Dict[cst.CSTNode, List[Enclose]] = {}
        for e in sorted((e for e in edits if isinstance(e, Enclose)), key=lambda e: len(e.stmts)):
            self.guards.append(e)
            for s in e.stmts:
                self.enclosing.setdefault(s, []).append(e)
        self.guards.sort(key=lambda g: len(g.stmts))

    def on_visit(self, node) -> bool:  # type: ignore[override]
        return self.on_path is None or node in self.on_path

    def on_leave(self, original_node, updated_node):  # type: ignore[override]
        result = updated_node
        for new in self.replace.get(original_node, ()):
            if isinstance(result, (cst.RemovalSentinel, cst.FlattenSentinel)):
                break
            if not callable(new) and result is updated_node and not updated_node.deep_equals(original_node):
                # a replacement made from the original node would drop the edits inside it
                raise OverlappingEdits(f"an edit replaces `{_code(original_node)}` whole, dropping edits made inside it")
            result = new(result) if callable(new) else new
        hoist = self.hoists.get(original_node)
        if hoist is not None and isinstance(result, cst.BaseExpression):
            if isinstance(result, cst.Call) and result.lpar:
                result = result.with_changes(lpar=[], rpar=[])  # ``%(f(x))``: the call alone is assigned
            self.taken[hoist] = result  # with every edit inside it
            result = cst.Name(hoist.name)
        if original_node in self.remove:
            result = cst.RemoveFromParent()
        if original_node in self.guard_members or original_node in self.enclosing:
            # the statement itself, without what is inserted before or after it: inserted
            # statements stay outside the guard
            if isinstance(result, cst.FlattenSentinel):
                self.results[original_node] = list(result.nodes)
            elif isinstance(result, cst.RemovalSentinel):
                self.results[original_node] = []
            else:
                self.results[original_node] = [result]
        before = self.before.get(original_node)
        moved = [h for h in self.hoisted.get(original_node, ()) if h in self.taken]
        if moved:
            assigns = [cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(h.name))], self.taken[h])]) for h in moved]
            if isinstance(result, cst.SimpleStatementLine) and result.leading_lines:
                assigns[0] = assigns[0].with_changes(leading_lines=result.leading_lines)
                result = result.with_changes(leading_lines=())
                if original_node in self.results:
                    self.results[original_node] = [result]
            before = list(before or ()) + assigns  # right before it: after what other edits insert (set_epoch)
        after = self.after.get(original_node)
        if before or after:
            items: List[cst.CSTNode] = list(before or ())
            if isinstance(result, cst.FlattenSentinel):
                items.extend(result.nodes)
            elif not isinstance(result, cst.RemovalSentinel):
                items.append(result)
            items.extend(after or ())
            result = cst.FlattenSentinel(items)
        if self.keep and isinstance(original_node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            self.became[original_node] = result
        if isinstance(result, (cst.IndentedBlock, cst.Module)) and self.keep:
            result = self._keep_removed_comments(original_node, result)
        if isinstance(result, cst.IndentedBlock):
            result = self._apply_guards(result)
            if not result.body:
                result = result.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])])
        elif isinstance(result, cst.Module):
            result = self._apply_guards(result)
        return result

    def unplaced(self) -> Optional[cst.CSTNode]:
        """A statement whose guard (or enclosing block) was never put around it: it stands
        where no block holds it as a statement (an ``elif``), and would run unguarded."""
        for g in self.guards:  # the Encloses among them
            if id(g) not in self.placed:
                kept = [s for s in g.stmts if self.results.get(s)]
                if kept:
                    return kept[0]
        return None

    def _keep_removed_comments(self, original, block):
        """The comment lines above each removed statement of ``original``'s body, moved
        above the next statement that stays (or to the block's end)."""
        body = list(block.body)
        carried: List[cst.EmptyLine] = []
        changed = False
        for stmt in original.body:
            if stmt in self.remove:
                lines = list(getattr(stmt, "leading_lines", ()))
                if any(ln.comment is not None and ln.comment.value in self.keep for ln in lines):
                    carried += lines
                continue
            if not carried:
                continue
            got = self.became.get(stmt, stmt)
            first = got.nodes[0] if isinstance(got, cst.FlattenSentinel) and got.nodes else got
            i = next((k for k, node in enumerate(body) if node is first), None)
            if i is None or not hasattr(body[i], "leading_lines"):
                continue
            body[i] = body[i].with_changes(leading_lines=carried + list(body[i].leading_lines))
            carried, changed = [], True
        if carried:
            footer = list(block.footer) + [ln for ln in carried if ln.comment is not None]
            block = block.with_changes(footer=footer)
            changed = True
        return block.with_changes(body=body) if changed else block

    def _apply_guards(self, block):
        body = list(block.body)
        changed = False
        for g in self.guards:
            members: List[cst.CSTNode] = []
            for s in g.stmts:
                members.extend(self.results.get(s, []))
            if not members:
                continue
            idx = [i for i, node in enumerate(body) if any(node is m for m in members)]
            if not idx:
                continue
            # contiguous runs of members: anything inserted between two of them splits the guard
            runs: List[List[int]] = []
            for i in idx:
                if runs and runs[-1][-1] == i - 1:
                    runs[-1].append(i)
                else:
                    runs.append([i])
            for run in reversed(runs):
                lo, hi = run[0], run[-1]
                inner = body[lo : hi + 1]
                first = inner[0]
                leading = getattr(first, "leading_lines", ())
                inner[0] = first.with_changes(leading_lines=()) if leading else first
                if isinstance(g, Guard):
                    grouped = cst.If(test=g.test, body=cst.IndentedBlock(body=inner), leading_lines=leading)
                else:
                    grouped = g.block.with_changes(
                        body=cst.IndentedBlock(body=inner), leading_lines=list(leading) + list(g.block.leading_lines)
                    )
                body[lo : hi + 1] = [grouped]
                self.placed.add(id(g))
                # a larger Enclose over these statements now finds the block they became
                for s in g.stmts:
                    if s in self.enclosing and any(e is not g for e in self.enclosing[s]):
                        self.results[s] = [grouped]
            changed = True
        return block.with_changes(body=body) if changed else block


def _targets(edit: Edit) -> Tuple[cst.CSTNode, ...]:
    if isinstance(edit, Replace):
        return (edit.node,)
    if isinstance(edit, (InsertBefore, InsertAfter)):
        return (edit.stmt,)
    if isinstance(edit, Hoist):
        return (edit.node, edit.stmt)
    if isinstance(edit, Remove):
        return (edit.stmt,)
    if isinstance(edit, (Guard, Enclose)):
        return edit.stmts
    return ()


def apply_edits(
    wrapper: Union[MetadataWrapper, cst.Module],
    edits: Sequence[Edit],
    ancestors: Optional[Callable[[cst.CSTNode], Iterable[cst.CSTNode]]] = None,
    before_imports: Optional[Callable[[cst.Module], cst.Module]] = None,
) -> cst.Module:
    """Apply ``edits`` (against ``wrapper.module``) and return the new module.

    ``ancestors`` (e.g. ``Analysis.ancestors``) lets the engine walk only the paths
    that lead to edited nodes instead of the whole tree. ``before_imports`` sees the
    tree after the statement edits and before the import visitors, which may copy it."""
    tree_edits = [e for e in edits if not isinstance(e, (AddImport, RemoveImportIfUnused))]
    module = wrapper if isinstance(wrapper, cst.Module) else wrapper.module
    if tree_edits:
        on_path = None
        if ancestors is not None:
            on_path = set()
            for e in tree_edits:
                for node in _targets(e):
                    on_path.add(node)
                    for a in ancestors(node):
                        if a in on_path:
                            break
                        on_path.add(a)
        before = module
        applier = _Applier(tree_edits, on_path)
        module = before.visit(applier)
        lost = _lost_comments(before, module, [e.stmt for e in tree_edits if isinstance(e, Remove)])
        if lost:
            applier = _Applier(tree_edits, on_path, lost)
            module = before.visit(applier)
        stray = applier.unplaced()
        if stray is not None:
            raise OverlappingEdits(f"a rank test for `{_code(stray)}` could not be put around it")
    if before_imports is not None:
        module = before_imports(module)
    adds = [e for e in edits if isinstance(e, AddImport)]
    removes = [e for e in edits if isinstance(e, RemoveImportIfUnused)]
    if adds or removes:
        # libcst.codemod is slow to import (~60 ms): only when imports change
        from libcst.codemod import CodemodContext
        from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor

        context = CodemodContext()
        for e in _unique(adds):
            AddImportsVisitor.add_needed_import(context, e.module, e.obj, e.asname)
        for e in _unique(removes):
            RemoveImportsVisitor.remove_unused_import(context, e.module, e.obj, e.asname)
        if removes:
            module = _remove_imports(module, RemoveImportsVisitor(context), _bound_names(_unique(removes)))
        if adds:
            module = _add_imports(module, AddImportsVisitor(context))
    return module


def _lost_comments(before: cst.Module, after: cst.Module, removed: Sequence[cst.CSTNode]) -> frozenset:
    """Comment texts on the lines above ``removed`` statements that ``after`` no longer has
    as often as ``before`` (a statement moved elsewhere took its comments along: those are
    not lost)."""
    import collections

    above = [ln.comment.value for st in removed for ln in getattr(st, "leading_lines", ()) if ln.comment is not None]
    if not above:
        return frozenset()

    def count(module: cst.Module) -> collections.Counter:
        found: collections.Counter = collections.Counter()

        class _Comments(cst.CSTVisitor):
            def visit_Comment(self, node: cst.Comment) -> None:
                found[node.value] += 1

        module.visit(_Comments())
        return found

    missing = count(before) - count(after)
    return frozenset(c for c in above if missing[c] > 0)


_STUB = "__dp2ddp_stub_{}__"


def _bound_names(removes) -> List[str]:
    """The names the imports that ``removes`` may drop bind (``b`` of ``from m import a as b``)."""
    names = []
    for e in removes:
        if e.asname:
            names.append(e.asname)
        elif e.obj:
            names.append(e.obj)
        else:
            names.append(e.module.split(".")[0])
    return names


def _remove_imports(module: cst.Module, visitor, names: Sequence[str]) -> cst.Module:
    """Run ``RemoveImportsVisitor`` with the top-level compound statements that cannot
    decide whether an import is used swapped for one-line stubs, put back afterwards.

    A statement is stubbed only where its source holds none of ``names`` (so it can neither
    use nor rebind one of them) and no ``import`` (a star import there could): the visitor
    then decides as it does over the whole module, walking a 200-line migration in a tenth
    of the time (its scope analysis is the costliest step of a rewrite)."""
    # a name is found as a whole word: in code, in a string annotation, in __all__
    pattern = re.compile(r"\bimport\b|" + "|".join(rf"\b{re.escape(n)}\b" for n in names))
    originals = {}
    body = []
    for i, stmt in enumerate(module.body):
        if not isinstance(stmt, cst.SimpleStatementLine):
            if not pattern.search(module.code_for_node(stmt)):
                name = _STUB.format(i)
                originals[name] = stmt
                stmt = cst.SimpleStatementLine([cst.Expr(cst.Name(name))])
        body.append(stmt)
    if not originals:
        return visitor.transform_module(module)
    out = visitor.transform_module(module.with_changes(body=body))
    return out.with_changes(body=_restore(out.body, originals))


def _restore(body, originals) -> list:
    restored = []
    for stmt in body:
        if (
            isinstance(stmt, cst.SimpleStatementLine)
            and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Expr)
            and isinstance(stmt.body[0].value, cst.Name)
            and stmt.body[0].value.value in originals
        ):
            restored.append(originals[stmt.body[0].value.value])
        else:
            restored.append(stmt)
    return restored


def _add_imports(module: cst.Module, visitor) -> cst.Module:
    """Run ``AddImportsVisitor`` over the module's top level only.

    It places imports among top-level statements, so the bodies of functions and
    classes are swapped for one-line stubs while it runs (a 1,000-line script is then
    walked in milliseconds) and put back afterwards, untouched."""
    originals = {}
    body = []
    for i, stmt in enumerate(module.body):
        if isinstance(stmt, cst.SimpleStatementLine):
            body.append(stmt)
        else:
            name = _STUB.format(i)
            originals[name] = stmt
            body.append(cst.SimpleStatementLine([cst.Expr(cst.Name(name))]))
    stubbed = module.with_changes(body=body)
    out = MetadataWrapper(stubbed, unsafe_skip_copy=True).visit(visitor)
    return out.with_changes(body=_restore(out.body, originals))


def _unique(items):
    seen = set()
    out = []
    for i in items:
        if i not in seen:
            seen.add(i)
            out.append(i)
    return out


def collect_edits(findings: Iterable[Finding]) -> List[Edit]:
    """All edits of all fixes, each fix once (several findings may share one fix)."""
    seen: set = set()
    out: List[Edit] = []
    for f in findings:
        if f.fix and id(f.fix) not in seen:
            seen.add(id(f.fix))
            out.extend(f.fix.edits)
    return out
