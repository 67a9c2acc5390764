"""The one registry of every code dp2ddp prints.

* ``DDP0xx``: the lint rules of `dp2ddp check` (:mod:`dp2ddp.rules`, one module each);
* ``DDP1xx``: what the migration says (:mod:`dp2ddp.migration_codes`): ``info`` notes of
  what it changed, ``warning`` for what it left for a human, ``error`` for why it left a
  file unchanged. `dp2ddp rewrite` prints them; `dp2ddp check --fix`/`--diff` reports the
  warnings and errors of DDP001's fix (the migration) as findings.

Selection (``--select``/``--extend-select``/``--ignore``, ``[tool.dp2ddp]``) and
``# noqa`` take any code, a code prefix (``DDP0``, ``DDP13``), a name or ``ALL``; the
default selection is the default rules plus the migration's warnings and errors.
``python -m dp2ddp.registry`` writes ``docs/rules.md``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple


@dataclass(frozen=True)
class Code:
    code: str
    name: str
    kind: str  # "rule" | "migration"
    severity: str  # "warning" | "info" | "error"
    default: bool  # in the default selection
    fixable: bool
    message: str  # the rule's message, the migration code's summary
    what: str
    why: str
    fix: str
    fix_safety: str
    rule: object = None  # the dp2ddp.rules.base.Rule of a DDP0xx code
    examples: Tuple[Tuple[bool, str], ...] = ()  # (valid, source)


def _load() -> Tuple[Code, ...]:
    from dp2ddp.migration_codes import CODES as MIGRATION
    from dp2ddp.rules import RULES

    out: List[Code] = []
    for r in RULES:
        out.append(
            Code(r.code, r.name, "rule", r.severity, r.default, r.fixable, r.message, r.what, r.why, r.fix,
                 r.fix_safety, r, tuple((e.valid, e.source) for e in r.examples))
        )
    for c in MIGRATION:
        examples = ((False, c.example),) if c.example else ()
        if c.example_after:
            examples += ((True, c.example_after),)
        out.append(
            Code(c.code, c.name, "migration", c.severity, c.severity != "info", False, c.summary, c.summary, c.why,
                 c.fix, c.fix_safety, None, examples)
        )
    out.sort(key=lambda c: c.code)
    return tuple(out)


CODES: Tuple[Code, ...] = _load()
BY_CODE: Dict[str, Code] = {c.code: c for c in CODES}
BY_NAME: Dict[str, Code] = {c.name: c for c in CODES}


MIGRATION_FIX = "DDP001"  # the rule whose fix is the migration


class UnknownCode(ValueError):
    def __init__(self, code: str) -> None:
        self.code = code
        valid = ", ".join(c.code for c in CODES)
        super().__init__(f"unknown rule code {code!r}; valid codes: ALL, {valid} (or a prefix such as DDP0)")


def split_codes(values: Iterable[str]) -> List[str]:
    out: List[str] = []
    for v in values:
        out.extend(p.strip() for p in str(v).split(",") if p.strip())
    return out


def expand(selector: str) -> List[Code]:
    """Codes matched by one selector: ``ALL``, a code, a code prefix or a name."""
    s = selector.strip()
    if not s:
        return []
    if s.upper() == "ALL":
        return list(CODES)
    if s in BY_NAME:
        return [BY_NAME[s]]
    matched = [c for c in CODES if c.code.startswith(s.upper())]
    if not matched:
        raise UnknownCode(s)
    return matched


def select(
    select: Optional[Sequence[str]] = None,
    ignore: Optional[Sequence[str]] = None,
    extend_select: Optional[Sequence[str]] = None,
) -> List[str]:
    """The selected codes, in code order. Without ``select``, the default ones; ``ignore``
    wins over ``select`` unless a more specific selector re-enables a code (ruff's rule).
    Selecting DDP001 selects the migration's warnings and errors too (its fix is the
    migration); ``ignore`` removes them like any code."""
    chosen: Dict[str, int] = {}  # code -> specificity of the selector that decided it
    if select is None:
        chosen = {c.code: 0 for c in CODES if c.default}
    else:
        for s in split_codes(select):
            for c in expand(s):
                chosen[c.code] = len(s) if s.upper() != "ALL" else 0
    for s in split_codes(extend_select or ()):
        for c in expand(s):
            chosen[c.code] = max(chosen.get(c.code, 0), len(s))
    if MIGRATION_FIX in chosen:
        # DDP001's fix is the migration: what it reports by default comes with it (any
        # --ignore of those codes still wins)
        for c in CODES:
            if c.kind == "migration" and c.default:
                chosen.setdefault(c.code, 0)
    for s in split_codes(ignore or ()):
        spec = len(s) if s.upper() != "ALL" else 0
        for c in expand(s):
            if c.code in chosen and chosen[c.code] <= spec:
                del chosen[c.code]
    return [c.code for c in CODES if c.code in chosen]


# --------------------------------------------------------------------------- docs/rules.md


def _fence(source: str) -> List[str]:
    return ["```python", source.rstrip("\n"), "```", ""]


def render() -> str:
    """docs/rules.md."""
    out = [
        "# dp2ddp codes",
        "",
        "<!-- Generated from dp2ddp/registry.py by `make docs` (python -m dp2ddp.registry); do not edit by hand. -->",
        "",
        "Every code dp2ddp prints. `DDP0xx` are the lint rules of `dp2ddp check`; `DDP1xx` are what the "
        "migration (`dp2ddp rewrite`, and `dp2ddp check --fix` through DDP001) says: `info` notes of what it "
        "changed, `warning` for what it left for a human, `error` for why it left a file unchanged. Every code "
        "can be selected, ignored (`--select`, `--extend-select`, `--ignore`, `[tool.dp2ddp]`) and silenced "
        "with `# noqa: CODE` on its line. By default `check` selects the default rules and the migration's "
        "warnings and errors.",
        "",
        "## Lint rules",
        "",
        "| Code | Name | Default | Fix |",
        "| --- | --- | --- | --- |",
    ]
    rules = [c for c in CODES if c.kind == "rule"]
    migration = [c for c in CODES if c.kind == "migration"]
    for c in rules:
        out.append(
            f"| [{c.code}](#{c.code.lower()}-{c.name}) | {c.name} | {'yes' if c.default else 'no (opt-in)'} | "
            f"{'yes' if c.fixable else ''} |"
        )
    out += ["", "## Migration codes", "", "| Code | Name | Severity | Reported by `check` by default |", "| --- | --- | --- | --- |"]
    for c in migration:
        out.append(f"| [{c.code}](#{c.code.lower()}-{c.name}) | {c.name} | {c.severity} | {'yes' if c.default else 'no'} |")
    out.append("")
    for c in rules:
        r = c.rule
        out += [f"## {c.code}: {c.name}", ""]
        flags = []
        if not c.default:
            flags.append(f"Off by default; enable with `--select {c.code}`.")
        if c.severity == "info":
            flags.append("Informational.")
        if c.fixable:
            flags.append("Fix available with `--fix`.")
        if flags:
            out += ["*" + " ".join(flags) + "*", ""]
        out += [f"Message: {c.message.replace('{what}', '…').replace('{n}', '…')}", ""]
        out += ["### What it does", "", c.what, ""]
        out += ["### Why is this bad?", "", c.why, ""]
        out += ["### Example", ""] + _fence(r.invalid[0].source)
        out += ["Use instead:", ""] + _fence(r.valid[0].source)
        out += ["### How to fix", "", c.fix, ""]
        if c.fixable:
            out += ["### Fix safety", "", c.fix_safety, ""]
    for c in migration:
        out += [f"## {c.code}: {c.name}", "", f"*Migration {c.severity}.*", ""]
        out += ["### What it says", "", c.message[0].upper() + c.message[1:] + ".", ""]
        out += ["### Why", "", c.why, ""]
        if c.examples:
            for valid, source in c.examples:
                out += ["Migrated to:" if valid else "Example:", ""] + _fence(source)
        out += ["### Fix", "", c.fix, ""]
        out += ["### Fix safety", "", c.fix_safety, ""]
    return "\n".join(out).rstrip("\n") + "\n"


if __name__ == "__main__":  # pragma: no cover
    sys.stdout.write(render())
