"""``[tool.dp2ddp]`` configuration of `dp2ddp check`, found in the nearest pyproject.toml.

    [tool.dp2ddp]
    select = ["DDP"]            # codes, prefixes, names or "ALL" (default: the default rules
                                # and the migration's warnings and errors)
    extend-select = ["DDP013"]  # added to the selection
    ignore = ["DDP005"]
    exclude = ["legacy/*", "third_party"]
    new-only = false            # like --new-only
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import List, Optional

KEYS = {"select", "extend-select", "ignore", "exclude", "new-only"}


class ConfigError(Exception):
    pass


@dataclass
class Config:
    path: Optional[str] = None  # the pyproject.toml it came from
    select: Optional[List[str]] = None
    extend_select: List[str] = field(default_factory=list)
    ignore: List[str] = field(default_factory=list)
    exclude: List[str] = field(default_factory=list)
    new_only: bool = False

    @property
    def root(self) -> str:
        return os.path.dirname(self.path) if self.path else os.getcwd()


def _load_toml(path: str) -> dict:
    try:
        import tomllib  # Python >= 3.11
    except ImportError:  # pragma: no cover - Python < 3.11
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            raise ConfigError(f"{path}: reading pyproject.toml needs Python >= 3.11 or the 'tomli' package") from None
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror}") from None


def find_config(start: str) -> Optional[str]:
    """The nearest pyproject.toml with a [tool.dp2ddp] table, walking up from ``start``."""
    cur = os.path.abspath(start)
    if not os.path.isdir(cur):
        cur = os.path.dirname(cur)
    while True:
        candidate = os.path.join(cur, "pyproject.toml")
        if os.path.isfile(candidate):
            try:
                with open(candidate, "rb") as fh:
                    if b"tool.dp2ddp" in fh.read():
                        return candidate
            except OSError:
                pass
        parent = os.path.dirname(cur)
        if parent == cur:
            return None
        cur = parent


def load_config(path: Optional[str]) -> Config:
    if path is None:
        return Config()
    table = _load_toml(path).get("tool", {}).get("dp2ddp")
    if table is None:
        return Config(path=path)
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.dp2ddp] must be a table")
    unknown = sorted(set(table) - KEYS)
    if unknown:
        raise ConfigError(f"{path}: [tool.dp2ddp]: unknown option {unknown[0]!r}; valid options: {', '.join(sorted(KEYS))}")

    def str_list(key: str) -> Optional[List[str]]:
        v = table.get(key)
        if v is None:
            return None
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise ConfigError(f"{path}: [tool.dp2ddp] {key} must be a list of strings")
        return v

    new_only = table.get("new-only", False)
    if not isinstance(new_only, bool):
        raise ConfigError(f"{path}: [tool.dp2ddp] new-only must be true or false")
    cfg = Config(
        path=path,
        select=str_list("select"),
        extend_select=str_list("extend-select") or [],
        ignore=str_list("ignore") or [],
        exclude=str_list("exclude") or [],
        new_only=new_only,
    )
    from dp2ddp.registry import UnknownCode, expand, split_codes

    for key, values in (("select", cfg.select or []), ("extend-select", cfg.extend_select), ("ignore", cfg.ignore)):
        for v in split_codes(values):
            try:
                expand(v)
            except UnknownCode as e:
                raise ConfigError(f"{path}: [tool.dp2ddp] {key}: {e}") from None
    return cfg
