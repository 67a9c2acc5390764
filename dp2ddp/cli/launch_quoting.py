"""The Jinja environment `dp2ddp template` renders launch files in, and its quoting filters.

Nothing the user passes reaches the output unquoted: the environment's ``finalize`` hook
refuses any value that did not go through one of the quoting filters below, so a template
that forgets a filter fails loudly instead of producing an injectable script.

* ``sh``     -- one shell word (``shlex.quote``);
* ``yq``     -- a YAML double-quoted scalar with every non-printable-ASCII character escaped;
* ``k8s``    -- doubles ``$`` so Kubernetes does not expand ``$(VAR)`` in command/args/env;
* ``token``  -- re-checks a value that was validated as a plain token (for ``#SBATCH``
  lines, which bash treats as comments and sbatch parses itself, so quoting cannot help).

Never imports torch.
"""

from __future__ import annotations

import re
import shlex


_TOKEN = re.compile(r"^[A-Za-z0-9_.,:+%=@/-]+$")


class Quoted(str):
    """A string that went through a quoting filter and may be written out as is."""


def sh_quote(value: object) -> Quoted:
    return Quoted(shlex.quote(str(value)))


def yaml_quote(value: object) -> Quoted:
    """A YAML double-quoted scalar. Only printable ASCII stays literal; everything else
    (newlines, tabs, control and non-ASCII characters) becomes an escape sequence."""
    out = ['"']
    for ch in str(value):
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif 0x20 <= o <= 0x7E:
            out.append(ch)
        elif o <= 0xFF:
            out.append(f"\\x{o:02x}")
        elif o <= 0xFFFF:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    out.append('"')
    return Quoted("".join(out))


def k8s_escape(value: object) -> str:
    """Kubernetes expands ``$(VAR)`` in container command, args and env values; ``$$`` is
    its escape for a literal ``$``."""
    return str(value).replace("$", "$$")


def token(value: object) -> Quoted:
    s = str(value)
    if not _TOKEN.match(s):  # validation upstream should make this unreachable
        raise ValueError(f"refusing to render {s!r} unquoted")
    return Quoted(s)


def _finalize(value: object) -> object:
    if isinstance(value, Quoted) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if value is None or value == "":
        return ""
    raise ValueError(f"template bug: value {value!r} rendered without a quoting filter")


def environment():
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("dp2ddp", "templates/launch"),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # shell and YAML, not HTML: quoting is done by the filters
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_finalize,
    )
    env.filters.update(sh=sh_quote, yq=yaml_quote, k8s=k8s_escape, token=token)
    return env
