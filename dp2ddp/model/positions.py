"""The module's source text: bytes decoded as Python does, lines as Python counts them,
and positions in characters (``ast`` columns are UTF-8 byte offsets; editors and LibCST
count characters), with the source segment of a node."""

from __future__ import annotations

import ast
import re
from functools import cached_property
from typing import List, Optional, Tuple

LINE_BREAK = re.compile(r"\r\n?|\n")  # Python's line ends (str.splitlines also splits at \x0c, \x85, \u2028 ...)


class Positions:
    """The part of :class:`~dp2ddp.model.core.SemanticModel` that reads its text (``text``,
    ``_lines``) by position."""

    @property
    def lines(self) -> List[str]:
        """The source lines as Python counts them: ``\\n``, ``\\r\\n`` and ``\\r`` end a line;
        form feeds, vertical tabs, ``\\x1c``-``\\x1e``, ``\\x85`` and ``\\u2028``/``\\u2029``
        (which :meth:`str.splitlines` also splits on) do not."""
        if self._lines is None:
            self._lines = LINE_BREAK.split(self.text)
        return self._lines

    def line_text(self, line: int) -> str:
        lines = self.lines
        return lines[line - 1] if 0 < line <= len(lines) else ""

    def char_col(self, line: int, byte_col: int) -> int:
        text = self.line_text(line)
        if text.isascii():
            return byte_col
        return len(text.encode("utf-8")[:byte_col].decode("utf-8", "replace"))

    def position(self, node: ast.AST) -> Tuple[int, int]:
        """``(line, column)``: 1-based line, 0-based column in characters."""
        line = getattr(node, "lineno", 1)
        return line, self.char_col(line, getattr(node, "col_offset", 0))

    def end_position(self, node: ast.AST) -> Tuple[int, int]:
        line = getattr(node, "end_lineno", None) or getattr(node, "lineno", 1)
        return line, self.char_col(line, getattr(node, "end_col_offset", 0) or 0)

    def source(self, node: ast.AST) -> str:
        """The source text of ``node`` (as written): what ``ast.get_source_segment`` gives,
        from the cached lines (it splits the whole text again on every call)."""
        seg = self._segment(node)
        return seg if seg is not None else ast.unparse(node)

    def brief(self, node: ast.AST, width: int = 60) -> str:
        """The source of ``node`` on one line (runs of white space made one space), cut to
        ``width`` characters with ``...``: how a message quotes an expression."""
        text = " ".join(self.source(node).split())
        return text if len(text) <= width else text[:width - 3] + "..."

    def _segment(self, node: ast.AST) -> Optional[str]:
        try:
            if node.end_lineno is None or node.end_col_offset is None:  # type: ignore[attr-defined]
                return None
            first, last = node.lineno, node.end_lineno  # type: ignore[attr-defined]
            col, end_col = node.col_offset, node.end_col_offset  # type: ignore[attr-defined]
        except AttributeError:
            return None
        starts = self._line_starts
        if last > len(starts):
            return None
        return self.text[starts[first - 1] + self.char_col(first, col) : starts[last - 1] + self.char_col(last, end_col)]

    @cached_property
    def _line_starts(self) -> List[int]:
        """Offset in the text of each line's first character (lines as Python counts them)."""
        return [0] + [mt.end() for mt in LINE_BREAK.finditer(self.text)]


def decode(data: bytes) -> str:
    """Bytes of a Python file to text, honouring a PEP 263 coding line and a BOM."""
    import io
    import tokenize

    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    text = data.decode(encoding)
    if text.startswith("\ufeff"):
        text = text[1:]
    return text
