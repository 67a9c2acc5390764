"""What a lint rule is, and the facts several rules share.

A rule is one small class: a code (``DDP0xx``), a kebab-case name of the problem, a
message, a docs entry in ruff's shape (what it does / why is this bad / example / fix),
VALID and INVALID examples (the tests run them, the docs print them), and a ``check``
method that inspects an :class:`~dp2ddp.analysis.Analysis` of the *original* tree and
yields :class:`~dp2ddp.engine.Finding` objects. Fixes are engine edits; `check --fix`
applies all of them in one pass through :func:`dp2ddp.engine.apply_edits`.

``needs`` declares what a file must contain for the rule to possibly fire. The
byte-level pre-filter (:mod:`dp2ddp.lint`) derives from it, so a file that cannot match
is never parsed. Each entry of ``needs`` is a requirement that must hold; a requirement
is satisfied when *any* of its alternatives is present:

* ``Tokens("a", "b")``: one of these byte strings occurs in the file (with
  ``ignore_case=True``, in any case: for a rule that matches names case-insensitively);
* ``Refs(names, prefix=False)``: the file may refer to one of these qualified names
  (checked against the file's imports, so ``from torch.nn import DataParallel as DP``
  counts and a local variable called ``DataParallel`` does not); with ``called=True``,
  the file may *call* one of them (for a rule that reports nothing unless
  ``an.calls(names)`` finds something; ``prefix`` does not apply);
* ``Shape(test, tokens)``: a structural condition on the file's Python ``ast``
  (``test(index)`` with an :class:`dp2ddp.prefilter.AstIndex`), e.g. "an ``if`` on the
  rank contains a collective call"; ``tokens`` are byte strings one of which the file
  must contain (checked first, cheaply), and ``pattern`` a byte regex that must match
  (also tier 1; write it so that comments and line continuations cannot hide a match —
  see ``GAP``). Python's ``ast`` differs from LibCST's tree
  (concatenated strings are joined, ``True`` is a constant): a shape must accept
  everything the rule's ``check`` could report on, so write it as a superset.

The requirements must be *necessary* conditions of the rule's ``check``: the pre-filter
may let through a file that then has no finding, never the reverse.
"""

from __future__ import annotations

import ast as _ast
import re
from dataclasses import dataclass
from typing import Callable, ClassVar, FrozenSet, Iterable, Iterator, List, Optional, Set, Tuple

import libcst as cst

from dp2ddp.analysis import DDP_NAMES, Analysis
from dp2ddp.engine import Finding, Fix


# --------------------------------------------------------------------------- needs


# a backslash escape that can spell a letter in a string ("\x63uda" is "cuda"), or a
# line continuation inside a one-line string: an alternative for Tokens of values that a
# rule evaluates (one regex, searched only when the plain spellings are absent)
ESCAPE = re.compile(rb"\\(?:[xuUN0-7]|\r?\n|\r)")


class Folded(bytes):
    """A token matched case-insensitively (lower case; the file is lowered to match it)."""


def _token_bytes(alternatives, ignore_case: bool) -> Tuple[bytes, ...]:
    """Byte strings (case-folded with ``ignore_case``); a compiled byte regex (``ESCAPE``)
    is kept as it is and searched."""
    return tuple(
        a if isinstance(a, re.Pattern) else Folded(a.lower().encode()) if ignore_case else a.encode()
        for a in alternatives
    )


@dataclass(frozen=True)
class Tokens:
    alternatives: Tuple[bytes, ...]

    def __init__(self, *alternatives: str, ignore_case: bool = False) -> None:
        object.__setattr__(self, "alternatives", _token_bytes(alternatives, ignore_case))


@dataclass(frozen=True)
class Refs:
    names: FrozenSet[str]
    prefix: bool = False  # match the names themselves and anything below them
    imports: bool = False  # an import statement of the name counts, not only uses
    type_checks: bool = True  # a use directly inside isinstance()/issubclass() counts
    called: bool = False  # only a call of the name counts (``an.calls(names)`` may be non-empty)

    def __init__(
        self,
        names: Iterable[str],
        prefix: bool = False,
        imports: bool = False,
        type_checks: bool = True,
        called: bool = False,
    ) -> None:
        object.__setattr__(self, "names", frozenset(names))
        object.__setattr__(self, "prefix", prefix)
        object.__setattr__(self, "imports", imports)
        object.__setattr__(self, "type_checks", type_checks)
        object.__setattr__(self, "called", called)


@dataclass(frozen=True)
class Shape:
    test: Callable[..., bool]  # (AstIndex) -> bool
    alternatives: Tuple[bytes, ...]
    pattern: Optional["re.Pattern[bytes]"] = None  # must also match the bytes (tier 1)

    def __init__(
        self, test: Callable[..., bool], *alternatives: str, pattern: Optional[bytes] = None, ignore_case: bool = False
    ) -> None:
        object.__setattr__(self, "test", test)
        object.__setattr__(self, "alternatives", _token_bytes(alternatives, ignore_case))
        object.__setattr__(self, "pattern", re.compile(pattern) if pattern is not None else None)


# between tokens: blanks, line continuations, comments (for byte patterns of Shapes)
# (a comment runs to the end of its line: one way to match, so no backtracking blow-up)
GAP = rb"(?:[ \t\r\n\f\\]|#[^\r\n]*(?![^\r\n]))*"


Need = object  # Tokens | Refs | Shape


# --------------------------------------------------------------------------- keep (source pruning)
#
# Before LibCST parses a file for `dp2ddp check`, :mod:`dp2ddp.prune_source` replaces the
# bodies of the functions that cannot matter to the candidate rules by ``...`` (keeping
# every line number). A rule says what it reads through ``keep``: a tuple of
# :class:`Keep` items; a function is kept when one item holds for its source text. The
# items must cover every function where the rule could report *and* every function whose
# content its ``check`` reads elsewhere (a ``destroy_process_group`` that silences the
# rule, the assignment of a DDP-wrapped model, ...). ``keep = None`` (the default): the
# rule reads everything, so no function is pruned when it is a candidate.


@dataclass(frozen=True)
class Text:
    """A function's source may hold one of: a match of ``words`` (a regex, matched
    case-insensitively), a spelling that may resolve to one of ``refs`` (any import alias,
    any dotted path; with ``prefix``, names below them too), the name of a variable
    assigned a call of one of ``assigned`` (``x = DDP(m)`` -> ``x``; ``self.x`` -> ``x``);
    with ``escapes``, also any string escape that could spell ``words``."""

    words: Optional[str] = None
    refs: FrozenSet[str] = frozenset()
    prefix: bool = False
    assigned: FrozenSet[str] = frozenset()
    escapes: bool = False

    def __init__(self, words=None, refs=(), prefix=False, assigned=(), escapes=False) -> None:
        object.__setattr__(self, "words", words)
        object.__setattr__(self, "refs", frozenset(refs))
        object.__setattr__(self, "prefix", prefix)
        object.__setattr__(self, "assigned", frozenset(assigned))
        object.__setattr__(self, "escapes", escapes)


@dataclass(frozen=True)
class Nodes:
    """Keep the function around every ``ast`` node of ``types`` for which ``test(node,
    names)`` holds. ``names`` (:class:`dp2ddp.prune_source.Names`) tells which identifiers
    may resolve to given qualified names (``names.spellings(DDP_NAMES)``: last components
    and import aliases) and which variables are assigned their calls. Like a shape, the
    test must accept every node where the rule could report."""

    types: Tuple[type, ...]
    test: Callable[..., bool]

    def __init__(self, types, test) -> None:
        object.__setattr__(self, "types", tuple(types))
        object.__setattr__(self, "test", test)


@dataclass(frozen=True)
class Keep:
    """Keep a function whose source satisfies every ``Text`` of ``requires``.

    For a fact of the kind "the module has X somewhere" (``is_ddp_code``, ``_uses_cuda``)
    one X is enough: ``witness`` is an exact test (on ``ast`` nodes of ASCII lines, the
    same nodes LibCST sees) for such an X; when the module has one, only the functions
    around one witness are kept (none if it is outside functions) and ``requires`` is
    not used. ``certain``: if no ``witness`` node is found, a use of a name of one of
    these ``Refs`` that LibCST certainly resolves so
    (:meth:`dp2ddp.prefilter.NameFacts.certain`) serves as the witness."""

    requires: Tuple[Text, ...]
    witness: Optional[Nodes] = None
    certain: Tuple[Refs, ...] = ()  # names whose certain use (NameFacts.certain) is a witness too

    def __init__(self, *requires: Text, witness: Optional[Nodes] = None, certain: Tuple[Refs, ...] = ()) -> None:
        object.__setattr__(self, "requires", tuple(requires))
        object.__setattr__(self, "witness", witness)
        object.__setattr__(self, "certain", certain)


def callee_spelling(call: "_ast.Call") -> Optional[str]:
    """The identifier a call's callee ends with (``f`` of ``f(...)`` and ``a.b.f(...)``)."""
    f = call.func
    return f.id if isinstance(f, _ast.Name) else f.attr if isinstance(f, _ast.Attribute) else None


def calls_to(names, test: Optional[Callable[..., bool]] = None) -> Nodes:
    """Keep the functions around the calls of something spelled like one of ``names``
    (every call ``an.calls(names)`` can return), only those ``test(call)`` accepts if given."""

    def accept(node, spelled) -> bool:
        return callee_spelling(node) in spelled.spellings(names) and (test is None or test(node))

    return Nodes((_ast.Call,), accept)


# "DDP code": the module refers to torch.distributed.* or DistributedDataParallel.
DIST_PREFIX = "torch.distributed"
DDP_CODE = Refs({DIST_PREFIX} | set(DDP_NAMES), prefix=True, imports=True)


def _is_ddp_name(q: str) -> bool:
    """What ``is_ddp_code`` accepts (a name *below* DistributedDataParallel is not DDP code)."""
    return q in DDP_NAMES or q == DIST_PREFIX or q.startswith(DIST_PREFIX + ".")


def _ddp_import(node, _spellings) -> bool:
    """An import statement that makes ``is_ddp_code`` true (``all_qnames`` holds the
    dotted names of every import statement)."""
    if isinstance(node, _ast.Import):
        return any(_is_ddp_name(a.name) for a in node.names)
    if node.module and not node.level:
        return _is_ddp_name(node.module) or any(_is_ddp_name(f"{node.module}.{a.name}") for a in node.names if a.name != "*")
    return False


# what ``is_ddp_code`` reads: one import of torch.distributed / DDP, or else every function
# that may refer to them
DDP_CONTEXT = Keep(
    Text(refs={DIST_PREFIX} | set(DDP_NAMES), prefix=True),
    witness=Nodes((_ast.Import, _ast.ImportFrom), _ddp_import),
    certain=(Refs({DIST_PREFIX}, prefix=True), Refs(DDP_NAMES)),
)


# --------------------------------------------------------------------------- rule


class Rule:
    code: ClassVar[str]
    name: ClassVar[str]  # kebab-case name of the problem
    message: ClassVar[str]  # the default message (a finding may be more specific)
    what: ClassVar[str]  # "What it does"
    why: ClassVar[str]  # "Why is this bad?"
    fix_doc: ClassVar[str]  # "How to fix" (prose)
    invalid: ClassVar[Tuple[str, ...]]  # each must produce >= 1 finding of this rule
    valid: ClassVar[Tuple[str, ...]]  # each must produce none
    default: ClassVar[bool] = True  # in the default selection
    severity: ClassVar[str] = "warning"  # "warning" | "info"
    fixable: ClassVar[bool] = False  # the rule can offer a fix (not always: see --fix)
    needs: ClassVar[Tuple[Need, ...]] = ()
    keep: ClassVar[Optional[Tuple[object, ...]]] = None  # Keep / Nodes items; None: no pruning
    keep_callers: ClassVar[bool] = False  # also keep the (transitive) callers of kept functions

    def check(self, an: Analysis) -> Iterable[Finding]:  # pragma: no cover - abstract
        raise NotImplementedError

    def finding(self, node: cst.CSTNode, message: Optional[str] = None, fix: Optional[Fix] = None) -> Finding:
        return Finding(self.code, message or self.message, node, fix=fix, severity=self.severity)


# --------------------------------------------------------------------------- shared facts


def _cached(an: Analysis, key: str, compute):
    key = "rules:" + key
    if key not in an.cache:
        an.cache[key] = compute()
    return an.cache[key]


def all_qnames(an: Analysis) -> Set[str]:
    """Every qualified name any Name/Attribute of the module resolves to, plus the
    dotted names of its imports."""

    def compute() -> Set[str]:
        out = set(import_qnames(an))
        for node in an.nodes_of(cst.Name, cst.Attribute):
            out |= an.qnames(node)
        return out

    return _cached(an, "qnames", compute)


def import_qnames(an: Analysis) -> Set[str]:
    """The dotted names of the module's import statements (part of ``all_qnames``, and
    far cheaper: no name resolution)."""

    def compute() -> Set[str]:
        out: Set[str] = set()
        for imp in an.nodes_of(cst.Import):
            for alias in imp.names:
                out.add(_dotted(alias.name))
        for imp in an.nodes_of(cst.ImportFrom):
            if imp.relative or imp.module is None:
                continue
            mod = _dotted(imp.module)
            out.add(mod)
            if not isinstance(imp.names, cst.ImportStar):
                for alias in imp.names:
                    out.add(f"{mod}.{_dotted(alias.name)}")
        return out

    return _cached(an, "import-qnames", compute)


def _dotted(node: cst.CSTNode) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    return ""


def is_ddp_code(an: Analysis) -> bool:
    """The module uses torch.distributed or DistributedDataParallel (by qualified name)."""

    def compute() -> bool:
        # the imports first: they usually decide it without resolving a single name
        return any(_is_ddp_name(q) for q in import_qnames(an)) or any(_is_ddp_name(q) for q in all_qnames(an))

    return _cached(an, "ddp", compute)


def uses(an: Analysis, names: Iterable[str]) -> bool:
    names = set(names)
    return bool(all_qnames(an) & names)


def kwarg(call: cst.Call, name: str) -> Optional[cst.Arg]:
    for a in call.args:
        if a.keyword is not None and a.keyword.value == name:
            return a
    return None


def has_star_kwargs(call: cst.Call) -> bool:
    return any(a.star == "**" for a in call.args)


def positional(call: cst.Call) -> List[cst.Arg]:
    return [a for a in call.args if a.keyword is None and not a.star]


def is_true(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Name) and node.value == "True"


def string_value(node: cst.CSTNode) -> Optional[str]:
    if isinstance(node, cst.SimpleString):
        try:
            v = node.evaluated_value
        except Exception:  # pragma: no cover - exotic literal
            return None
        return v if isinstance(v, str) else None
    return None


def terminal_identifier(node: cst.CSTNode) -> Optional[str]:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    if isinstance(node, cst.Call):
        return terminal_identifier(node.func)
    if isinstance(node, cst.Subscript):
        # os.environ["RANK"] -> "RANK"
        for el in node.slice:
            if isinstance(el.slice, cst.Index):
                s = string_value(el.slice.value)
                if s:
                    return s
        return terminal_identifier(node.value)
    return None


_RANK_WORD = re.compile(
    r"(^|_)(rank|rank0|rank_zero|master|main_process|main_rank|is_main|is_master|primary|is_primary|chief|is_chief|leader)(_|$)",
    re.IGNORECASE,
)


GET_RANK = frozenset({"torch.distributed.get_rank", "torch.distributed.distributed_c10d.get_rank"})


def mentions_rank(an: Analysis, expr: cst.CSTNode) -> bool:
    """The expression depends on which rank runs it: ``rank == 0``, ``args.local_rank``,
    ``dist.get_rank()``, ``is_main_process()``, ``os.environ["RANK"]`` ..."""

    found = False

    class _V(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            nonlocal found
            if found:
                return False
            if isinstance(node, (cst.Name, cst.Attribute, cst.Subscript)):
                ident = terminal_identifier(node)
                if ident and _RANK_WORD.search(ident):
                    found = True
                    return False
            if isinstance(node, cst.Call) and an.is_name(
                node.func, GET_RANK
            ):
                found = True
                return False
            if isinstance(node, cst.Lambda):
                return False
            return True

    expr.visit(_V())
    return found


def if_branches(node: cst.If) -> List[cst.CSTNode]:
    """Body, each elif body and the else body of an if chain, in order."""
    out: List[cst.CSTNode] = [node.body]
    cur = node.orelse
    while cur is not None:
        if isinstance(cur, cst.If):
            out.append(cur.body)
            cur = cur.orelse
        else:
            out.append(cur.body)
            cur = None
    return out


def rank_conditionals(an: Analysis, node: cst.CSTNode) -> Iterator[Tuple[cst.If, cst.CSTNode]]:
    """(if, branch) pairs around ``node`` whose test depends on the rank, innermost first,
    inside the enclosing function."""
    child = node
    for a in an.ancestors(node):
        if isinstance(a, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            return
        if isinstance(a, cst.If) and child is not a.test:
            if mentions_rank(an, a.test):
                yield a, child
        child = a


def _ends_flow(stmt: cst.CSTNode) -> bool:
    """``return`` / ``continue`` / ``break`` / ``raise`` / ``sys.exit()`` as the whole block."""
    body = stmt.body
    stmts = body.body if isinstance(body, (cst.IndentedBlock, cst.SimpleStatementSuite)) else ()
    for s in stmts:
        small = s.body if isinstance(s, cst.SimpleStatementLine) else [s]
        for x in small:
            if isinstance(x, (cst.Return, cst.Continue, cst.Break, cst.Raise)):
                return True
            if isinstance(x, cst.Expr) and isinstance(x.value, cst.Call):
                ident = terminal_identifier(x.value.func)
                if ident in {"exit", "_exit"}:
                    return True
    return False


def rank_guarded(an: Analysis, node: cst.CSTNode, _depth: int = 0) -> bool:
    """``node`` only runs on some ranks: it sits in an ``if`` on the rank, follows an
    ``if <rank test>: return`` in an enclosing block, or sits in a function that this
    module only calls from such places."""
    if next(rank_conditionals(an, node), None) is not None:
        return True
    # an early exit on the rank before it, in any enclosing block of the function
    cur: Optional[cst.CSTNode] = node
    while cur is not None and not isinstance(cur, (cst.FunctionDef, cst.Module)):
        stmt = an.statement_of(cur) if not isinstance(cur, cst.BaseStatement) else cur
        if stmt is None:
            break
        block = an.block_of(stmt)
        if block is not None:
            for sib in block.body:
                if sib is stmt:
                    break
                if isinstance(sib, cst.If) and mentions_rank(an, sib.test) and _ends_flow(sib):
                    return True
        cur = an.parent(stmt)
    func = an.enclosing_function(node)
    if func is None or _depth > 3:
        return False
    sites = call_sites(an, func)
    return bool(sites) and all(rank_guarded(an, s, _depth + 1) for s in sites)


def call_sites(an: Analysis, func: cst.FunctionDef) -> List[cst.Call]:
    """Calls of ``func`` in this module (module functions by name, methods via self.)."""

    def compute():
        index = {}
        for call in an.nodes_of(cst.Call):
            cls = an.enclosing_class(call)
            target = an.resolve_call_target(call, cls)
            if target is not None:
                index.setdefault(target, []).append(call)
        return index

    return _cached(an, "call_sites", compute).get(func, [])


def assigned_names(an: Analysis, value: cst.CSTNode) -> List[str]:
    """Spelling of the simple targets (``x`` or ``self.x``) that ``value`` is assigned to."""
    parent = an.parent(value)
    targets: List[cst.CSTNode] = []
    if isinstance(parent, cst.Assign) and parent.value is value:
        targets = [t.target for t in parent.targets]
    elif isinstance(parent, (cst.AnnAssign, cst.AugAssign)) and parent.value is value:
        targets = [parent.target]
    out = []
    for t in targets:
        if isinstance(t, cst.Name):
            out.append(t.value)
        elif isinstance(t, cst.Attribute) and isinstance(t.value, cst.Name) and t.value.value == "self":
            out.append("self." + t.attr.value)
    return out


def spelled(node: cst.CSTNode) -> Optional[str]:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self":
        return "self." + node.attr.value
    return None


def scope_key(an: Analysis, node: cst.CSTNode):
    """Where a local name lives: the enclosing function (methods share ``self.*`` through
    their class), or the module."""
    func = an.enclosing_function(node)
    return func if func is not None else an.module


COLLECTIVES = frozenset(
    f"{mod}.{name}"
    for mod in ("torch.distributed", "torch.distributed.distributed_c10d")
    for name in (
        "all_reduce",
        "reduce",
        "broadcast",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_object",
        "gather",
        "gather_object",
        "scatter",
        "scatter_object_list",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "all_to_all",
        "all_to_all_single",
        "broadcast_object_list",
        "barrier",
        "monitored_barrier",
        "new_group",
    )
)


def ddp_wrapped(an: Analysis):
    """{(scope, spelling)} of variables bound to a ``DistributedDataParallel(...)`` result
    (``self.x`` attributes are keyed by class)."""

    def compute():
        out = set()
        for call in an.calls(DDP_NAMES):
            for name in assigned_names(an, call):
                out.add(_var_key(an, call, name))
        return out

    return _cached(an, "ddp_wrapped", compute)


def _var_key(an: Analysis, node: cst.CSTNode, name: str):
    if name.startswith("self."):
        return (an.enclosing_class(node), name)
    return (scope_key(an, node), name)


def is_ddp_forward(an: Analysis, call: cst.Call) -> bool:
    name = spelled(call.func)
    if name is None:
        return False
    wrapped = ddp_wrapped(an)
    return _var_key(an, call, name) in wrapped or (an.module, name) in wrapped


# --------------------------------------------------------------------------- shapes (pre-filter)
# Helpers for ``Shape`` tests. They look at Python's ``ast`` and must over-approximate
# what the LibCST-based ``check`` methods find.

RANK_WORD = _RANK_WORD


def ast_terminal(node) -> Optional[str]:
    if isinstance(node, _ast.Name):
        return node.id
    if isinstance(node, _ast.Attribute):
        return node.attr
    if isinstance(node, _ast.Call):
        return ast_terminal(node.func)
    return None


def ast_words(expr) -> Iterator[str]:
    """Every identifier and string constant in ``expr``: names, attributes, keyword
    argument names, string literals (what LibCST's ``terminal_identifier`` can return)."""
    for n in _ast.walk(expr):
        if isinstance(n, _ast.Name):
            yield n.id
        elif isinstance(n, _ast.Attribute):
            yield n.attr
        elif isinstance(n, _ast.keyword) and n.arg:
            yield n.arg
        elif isinstance(n, _ast.Constant) and isinstance(n.value, str):
            yield n.value


def ast_kwarg(call, name: str):
    for k in call.keywords:
        if k.arg == name:
            return k
    return None


def ast_walk_branch(stmts) -> Iterator:
    """Nodes of ``stmts`` without entering functions, classes and lambdas (the LibCST
    rules stop at those when they look for an enclosing ``if``)."""
    todo = list(stmts)
    while todo:
        n = todo.pop()
        yield n
        for c in _ast.iter_child_nodes(n):
            if not isinstance(c, (_ast.FunctionDef, _ast.AsyncFunctionDef, _ast.ClassDef, _ast.Lambda)):
                todo.append(c)
