"""TensorBoard, wandb, tqdm, log files and result files act on rank 0 only.

Each is restricted in the way that keeps every other rank's calls harmless:

* ``SummaryWriter(...)`` is created on rank 0 only (``None`` elsewhere) and every use of
  it — followed through ``self.writer``, return values and parameters — is a statement
  that :mod:`rank_zero` puts under ``if dist.get_rank() == 0:``. When some use is not
  such a statement (the writer kept in a dict, handed on as a value, used by a subclass in
  another module), the other ranks get a stand-in whose ``add_*``/``flush``/``close`` do
  nothing instead of ``None`` (DDP173); a writer-like object of the project's is refused.
* ``wandb.init(...)`` gets ``mode="disabled"`` on other ranks: their ``wandb.log`` calls
  do nothing.
* ``tqdm(...)`` gets ``disable=dist.get_rank() != 0`` (or'ed with the script's own).
* ``logging.FileHandler(path)`` and ``logging.basicConfig(filename=path)`` write to
  ``os.devnull`` on other ranks; so do files opened for writing (``open(path, "w")``),
  so that ``json.dump(results, f)`` and ``f.write(...)`` work everywhere and only rank 0
  writes the file.
"""

from __future__ import annotations

import ast
from typing import List, Optional

import libcst as cst

from dp2ddp.codemods.context import Context, add_kwarg
from dp2ddp.codemods.rank_zero_setup import in_a_choosing_expression, propose as setup_on_rank_zero
from dp2ddp.codemods.facts import GuardedWriters
from dp2ddp.codemods.write_barriers import barriers
from dp2ddp.codemods.writer_guards import guarded_writers
from dp2ddp.engine import Finding, Guard, InsertAfter, InsertBefore, Replace
from dp2ddp.model.checkpoints import helper_whole_saves
from dp2ddp.model.collectives import var_key
from dp2ddp.model.dp_idioms import dp_helper_calls
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.names import SUMMARY_WRITERS
from dp2ddp.model.passes import same_passes
from dp2ddp.model.ranks import mentions_rank, rank_guarded
from dp2ddp.model.call_args import SUMMARY_WRITER_PARAMS, argument
from dp2ddp.model.syntax import kwarg
from dp2ddp.model.uses import dp_wrapper_keys
from dp2ddp.model.companion_writes import companion_folder_races, companion_writes
from dp2ddp.model.log_helpers import LoggerMaker, logger_makers, logging_setups, stdout_tees
from dp2ddp.model.writers import Writer, h5_write_opens, open_modes, writers
from dp2ddp.model.writing_classes import training_class_saves
from dp2ddp.model.writers_setup import handed_models, joins_the_others, reads_the_wrapper, runs_a_handed_model, setup_calls


PROVIDES = (GuardedWriters,)


def propose(ctx: Context) -> List[Finding]:
    m = ctx.m
    out: List[Finding] = []
    early = (lambda node: not ctx.in_setup_region(node)) if ctx.mode == "plain" else None
    guarded = guarded_writers(m, getattr(ctx.options, "shared_attrs", frozenset()), early)
    ctx.provide(guarded)
    bad = {id(w): why for w, why in guarded.bad}
    listed = {id(w.call) for w in writers(m)}
    for node, where in h5_write_opens(m):
        if not rank_guarded(m, node):
            out.append(ctx.block(node, "DDP110", f"`{m.source(node)[:60]}` opens an HDF5 file to write ({where}: a mode other "
                                 "than 'r') on every rank: HDF5 locks a file opened to write, and a rank opening it while "
                                 "another holds it fails (BlockingIOError: unable to lock file), at random; open it "
                                 "read-only ('r') where it only reads, then migrate"))
    for w, why in guarded.bad:
        if id(w.call) not in listed and not rank_guarded(m, w.call):  # a writer-like object of the project's
            out.append(ctx.block(w.call, "DDP110", f"`{m.source(w.call.func)}` writes files on every rank and cannot be made "
                                 f"on rank 0 alone: {why}; make it on rank 0 only (and test for it where it is used), then migrate"))
    for made in guarded.made:
        if not rank_guarded(m, made):
            early = ctx.mode == "plain" and not ctx.in_setup_region(made)
            out.append(_restrict(ctx, Writer("tensorboard", made), None, early))  # type: ignore[arg-type]
    for w in writers(m):
        if w.kind not in ("tensorboard", "wandb", "tqdm", "logfile", "open"):
            continue
        if rank_guarded(m, w.call):
            continue
        early = ctx.mode == "plain" and not ctx.in_setup_region(w.call)
        if early and w.kind == "open":
            continue
        f = _restrict(ctx, w, bad.get(id(w)), early)
        if f is not None:
            out.append(f)
            if w.kind == "open" and f.severity != "error" and not early and _every_rank_runs(m, w.call):
                # written on rank 0 only (os.devnull elsewhere): a barrier before the same function reads it back
                stmt = m.statement_of(w.call)
                if stmt is not None:
                    out.extend(barriers(ctx, [(stmt, stmt)], local=True))
    setups = set()
    for sc in setup_calls(m):
        if not rank_guarded(m, sc.call) and not ctx.migrated_with(sc.module):
            out.append(setup_on_rank_zero(ctx, sc))
            setups.add(id(sc.call))
    firsts = set()
    logs = {id(call) for call, _ in logging_setups(m)}  # run on rank 0 alone, below: their folders too
    for race in companion_folder_races(m):
        if id(race.call) in logs:
            continue
        if not rank_guarded(m, race.call) and not ctx.migrated_with(race.module) and id(race.call) not in setups:
            first = _rank_zero_first(ctx, race)
            out.append(first)
            if first.severity != "error":
                firsts.add(id(race.call))  # rank 0 runs it first already: its writes further down too
    for t in training_class_saves(m):
        if not rank_guarded(m, t.call) and ctx.migrated_with(t.module) and t.leaves_early is not None:
            out.append(ctx.block(t.call, "DDP110", f"{t.name} trains ({t.trains}) and its epoch loop ends early ({t.leaves_early}) "
                                 "on a test of values dp2ddp cannot show are alike on every rank (early stopping on the epoch's "
                                 "results: a training metric is each rank's own under DDP): one rank would stop while the others "
                                 "wait in the next epoch's collectives; decide on rank 0 and broadcast the decision (or stop on a "
                                 "metric every rank computes on the same data), then migrate"))
        if not rank_guarded(m, t.call) and not ctx.migrated_with(t.module):
            out.append(ctx.block(t.call, "DDP110", f"{t.name} trains ({t.trains}) and saves a file with no rank test "
                                 f"({t.where}), in a module this migration does not edit: every rank must train, so every "
                                 "rank would write the same file at once; put that save under `if dist.get_rank() == 0:` "
                                 "(or split it out of the training class), then migrate"))
    for w in companion_writes(m):
        # (a write in a module migrated with this script is that module's migration's: SRFBN's
        # create_solver() -> SRSolver's network_summary.txt, opened on rank 0 only there)
        if (not rank_guarded(m, w.call) and not ctx.migrated_with(w.module) and not ctx.migrated_with(w.written_in)
                and id(w.call) not in setups):
            out.extend(_companion_write(ctx, w, id(w.call) in firsts))
    for lm in logger_makers(m):
        if not rank_guarded(m, lm.stmt) and ctx.bridge.alone_on_line(lm.stmt):
            out.append(_logger_on_rank_zero(ctx, lm))
    for stmt, name, where in stdout_tees(m):
        if not rank_guarded(m, stmt) and ctx.bridge.alone_on_line(stmt):
            out.append(_tee_on_rank_zero(ctx, stmt, name, where))
    for call, where in logging_setups(m):
        stmt = m.statement_of(call)
        if rank_guarded(m, call) or stmt is None or not ctx.bridge.alone_on_line(stmt) or id(call) in setups:
            continue
        if ctx.mode == "plain" and not ctx.in_setup_region(stmt):
            continue  # before the process group: the script's own distributed path decides
        out.append(ctx.note(call, "DDP135", (
            f"`{m.source(call.func)}(...)` configures logging to a file ({where}) and does nothing else: it runs on rank 0 "
            "only (on every rank it would pick the same log file and write it at once); the other ranks' logging goes "
            "nowhere, as their printing does"), [Guard((ctx.bridge.statement(stmt),), ctx.expr(ctx.rank0()))]))
    out.extend(_graphs_of_the_bare_module(ctx))
    out.extend(_clock_named_reads(ctx))
    return out


def _clock_named_reads(ctx: Context) -> List[Finding]:
    """A file written on rank 0 under a name from the clock that every rank reads again after
    the write (:mod:`dp2ddp.model.clock_paths`): the name becomes rank 0's on every rank
    (``rank_zero_value(...)``, one broadcast where it is bound, which every rank passes
    alike; else DDP110), and the barrier after rank 0's write
    (:func:`dp2ddp.codemods.write_barriers.barriers`, which counts that read) makes every
    rank wait for the file."""
    from dp2ddp.model.clock_paths import clock_named_reads

    m = ctx.m
    out: List[Finding] = []
    done: set = set()
    for c in clock_named_reads(m):
        if rank_guarded(m, c.read):
            continue
        bindings = m.bindings_of(c.name)
        bound = bindings[0] if len(bindings) == 1 and bindings[0].kind == "assign" else None
        bind_stmt = m.statement_of(bound.node) if bound is not None else None
        func = m.enclosing_function(c.write)
        if (bind_stmt is None or not isinstance(bind_stmt, ast.Assign) or len(bind_stmt.targets) != 1
                or m.enclosing_function(bind_stmt) is not func or not ctx.bridge.alone_on_line(bind_stmt)
                or not same_passes(m, bind_stmt)):
            out.append(ctx.block(c.write, "DDP110", (
                f"the file is written under `{c.name.id}`, named from the clock (`{' '.join(m.source(c.clock).split())[:40]}`, "
                f"line {c.clock.lineno}), and line {c.read.lineno} reads `{c.name.id}` after the write on every rank: rank 0 "
                "alone writes the file, but each rank names it by its own clock, so another rank may look for a file nobody "
                "wrote; let rank 0 choose the name and send it to the others (dist.broadcast_object_list), then migrate")))
            continue
        if id(bind_stmt) in done:
            continue
        done.add(id(bind_stmt))
        helper = ctx.rank_zero_value()
        edits = [Replace(ctx.cst(bind_stmt.value), lambda u, h=helper: ctx.expr(f"{h}({{v}})", v=u))]
        out.append(ctx.note(c.write, "DDP132", (
            f"`{c.name.id}` is named from the clock (line {c.clock.lineno}) and read again on every rank (line "
            f"{c.read.lineno}): every rank takes rank 0's name ({helper}); the barrier after rank 0's write makes them "
            "wait for the file"), edits))
    return out


def _graphs_of_the_bare_module(ctx: Context) -> List[Finding]:
    """``writer.add_graph(model, x)`` traces a forward of what it is handed. The writer is
    rank 0's: handed the DDP wrapper, that forward's buffer broadcast would wait for the other
    ranks (and DDP does not trace). It is handed the bare module, ``model.module``."""
    from dp2ddp.model.flow import origins

    m = ctx.m
    made = {id(w.call) for w in writers(m) if w.kind == "tensorboard"}
    keys = dp_wrapper_keys(m) if made else set()
    out = []
    for use in m.calls_spelled("add_graph") if made else ():
        f, model = use.func, next(iter(use.args), None)
        if not (isinstance(f, ast.Attribute) and isinstance(f.value, (ast.Name, ast.Attribute))
                and any(id(node) in made for node, _ in origins(m, f.value))):
            continue  # not a SummaryWriter's
        if isinstance(model, (ast.Name, ast.Attribute)) and var_key(m, model) in keys:
            fed = ctx.fed_like_the_wrapper()
            out.append(ctx.note(use, "DDP135", f"`{m.source(f)}` traces a forward of what it is handed: on rank 0 "
                                f"alone it gets the bare module (`{m.source(model)}.module`), as a DDP forward would "
                                "wait for the other ranks", [Replace(ctx.cst(model), lambda u: ctx.expr(fed + "({a}.module)", a=u))]))
    return out


def _used_as_a_logger(m: SemanticModel, lm: LoggerMaker) -> bool:
    """Every use of the name the maker's result is bound to reads something a
    ``logging.Logger`` has (``logger.info``, ``logging.info`` where the helper returns the
    logging module, Face_Pytorch's ``init_log``): a disabled Logger can stand in for it on
    the other ranks. A use as anything else (``logging.getLogger(...)``, handed on) cannot."""
    import logging

    target = lm.stmt.targets[0]
    for name in m.nodes(ast.Name):
        if name.id != lm.name or not isinstance(name.ctx, ast.Load):
            continue
        if not any(b.target is target or b.node is lm.stmt for b in m.bindings_of(name)):
            continue
        up = m.parent(name)
        if not (isinstance(up, ast.Attribute) and up.value is name and hasattr(logging.Logger, up.attr)):
            return False
    return True


def _tee_on_rank_zero(ctx: Context, stmt: ast.Assign, name: str, where: str) -> Finding:
    """``sys.stdout = Logger(path)``: made on rank 0 only; on the other ranks the stream stays
    the console (their prints, like those of helpers the migration does not edit, go there)."""
    early = ctx.mode == "plain" and not ctx.in_setup_region(stmt)
    rank0 = ctx.env_rank0() if early else ctx.rank0()
    stream = ctx.m.source(stmt.targets[0])
    return ctx.note(stmt, "DDP135", (
        f"`{stream} = {name}(...)` copies what is printed into a file ({where}): made on rank 0 only, so the file is "
        f"opened once and holds rank 0's lines; on the other ranks `{stream}` stays the console"),
        [Replace(ctx.cst(stmt.value), lambda u: ctx.expr(f"{{c}} if {_paren_text(rank0)} else {stream}", c=u))])


def _logger_on_rank_zero(ctx: Context, lm: LoggerMaker) -> Finding:
    """``logger = utils.get_logger(path)``, a logger with a file handler a project function
    made: disabled on the other ranks, as their prints are (every line once in the file).
    A helper that takes the process's rank and adds no handler on the other ranks
    (``setup_logger(name, out, 0)``) is handed the rank instead."""
    early = ctx.mode == "plain" and not ctx.in_setup_region(lm.stmt)
    if lm.rank_arg is not None and isinstance(lm.rank_arg, ast.Constant) and lm.rank_arg.value == 0:
        rank = f'int({ctx.name("os")}.environ.get("RANK", 0))' if early else ctx.rank()
        return ctx.note(lm.rank_arg, "DDP135", (
            f"`{lm.name}`'s helper takes the process's rank and adds its file handler ({lm.where}) on rank 0 only: it is "
            f"handed this process's rank (`{rank}`) instead of 0, so rank 0 alone writes the log"),
            [Replace(ctx.cst(lm.rank_arg), ctx.expr(rank))])
    if lm.rank_arg is not None and _reads_the_rank(ctx.m, lm.rank_arg):
        return ctx.note(lm.rank_arg, "DDP135", (
            f"`{lm.name}`'s helper adds its file handler ({lm.where}) only where its rank parameter is 0, and this call "
            f"hands it `{ctx.m.source(lm.rank_arg)}`, torchrun's rank: rank 0 alone writes the log, as it is"), [])
    if lm.rank_arg is not None and not isinstance(lm.rank_arg, ast.Constant):
        return ctx.block(lm.stmt, "DDP110", f"`{lm.name}`'s helper adds its file handler ({lm.where}) only where its rank "
                         f"parameter is 0, and this call hands it `{ctx.m.source(lm.rank_arg)}`, which dp2ddp cannot tell is "
                         "the process's rank under torchrun; pass `dist.get_rank()`, then migrate")
    other = ctx.env_not_rank0() if early else ctx.not_rank0()
    stmt = ctx.stmt(f"if {other}:\n    {lm.name}.disabled = True\n")
    if lm.alone and (not lm.module or _used_as_a_logger(ctx.m, lm)):
        # what the helper runs only sets up logging: rank 0 alone makes the logger, so no other
        # rank opens (or empties, or names by its own clock) a file in a folder rank 0 may not
        # have made yet (pytorch-semseg's get_logger(logdir), logdir made by rank 0's writer)
        rank0 = ctx.env_rank0() if early else ctx.rank0()
        quiet = f'{ctx.name("logging")}.getLogger("dp2ddp.other_ranks")'
        return ctx.note(lm.stmt, "DDP135", (
            f"`{lm.name}` logs to a file ({lm.where}) and the console: its helper runs on rank 0 only, and the other ranks "
            "get a disabled logger, so each line is written once and no other rank opens the file"),
            [Replace(ctx.cst(lm.stmt.value), lambda u: ctx.expr(f"{{c}} if {_paren_text(rank0)} else {quiet}", c=u)),
             InsertAfter(ctx.bridge.statement(lm.stmt), (stmt,))])
    if lm.module:
        return ctx.block(lm.stmt, "DDP110", f"`{lm.name}` is the logging module, set up to log to a file ({lm.where}) by a "
                         "helper that every rank would run (each opening the file), and the script uses it as more than a "
                         "logger, so a disabled logger cannot stand in for it on the other ranks; call the helper on rank 0 "
                         "only, then migrate")
    if lm.truncates:
        return ctx.block(lm.stmt, "DDP110", f"`{lm.name}` logs to a file its handler opens with mode 'w' when it is made "
                         f"({lm.where}): on every rank that makes it, the other ranks would empty what rank 0 has "
                         "written; open it in append mode (or with delay=True), then migrate")
    return ctx.note(lm.stmt, "DDP135", f"`{lm.name}` logs to a file ({lm.where}) and the console: it logs on rank 0 only "
                    "(disabled on the other ranks), so each line is written once", [InsertAfter(ctx.bridge.statement(lm.stmt), (stmt,))])


def _reads_the_rank(m, expr: ast.AST) -> bool:
    """``dist.get_rank()``, ``int(os.environ["RANK"])``, ``int(os.environ.get("RANK", 0))``:
    the process's global rank under torchrun."""
    from dp2ddp.model.names import GET_RANK
    from dp2ddp.model.ranks import env_read

    return env_read(m, expr, "RANK") or any(isinstance(n, ast.Call) and m.is_name(n.func, GET_RANK) for n in ast.walk(expr))


def _rank_zero_first(ctx: Context, race) -> Finding:
    """``saver = Saver(args)`` whose ``__init__`` makes a folder without ``exist_ok``: rank 0
    runs it first, the other ranks after a barrier (then the folder exists), each rank
    passing exactly one barrier. One that also deletes files (``rmtree`` then ``makedirs``)
    would delete rank 0's: refused."""
    m = ctx.m
    stmt = m.statement_of(race.call)
    if race.deletes is not None:
        return ctx.block(race.call, "DDP110", f"{race.name} removes or moves folders and creates them ({race.deletes}, {race.where}) "
                         "on every rank: the other ranks would delete or move away what rank 0 wrote; make it run on rank 0 "
                         "only, then migrate")
    if race.lists is not None:
        return ctx.block(race.call, "DDP110", f"{race.name} picks the folder it creates from what already exists ({race.lists}, "
                         f"{race.where}): every rank would pick and create its own; let rank 0 choose the folder and pass it "
                         "to the others, then migrate")
    together = joins_the_others(m, race.call)
    if together is not None:
        return ctx.block(race.call, "DDP110", f"{race.name} creates a folder without exist_ok ({race.where}) on every rank, and "
                         f"rank 0 cannot run it first while the others wait: {together}; create the folder on rank 0 "
                         "yourself (or with exist_ok=True), then migrate")
    if not race.checked:
        return ctx.block(race.call, "DDP110", f"{race.name} creates a folder without exist_ok and without checking that it is "
                         f"missing ({race.where}): every rank after the first would raise FileExistsError, in whatever order "
                         "they run; create it with exist_ok=True (or on rank 0 only), then migrate")
    if stmt is None or not ctx.bridge.alone_on_line(stmt):
        return ctx.block(race.call, "DDP110", f"{race.name} creates a folder without exist_ok ({race.where}) on every rank, in a "
                         "statement dp2ddp cannot order between the ranks: create it on rank 0 first, then migrate")
    if not same_passes(m, stmt):
        return ctx.block(race.call, "DDP110", f"{race.name} creates a folder without exist_ok ({race.where}) on every rank, under a "
                         "loop or a test that dp2ddp cannot show takes the same passes on every rank (so barriers around it "
                         "would not pair up): create it on rank 0 first, then migrate")
    line = ctx.bridge.statement(stmt)
    before = ctx.barrier("others", comment=f"rank 0 creates {race.name}'s folders first")
    after = ctx.barrier("rank0")
    return ctx.note(race.call, "DDP132", f"{race.name} runs on rank 0 first, then on the other ranks ({race.where} creates a "
                    "folder without exist_ok: no race)", [InsertBefore(line, (before,)), InsertAfter(line, (after,))])


def _companion_write(ctx: Context, w, first: bool = False) -> List[Finding]:
    """``utils.save_checkpoint(state, path)``: a project function or method that only writes
    (returns nothing, keeps no state, reaches no collective), called as a statement, runs on
    rank 0, with a barrier after it where the script reads the path it wrote later
    (:func:`dp2ddp.codemods.write_barriers.barriers`); anything else is refused."""
    m = ctx.m
    stmt = m.statement_of(w.call)
    whole = isinstance(stmt, ast.Expr) and stmt.value is w.call and ctx.bridge.alone_on_line(stmt)
    if (w.torch_saves and whole and not w.only_writes and w.deletes is None and w.trains is None
            and isinstance(w.call.func, (ast.Name, ast.Attribute))):
        # ``early_stopping(val_loss, model, path)``: a counter every rank needs, and a torch.save
        # of the synchronised model: every rank runs it, only rank 0's torch.save writes
        # (then every rank waits for rank 0's file: whoever loads it later finds it whole)
        if same_passes(ctx.m, stmt, training=True):
            helper = ctx.saves_on_rank_zero()
            edits = [Replace(ctx.cst(w.call.func), lambda u, helper=helper: ctx.expr(f"{helper}({{f}})", f=u)),
                     InsertAfter(ctx.bridge.statement(stmt), (ctx.barrier(comment=f"every rank waits for rank 0's torch.save ({w.where})"),))]
            return [ctx.note(w.call, "DDP132", f"{w.name} runs on every rank (it keeps state every rank needs), its "
                             f"torch.save ({w.where}) writing on rank 0 only ({helper}), and every rank waits for that file",
                             edits)]
    if (w.deeper or w.cached) and w.deletes is None and w.trains is None and not (w.only_writes and whole):
        if first:
            return []  # rank 0 runs it first for the folder it makes already: its writes too, one pair of barriers
        ahead = _write_first_on_rank_zero(ctx, w, stmt)
        if ahead is not None:
            return [ahead]
    if not w.only_writes or not whole:
        # (a helper that removes files and writes, and does nothing else, runs on rank 0 alone
        # like one that only writes: pytorch-playground's model_snapshot removes the last best
        # file and saves the new one; what the script reads after it waits at a barrier)
        why = (
            f"it also removes files ({w.deletes}) and does more than write" if w.deletes is not None
            else f"it also trains ({w.trains}), which every rank must do" if w.trains is not None
            else "its result is used" if not whole
            else "it also keeps state or returns a value every rank needs"
        )
        return [ctx.block(w.call, "DDP110", f"{w.name} writes a file ({w.where}) on every rank, and dp2ddp cannot run it on rank 0 "
                          f"alone: {why}; split the writing out and call that on rank 0, then migrate")]
    edits = [Guard((ctx.bridge.statement(stmt),), ctx.expr(ctx.rank0()))]
    how = "it runs on rank 0 only"
    # (a helper written for DataParallel is dp_idioms' to hand the module, DDP165/166; a whole save, checkpoints')
    unwrapped = {id(a) for _, a, _ in helper_whole_saves(m, dp_wrapper_keys(m))}
    handed = [] if any(h.call is w.call for h in dp_helper_calls(m)) else [
        a for a in handed_models(m, w.call) if id(a) not in unwrapped]
    if handed and runs_a_handed_model(m, w.call):
        # a DDP forward on rank 0 alone would wait for the other ranks (its buffers' broadcast):
        # rank 0 hands it the bare module, where nothing it runs reads the wrapper's own API
        wrapper_api = reads_the_wrapper(m, w.call)
        if wrapper_api is not None:
            return [ctx.block(w.call, "DDP110", f"{w.name} writes a file ({w.where}) on every rank, and dp2ddp cannot run it "
                              f"on rank 0 alone: it is handed the model `{m.source(handed[0])}` (a DDP forward on one rank "
                              f"waits for the others) and reads the wrapper's own API ({wrapper_api}), so it cannot be handed "
                              "the bare module; split the writing out and call that on rank 0, then migrate")]
        fed = ctx.fed_like_the_wrapper()
        edits += [Replace(ctx.cst(a), lambda u: ctx.expr(fed + "({a}.module)", a=u)) for a in handed]
        how = (f"it runs on rank 0 only, handed the bare module (`{m.source(handed[0])}.module`: a DDP forward on one rank "
               "would wait for the others)")
    return [ctx.note(w.call, "DDP132", f"{w.name} writes files ({w.where}) and nothing else: {how}", edits)] + barriers(
        ctx, [(stmt, stmt)], companion=True)


def _write_first_on_rank_zero(ctx: Context, w, stmt) -> Optional[Finding]:
    """``tokenizer = BertTokenizer.from_pretrained(...)``, ``roidb = combined_roidb(...)``: a
    project call whose write lies further down (a download cache, a pickled index, a plot)
    and whose result every rank needs runs on rank 0 first, then on the other ranks, a
    barrier between (HF's own examples' pattern): they find what rank 0 wrote, or write the
    same again, never at once. ``None`` where the ranks cannot be shown to pass the barriers
    alike, or no process group exists yet there."""
    m = ctx.m
    if stmt is None or not ctx.bridge.alone_on_line(stmt) or not same_passes(m, stmt) or joins_the_others(m, w.call):
        return None
    if ctx.mode == "plain" and ctx.role != "helper" and not ctx.in_setup_region(w.call):
        return None  # (a script with its own distributed path: the barriers wait only where its group exists)
    if in_a_choosing_expression(m, w.call, stmt):
        return None
    line = ctx.bridge.statement(stmt)
    before = ctx.barrier("others", comment=f"rank 0 runs {w.name} first (it writes {w.where})")
    after = ctx.barrier("rank0")
    # every rank goes on once the others have written too: rank 0 never reads the file (a
    # checkpoint loaded after the loop) while another rank is still writing it
    together = ctx.barrier(comment=f"every rank has run {w.name}")
    further = " further down" if w.deeper else " only where it finds none (a cache: the others read rank 0's)" if w.cached else ""
    return ctx.note(w.call, "DDP132", f"{w.name} runs on rank 0 first, then on the other ranks ({w.where} writes a file"
                    f"{further}, and every rank needs its result), and every rank goes on when all have run it: the ranks "
                    "never write it at once, and none reads it while another writes",
                    [InsertBefore(line, (before,)), InsertAfter(line, (after, together))])


def _writer_state_reads(m: SemanticModel, call: ast.Call) -> List[ast.Attribute]:
    """The reads of something other than a writing method (``add_*``, ``flush``, ``close``)
    of the SummaryWriter ``call`` makes: ``writer.file_writer.get_logdir()``, ``writer.log_dir``."""
    from dp2ddp.model.flow import origins

    return [a for a in m.nodes(ast.Attribute)
            if (isinstance(a.ctx, ast.Load) and not a.attr.startswith("add_") and a.attr not in ("flush", "close")
                and isinstance(a.value, (ast.Name, ast.Attribute, ast.Subscript))
                and any(node is call for node, path in origins(m, a.value) if not path))]


def _reads_its_folder(m: SemanticModel, read: ast.Attribute) -> bool:
    """``writer.get_logdir()``, ``writer.file_writer.get_logdir()``, ``writer.log_dir`` (or
    tensorboardX's ``logdir``): the folder, which the stand-in is told."""
    if read.attr in ("log_dir", "logdir"):
        return True
    up = m.parent(read)
    if read.attr == "file_writer" and isinstance(up, ast.Attribute) and up.attr == "get_logdir":
        read, up = up, m.parent(up)
    return read.attr == "get_logdir" and isinstance(up, ast.Call) and up.func is read and not up.args and not up.keywords


def _log_dir_cst(u: cst.Call) -> cst.BaseExpression:
    """The folder argument of the (edited) SummaryWriter call, for the stand-in (see _log_dir)."""
    for i, a in enumerate(u.args):
        if (a.keyword is None and not a.star and i == 0) or (a.keyword is not None and a.keyword.value in ("log_dir", "logdir")):
            return a.value
    raise AssertionError("no folder argument: _log_dir found one")  # (checked before the edit is proposed)


def _log_dir(call: ast.Call) -> Optional[ast.AST]:
    """The folder a SummaryWriter is made with: first argument, ``log_dir=`` (torch) or ``logdir=`` (tensorboardX)."""
    got = argument(call, SUMMARY_WRITER_PARAMS, "log_dir")
    if got is None:
        k = kwarg(call, "logdir")
        got = k.value if k is not None else None
    return got


def _what(w: Writer) -> str:
    return {"tensorboard": "a SummaryWriter", "wandb": "a wandb run", "tqdm": "a tqdm bar", "logfile": "a log file", "open": "a file opened for writing"}[w.kind]


def _restrict(ctx: Context, w: Writer, problem: Optional[str], early: bool = False) -> Optional[Finding]:
    """Restrict a writer to rank 0; ``early``: it is made before the process group exists,
    so the rank comes from torchrun's environment (RANK)."""
    m = ctx.m
    call = w.call
    rank0 = ctx.env_rank0() if early else ctx.rank0()
    if w.kind == "tensorboard":
        named = m.qualified_names(call.func) & SUMMARY_WRITERS
        reads = _writer_state_reads(m, call) if problem is not None and named else []
        log_dir = _log_dir(call) if reads else None
        read = next((r for r in reads if log_dir is None or not _reads_its_folder(m, r)), None)
        if read is not None:
            why = ("which a stand-in on the other ranks cannot give; read the folder from the value the writer was made "
                   "with, then migrate") if not _reads_its_folder(m, read) else (
                "its folder, a name the writer picked itself (it was made without one), which a stand-in on the other ranks "
                "cannot know; give the writer its folder (log_dir=...), then migrate")
            return ctx.block(read, "DDP110", (
                f"SummaryWriter left on every rank (one event file per rank): {problem}, and line {read.lineno} reads "
                f"its state (`{m.source(read)}`), {why}"))
        if problem is not None and named:
            # its uses cannot all be guarded (kept in a dict, handed on as a value): on the other
            # ranks a stand-in whose writing methods do nothing (and anything else stops loudly);
            # told the folder where the script reads it (pytorch-semseg's file_writer.get_logdir())
            stand_in = ctx.writes_nothing()
            told = " and whose `get_logdir()` is the folder it was made with" if reads else ""
            new = f"{{c}} if {_paren_text(rank0)} else {stand_in}({{d}})" if reads else f"{{c}} if {_paren_text(rank0)} else {stand_in}()"
            return ctx.note(call, "DDP173", f"SummaryWriter created on rank 0 only; on the other ranks `{stand_in}()`, whose "
                            f"`add_*`, `flush` and `close` do nothing{told} ({problem}, so its uses cannot be put under a rank "
                            "test)", [Replace(ctx.cst(call), lambda u: ctx.expr(new, c=u, d=_log_dir_cst(u)) if reads
                                      else ctx.expr(new, c=u))])
        if problem is not None:
            return ctx.block(call, "DDP110", f"SummaryWriter left on every rank (one event file per rank): {problem}")
        new = f"{{c}} if {_paren_text(rank0)} else None"
        what = "SummaryWriter" if any(q.endswith("SummaryWriter") for q in named) else f"`{m.source(call.func)}`"
        return ctx.note(call, "DDP135", f"{what} created on rank 0 only; its uses run on rank 0", [Replace(ctx.cst(call), lambda u: ctx.expr(new, c=u))])
    if w.kind == "wandb":
        mode = kwarg(call, "mode")
        if mode is not None:
            edit = Replace(ctx.cst(mode.value), ctx.expr('{v} if {r} else "disabled"', v=_paren(m, mode.value), r=_paren_text(rank0)))
        else:
            edit = Replace(ctx.cst(call), lambda u, r=_paren_text(rank0): add_kwarg(u, "mode", f'None if {r} else "disabled"'))
        return ctx.note(call, "DDP135", "wandb.init(mode=\"disabled\") on ranks other than 0", [edit])
    if w.kind == "tqdm":
        dis = kwarg(call, "disable")
        not0 = ctx.not_rank0()
        if dis is not None:
            if mentions_rank(m, dis.value):
                return None
            edit = Replace(ctx.cst(dis.value), ctx.expr("{v} or {n}", v=_paren(m, dis.value), n=not0))
        else:
            edit = Replace(ctx.cst(call), lambda u, n=not0: add_kwarg(u, "disable", n))
        return ctx.note(call, "DDP135", "tqdm bar shown on rank 0 only", [edit])
    if w.kind in ("logfile", "open"):
        path = w.path
        if path is None:
            return ctx.block(call, "DDP110", f"{_what(w)} without a path dp2ddp can read: restrict it to rank 0, then migrate")
        if w.kind == "open":
            modes = open_modes(m, call)  # (("r",) where no mode is given, None where one cannot be read)
            if modes is None:
                return ctx.block(call, "DDP110", "file opened for writing in a mode dp2ddp cannot read: restrict it to rank 0, then migrate")
            kept = next((x for x in modes if "x" in x or "r" in x), None)
            if kept is not None:
                why = "reads the file back" if "r" in kept else "fails where the file exists"
                return ctx.block(call, "DDP110", f"file opened for writing in mode {kept!r}, which {why}: os.devnull cannot stand "
                                 "in for it on the other ranks; restrict it to rank 0, then migrate")
            if _rank_specific(m, path):
                return None
        edit = Replace(ctx.cst(path), ctx.expr("{p} if {r} else {os}.devnull", p=_paren(m, path), r=_paren_text(rank0), os=ctx.name("os")))
        return ctx.note(call, "DDP135", f"{_what(w)} written on rank 0 only (os.devnull on other ranks)", [edit])
    return None


def _every_rank_runs(m: SemanticModel, node: ast.AST) -> bool:
    """``node`` is at module level, or in a function of the module (not a method, whose
    callers may be anywhere) that is called, and never where a rank test guards the call
    (a barrier there would wait for ranks that never come)."""
    func = m.enclosing_function(node)
    if func is None:
        return True
    if isinstance(m.parent(func), ast.ClassDef):
        return False
    callers = [c for c in m.nodes(ast.Call) if m.resolve_call(c) is func]
    return bool(callers) and not any(rank_guarded(m, c) for c in callers)


def _paren_text(test: str) -> str:
    """A test inside a conditional expression: parenthesized when it has ``or``/``and``."""
    return f"({test})" if " or " in test or " and " in test else test


def _rank_specific(m: SemanticModel, path: ast.AST) -> bool:
    """A path that already differs per rank (``f"log_{rank}.txt"``)."""
    return mentions_rank(m, path)


def _paren(m: SemanticModel, node: ast.AST) -> str:
    text = m.source(node)
    if isinstance(node, (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant, ast.JoinedStr)):
        return text
    return f"({text})"
