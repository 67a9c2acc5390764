"""What a lint rule is.

A rule is one module with one definition, ``RULE = Rule(...)``: its code (``DDP0xx``), a
kebab-case name of the problem, the message, its docs in ruff's shape (what it does / why
is this bad / example / how to fix / fix safety), ``Valid``/``Invalid`` examples — which
are its tests (an ``Invalid`` one carries where the first finding is and, for a fixable
rule, the source after ``--fix``) and the docs' examples —, and one detection function
over the module's :class:`~dp2ddp.model.core.SemanticModel` that yields :class:`Hit`
objects. Shared facts (rank guards, collectives, loaders, wraps ...) live in
:mod:`dp2ddp.model`, not in rules.

``gate`` is the rule's cheap pre-check on the file's bytes, so that most files are never
parsed: a tuple of requirements that must all hold, each a tuple of alternatives of which
one must occur. An alternative is an identifier (matched as a whole word) that the rule
cannot fire without — a component of a qualified name it resolves, an attribute or
keyword it reads —, a :class:`Text` (a part of an identifier, or of a string), or a
:class:`Pattern`. That is
sound by construction: Python builds names from identifier tokens, which no comment,
continuation or parenthesis can split, and a non-ASCII file is matched after NFKC
normalization, as Python reads its identifiers. A rule that reads a string's value also
accepts an escape or the value split into adjacent literals (:func:`literal`). ``tests/test_rules.py`` checks it on
every example and fixture.
"""

from __future__ import annotations

import ast
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Callable, Iterable, List, NamedTuple, Optional, Tuple

from dp2ddp.findings import Finding, Fix

# --------------------------------------------------------------------------- examples


@dataclass(frozen=True)
class Example:
    source: str
    valid: bool
    line: Optional[int] = None  # Invalid: where the first finding is (1-based line ...
    col: Optional[int] = None  # ... and 1-based column, as printed)
    fixed: Optional[str] = None  # Invalid: the source after `check --fix`; None: the finding offers no fix
    count: int = 1  # Invalid: how many findings
    end: Optional[Tuple[int, int]] = None  # Invalid: where the first finding ends (line, column, as printed)


def Valid(source: str) -> Example:
    """Code the rule must not report."""
    return Example(source, True)


def Invalid(
    source: str, line: int, col: int, fixed: Optional[str] = None, count: int = 1, end: Optional[Tuple[int, int]] = None
) -> Example:
    """Code the rule reports: ``count`` findings, the first from ``line:col`` to ``end``;
    with ``fixed``, what ``--fix`` makes of it (without, the finding must offer no fix)."""
    return Example(source, False, line, col, fixed, count, end)


# --------------------------------------------------------------------------- hits


class Hit(NamedTuple):
    """What a detection function reports: the node (an ``ast`` node of the model), the
    message when it differs from the rule's, a lazy fix, and a position when the finding
    is not where the node starts (``at``: 1-based line, 0-based column in characters)."""

    node: ast.AST
    message: Optional[str] = None
    fix: Optional[Fix] = None
    at: Optional[Tuple[int, int]] = None


# --------------------------------------------------------------------------- gates


class Text:
    """A gate alternative matched as a substring (``ignore_case``: in any case), not as a
    whole identifier: for identifiers a rule matches by a part (``*rank*``)."""

    __slots__ = ("text", "ignore_case")

    def __init__(self, text: str, ignore_case: bool = False) -> None:
        self.text = text.lower().encode() if ignore_case else text.encode()
        self.ignore_case = ignore_case


class Pattern:
    """A gate alternative matched by a regular expression over the bytes."""

    __slots__ = ("regex",)

    def __init__(self, regex: bytes) -> None:
        self.regex = re.compile(regex)


STRING_ESCAPE = Pattern(rb"\\")  # a backslash: a string escape may spell the value (``"\x63uda"``)


def string_pieces(*values: str, ignore_case: bool = False) -> Pattern:
    """A quoted proper prefix of one of ``values`` (``"cu"``): Python joins adjacent
    literals (``"cu" "da"`` is ``"cuda"``), and a value spelled so has no piece that
    holds it whole, but its first piece is such a prefix (or holds an escape)."""
    prefixes = sorted({v[:i] for v in values for i in range(1, len(v))}, key=len, reverse=True)
    body = b"|".join(re.escape(p.encode()) for p in prefixes)
    return Pattern((b"(?i)" if ignore_case else b"") + rb"[\"'](?:" + body + rb")[\"']")


def literal(*values: str, ignore_case: bool = False) -> Tuple[object, ...]:
    """Alternatives for a rule that reads a string literal's value: the value's text, an
    escape, or the value split into adjacent literals."""
    head = tuple(Text(v, ignore_case) for v in values)
    return head + (STRING_ESCAPE, string_pieces(*values, ignore_case=ignore_case))


_IDENT = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


class Gate:
    """A compiled gate (see the module docstring). Alternatives: an identifier (``str``,
    whole word), :class:`Text` or :class:`Pattern`."""

    def __init__(self, requirements: Tuple[Tuple[object, ...], ...]) -> None:
        self.requirements = tuple(_requirement(alts) for alts in requirements)

    def passes(self, data: bytes, memo: Optional[dict] = None) -> bool:
        """``memo``: what the gates of one file already found out (requirement -> bool),
        shared by all rules (most share ``DDP_CODE``)."""
        if memo is None:
            memo = {}
        for req in self.requirements:
            got = memo.get(req)
            if got is None:
                got = memo[req] = req.holds(data, memo)
            if not got:
                return False
        return True


_REQUIREMENTS: dict = {}


def _requirement(alts: Tuple[object, ...]) -> "_Requirement":
    """One compiled object per distinct requirement, so that rules share their results."""
    key = tuple(a if isinstance(a, str) else ("text", a.text, a.ignore_case) if isinstance(a, Text) else ("re", a.regex.pattern) for a in alts)
    got = _REQUIREMENTS.get(key)
    if got is None:
        got = _REQUIREMENTS[key] = _Requirement(alts)
    return got


class _Requirement:
    __slots__ = ("words", "texts", "folded", "patterns")

    def __init__(self, alts: Tuple[object, ...]) -> None:
        self.words = tuple(a.encode() for a in alts if isinstance(a, str))
        self.texts = tuple(a.text for a in alts if isinstance(a, Text) and not a.ignore_case)
        self.folded = tuple(a.text for a in alts if isinstance(a, Text) and a.ignore_case)
        self.patterns = tuple(a.regex for a in alts if isinstance(a, Pattern) and a is not STRING_ESCAPE)
        if any(a is STRING_ESCAPE for a in alts):
            self.texts += (b"\\",)

    def holds(self, data: bytes, memo: dict) -> bool:
        for t in self.texts:
            got = memo.get(t)
            if got is None:
                got = memo[t] = t in data
            if got:
                return True
        for w in self.words:
            got = memo.get(w)
            if got is None:
                absent = memo.setdefault("absent", [])
                # a word that holds a string absent from the bytes is absent too
                # (DistributedDataParallel without DataParallel): no other pass over them
                if any(a in w for a in absent):
                    got = memo[w] = False
                else:
                    i = data.find(w)
                    if i < 0:
                        absent.append(w)
                    got = memo[w] = i >= 0 and _has_word(data, w, i)
            if got:
                return True
        if self.folded:
            lowered = memo.get("lower")
            if lowered is None:
                lowered = memo["lower"] = data.lower()
            if any(t in lowered for t in self.folded):
                return True
        return any(p.search(data) is not None for p in self.patterns)


def _has_word(data: bytes, w: bytes, i: Optional[int] = None) -> bool:
    """``w`` occurs as a whole word: no identifier character either side (``i``: where
    the search starts, when the first occurrence is already known)."""
    if i is None:
        i = data.find(w)
    while i >= 0:
        j = i + len(w)
        if (i == 0 or data[i - 1] not in _IDENT) and (j == len(data) or data[j] not in _IDENT):
            return True
        i = data.find(w, i + 1)
    return False


def gate_bytes(data: bytes) -> Optional[bytes]:
    """The bytes gates read: the file itself, or for a non-ASCII file its text after NFKC
    normalization (Python normalizes identifiers so: ``ｓave`` is ``save``). ``None`` when
    normalizing cannot make a new identifier character appear (no non-ASCII character of
    the file normalizes to a letter, digit or underscore): the bytes already said it all."""
    if data.isascii():
        return data
    head = data[:400]
    try:
        if b"coding" in head:  # a PEP 263 declaration: read the file as Python would
            from dp2ddp.model.positions import decode

            text = decode(data)
        else:
            text = data.decode("utf-8")
    except Exception:  # undecodable: the parser will say so; let every rule through
        return b"\\" + data
    chars = set(text) - _ASCII
    if not any(_IDENT.intersection(unicodedata.normalize("NFKC", c).encode("utf-8", "replace")) for c in chars):
        return None
    return unicodedata.normalize("NFKC", text).encode("utf-8", "surrogatepass")


_ASCII = frozenset(chr(i) for i in range(128))


def components(*name_sets: Iterable[str]) -> Tuple[Tuple[str, ...], ...]:
    """Requirements derived from names the way :func:`tails` is: every component (other
    than ``torch``) that all the names share — ``torch.distributed.init_process_group``
    and ``torch.distributed.distributed_c10d.init_process_group`` both need ``distributed``
    and ``init_process_group`` — each a requirement of its own."""
    names = [n for ns in name_sets for n in ns]
    common = set(names[0].split("."))
    for n in names[1:]:
        common &= set(n.split("."))
    return tuple((c,) for c in sorted(common - {"torch"}, key=len))


def tails(*name_sets: Iterable[str]) -> Tuple[str, ...]:
    """The identifiers that qualified names end with (a gate alternative derived from the
    names a rule resolves: ``torch.save`` needs ``save``)."""
    return tuple(sorted({n.rsplit(".", 1)[-1] for names in name_sets for n in names}))


# DDP code (``dp2ddp.model.collectives.is_ddp_code``): torch.distributed or DDP, by name
DDP_CODE = ("distributed", "DistributedDataParallel")


# --------------------------------------------------------------------------- the rule


@dataclass(frozen=True)
class Rule:
    code: str
    name: str  # kebab-case name of the problem
    message: str  # the default message (a finding may be more specific)
    what: str  # "What it does"
    why: str  # "Why is this bad?"
    fix: str  # "How to fix" (prose)
    fix_safety: str  # what the fix of `--fix` may change besides the problem; "" when there is no fix
    examples: Tuple[Example, ...]
    check: Callable[..., Iterable[Hit]]  # (SemanticModel) -> hits
    gate: Tuple[Tuple[object, ...], ...]
    default: bool = True  # in the default selection
    severity: str = "warning"  # "warning" | "info"
    fixable: bool = False  # the rule can offer a fix
    # migration refusals of the same hazard: where `rewrite --accept` took one of them at a
    # statement, the migration's own check (DDP186) does not refuse this rule's finding there
    accepted_by: Tuple[str, ...] = ()
    _gate: Gate = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_gate", Gate(self.gate))

    @property
    def valid(self) -> List[Example]:
        return [e for e in self.examples if e.valid]

    @property
    def invalid(self) -> List[Example]:
        return [e for e in self.examples if not e.valid]

    def may_fire(self, gated: bytes, memo: Optional[dict] = None) -> bool:
        """The gate: ``False`` means the rule certainly reports nothing on these bytes
        (``gated`` from :func:`gate_bytes`; ``memo`` shared by the rules of one file)."""
        return self._gate.passes(gated, memo)

    def passes_gate(self, data: bytes) -> bool:
        """What :func:`dp2ddp.check.analyze.candidates` decides for this rule alone: the bytes, and
        for a non-ASCII file the NFKC-normalized text, let it through."""
        if self.may_fire(data):
            return True
        gated = gate_bytes(data) if not data.isascii() else None
        return gated is not None and self.may_fire(gated)

    def run(self, m) -> List[Finding]:
        """The rule's findings on the model ``m``, positioned."""
        out = []
        for hit in self.check(m):
            node = hit.node
            line, col = hit.at if hit.at is not None else m.position(node)
            end_line, end_col = m.end_position(node)
            out.append(
                Finding(
                    self.code,
                    hit.message or self.message,
                    node,
                    fix=hit.fix,
                    line=line,
                    col=col,
                    severity=self.severity,
                    end_line=end_line,
                    end_col=end_col,
                )
            )
        return out


def attribute_name_position(m, node: ast.Attribute) -> Tuple[int, int]:
    """Where the attribute name of ``node`` (``cuda`` of ``model.cuda``) starts."""
    end_line, end_col = m.end_position(node)
    text = m.line_text(end_line)
    i = end_col
    while i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_" or not text[i - 1].isascii()):
        i -= 1
    return end_line, i


def positional(call: ast.Call) -> List[ast.AST]:
    """Positional arguments other than ``*args``."""
    return [a for a in call.args if not isinstance(a, ast.Starred)]


def has_double_star(call: ast.Call) -> bool:
    return any(k.arg is None for k in call.keywords)


def cached(m, key: str, compute):
    key = "rules:" + key
    got = m.cache.get(key)
    if got is None:
        got = m.cache[key] = compute()
    return got

