"""Rank guards: code that only some ranks run. One definition for `check` and `rewrite`.

An expression *depends on the rank* when it mentions a rank-like identifier
(``rank``, ``local_rank``, ``args.local_rank``, ``is_main_process``, ``is_primary``,
``master``, ``chief``, ``leader``, ``os.environ["RANK"]`` ...), calls
``dist.get_rank()``, or calls a function of this module whose result does.

A node is *rank guarded* when it only runs on some ranks:

* it sits in an ``if`` (or conditional expression) whose test depends on the rank, in the
  same function;
* an ``if <rank test>: return/continue/break/raise/sys.exit()`` comes before it in one
  of its enclosing blocks of the same function;
* it sits in a function whose name says so (``*_main_process``, ``*rank0*``,
  ``*rank_zero*``), or in a function this module only calls from guarded places.
"""

from __future__ import annotations

import ast
import re
from typing import Iterator, List, Optional, Set, Tuple

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.names import GET_RANK
from dp2ddp.model.syntax import FUNCTIONS, children, kwarg, terminal

RANK_WORD = re.compile(
    r"(^|_)(rank|rank0|rank_zero|master|main_process|main_rank|is_main|is_master|primary|is_primary|chief|is_chief"
    r"|leader)(_|$)",
    re.IGNORECASE,
)
_RANK_FUNCTION = re.compile(r"main_process|rank0|rank_zero|on_master|on_main", re.IGNORECASE)
_EXITS = {"exit", "_exit"}


def _rank_functions(m: SemanticModel) -> Set[str]:
    """Module functions whose return value depends on the rank (``def is_primary(): ...``)."""
    key = "ranks:functions"
    got = m.cache.get(key)
    if got is None:
        got = {name for name in m.module_functions if RANK_WORD.search(name)}
        # the returns anywhere in a module function (nested ones included), from the index
        # of Return nodes instead of a walk of every function
        tops = {id(f): name for name, f in m.module_functions.items() if name not in got}
        for node in m.nodes(ast.Return):
            if node.value is None:  # type: ignore[attr-defined]
                continue
            top = m.top_statement(node)
            name = tops.get(id(top))
            if name is not None and name not in got and _mentions(m, node.value, set()):  # type: ignore[attr-defined]
                got.add(name)
        m.cache[key] = got
    return got  # type: ignore[return-value]


def _mentions(m: SemanticModel, expr: ast.AST, functions: Set[str]) -> bool:
    todo = [expr]
    while todo:
        n = todo.pop()
        if isinstance(n, ast.Lambda):
            continue
        if (
            isinstance(n, ast.Compare)
            and len(n.ops) == 1
            and isinstance(n.ops[0], (ast.In, ast.NotIn))
            and isinstance(n.left, ast.Constant)
            and isinstance(n.comparators[0], (ast.Name, ast.Attribute))
        ):
            continue  # "LOCAL_RANK" in os.environ: launched by torchrun or not, the same on every rank
        if isinstance(n, (ast.Name, ast.Attribute, ast.Subscript)):
            ident = terminal(n)
            if ident and RANK_WORD.search(ident):
                return True
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.upper() in ("RANK", "LOCAL_RANK"):
            return True
        elif isinstance(n, ast.Call):
            if m.is_name(n.func, GET_RANK):
                return True
            if isinstance(n.func, ast.Name) and n.func.id in functions:
                return True
        elif isinstance(n, ast.keyword) and n.arg and RANK_WORD.search(n.arg):
            return True
        todo.extend(children(n))
    return False


_RANK_TEXT = ("rank", "master", "main", "primary", "chief", "leader")
# a piece of "RANK" / "LOCAL_RANK" split into adjacent literals ('R' 'ANK'), which Python joins
_RANK_PIECE = re.compile(r"""["'](?:r|ra|ran|l|lo|loc|loca|local|local_|local_r|local_ra|local_ran)["']""", re.IGNORECASE)


def mentions_rank(m: SemanticModel, expr: ast.AST) -> bool:
    """``expr`` depends on which rank evaluates it."""
    functions = _rank_functions(m)
    # (first the text: what no rank word, escape, non-ASCII identifier or rank function
    # appears in cannot mention the rank — most tests of a script are so)
    text = m.source(expr) if hasattr(expr, "end_col_offset") else None
    if text is not None and text.isascii() and "\\" not in text:
        lowered = text.lower()
        if not any(w in lowered for w in _RANK_TEXT) and not any(f in text for f in functions) and not _RANK_PIECE.search(text):
            return False
    return _mentions(m, expr, functions)


def restricts_rank(m: SemanticModel, test: ast.AST) -> bool:
    """The test lets only some ranks through: it depends on the rank, and no operand of
    an ``or`` can be true on every rank (``not args.multiprocessing_distributed or
    args.rank % ngpus == 0`` is true on every rank of a torchrun job without that flag)."""
    if isinstance(test, ast.BoolOp):
        if isinstance(test.op, ast.And):
            return any(restricts_rank(m, v) for v in test.values)
        return all(restricts_rank(m, v) for v in test.values)
    if isinstance(test, ast.Call) and isinstance(test.func, ast.Name):
        func = m.module_functions.get(test.func.id)
        if func is not None:
            return _returns_restrict(m, func)
    return mentions_rank(m, test)


def _returns_restrict(m: SemanticModel, func: ast.AST) -> bool:
    """Every value ``func`` returns restricts the rank; once per function. A function that
    returns a call of itself (``return is_main(dist.get_rank())``) is judged by its other
    returns: while it is being judged, it counts as restricting."""
    memo = m.cache.setdefault("_returns_restrict", {})
    if func not in memo:
        memo[func] = True  # type: ignore[index]
        rets = [r.value for r in ast.walk(func) if isinstance(r, ast.Return) and r.value is not None]
        memo[func] = bool(rets) and all(restricts_rank(m, r) for r in rets)  # type: ignore[index]
    return memo[func]  # type: ignore[index]


def rank_conditionals(m: SemanticModel, node: ast.AST) -> Iterator[Tuple[ast.AST, str]]:
    """``(if_or_ifexp, "body"|"orelse")`` around ``node`` whose test lets only some ranks
    through (:func:`restricts_rank`), innermost first, inside the enclosing function."""
    child = node
    for a in m.ancestors(node):
        if isinstance(a, FUNCTIONS + (ast.Lambda, ast.ClassDef)):
            return
        if isinstance(a, (ast.If, ast.IfExp)) and child is not a.test:
            if restricts_rank(m, a.test):
                in_body = any(child is s for s in a.body) if isinstance(a, ast.If) else child is a.body
                yield a, "body" if in_body else "orelse"
        child = a


def ends_flow(stmt: ast.If) -> bool:
    """The ``if`` body leaves the block: return / continue / break / raise / sys.exit()."""
    for s in stmt.body:
        if isinstance(s, (ast.Return, ast.Continue, ast.Break, ast.Raise)):
            return True
        if is_exit(s):
            return True
    return False


def is_exit(stmt: ast.stmt) -> bool:
    """``sys.exit(...)``, ``exit()``, ``os._exit(...)`` as a statement."""
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and terminal(stmt.value.func) in _EXITS


def early_exit_before(m: SemanticModel, node: ast.AST) -> Optional[ast.If]:
    """An ``if <rank test>: return`` before ``node`` in one of its blocks (same function)."""
    cur: Optional[ast.AST] = m.statement_of(node)
    while cur is not None and not isinstance(cur, FUNCTIONS + (ast.Module, ast.ClassDef)):
        for sib in m.siblings_before(cur):  # type: ignore[arg-type]
            if isinstance(sib, ast.If) and ends_flow(sib) and restricts_rank(m, sib.test):
                return sib
        cur = m.parent(cur)
        while cur is not None and not isinstance(cur, ast.stmt):
            cur = m.parent(cur)
    return None


def rank_guarded(m: SemanticModel, node: ast.AST, _depth: int = 0) -> bool:
    """``node`` only runs on some ranks (see the module docstring)."""
    if next(rank_conditionals(m, node), None) is not None:
        return True
    if early_exit_before(m, node) is not None:
        return True
    func = m.enclosing_function(node)
    if func is None or _depth > 3:
        return False
    if _RANK_FUNCTION.search(func.name):  # type: ignore[attr-defined]
        return True
    sites = m.call_sites(func)
    return bool(sites) and all(rank_guarded(m, s, _depth + 1) for s in sites)


LOCAL_RANK_WORD = re.compile(r"local_rank|localrank|local_process_index", re.IGNORECASE)
# a piece of such a string split into adjacent literals ("local_" "rank"), which Python joins
_LOCAL_RANK_PIECE = re.compile(r"""["'](?:l|lo|loc|loca|local|local_|local_r|local_ra|local_ran|localr|localra|localran|local_p\w*)["']""", re.IGNORECASE)


def _identifiers(m: SemanticModel) -> Iterator[str]:
    """Every identifier of the module, wherever it stands: names, attribute names, keyword
    argument names, parameters, definitions, imports, globals, exception and match names."""
    nodes = m.all_nodes
    for n in nodes(ast.Name):
        yield n.id  # type: ignore[attr-defined]
    for n in nodes(ast.Attribute):
        yield n.attr  # type: ignore[attr-defined]
    for n in nodes(ast.keyword):
        if n.arg:  # type: ignore[attr-defined]
            yield n.arg  # type: ignore[attr-defined]
    for n in nodes(ast.arg):
        yield n.arg  # type: ignore[attr-defined]
    for n in nodes(ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef):
        yield n.name  # type: ignore[attr-defined]
    for n in nodes(ast.alias):
        yield from n.name.split(".")  # type: ignore[attr-defined]
        if n.asname:  # type: ignore[attr-defined]
            yield n.asname  # type: ignore[attr-defined]
    for n in nodes(ast.ImportFrom):
        if n.module:  # type: ignore[attr-defined]
            yield from n.module.split(".")  # type: ignore[attr-defined]
    for n in nodes(ast.Global, ast.Nonlocal):
        yield from n.names  # type: ignore[attr-defined]
    for n in nodes(ast.ExceptHandler):
        if n.name:  # type: ignore[attr-defined]
            yield n.name  # type: ignore[attr-defined]


def mentions_local_rank(m: SemanticModel) -> bool:
    """The module reads its local rank somewhere: an identifier (``local_rank``,
    ``args.local_rank``, ``LOCAL_RANK``, ``local_process_index``) or a string literal
    (``os.environ["LOCAL_RANK"]``, a docstring that names it) spelled like it. Parts of
    f-strings do not count."""
    got = m.cache.get("ranks:local-rank")
    if got is None:
        text = m.text
        # an identifier can only spell it in the text (or NFKC-normalized, when non-ASCII);
        # a string also through an escape
        spelled = LOCAL_RANK_WORD.search(text) is not None or not text.isascii()
        # (one search over the distinct identifiers, one over the string values)
        got = spelled and LOCAL_RANK_WORD.search("\n".join(set(_identifiers(m)))) is not None
        if not got and (spelled or "\\" in text or _LOCAL_RANK_PIECE.search(text)):
            in_fstrings = {id(v) for j in m.all_nodes(ast.JoinedStr) for v in j.values}  # type: ignore[attr-defined]
            strings = {c.value for c in m.all_nodes(ast.Constant) if isinstance(c.value, str) and id(c) not in in_fstrings}  # type: ignore[attr-defined]
            got = LOCAL_RANK_WORD.search("\n".join(strings)) is not None
        m.cache["ranks:local-rank"] = got
    return got  # type: ignore[return-value]


def _is_minus_one(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
        return isinstance(node, ast.Constant) and node.value == 1 and type(node.value) is int
    return isinstance(node, ast.Constant) and node.value == -1 and type(node.value) is int


def _distributed_checks(test: ast.AST) -> List[ast.Compare]:
    """``args.local_rank != -1``, ``rank == -1``: comparisons with -1 (the rank a script
    gets without a launcher)."""
    return [
        c
        for c in ast.walk(test)
        if isinstance(c, ast.Compare)
        and len(c.ops) == 1
        and isinstance(c.ops[0], (ast.Eq, ast.NotEq, ast.Is, ast.IsNot))
        and (_is_minus_one(c.comparators[0]) or _is_minus_one(c.left))
    ]


def splits_ranks(m: SemanticModel, test: ast.AST) -> bool:
    """``test`` depends on the rank (:func:`mentions_rank`) in a way that can differ
    between the ranks of one job. A rank only compared with -1 (``if args.local_rank !=
    -1:``, the Hugging Face way to ask "distributed or not?") is the same on every rank:
    such a test does not split them."""
    if not mentions_rank(m, test):
        return False
    checks = _distributed_checks(test)
    if not checks:
        return True
    functions = _rank_functions(m)
    skip = {id(c) for c in checks}
    todo = [test]
    while todo:
        n = todo.pop()
        if id(n) in skip:
            continue
        if _mentions_here(m, n, functions):
            return True
        todo.extend(children(n))
    return False


def _mentions_here(m: SemanticModel, n: ast.AST, functions: Set[str]) -> bool:
    """:func:`_mentions` of the node alone (not its children)."""
    if isinstance(n, (ast.Name, ast.Attribute, ast.Subscript)):
        ident = terminal(n)
        return bool(ident and RANK_WORD.search(ident))
    if isinstance(n, ast.Constant):
        return isinstance(n.value, str) and n.value.upper() in ("RANK", "LOCAL_RANK")
    if isinstance(n, ast.Call):
        return m.is_name(n.func, GET_RANK) or (isinstance(n.func, ast.Name) and n.func.id in functions)
    if isinstance(n, ast.keyword):
        return bool(n.arg and RANK_WORD.search(n.arg))
    return False


def rank_split_conditionals(m: SemanticModel, node: ast.AST) -> Iterator[Tuple[ast.AST, str]]:
    """:func:`rank_conditionals` whose test can differ between ranks (:func:`splits_ranks`):
    what only *some* ranks of a distributed job run."""
    for a, branch in rank_conditionals(m, node):
        if splits_ranks(m, a.test):  # type: ignore[attr-defined]
            yield a, branch


def runs_undistributed_only(m: SemanticModel, node: ast.AST) -> bool:
    """``node`` only runs when the script is not distributed: on the way to it (same
    function) an ``if`` requires a rank to equal -1 (``if args.local_rank == -1 and ...:``,
    or the ``else`` of ``if args.local_rank != -1:``) — one process, nothing to wait for."""
    child = node
    for a in m.ancestors(node):
        if isinstance(a, FUNCTIONS + (ast.Lambda, ast.ClassDef)):
            return False
        if isinstance(a, (ast.If, ast.IfExp)) and child is not a.test:
            in_body = any(child is s for s in a.body) if isinstance(a, ast.If) else child is a.body
            for c in _required(a.test, in_body):
                if isinstance(c.ops[0], (ast.Eq, ast.Is)) == in_body and mentions_rank(m, c):
                    return True
        child = a
    return False


def _required(test: ast.AST, truth: bool) -> List[ast.Compare]:
    """Comparisons with -1 that must hold (``truth``) or fail for ``test`` to be ``truth``:
    the test itself, or a conjunct of an ``and`` (a disjunct of an ``or`` when false)."""
    parts = [test]
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And if truth else ast.Or):
        parts = list(test.values)
    return [p for p in parts if p in _distributed_checks(p)]


# --------------------------------------------------------------------------- --local_rank

LOCAL_RANK_FLAGS = ("--local_rank", "--local-rank")
ENV_READS = frozenset({"os.environ", "os.getenv", "os.environ.get"})


def env_read(m: SemanticModel, expr: ast.AST, var: Optional[str] = None) -> bool:
    """``expr`` reads the process environment (``os.environ[...]``, ``os.getenv``); with
    ``var``, a read that names that variable (``os.environ.get("LOCAL_RANK", -1)``)."""
    for n in ast.walk(expr):
        if isinstance(n, (ast.Attribute, ast.Name)) and m.is_name(n, ENV_READS):
            if var is None or any(isinstance(c, ast.Constant) and c.value == var for c in ast.walk(expr)):
                return True
    return False


def local_rank_arguments(m: SemanticModel) -> List[Tuple[ast.Call, ast.AST, bool]]:
    """``parser.add_argument("--local_rank", ...)`` calls (``torch.distributed.launch``'s
    flag): ``(call, the flag's string node, whether its default is torchrun's LOCAL_RANK)``.
    One reading for the DDP011 rule and the mixed-script migration."""
    got = m.cache.get("ranks:local_rank_args")
    if got is None:
        got = []
        for call in m.nodes(ast.Call):
            if not (isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument"):
                continue
            flag = next((a for a in call.args if isinstance(a, ast.Constant) and a.value in LOCAL_RANK_FLAGS), None)
            if flag is None:
                continue
            default = next((k.value for k in call.keywords if k.arg == "default"), None)
            got.append((call, flag, default is not None and env_read(m, default, "LOCAL_RANK")))
        m.cache["ranks:local_rank_args"] = got
    return got  # type: ignore[return-value]


def local_rank_dest(call: ast.Call) -> str:
    """The option of the parsed arguments that holds a ``--local_rank`` argument: its
    ``dest=``, else ``local_rank`` (argparse's name for ``--local-rank`` too)."""
    dest = kwarg(call, "dest")
    return dest.value.value if dest is not None and isinstance(dest.value, ast.Constant) else "local_rank"
