"""Signature binding for LibCST nodes: which expression of a call each parameter of a
``def`` receives, as Python would bind them (``inspect.Signature.bind`` on source, not on
values)."""

from __future__ import annotations

from typing import Dict, List

import libcst as cst


class BindError(TypeError):
    """The call does not bind to the function statically: it would raise ``TypeError``
    (too many arguments, a missing one, a repeated or unknown keyword), or it passes
    ``*xs``/``**kw`` whose length and keys the source does not tell."""


def bind(call: cst.Call, function: cst.FunctionDef, *, method: bool = False) -> Dict[str, cst.BaseExpression]:
    """Every parameter of ``function`` to the expression ``call`` passes for it, in the
    order of the parameters: positional and keyword arguments, else the parameter's
    default; ``*args`` to a :class:`libcst.Tuple` of the extra positional expressions and
    ``**kwargs`` to a :class:`libcst.Dict` of the extra keywords (string keys), empty when
    none. ``method``: the call is ``obj.name(...)`` or ``Class(...)`` and the first
    parameter (``self``) is bound by the object, not by the call; it is left out.

    Raises :class:`BindError` where Python would raise ``TypeError`` or where the call
    unpacks ``*``/``**`` arguments."""
    p = function.params
    fname = function.name.value
    positional: List[cst.Param] = list(p.posonly_params) + list(p.params)
    posonly = {param.name.value for param in p.posonly_params}
    if method:
        if not positional:
            raise BindError(f"{fname}() has no parameter for the object")
        positional = positional[1:]
    star = p.star_arg if isinstance(p.star_arg, cst.Param) else None
    by_keyword = {q.name.value: q for q in positional + list(p.kwonly_params) if q.name.value not in posonly}

    bound: Dict[str, cst.BaseExpression] = {}
    extra_positional: List[cst.BaseExpression] = []
    extra_keywords: Dict[str, cst.BaseExpression] = {}
    n_positional = 0
    for arg in call.args:
        if arg.star:
            raise BindError(f"{arg.star}-unpacked argument: its length or keys are not known statically")
        if arg.keyword is None:
            if n_positional < len(positional):
                bound[positional[n_positional].name.value] = arg.value
            elif star is not None:
                extra_positional.append(arg.value)
            else:
                raise BindError(f"{fname}() takes {len(positional)} positional arguments but more were given")
            n_positional += 1
            continue
        name = arg.keyword.value
        into = bound if name in by_keyword else extra_keywords if p.star_kwarg is not None else None
        if into is None:
            raise BindError(f"{fname}() got an unexpected keyword argument {name!r}")
        if name in into:
            raise BindError(f"{fname}() got multiple values for argument {name!r}")
        into[name] = arg.value

    out: Dict[str, cst.BaseExpression] = {}
    for param in positional + ([star] if star is not None else []) + list(p.kwonly_params):
        name = param.name.value
        if param is star:
            out[name] = cst.Tuple([cst.Element(e) for e in extra_positional])
        elif name in bound:
            out[name] = bound[name]
        elif param.default is not None:
            out[name] = param.default
        else:
            raise BindError(f"{fname}() missing required argument {name!r}")
    if p.star_kwarg is not None:
        out[p.star_kwarg.name.value] = cst.Dict([cst.DictElement(cst.SimpleString(repr(k)), v) for k, v in extra_keywords.items()])
    return out
