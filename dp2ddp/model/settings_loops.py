"""Training loops over a list of settings, not over data.

:func:`settings_loops`: a training loop over constants, the script's options or imported
configuration (``for width_mult in sorted(FLAGS.width_mult_list)`` inside the batch loop),
whether its items are the same on every rank, and the training loop around it whose step
follows its passes.
"""

from __future__ import annotations

import ast
from typing import List, NamedTuple, Optional

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.phase_keys import keyed_feed
from dp2ddp.model.syntax import terminal
from dp2ddp.model.training import reaches_update, training_loops
from dp2ddp.model.training_feeds import NOT_DATA, fed_values, iterated


# ---------------------------------------------------------------------- loops over settings
# ``for width_mult in sorted(FLAGS.width_mult_list, reverse=True): model.apply(...);
# loss = ...; loss.backward()`` inside the batch loop (slimmable networks): a training loop
# over a list of numbers, not over data. Every rank runs every item, as the one process of
# the original did; the model may be set up differently for each (a BatchNorm per width),
# so a pass may leave parameters unused that the next one uses.


class SettingsLoop(NamedTuple):
    loop: ast.AST  # ``for width_mult in widths: ...`` (a training loop)
    value: ast.AST  # what it iterates
    same: bool  # its items are the same on every rank (built from constants, options, imports)
    unsure: Optional[ast.AST]  # where not: the value dp2ddp cannot show the same (``random.uniform(...)``)
    within: Optional[ast.AST]  # the training loop around it, when it runs several backward passes per step of that loop


def settings_loops(m: SemanticModel) -> List[SettingsLoop]:
    """Training loops over values that are not data: not a loader, a range or a counter, but
    a list of settings (numbers, names) built from constants, the script's options and
    imported configuration, with nothing else put in it — also where one of those cannot be
    shown the same on every rank (``unsure``: a random draw appended), which a migration must
    refuse. A loop over the keys of a dict of loaders (a phase loop) is not one of them."""
    got = m.cache.get("training:settings")
    if got is not None:
        return got  # type: ignore[return-value]
    from dp2ddp.model.flow import key_loop, origins
    from dp2ddp.model.stores import container_mutations
    from dp2ddp.model.handles import expr_handle
    from dp2ddp.model.names import DATALOADER
    from dp2ddp.model.rank_alike import same_on_every_rank

    keyed = {id(kl.loop) for v, lp in fed_values(m) if (g := keyed_feed(m, v, lp)) is not None for kl in [g[1]]}
    out: List[SettingsLoop] = []
    for loop in training_loops(m):
        if not isinstance(loop, (ast.For, ast.AsyncFor)) or id(loop) in keyed:
            continue
        values = list(iterated(loop.iter))
        if len(values) != 1 or (isinstance(values[0], ast.Call) and terminal(values[0].func) in NOT_DATA):
            continue
        value = values[0]
        kl = key_loop(m, loop)
        if kl is not None and kl.container is not None:
            continue  # the keys or items of a dict
        found = origins(m, value)
        if any((isinstance(n, ast.Call) and m.call_is(n, DATALOADER)) or isinstance(n, ast.DictComp) for n, _ in found):
            continue  # loaders
        unsure = None
        pieces = [value] + [n for n, p in found if not p]
        for piece in pieces:
            h = expr_handle(m, piece) if isinstance(piece, (ast.Name, ast.Attribute)) else None
            added = container_mutations(m).get(h, []) if h is not None else []
            for x in [piece] + list(added):
                if x is piece and isinstance(piece, ast.Name) and added:
                    continue  # a list built by appends: judged by what is appended
                if not _same_settings(m, x, same_on_every_rank):
                    unsure = x
                    break
            if unsure is not None:
                break
        if not _settings_shaped(m, found):
            continue
        out.append(SettingsLoop(loop, value, unsure is None, unsure, _passes_within(m, loop)))
    m.cache["training:settings"] = out
    return out


def _same_settings(m: SemanticModel, x: ast.AST, same, depth: int = 0) -> bool:
    """``x`` is the same on every rank; a list built from such lists (``[a, b] + rest``)."""
    if isinstance(x, ast.BinOp) and isinstance(x.op, ast.Add):
        return _same_settings(m, x.left, same, depth) and _same_settings(m, x.right, same, depth)
    if isinstance(x, ast.Name) and depth < 3:
        from dp2ddp.model.flow import origins

        found = origins(m, x)
        if found and all(not p and n is not x for n, p in found):
            return all(_same_settings(m, n, same, depth + 1) for n, _ in found)
    return same(m, x)


def _settings_shaped(m: SemanticModel, found) -> bool:
    """What a loop iterates looks like settings, not batches: a list literal, an attribute of
    an options or configuration object, a sum of such lists (``[lo, hi] + drawn``)."""
    for n, p in found:
        if p:
            return False
        if not _shaped(n):
            return False
    return bool(found)


def _shaped(n: ast.AST) -> bool:
    """A list literal (of anything but calls), an attribute, or a sum of such lists and names."""
    if isinstance(n, (ast.List, ast.Tuple, ast.Set)):
        return not any(isinstance(x, ast.Call) or isinstance(x, ast.Starred) for x in n.elts)
    if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add):
        return all(isinstance(x, ast.Name) or _shaped(x) for x in (n.left, n.right))
    if isinstance(n, ast.Call) and terminal(n.func) in ("list", "tuple", "sorted") and len(n.args) == 1:
        return isinstance(n.args[0], (ast.Name, ast.Attribute))  # ``list(WIDTHS)``
    return isinstance(n, ast.Attribute)


def _passes_within(m: SemanticModel, loop: ast.AST) -> Optional[ast.AST]:
    """The training loop around ``loop`` whose optimizer step follows it: ``loop`` runs
    several forward and backward passes per step."""
    if reaches_update(m, loop):
        return None
    for outer in m.enclosing_loops(loop):
        if outer is loop:
            continue
        if outer in training_loops(m):
            return outer
        break
    return None
