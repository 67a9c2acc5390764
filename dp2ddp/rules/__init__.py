"""The lint rules of `dp2ddp check`.

Every module of this package other than :mod:`~dp2ddp.rules.base` is one rule: it is
named for its code (``ddp004_unguarded_save``) and defines ``RULE = Rule(...)``
(:class:`~dp2ddp.rules.base.Rule`: code, name, message, docs, examples, gate, detection).
Rules are found by discovery — adding a rule is adding its module — and a module here
that defines no ``RULE`` is an error, never silently skipped. :mod:`dp2ddp.registry`
joins the rules with the migration's codes (DDP1xx) into the one registry of every code
the tool prints. How to add one: ``docs/adding-a-rule.md``.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import List

from dp2ddp.rules.base import Rule

NOT_RULES = frozenset({"base"})  # the modules here that are not rules


class RuleModuleError(ImportError):
    pass


def discover() -> List[Rule]:
    """The ``RULE`` of every rule module of this package, in code order."""
    rules: List[Rule] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name in NOT_RULES:
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        rule = getattr(module, "RULE", None)
        if not isinstance(rule, Rule):
            raise RuleModuleError(f"{module.__file__}: a module of dp2ddp/rules/ is a rule and must define RULE = Rule(...)")
        if not info.name.startswith(rule.code.lower() + "_"):
            raise RuleModuleError(f"{module.__file__}: the module of {rule.code} is named {rule.code.lower()}_<what>.py")
        rules.append(rule)
    rules.sort(key=lambda r: r.code)
    return rules


RULES: List[Rule] = discover()

__all__ = ["RULES", "Rule", "discover"]
