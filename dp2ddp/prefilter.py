"""Pre-filter: decide, before LibCST parses a file, which rules could fire on it.

Derived from the rules' ``needs`` (see :mod:`dp2ddp.rules.base`). Three tiers, each a
*necessary* condition of the rules (a file they reject cannot produce a finding), each
run only on what the previous one let through:

1. bytes: every requirement must have one of its byte strings in the file; a
   qualified-name requirement needs the last component of one of its names
   (``torch.nn.DataParallel`` can only be referred to if ``DataParallel`` occurs);
2. imports: a qualified-name requirement needs an import that can produce the name
   (``import torch`` + ``.save``, ``from torch import save as s``, ...), found by a
   conservative scan of the import statements: whatever it misreads adds bindings,
   never removes them;
3. names and shapes: Python's own (C) parser lists every dotted name the module can
   refer to, through every import of every scope — a superset of what LibCST's
   ``QualifiedNameProvider`` resolves — so a name that only occurs in a docstring or a
   comment no longer counts; the same ``ast`` answers the rules' ``Shape`` needs
   (e.g. "an ``if`` on the rank contains a collective call"), which are written as
   supersets of what the rules report. Roughly ten times cheaper than the LibCST
   analysis it saves. A shape may also use an *exact* fact to say "no finding":
   :meth:`NameFacts.definite` (the module certainly refers to, or calls, a name as
   LibCST resolves it), for rules that one such reference silences.
"""

from __future__ import annotations

import ast
import re
from typing import Dict, List, Optional, Sequence, Set, Tuple

from dp2ddp.rules.base import Folded, Refs, Rule, Shape, Tokens

# a dotted name, blanks allowed around its dots (``torch . distributed``)
_DOTTED = rb"\w+(?:[ \t]*\.[ \t]*\w+)*"
_FROM = re.compile(
    rb"from[ \t]+(\.*(?:" + _DOTTED + rb")?)[ \t]+import[ \t]*(\((?:[^)#]|#[^\r\n]*)*\)|[^\r\n;#]*(?:\\(?:\r\n|\r|\n)[^\r\n;#]*)*)"
)
_IMPORT = re.compile(
    rb"import[ \t]+(" + _DOTTED + rb"(?:[ \t]+as[ \t]+\w+)?(?:[ \t]*,[ \t]*(?:\\\r?\n[ \t]*)?" + _DOTTED + rb"(?:[ \t]+as[ \t]+\w+)?)*)"
)
_ALIAS = re.compile(rb"(" + _DOTTED + rb"|\*)(?:\s+as\s+(\w+))?")
_BLANKS = re.compile(rb"[ \t]+")
_WORDCHARS = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_SPACE = frozenset(b" \t\r\n\f\\")
# what the import scan and the attribute tests read: line continuations joined and form
# feeds as blanks (``from \\<newline> torch...``, ``torch.<FF>distributed``)
_CONTINUATION = re.compile(rb"\\(?:\r\n|\r|\n)")


def _normalized(data: bytes) -> bytes:
    if b"\\" in data:
        data = _CONTINUATION.sub(b" ", data)
    if b"\f" in data:
        data = data.replace(b"\f", b" ")
    return data


def _starts_word(data: bytes, i: int) -> bool:
    return i == 0 or data[i - 1] not in _WORDCHARS


def import_bindings(data: bytes) -> Set[Tuple[bytes, bytes]]:
    """(local name, qualified name) pairs the file's imports may bind. ``*`` as local
    name marks a star import of the module."""
    out: Set[Tuple[bytes, bytes]] = set()
    if b"from" in data:
        for m in _FROM.finditer(data):
            if not _starts_word(data, m.start()):
                continue
            mod = _BLANKS.sub(b"", m.group(1))
            for a in _ALIAS.finditer(m.group(2)):
                name, asname = _BLANKS.sub(b"", a.group(1)), a.group(2)
                if name in (b"as", b"import"):
                    continue
                if name == b"*":
                    out.add((b"*", mod))
                else:
                    out.add((asname or name, mod + b"." + name))
    for m in _IMPORT.finditer(data):
        if not _starts_word(data, m.start()):
            continue
        for a in _ALIAS.finditer(m.group(1)):
            name, asname = _BLANKS.sub(b"", a.group(1)), a.group(2)
            if name == b"as":
                continue
            if asname:
                out.add((asname, name))
            else:
                head = name.split(b".", 1)[0]
                out.add((head, head))
    return out


def _has_attr(data: bytes, name: bytes) -> bool:
    """``.name`` occurs (blanks, line breaks and continuations allowed after the dot, and
    a comment: ``(torch.  # c<newline> distributed)``)."""
    i = data.find(name)
    n = len(name)
    while i != -1:
        end = i + n
        if end == len(data) or data[end] not in _WORDCHARS:
            j = i - 1
            crossed = False
            while j >= 0 and data[j] in _SPACE:
                crossed = crossed or data[j] in (0x0A, 0x0D)
                j -= 1
            if j >= 0 and data[j] == 0x2E:  # "."
                return True
            if crossed and j >= 0:
                # the line we landed on may end in a comment after a dot
                start = max(data.rfind(b"\n", 0, j + 1), data.rfind(b"\r", 0, j + 1)) + 1
                line = data[start : j + 1]
                k = line.find(b"#")
                if k >= 0 and line[:k].rstrip(b" \t\f").endswith(b"."):
                    return True
        i = data.find(name, i + 1)
    return False


def _has_word(data: bytes, name: bytes) -> bool:
    i = data.find(name)
    n = len(name)
    while i != -1:
        end = i + n
        if (end == len(data) or data[end] not in _WORDCHARS) and _starts_word(data, i) and (i == 0 or data[i - 1] != 0x2E):
            return True
        i = data.find(name, i + 1)
    return False


def _assigned(data: bytes, name: bytes) -> bool:
    """``name = ...`` / ``name: T = ...`` occurs (a variable spelled like a module)."""
    for m in re.finditer(re.escape(name) + rb"[ \t]*(?::[^=\n]*)?=(?!=)", data):
        if _starts_word(data, m.start()) and (m.start() == 0 or data[m.start() - 1] != 0x2E):
            return True
    return False


def _may_refer(data: bytes, bindings: Set[Tuple[bytes, bytes]], need: Refs, memo: Dict) -> bool:
    def attr(name: bytes) -> bool:
        key = (".", name)
        if key not in memo:
            memo[key] = _has_attr(data, name)
        return memo[key]

    def word(name: bytes) -> bool:
        key = ("w", name)
        if key not in memo:
            memo[key] = _has_word(data, name)
        return memo[key]

    targets = [t.encode() for t in need.names]
    for local, qual in bindings:
        for t in targets:
            if local == b"*":
                # from m import *: LibCST does not resolve these names, but stay safe
                if t.startswith(qual + b".") or (need.prefix and qual.startswith(t)):
                    return True
                continue
            if qual == t or (need.prefix and qual.startswith(t + b".")):
                return True  # the import itself binds the name
            if t.startswith(qual + b"."):
                if attr(t.rsplit(b".", 1)[1]) and word(local):
                    return True
    # a module-level variable spelled like the head of the name (``torch = ...``)
    for t in targets:
        head, _, rest = t.partition(b".")
        if rest and attr(rest.rsplit(b".", 1)[-1]):
            key = ("=", head)
            if key not in memo:
                memo[key] = _assigned(data, head)
            if memo[key]:
                return True
    return False


class NameFacts:
    """Every dotted name a module can refer to, from Python's ``ast`` (tier 3)."""

    def __init__(self, tree: ast.AST, heads: Set[str], source: bytes = b"") -> None:
        """``heads``: first components of the names asked about later (``torch``). The
        nodes are also sorted by type, for the rules' shapes and for pruning
        (:class:`AstIndex`); ``bindings`` maps each name the imports bind (every scope)
        to the qualified names it may stand for; ``called`` holds what ``names`` holds for
        the callees of calls only. ``source``: the bytes ``tree`` was parsed from."""
        by_type: Dict[type, List[ast.AST]] = {}
        callees: Set[int] = set()
        called: Set[str] = set()
        bindings: Dict[str, Set[str]] = {}
        stars: Set[str] = set()
        names: Set[str] = set()  # used names
        typecheck_names: Set[str] = set()  # used only as direct arguments of isinstance/issubclass
        in_typecheck: Set[int] = set()
        shadowed = False
        imported: Set[str] = set()  # names of import statements
        chains: List[Tuple[str, Tuple[str, ...]]] = []
        for node in _walk(tree):
            t = type(node)
            if t in by_type:
                by_type[t].append(node)
            else:
                by_type[t] = [node]
            if isinstance(node, ast.Call):
                callees.add(id(node.func))
                if isinstance(node.func, ast.Name) and node.func.id in _TYPE_CHECKS:
                    _mark(node, in_typecheck)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                shadowed = shadowed or node.name in _TYPE_CHECKS
            elif isinstance(node, ast.alias):
                shadowed = shadowed or (node.asname or node.name) in _TYPE_CHECKS
            elif isinstance(node, ast.arg):
                shadowed = shadowed or node.arg in _TYPE_CHECKS
            if isinstance(node, ast.Attribute):
                attrs = []
                cur: ast.AST = node
                while isinstance(cur, ast.Attribute):
                    attrs.append(cur.attr)
                    cur = cur.value
                if isinstance(cur, ast.Name):
                    chains.append((cur.id, tuple(reversed(attrs)), id(node) in in_typecheck, id(node) in callees))
            elif isinstance(node, ast.Name):
                chains.append((node.id, (), id(node) in in_typecheck, id(node) in callees))
                if node.id in _TYPE_CHECKS and not isinstance(node.ctx, ast.Load):
                    shadowed = True
            elif isinstance(node, ast.Import):
                for a in node.names:
                    imported.add(a.name)
                    if a.asname:
                        bindings.setdefault(a.asname, set()).add(a.name)
                    else:
                        head = a.name.split(".", 1)[0]
                        bindings.setdefault(head, set()).add(head)
            elif isinstance(node, ast.ImportFrom):
                if node.level or not node.module:
                    continue
                imported.add(node.module)
                for a in node.names:
                    if a.name == "*":
                        stars.add(node.module)
                        continue
                    q = f"{node.module}.{a.name}"
                    imported.add(q)
                    bindings.setdefault(a.asname or a.name, set()).add(q)
        seen: Set[Tuple[str, Tuple[str, ...], bool, bool]] = set()
        for chain in chains:
            head, attrs, typecheck, callee = chain
            if (head not in bindings and head not in heads) or chain in seen:
                continue
            seen.add(chain)
            pool = typecheck_names if typecheck and not shadowed else names
            bases = bindings.get(head, set()) | {head} if head in heads else bindings[head]
            for base in bases:
                q = base
                pool.add(q)
                for a in attrs:
                    q = f"{q}.{a}"
                    pool.add(q)
                if callee:
                    called.add(q)
        self.tree = tree
        # computed when first asked: bindings per name, module-level imports, source
        # lines, spellings of names
        self._counts: Optional[Dict[str, int]] = None
        self._imports: Optional[Dict[str, Tuple[str, int, ast.stmt]]] = None
        self._lines: Optional[List[bytes]] = None
        self._spellings: Dict[frozenset, Set[str]] = {}
        self.source = source
        self.called = called
        self.index = AstIndex(tree, self, by_type)
        self.bindings = bindings
        self.names = names
        self.typecheck_names = typecheck_names
        self.imported = imported
        self.stars = stars

    def refers(self, need: Refs) -> bool:
        if need.called:
            return not self.called.isdisjoint(need.names) or any(
                t.startswith(star + ".") for star in self.stars for t in need.names
            )
        pools = [self.names]
        if need.imports:
            pools.append(self.imported)
        if need.type_checks:
            pools.append(self.typecheck_names)
        for pool in pools:
            if not pool.isdisjoint(need.names):
                return True
            if need.prefix:
                prefixes = tuple(n + "." for n in need.names)
                if any(q.startswith(prefixes) for q in pool):
                    return True
        for star in self.stars:
            if any(t.startswith(star + ".") for t in need.names):
                return True
        return False

    @property
    def lines(self) -> List[bytes]:
        """The source's lines (as ``ast`` counts them: cut at CR, LF and CRLF)."""
        if self._lines is None:
            self._lines = self.source.splitlines()
        return self._lines

    def ascii(self, node: ast.AST) -> bool:
        """``node``'s lines are ASCII, so its identifiers are spelled in ``ast`` as in the
        file: ``ast`` applies NFKC to identifiers (``ｄist`` becomes ``dist``), LibCST does not."""
        lines = self.lines
        end = getattr(node, "end_lineno", None) or node.lineno
        return end <= len(lines) and all(lines[k].isascii() for k in range(node.lineno - 1, end))

    def spellings(self, names) -> Set[str]:
        """Identifiers a reference to one of the qualified ``names`` can end with: their
        last components and the local names that imports (any scope) bind to them."""
        key = frozenset(names)
        out = self._spellings.get(key)
        if out is None:
            out = {n.rsplit(".", 1)[-1] for n in key}
            out |= {local for local, quals in self.bindings.items() if not quals.isdisjoint(key)}
            self._spellings[key] = out
        return out

    def definite(self, names, called: bool = False, prefix: bool = False) -> bool:
        """The module *certainly* refers to (with ``called``: calls) one of ``names`` as
        LibCST resolves them (with ``prefix``: or to a name below one of them): the
        opposite of the supersets above, for a rule that one such reference silences (a
        ``destroy_process_group`` anywhere, a ``set_device`` call).

        Counted: an import statement of a name (LibCST's ``all_qnames`` holds those), and
        a dotted use ``head.a.b`` whose ``head`` the module binds exactly once, in every
        scope and by every kind of binding, with a module-level ``import m as head`` /
        ``import head`` / ``from m import x as head`` on an earlier line: every scope
        then resolves ``head`` to that import."""
        return self.certain(names, called, prefix) is not None

    def certain(self, names, called: bool = False, prefix: bool = False) -> Optional[ast.AST]:
        """The node that makes :meth:`definite` true: the import statement, or the use."""
        names = frozenset(names)
        below = tuple(n + "." for n in names) if prefix else ()

        def match(q: str) -> bool:
            return q in names or (prefix and q.startswith(below))

        if not called:
            for node in self.index.of(ast.Import):
                if any(match(a.name) for a in node.names) and self.ascii(node):
                    return node
            for node in self.index.of(ast.ImportFrom):
                if (
                    node.module
                    and not node.level
                    and (match(node.module) or any(match(f"{node.module}.{a.name}") for a in node.names))
                    and self.ascii(node)
                ):
                    return node
        if self._imports is None:
            self._imports = {local: v for local, v in _module_imports(self.tree).items() if self.ascii(v[2])}
        imports = self._imports
        heads = {n.split(".", 1)[0] for n in names} | {
            local
            for local, (qual, _line, _node) in imports.items()
            if match(qual) or any(n.startswith(qual + ".") for n in names)
        }
        heads &= set(imports)
        if not heads:
            return None
        if self._counts is None:
            self._counts = _binding_counts(self.index)
        heads = {h for h in heads if self._counts.get(h) == 1}
        if not heads:
            return None
        targets = [c.func for c in self.index.of(ast.Call)] if called else self.index.of(ast.Attribute, ast.Name)
        for node in targets:
            attrs = []
            cur = node
            while isinstance(cur, ast.Attribute):
                attrs.append(cur.attr)
                cur = cur.value
            if not isinstance(cur, ast.Name) or cur.id not in heads:
                continue
            qual, line, _node = imports[cur.id]
            if cur.lineno <= line or not self.ascii(node):
                continue
            if match(".".join([qual] + attrs[::-1])):
                return node
        return None


_TYPE_CHECKS = frozenset({"isinstance", "issubclass"})


class AstIndex:
    """What a ``Shape`` test sees: the module's ``ast`` (``tree``), its nodes by type
    (``of(ast.Call, ...)``) and the module's :class:`NameFacts` (``refers(Refs(...))``)."""

    def __init__(self, tree: ast.AST, facts: "NameFacts", by_type: Dict[type, List[ast.AST]]) -> None:
        self.tree = tree
        self.facts = facts
        self._by_type = by_type

    def of(self, *types: type) -> List[ast.AST]:
        if len(types) == 1:
            return self._by_type.get(types[0], [])
        return [n for t in types for n in self._by_type.get(t, [])]

    def refers(self, need: Refs) -> bool:
        return self.facts.refers(need)


def _module_imports(tree: ast.Module) -> Dict[str, Tuple[str, int, ast.stmt]]:
    """{local name: (qualified name, line, statement)} of the imports in module-level code (blocks of
    ``if``/``try``/``with``/loops included, functions and classes not); ``import a.b``
    without ``as`` binds ``a`` in a way this does not model, so it is left out."""
    out: Dict[str, Tuple[str, int, ast.stmt]] = {}
    todo = list(tree.body)
    while todo:
        s = todo.pop()
        if isinstance(s, ast.Import):
            for a in s.names:
                if a.asname:
                    out[a.asname] = (a.name, s.lineno, s)
                elif "." not in a.name:
                    out[a.name] = (a.name, s.lineno, s)
        elif isinstance(s, ast.ImportFrom):
            if s.module and not s.level:
                for a in s.names:
                    if a.name != "*":
                        out[a.asname or a.name] = (f"{s.module}.{a.name}", s.lineno, s)
        elif not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                for sub in getattr(s, field, ()) or ():
                    todo.extend(sub.body if isinstance(sub, (ast.ExceptHandler, ast.match_case)) else [sub])
    return out


def _binding_counts(index: "AstIndex") -> Dict[str, int]:
    """How many times each name is bound anywhere in the module, by any kind of binding
    (assignment and deletion targets, parameters, definitions, imports, ``except ... as``,
    ``global``/``nonlocal``, match captures, type parameters)."""
    out: Dict[str, int] = {}

    def add(name) -> None:
        out[name] = out.get(name, 0) + 1

    for node in index.of(ast.Name):
        if not isinstance(node.ctx, ast.Load):
            add(node.id)
    for node in index.of(ast.arg):
        add(node.arg)
    for node in index.of(ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef):
        add(node.name)
    for node in index.of(ast.alias):
        add(node.asname or node.name.split(".", 1)[0])
    for node in index.of(ast.Global, ast.Nonlocal):
        for n in node.names:
            add(n)
    for node in index.of(ast.ExceptHandler, *_CAPTURES):
        for field in ("name", "rest"):
            v = getattr(node, field, None)
            if isinstance(v, str):
                add(v)
    return out


# nodes that bind a name in a field called ``name`` or ``rest`` (match patterns, and the
# type parameters of Python 3.12)
_CAPTURES = tuple(
    getattr(ast, n) for n in ("MatchAs", "MatchStar", "MatchMapping", "TypeVar", "ParamSpec", "TypeVarTuple") if hasattr(ast, n)
)

# fields that never hold a node worth indexing: names and flags, and the expression
# contexts and operators (singletons that would be most of the nodes walked)
_SKIP = frozenset({"ctx", "op", "id", "attr", "arg", "asname", "module", "level", "type_comment", "kind", "conversion", "simple", "is_async"})
_FIELDS: Dict[type, Tuple[str, ...]] = {}


def _walk(tree: ast.AST) -> List[ast.AST]:
    """The nodes of ``tree`` in pre-order (a node before its children, children in
    source order), without ``Load``/``Store`` contexts and operators; faster than
    ``ast.walk``, and the pre-filter walks every tree it parses."""
    out: List[ast.AST] = []
    todo = [tree]
    pop, push, AST = todo.pop, todo.append, ast.AST
    while todo:
        node = pop()
        out.append(node)
        t = type(node)
        fields = _FIELDS.get(t)
        if fields is None:
            fields = _FIELDS[t] = tuple(f for f in t._fields if f not in _SKIP)
        children = []
        for f in fields:
            v = getattr(node, f, None)
            if type(v) is list:
                for x in v:
                    if isinstance(x, AST):
                        children.append(x)
            elif isinstance(v, AST):
                children.append(v)
        for x in reversed(children):
            push(x)
    return out


def _mark(call: ast.Call, out: Set[int]) -> None:
    """Ids of the nodes in ``call``'s arguments whose nearest enclosing call is ``call``
    (the same test the DataParallel rule makes on the LibCST tree)."""
    todo: List[ast.AST] = [*call.args, *(k.value for k in call.keywords)]
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.Call, ast.Lambda)):
            continue  # below another call / a lambda the rule does not see a type check
        out.add(id(n))
        todo.extend(ast.iter_child_nodes(n))


def _tokens(need) -> Tuple[bytes, ...]:
    if isinstance(need, (Tokens, Shape)):
        return need.alternatives
    if isinstance(need, Refs):
        return tuple(sorted({n.rsplit(".", 1)[-1].encode() for n in need.names}))
    raise TypeError(need)


def name_facts(data: bytes, heads: Set[str]) -> Optional[NameFacts]:
    try:
        tree = ast.parse(data)
        return NameFacts(tree, heads, data)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None  # let LibCST parse it and report the error


# Byte strings that several tokens contain: when a guard is absent, so are they.
_GUARDS = (b"istributed",)


class Prefilter:
    """Compiled pre-filter for a set of rules."""

    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = list(rules)
        self._needs = [(r, [(_tokens(n), n) for n in r.needs]) for r in self.rules]
        self._heads = {name.split(".", 1)[0] for r in self.rules for n in r.needs if isinstance(n, Refs) for name in n.names}
        tokens = {t for _r, needs in self._needs for toks, _n in needs for t in toks}
        self._guard_of = {t: g for t in tokens if type(t) is bytes for g in _GUARDS if g in t}

    def candidates(self, data: bytes, use_ast: bool = True) -> List[Rule]:
        """The rules that could fire on ``data``."""
        return self.analyse(data, use_ast)[0]

    def analyse(self, data: bytes, use_ast: bool = True) -> Tuple[List[Rule], Optional["NameFacts"]]:
        """The rules that could fire on ``data``, and the tier-3 facts when they were
        computed (what :mod:`dp2ddp.prune_source` prunes with)."""
        tier1 = []
        token_hit: Dict[object, bool] = {}
        lower: Optional[bytes] = None  # data.lower(), for case-insensitive tokens
        for g in _GUARDS:
            if g not in data:
                for t, guard in self._guard_of.items():
                    if guard == g:
                        token_hit[t] = False
        for rule, needs in self._needs:
            ok = True
            for toks, need in needs:
                hit = False
                for t in toks:
                    folded = type(t) is Folded
                    key = ("i", t) if folded else t
                    h = token_hit.get(key)
                    if h is None:
                        if isinstance(t, re.Pattern):
                            h = token_hit[key] = t.search(data) is not None
                        elif folded:
                            if lower is None:
                                # Unicode case folding also maps other letters to ASCII
                                # (U+212A KELVIN SIGN is a "k"): non-ASCII text may match
                                lower = data.lower() if data.isascii() else b""
                            h = token_hit[key] = not lower or bytes(t) in lower
                        else:
                            h = token_hit[key] = t in data
                    if h:
                        hit = True
                        break
                if hit and isinstance(need, Shape) and need.pattern is not None:
                    h = token_hit.get(need.pattern)
                    if h is None:
                        h = token_hit[need.pattern] = need.pattern.search(data) is not None
                    hit = h
                if not hit:
                    ok = False
                    break
            if ok:
                tier1.append((rule, needs))
        if not tier1:
            return [], None
        bindings = None
        tier2 = []
        ref_cache: Dict[object, bool] = {}
        memo: Dict = {}
        for rule, needs in tier1:
            ok = True
            for _toks, need in needs:
                if isinstance(need, Refs):
                    if need not in ref_cache:
                        if bindings is None:
                            norm = _normalized(data)
                            bindings = import_bindings(norm)
                        ref_cache[need] = _may_refer(norm, bindings, need, memo)
                    if not ref_cache[need]:
                        ok = False
                        break
            if ok:
                tier2.append((rule, needs))
        if not use_ast or not any(isinstance(n, (Refs, Shape)) for _r, needs in tier2 for _t, n in needs):
            return [r for r, _ in tier2], None
        facts = name_facts(data, self._heads) if tier2 else None
        if facts is None:
            return [r for r, _ in tier2], None
        exact: Dict[object, bool] = {}
        out = []
        # names before shapes: a shape is the dearer test
        for rule, needs in tier2:
            ok = True
            for _toks, need in sorted(needs, key=lambda n: isinstance(n[1], Shape)):
                if isinstance(need, (Refs, Shape)):
                    if need not in exact:
                        exact[need] = facts.refers(need) if isinstance(need, Refs) else _shape_holds(need, facts.index)
                    if not exact[need]:
                        ok = False
                        break
            if ok:
                out.append(rule)
        return out, facts if out else None


def _shape_holds(shape: Shape, index: AstIndex) -> bool:
    try:
        return bool(shape.test(index))
    except Exception:
        return True  # cannot tell (or a bug in the shape): let LibCST decide
