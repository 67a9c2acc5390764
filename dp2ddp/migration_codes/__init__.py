"""Every code the migration prints (DDP1xx), documented once: one module a family
(:mod:`.wraps`, :mod:`.data`, :mod:`.rank_zero`, :mod:`.training`), joined here.

Lint rules (DDP0xx) document themselves in :mod:`dp2ddp.rules`; :mod:`dp2ddp.registry`
joins both into the one registry that `check --select`, ``# noqa``, the docs
(``docs/rules.md``) and the tests read. Severity: ``info`` says what the migration
changed; ``warning`` says what it left for a human (exit code 1); ``error`` says why the
file was left unchanged as a whole (exit code 1). Plain data: `check` reads it without
importing the transforms (:mod:`dp2ddp.codemods`) or LibCST.
"""

from __future__ import annotations

from typing import Dict, Tuple

from dp2ddp.migration_codes import data, rank_zero, training, wraps
from dp2ddp.migration_codes.code import MigrationCode

CODES: Tuple[MigrationCode, ...] = wraps.CODES + data.CODES + rank_zero.CODES + training.CODES

BY_CODE: Dict[str, MigrationCode] = {c.code: c for c in CODES}
