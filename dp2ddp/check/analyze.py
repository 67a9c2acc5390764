"""The findings of one file's bytes: gate, parse, model, rules, ``# noqa``.

Nothing here imports torch or LibCST. The selected rules' gates read the bytes first
(most files stop there, unparsed); the file is parsed once with Python's ``ast``, its
:class:`~dp2ddp.model.core.SemanticModel` built once, and every candidate rule runs on it.
"""

from __future__ import annotations

from typing import Dict, Sequence, Tuple

from dp2ddp.check.noqa import suppressed
from dp2ddp.check.results import diagnostic
from dp2ddp.source import display_path

_SELECTED: Dict[Tuple[str, ...], list] = {}


def selected_rules(codes: Sequence[str]) -> list:
    """The lint rules among ``codes`` (the migration's codes have no detection of their own)."""
    key = tuple(codes)
    got = _SELECTED.get(key)
    if got is None:
        from dp2ddp.rules import RULES

        wanted = set(codes)
        got = _SELECTED[key] = [r for r in RULES if r.code in wanted]
    return got


def candidates(data: bytes, codes: Sequence[str]) -> list:
    """The selected rules whose gate lets ``data`` through."""
    rules = selected_rules(codes)
    memo: dict = {}
    out = [r for r in rules if r.may_fire(data, memo)]
    if len(out) < len(rules) and not data.isascii():
        # Python reads identifiers NFKC-normalized: what the bytes did not show, the
        # normalized text may (only non-ASCII characters change)
        from dp2ddp.rules.base import gate_bytes

        gated, memo = gate_bytes(data), {}
        if gated is not None:
            out = [r for r in rules if r in out or r.may_fire(gated, memo)]
    return out


def parse_model(data: bytes, path: str):
    """The semantic model of a file's bytes; a file that cannot be read as Python raises
    :class:`dp2ddp.source.InputError` with CPython's own message and line."""
    from dp2ddp.model.core import SemanticModel
    from dp2ddp.source import Source, parse_ast

    src = Source(path, data)
    tree, text = parse_ast(src)
    return SemanticModel(tree, text, src.display)


def check_source(data: bytes, path: str, rules: Sequence):
    """``(diagnostics, their findings, model, error)``: every finding of ``rules`` that
    no ``# noqa`` suppresses, in position order."""
    from dp2ddp.source import InputError

    display = display_path(path)
    try:
        model = parse_model(data, path)
    except InputError as e:
        return [], [], None, str(e)
    findings = []
    for rule in rules:
        try:
            findings.extend(rule.run(model))
        except RecursionError:
            return [], [], None, f"{display}: internal error in {rule.code}: file too deeply nested"
        except Exception as e:  # a bug in a rule must not stop the run; say which
            return [], [], None, f"{display}: internal error in {rule.code} ({type(e).__name__}: {e})"
    findings.sort(key=lambda f: (f.line, f.col, f.code))
    names = {r.code: r.name for r in rules}
    kept, out = [], []
    for f in findings:
        if suppressed(f.code, model.line_text(f.line)):
            continue
        kept.append(f)
        out.append(diagnostic(display, f, names.get(f.code, "")))
    return out, kept, model, None
