"""Source pruning for `dp2ddp check`: blank out the functions no candidate rule can need.

LibCST's parse and metadata are the dear part of checking a big module, and most of a
big module (torch's test suites are classes with hundreds of methods) is functions that
have nothing to do with the rules that the pre-filter let through. Before LibCST sees
the file, the *body* of every function that no rule's :class:`~dp2ddp.rules.base.Keep`
item holds for is replaced by ``...`` on its first line followed by as many empty lines
as it had: every kept line keeps its number and its text, so the findings need no
remapping and their ``# noqa`` comments are where they were. Decorators, parameters,
defaults and annotations stay (they run in the enclosing scope).

Why that cannot change a finding, given correct ``keep`` declarations:

* a function body is its own scope; it can change how names outside it resolve only
  through ``global`` (so a function holding one for a name that an import binds, or a
  builtin, is kept: other module-level names never resolve to what the rules look
  for) and ``nonlocal`` (kept, with the functions around it, whenever one of the
  functions around it is kept);
* a function is kept when its text matches a rule's item (a superset test: spellings of
  qualified names through every import of the module, case-insensitive words, string
  escapes), and so is every function that contains a kept one (its text contains it);
* with ``keep_callers``, every function calling a kept function by name is kept too,
  transitively (the rules follow module functions and ``self.`` methods by name);
* only bodies that start on a line of their own are replaced (``def f(): return 1`` is
  left alone), and the file is only pruned when Python's ``ast`` parsed it (the tree
  the pre-filter built) from UTF-8 without a coding declaration, so ``ast`` line
  numbers are the file's lines.

``tests/test_check_prune.py`` checks pruned == full on every example and fixture, and
``benchmarks/bench_check.py --verify-pruning`` on a whole tree.
"""

from __future__ import annotations

import ast
import bisect
import builtins
import re
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from dp2ddp.rules.base import Nodes, Rule, Text, callee_spelling

if TYPE_CHECKING:
    from dp2ddp.prefilter import NameFacts

# between the parts of a dotted name: blanks, line continuations, comments (a comment
# runs to the end of its line: one way to match, so no backtracking blow-up on "# # #")
_GAP = r"(?:[ \t\r\n\f\\]|#[^\r\n]*(?![^\r\n]))*"
# a string escape that could spell a letter (``"\x63uda"``), or a continued string line
_ESCAPE = r"\\(?:[xuUN0-7]|\r?\n|\r)"
_CALL = re.compile(r"([^\W\d]\w*)" + _GAP + r"\(")
_NEWLINE = re.compile(r"\r\n|\r|\n")
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)


def prunable(rules: Sequence[Rule]) -> bool:
    """Every rule says what it reads (no rule has ``keep = None``)."""
    return bool(rules) and all(r.keep is not None for r in rules)


def prune(data: bytes, facts: "Optional[NameFacts]", rules: Sequence[Rule]) -> Optional[bytes]:
    """``data`` with the bodies of the functions that ``rules`` cannot need replaced by
    ``...`` (same lines); ``None`` when nothing is pruned or pruning is not safe here.
    ``facts``: what the pre-filter's third tier found (its ``ast``, nodes by type, imports)."""
    if facts is None or not prunable(rules) or b"coding" in b"\n".join(data.split(b"\n", 2)[:2]):
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    tree = facts.tree
    defs = list(_functions(tree.body, None))
    if not defs:
        return None
    starts = [0] + [m.end() for m in _NEWLINE.finditer(text)]
    lines = [text[starts[k] : starts[k + 1] if k + 1 < len(starts) else len(text)] for k in range(len(starts))]
    spans = [(starts[d.lineno - 1], starts[d.end_lineno] if d.end_lineno < len(starts) else len(text)) for d, _p in defs]
    pos = {id(d): i for i, (d, _p) in enumerate(defs)}
    parent = [pos[id(p)] if p is not None else None for _d, p in defs]
    names = Names(facts)
    # the innermost function whose body holds each line (outer functions come first)
    owner: List[Optional[int]] = [None] * (len(lines) + 2)
    for i, (d, _p) in enumerate(defs):
        for k in range(_first_line(d.body[0]), d.end_lineno + 1):
            owner[k] = i

    def chain(i: Optional[int]) -> Set[int]:
        out = set()
        while i is not None:
            out.add(i)
            i = parent[i]
        return out

    def around(node) -> Set[int]:
        return chain(owner[node.lineno])

    kept: Set[int] = set()  # kept for their content
    seeds: Set[int] = set()  # ... by rules that follow calls
    texts = []
    for rule in rules:
        got: Set[int] = set()
        for item in rule.keep:
            if isinstance(item, Nodes):
                for node in names.of(item.types):
                    if item.test(node, names):
                        got |= around(node)
                continue
            if item.witness is not None:
                w = _witness(item.witness, names, owner)
                for refs in item.certain:
                    if w is None:
                        w = names.certain(refs)
                if w is not None:
                    got |= around(w)
                    continue
            texts.append([_pattern(t, names) for t in item.requires])
        kept |= got
        if rule.keep_callers:
            seeds |= got
    if texts:
        for i, (a, b) in enumerate(spans):
            body = text[a:b]
            if any(all(p is not None and p.search(body) for p in item) for item in texts):
                kept.add(i)
                seeds.add(i)  # a text match holds for the callers' rules too (cheap superset)
    if any(r.keep_callers for r in rules) and seeds:
        for i in _callers(text, defs, spans, seeds):
            kept |= chain(i)
    # ``global`` binds names of the module: never blank out one that binds a name an
    # import binds or a builtin (those the rules resolve to qualified names; any other
    # module-level name only ever resolves to the module's own). ``nonlocal`` binds a
    # name of an enclosing function: while any enclosing function is kept, keep the
    # function and every function around it (with the outermost one blanked, both the
    # binding and what it binds are gone)
    imported = {local for local, _q in names.bindings}
    for node in names.of((ast.Global,)):
        if any(n in imported or hasattr(builtins, n) for n in node.names):
            kept |= around(node)
    inner = [owner[node.lineno] for node in names.of((ast.Nonlocal,))]
    changed = True
    while changed:
        changed = False
        for i in inner:
            if i is not None and i not in kept and not chain(parent[i]).isdisjoint(kept):
                kept |= chain(i)
                changed = True
    changed = False
    stubbed: Set[int] = set()
    for i, (d, _p) in enumerate(defs):  # outer functions first
        if parent[i] is not None and parent[i] in stubbed:
            stubbed.add(i)  # gone with its parent's body
            continue
        if i in kept:
            continue
        first = d.body[0]
        row = _first_line(first) - 1
        line = lines[row]
        indent = len(line) - len(line.lstrip(" \t\f"))
        if indent != first.col_offset or row < d.lineno:
            continue  # the body starts on the header's line
        for k in range(row, d.end_lineno):
            ending = _NEWLINE.search(lines[k])
            lines[k] = ending.group() if ending else ""
        ending = _NEWLINE.search(line)
        lines[row] = line[:indent] + "..." + (ending.group() if ending else "")
        stubbed.add(i)
        changed = True
    return "".join(lines).encode("utf-8") if changed else None


def _first_line(stmt: ast.stmt) -> int:
    """The line a statement starts on: its first decorator's for a decorated definition
    (``ast`` gives the ``def``/``class`` line as ``lineno``)."""
    decorators = getattr(stmt, "decorator_list", None)
    return min([stmt.lineno] + [d.lineno for d in decorators]) if decorators else stmt.lineno


def _witness(nodes: Nodes, names: "Names", owner) -> Optional[ast.AST]:
    """A node that ``nodes.test`` accepts, on ASCII lines (``ast`` and LibCST spell it
    alike), preferably outside functions; ``None`` if there is none."""
    found = None
    for node in names.of(nodes.types):
        if nodes.test(node, names) and names.ascii(node):
            if owner[node.lineno] is None:
                return node
            found = found or node
    return found


def _functions(stmts, parent) -> Iterator[Tuple[ast.AST, Optional[ast.AST]]]:
    """Every function definition under ``stmts`` with its nearest enclosing function,
    outer ones first (statements only: a function cannot sit inside an expression)."""
    for s in stmts:
        if isinstance(s, _DEFS):
            yield s, parent
            yield from _functions(s.body, s)
            continue
        for name in ("body", "orelse", "finalbody"):
            sub = getattr(s, name, None)
            if isinstance(sub, list):
                yield from _functions(sub, parent)
        for h in getattr(s, "handlers", ()) or ():
            yield from _functions(h.body, parent)
        for c in getattr(s, "cases", ()) or ():
            yield from _functions(c.body, parent)


class Names:
    """What the keep items are evaluated with: the module's import bindings (every scope),
    its nodes by type, and which identifiers may stand for given qualified names."""

    def __init__(self, facts: "NameFacts") -> None:
        self._facts = facts
        self._index = facts.index
        self.bindings: Set[Tuple[str, str]] = {(local, q) for local, qs in facts.bindings.items() for q in qs}
        self._assigned: Dict[frozenset, Set[str]] = {}
        self.ascii = facts.ascii  # the node's lines are ASCII (ast and LibCST spell it alike)

    def certain(self, refs) -> Optional[ast.AST]:
        """A node (on ASCII lines) through which LibCST certainly resolves one of
        ``refs.names``; ``None`` if there is none."""
        return self._facts.certain(refs.names, prefix=refs.prefix)

    def of(self, types: Tuple[type, ...]) -> List[ast.AST]:
        """The module's nodes of ``types``."""
        return self._index.of(*types)

    def spellings(self, names) -> Set[str]:
        """Identifiers a reference to one of ``names`` can end with (see
        :meth:`dp2ddp.prefilter.NameFacts.spellings`)."""
        return self._facts.spellings(names)

    def assigned(self, names) -> Set[str]:
        """Names (``x``, and ``x`` of ``self.x``) assigned a call whose callee is spelled
        like one of ``names`` (what ``assigned_names`` finds, by spelling)."""
        key = frozenset(names)
        if key not in self._assigned:
            spellings = self.spellings(key)
            out: Set[str] = set()
            for n in self.of((ast.Assign, ast.AnnAssign, ast.AugAssign)):
                v = n.value
                if not isinstance(v, ast.Call):
                    continue
                if callee_spelling(v) not in spellings:
                    continue
                for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
                    if isinstance(t, ast.Name):
                        out.add(t.id)
                    elif isinstance(t, ast.Attribute):
                        out.add(t.attr)
            self._assigned[key] = out
        return self._assigned[key]


def _ref_patterns(names, prefix: bool, bindings) -> Tuple[List[str], Set[str]]:
    """Regexes for every spelling that may resolve to one of ``names``: the dotted path
    itself (a module-level variable spelled like its head), and ``local.rest`` for every
    import binding of a prefix; plus the local names bound to the names themselves."""
    out: List[str] = []
    aliases: Set[str] = set()

    def chain(parts: Sequence[str]) -> str:
        # ``(nn).BatchNorm2d``, ``(torch.cuda).set_device``: closing parentheses before a dot
        return r"\b" + (_GAP + r"(?:\)" + _GAP + r")*\." + _GAP).join(map(re.escape, parts)) + r"\b"

    for name in names:
        out.append(chain(name.split(".")))
        for local, qual in bindings:
            if qual == name or (prefix and qual.startswith(name + ".")):
                aliases.add(local)
            elif name.startswith(qual + "."):
                out.append(chain([local] + name[len(qual) + 1 :].split(".")))
    return out, aliases


def _pattern(t: Text, facts: Names) -> Optional["re.Pattern[str]"]:
    alts: List[str] = []
    if t.words:
        alts.append(f"(?:{t.words})")
    if t.escapes:
        alts.append(_ESCAPE)
    if t.refs:
        chains, aliases = _ref_patterns(sorted(t.refs), t.prefix, facts.bindings)
        alts.extend(chains)
        if aliases:
            alts.append(r"\b(?:%s)\b" % "|".join(map(re.escape, sorted(aliases))))
    if t.assigned:
        names = facts.assigned(t.assigned)
        if names:
            alts.append(r"\b(?:%s)\b" % "|".join(map(re.escape, sorted(names))))
    if not alts:
        return None
    return re.compile("|".join(alts), re.IGNORECASE if t.words else 0)


def _callers(text: str, defs, spans, seeds: Set[int]) -> Set[int]:
    """The functions whose text calls (``name(``) one of ``seeds`` or, transitively, of
    these callers."""
    calls = [(m.start(), m.group(1)) for m in _CALL.finditer(text)]
    offsets = [c[0] for c in calls]
    called: List[Set[str]] = []
    for a, b in spans:
        lo, hi = bisect.bisect_left(offsets, a), bisect.bisect_left(offsets, b)
        called.append({calls[k][1] for k in range(lo, hi)})
    out: Set[int] = set()
    names = {defs[i][0].name for i in seeds}
    changed = True
    while changed:
        changed = False
        for i in range(len(defs)):
            if i not in out and i not in seeds and not called[i].isdisjoint(names):
                out.add(i)
                names.add(defs[i][0].name)
                changed = True
    return out
