"""The DataParallel -> DistributedDataParallel migration: plan it, apply it.

:func:`plan` runs every transform of :mod:`dp2ddp.codemods` over one module's semantic
model. Each transform *proposes* findings (notes about what changes, warnings about what
does not, errors that stop the file); their edits — against LibCST nodes found through
the bridge — form one fix that the shared engine applies. `rewrite`, `check --fix`
(rule DDP001) and the hooks all go through here.

The rule for every transform: the migrated script runs wherever the original ran (plain
python on CPU, one GPU, several GPUs under torchrun) and does what it did; where that
cannot be guaranteed, the file is left as it was and the reason is an ``error`` finding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from dp2ddp.engine import Edit, Finding, Fix, OverlappingEdits, apply_edits
from dp2ddp.source import InputError, Source

BLOCKING = "error"


@dataclass
class Options:
    keep_batch_size: bool = False  # keep batch_size/num_workers per process instead of dividing
    print_all_ranks: bool = False  # do not restrict print() to rank 0
    shard_eval: bool = False  # shard evaluation loops whose results are sums (codemods/shard_eval.py)
    accept: frozenset = frozenset()  # refusal codes the user takes the risk of (rewrite --accept)
    # "script": one file on its own; in a project migration (rewrite --with-helpers), "entry" is
    # the script that runs (its helpers hold the DataParallel wraps) and "helper" a project
    # module it imports (it gets the wrap, not the process group)
    role: str = "script"
    # helper role: ``(function name, line, parameter)`` of the module's functions (a class's
    # ``__init__``) to which the entry script hands the values their training loops iterate:
    # the entry's migration shards what it hands (dp2ddp.model.training_feeds.handed_params)
    handed: frozenset = frozenset()
    # entry role: the real paths of the project modules migrated with the entry (their writes,
    # folders and loaders are their own migrations' business)
    plan_modules: frozenset = frozenset()
    # helper role: a module without DataParallel that trains on loaders it makes itself
    # (foreign_training.foreign_training): migrated for its loaders, writers and prints
    trains_only: bool = False
    # helper role: ``self.`` attributes that subclasses in other modules read (the module holds
    # the base of a training class the entry makes): a writer kept in one cannot be ``None``
    # on other ranks, since those reads are not this migration's to guard
    shared_attrs: frozenset = frozenset()
    # helper role: a transformers model class the entry or a project module imports (its wraps
    # of a handed model then find unused parameters: codemods/find_unused.py)
    transformers_model: Optional[str] = None
    # helper role: ``(line, column, why)`` of the subjects (``self.model``) of the
    # ``state_dict``/``load_state_dict`` calls on a wrapper the entry hands in whose keys stay
    # without ``module.`` (dp2ddp.model.handed_wrappers, codemods/handed_keys.py)
    plain_keys: frozenset = frozenset()


def _acts(options: Optional["Options"]) -> bool:
    """A file migrated although it names no DataParallel: a project's entry script, or a
    helper that trains on its own loaders."""
    return options is not None and (options.role == "entry" or options.trains_only or bool(options.plain_keys))


@dataclass
class Migration:
    findings: List[Finding] = field(default_factory=list)
    edits: List[Edit] = field(default_factory=list)
    blocked: bool = False
    applicable: bool = False  # the file uses DataParallel at all (or may: see DDP107)

    @property
    def notes(self) -> List[Finding]:
        return [f for f in self.findings if f.severity == "info"]

    @property
    def warnings(self) -> List[Finding]:
        return [f for f in self.findings if f.severity != "info"]

    @property
    def fix(self) -> Optional[Fix]:
        return Fix(list(self.edits), "migrate DataParallel to DistributedDataParallel") if self.edits else None

    @property
    def clean(self) -> bool:
        """Migrated with nothing left for a human (exit code 0)."""
        return not self.blocked and not self.warnings


@dataclass
class Result:
    path: str
    output: bytes
    changed: bool
    migration: Migration


def quick_reject(data: bytes) -> bool:
    """True when the file cannot possibly use DataParallel (:data:`dp2ddp.model.names.DP_BYTES`)."""
    from dp2ddp.model.names import may_use_dp

    return not may_use_dp(data)


def applicable(model) -> bool:
    from dp2ddp.model.wraps import uses_dataparallel

    return uses_dataparallel(model)


def plan(model, bridge, options: Optional[Options] = None) -> Migration:
    """Plan the migration of ``model`` (its LibCST tree is ``bridge.module``)."""
    from dp2ddp.codemods import TRANSFORMS
    from dp2ddp.codemods.context import Context
    from dp2ddp.codemods.mixed import detect_mode
    from dp2ddp.model.bridge import BridgeError
    from dp2ddp.model.wraps import dp_other_refs, dp_type_refs, dp_wraps, unresolved_dp

    options = options or Options()
    if not applicable(model) and not _acts(options):
        return Migration()
    ctx = Context(model, bridge, options)
    findings: List[Finding] = []
    unresolved = unresolved_dp(model)
    for node in unresolved:
        findings.append(
            ctx.warn(
                node,
                "DDP107",
                f"`{model.source(node)[:60]}` may be DataParallel but dp2ddp cannot resolve it "
                f"({_why_unresolved(model, node)}); migrate it by hand or import DataParallel explicitly",
            )
        )
    if unresolved and (dp_wraps(model) or dp_type_refs(model) or dp_other_refs(model)):
        findings.append(ctx.block(unresolved[0], "DDP101", "the file also uses DataParallel in a way dp2ddp cannot resolve; nothing was migrated"))
    if unresolved and not any(f.severity == BLOCKING for f in findings):
        return Migration(findings=_sorted(findings), applicable=True, blocked=False)
    if not any(f.severity == BLOCKING for f in findings):
        try:
            from dp2ddp.codemods import hand_batches
            from dp2ddp.codemods.entry import check_entry
            from dp2ddp.codemods.wrap_problems import problems, steered_by_shard, step_decided_by_the_loss, trained_outside_wrap

            findings.extend(problems(ctx))
            findings.extend(hand_batches.problems(ctx))  # DataParallel(dim != 0) whose batches cannot be split
            if not any(f.severity == BLOCKING for f in findings):
                findings.extend(check_entry(ctx))
            if not any(f.severity == BLOCKING for f in findings):
                findings.extend(detect_mode(ctx))
            if not any(f.severity == BLOCKING for f in findings):
                findings.extend(step_decided_by_the_loss(ctx))
            if not any(f.severity == BLOCKING for f in findings):
                for transform in TRANSFORMS:
                    findings.extend(transform(ctx))
                    if any(f.severity == BLOCKING for f in findings):
                        break
            if not any(f.severity == BLOCKING for f in findings):
                findings.extend(trained_outside_wrap(ctx))
                findings.extend(steered_by_shard(ctx))
        except BridgeError as e:
            findings.append(ctx.block(None, "DDP101", f"dp2ddp could not map this file's syntax tree ({e}); nothing was migrated"))
    blocked = any(f.severity == BLOCKING for f in findings)
    edits: List[Edit] = []
    if blocked:
        findings = [f for f in findings if f.severity != "info"]
        for f in findings:
            f.fix = None
    else:
        for f in findings:
            if f.fix is not None:
                edits.extend(f.fix.edits)
        edits.extend(ctx.extra_edits)
        shared = Fix(edits, "migrate DataParallel to DistributedDataParallel")
        for f in findings:
            if f.fix is not None:
                f.fix = shared
    return Migration(findings=_sorted(findings), edits=edits, blocked=blocked, applicable=True)


def _project_miss(model) -> Migration:
    """A script without DataParallel whose project modules wrap its model in DataParallel
    (``model = models.build(args)``): not "nothing to migrate" but a refusal that says to
    migrate the project (DDP151)."""
    from dp2ddp.project import helper_dp_message, helpers_with_dp

    found = helpers_with_dp(model)
    if not found:
        return Migration()
    call, rel, line = found[0]
    import ast

    from dp2ddp.engine import Finding
    from dp2ddp.model.entry_points import LIBRARY_MODULE, has_entry_point

    pos = model.position(call)
    end = model.end_position(call)
    inference = _helper_inference(model, found) if has_entry_point(model) else None
    if inference is not None:
        f = inference  # the project plan would refuse it too: say why now, not "--with-helpers"
    elif has_entry_point(model):
        f = Finding("DDP151", helper_dp_message(model, call, rel, line), call, line=pos[0], col=pos[1], severity="error",
                    end_line=end[0], end_col=end[1])
    else:  # a library module of the project (a trainer subclass): the script that runs is what migrates
        what = f"{model.source(call.func)}()" if isinstance(call, ast.Call) else f"`{model.source(call)}`"
        f = Finding("DDP116", f"{LIBRARY_MODULE} whose {what} reaches DataParallel in the project module {rel}:{line}: "
                    "the process group must be set up by the script that runs; migrate that script with its helpers "
                    "(`dp2ddp rewrite train.py --with-helpers`)",
                    call, line=pos[0], col=pos[1], severity="error", end_line=end[0], end_col=end[1])
    return Migration(findings=[f], blocked=True, applicable=True)


def _why_unresolved(model, node) -> str:
    import ast

    if isinstance(node, ast.Call):
        return "a name looked up with getattr"
    if model.maybe_star(node):
        return "a star import may provide it"
    q = model.qualified_names(node)
    if q:
        return f"it is {sorted(q)[0]}, not torch's"
    return "no import binds it"


def _sorted(findings: List[Finding]) -> List[Finding]:
    return sorted(findings, key=lambda f: (f.line, f.col, f.code))


def migrate_source(data: bytes, path: str = "<stdin>", options: Optional[Options] = None) -> Result:
    """Migrate one file's bytes. Raises :class:`dp2ddp.source.InputError` on bad input
    (the file is always parsed, so a syntax error is reported even without DataParallel)."""
    from dp2ddp.model.core import SemanticModel
    from dp2ddp.source import parse, parse_ast

    src = Source(path, data)
    tree, text = parse_ast(src)
    if quick_reject(data) and not _acts(options):
        if b"import" in data and path not in ("<stdin>", "-"):
            from dp2ddp.model.core import SemanticModel

            return Result(path, data, False, _project_miss(SemanticModel(tree, text, path)))
        return Result(path, data, False, Migration())
    model = SemanticModel(tree, text, path)
    if not applicable(model) and not _acts(options):
        return Result(path, data, False, _project_miss(model))
    from dp2ddp.model.bridge import Bridge

    module = parse(src)
    bridge = Bridge(model, module)
    migration = plan(model, bridge, options)
    if migration.blocked or not migration.edits:
        return Result(path, data, False, migration)
    try:
        new = apply_edits(module, migration.edits, bridge.ancestors)
    except OverlappingEdits as e:  # a bug of dp2ddp: said in one line, nothing written
        raise InputError(path, None, f"dp2ddp could not combine its own edits ({e}); this is a bug of dp2ddp, "
                         "please report it with the file") from None
    out = new.bytes
    accepted = {(f.code, f.line) for f in migration.findings if f.code in getattr(options, "accept", ())}
    own = None if "DDP186" in getattr(options, "accept", ()) else own_check(out, path, data, getattr(options, "role", "script"),
                                                                           accepted)
    if own is not None:  # the migration fails dp2ddp's own check: nothing is written
        kept = [f for f in migration.findings if f.severity != "info"]
        for f in kept:
            f.fix = None
        return Result(path, data, False, Migration(findings=_sorted([own] + kept), blocked=True, applicable=True))
    return Result(path, out, out != data, migration)


# what a project module migrated with its entry leaves to the entry: the process group, and
# the rank's device (``torch.cuda.set_device(local_rank)``, which covers every module of the process)
_ENTRY_FACTS = frozenset({"DDP006", "DDP008"})
# a --local_rank flag the migration keeps at its default on purpose (dp2ddp.codemods.local_rank_flag)
_KEPT_ON_PURPOSE = frozenset({"DDP011"})


def own_check(out: bytes, path: str, data: bytes, role: str = "script", accepted=frozenset()) -> Optional[Finding]:
    """The first finding of ``check``'s default rules on the migration ``out`` of ``data``,
    as a DDP186 refusal placed at the input's line that the output's line came from (where
    that line's text stands once in the input); ``None`` where the migration passes. Every
    transform is meant to leave nothing for ``check`` to find: a finding here is a case the
    migration missed (a ``torch.save`` inside a lambda), and the file is better refused. A
    module migrated in the ``helper`` role is not asked what its entry sets up (_ENTRY_FACTS).
    ``accepted``: ``(code, input line)`` of the refusals the user took (``rewrite --accept``):
    a finding of a rule whose :attr:`~dp2ddp.rules.base.Rule.accepted_by` names one of them at
    its input line is the hazard the user accepted, not a miss."""
    from dp2ddp.check.analyze import candidates, check_source
    from dp2ddp.rules import RULES

    skip = (_ENTRY_FACTS if role == "helper" else frozenset()) | _KEPT_ON_PURPOSE
    rules = candidates(out, tuple(r.code for r in RULES if r.default and r.code not in skip))
    if not rules:
        return None
    _, found, model, error = check_source(out, path, rules)
    if error or not found:
        return None
    by_code = {r.code: r for r in RULES}
    input_lines = data.decode("utf-8", "replace").splitlines()
    miss = None
    for f in found:
        text = model.line_text(f.line).strip()
        lines = [i for i, line in enumerate(input_lines, 1) if line.strip() == text]
        line = lines[0] if len(lines) == 1 else 1
        rule = by_code.get(f.code)
        if len(lines) == 1 and rule is not None and any((c, line) in accepted for c in rule.accepted_by):
            continue
        miss = (f, text, line)
        break
    model.release()
    if miss is None:
        return None
    first, text, line = miss
    return Finding("DDP186", (
        f"the migration would not pass dp2ddp's own check: {first.code} at its line {first.line} (`{text[:70]}`): "
        f"{first.message}; nothing was written (a case the migration misses: please report it); migrate that "
        "statement by hand, then migrate"), None, line=line, col=0, severity=BLOCKING)


migrate_bytes = migrate_source


def migrate_file(path: str, options: Optional[Options] = None) -> Result:
    from dp2ddp.source import read_source

    src = read_source(path)
    return migrate_source(src.data, src.display, options)


def migrate_project(entry: str, options: Optional[Options] = None):
    """Migrate ``entry`` and the project modules with DataParallel it reaches, as one plan
    (``rewrite --with-helpers``): every helper in the ``helper`` role, the entry in the
    ``entry`` role. Raises :class:`dp2ddp.source.InputError` on unreadable input."""
    import os
    from dataclasses import replace

    from dp2ddp.project import FileResult, ProjectResult, only_checks_dp, project_modules, uses_dp
    from dp2ddp.source import read_source

    options = options or Options()
    out = ProjectResult(entry)
    helpers = sorted((rel, real) for real, (rel, _d) in project_modules(entry).items() if uses_dp(real))
    trainers = _trainers(entry, {real for _, real in helpers})
    saving = _saving_trainers(entry)
    trainers += [t for t in saving if t[1] not in {real for _, real in helpers + trainers}]
    plain_keys = _plain_keys(entry)
    # modules whose only part in the plan is the keys of a wrapper handed in (``save_checkpoint(model, ...)``)
    base = os.path.dirname(os.path.abspath(entry))
    planned = {real for _, real in helpers + trainers}
    keyed = sorted((os.path.relpath(real, base), real) for real in plain_keys if real not in planned)
    handed = _handed_params(entry) if helpers or trainers else {}
    library = None
    if helpers:
        from dp2ddp.model.project_defs import file_model
        from dp2ddp.model.uses import transformers_model_in_project

        em = file_model(entry)
        library = transformers_model_in_project(em) if em is not None else None
    for rel, real in sorted(helpers + trainers + keyed):
        src = read_source(os.path.join(base, rel))
        res = migrate_source(src.data, src.display, replace(options, role="helper", handed=frozenset(handed.get(real, ())),
                                                            trains_only=(rel, real) in trainers,
                                                            shared_attrs=saving.get((rel, real), frozenset()),
                                                            transformers_model=library,
                                                            plain_keys=frozenset(plain_keys.get(real, ()))))
        out.files.append(FileResult(src.display, rel, "helper", res))
    src = read_source(entry)
    # helpers that only test for DataParallel wrap nothing: an entry that names no DataParallel
    # of its own needs no process group for them (an inference script printing a model's description)
    wrapping = [h for h in helpers if not only_checks_dp(h[1])]
    role = "entry" if wrapping or trainers or keyed or (helpers and not quick_reject(src.data)) else "script"
    if role == "script":
        # nothing wraps: the helpers' tests for DataParallel stay as they are (CPC's
        # ``get_module`` serves the scripts that do wrap, which still use DataParallel)
        out.files = []
    plan_modules = frozenset(real for _, real in helpers + trainers + keyed)
    res = migrate_source(src.data, src.display, replace(options, role=role, plan_modules=plan_modules))
    if role == "entry" and not res.migration.blocked:
        res = _library_entry(entry, res, src.data)
    if wrapping and not trainers and not res.migration.blocked:
        res = _inference_through_helpers(entry, res, src.data)
    out.files.insert(0, FileResult(src.display, os.path.basename(entry), role, res))
    if not out.blocked:
        _left_behind(entry, out)  # (a refused plan writes nothing: no other script is left behind)
    return out


def _library_entry(entry: str, res, data: bytes):
    """A project migration asked of a module that does not run (no main guard, no module-level
    code but definitions and settings: BERT-NER's ``callback/trainingmonitor.py``): it would
    start a process group whenever it is imported. Refused (DDP116), as the module alone is."""
    from dp2ddp.engine import Finding
    from dp2ddp.model.entry_points import LIBRARY_MODULE, has_entry_point
    from dp2ddp.model.project_defs import file_model

    model = file_model(entry)
    if model is None or has_entry_point(model):
        return res
    first = next(iter(model.tree.body), None)
    f = Finding("DDP116", f"{LIBRARY_MODULE}: it cannot be the script a project migration starts from (it would start a "
                "process group whenever it is imported); migrate the script that runs with its helpers (`dp2ddp rewrite "
                "train.py --with-helpers`)", first, line=getattr(first, "lineno", 1), col=0, severity="error")
    return _refused(res, f, data)


def _inference_through_helpers(entry: str, res, data: bytes):
    """The project plan of an entry that evaluates through its helpers' DataParallel
    (:func:`_helper_inference`) is refused (DDP115) at the entry's call that reaches the
    helper's wrap."""
    from dp2ddp.model.project_defs import file_model

    model = file_model(entry)
    f = _helper_inference(model) if model is not None else None
    return _refused(res, f, data) if f is not None else res


def _helper_inference(model, found=None):
    """DDP115 for a script that trains nowhere (nothing it or the project modules it reaches
    runs backs a loss: :func:`dp2ddp.project.trains_nowhere`), or nowhere dp2ddp can see (no
    step and no optimizer: :func:`dp2ddp.model.inference.trains_nothing_visible`;
    adversarial_robustness' ``eval-aa.py`` hands the model to an attack library), and whose
    project helpers wrap the model it evaluates in DataParallel (Deep_Metric's ``test.py`` ->
    ``Model2Feature``): every rank would repeat the whole inference that DataParallel split
    between the GPUs. ``None`` where that is not so. The file alone and its project plan say
    the same. ``found``: :func:`dp2ddp.project.helpers_with_dp` of the model, where the caller
    has it already."""
    import ast
    import os

    from dp2ddp.engine import Finding
    from dp2ddp.model.inference import no_training_message, trains_nothing_visible
    from dp2ddp.project import helpers_with_dp, trains_nowhere

    if not os.path.isfile(model.path):
        return None
    found = found if found is not None else helpers_with_dp(model)
    if not found:
        return None
    nowhere = trains_nowhere(model.path, model)
    if not nowhere and not (trains_nothing_visible(model) and _followed(model, found)):
        return None
    call, rel, line = found[0]
    pos, end = model.position(call), model.end_position(call)
    what = f"{model.source(call.func)}()" if isinstance(call, ast.Call) else f"`{model.source(call)}`, handed on as a value,"
    why = (f"its model is wrapped in DataParallel by {what} ({rel}:{line}), and nothing this script "
           "or its project modules run trains it" + ("" if nowhere else (
               " (no backward pass, no optimizer.step(), no optimizer made; if a library it hands the model to trains "
               "it, dp2ddp cannot find the data to shard)")))
    return Finding("DDP115", no_training_message(why, own_step=False), call, line=pos[0], col=pos[1], severity="error",
                   end_line=end[0], end_col=end[1])


def _followed(model, found) -> bool:
    """Every path from the script to the helpers' DataParallel is a call dp2ddp follows, and
    the script calls nothing it cannot name (``trainer[name](args, net)``, ``getattr(m, n)()``):
    where it finds no training, none is hidden behind a dispatch (TransUNet's table of
    trainers, whose one entry trains)."""
    import ast

    return all(isinstance(call, ast.Call) for call, _rel, _line in found) and not any(
        isinstance(c.func, (ast.Subscript, ast.Call)) for c in model.nodes(ast.Call))


def _refused(res, finding, data: bytes):
    """``res`` (a migration of ``data``) refused for ``finding``: the file left as it was."""
    from dataclasses import replace

    return replace(res, migration=Migration(findings=[finding], blocked=True, applicable=True), output=data, changed=False)


def _left_behind(entry: str, out) -> None:
    """DDP175 on each rewritten helper that other scripts beside the entry import: they
    start no process group, and the rewritten helper gives them the bare model where the
    original gave a DataParallel wrapper (``module.`` keys lost) — where a wrap of the helper
    ran on one GPU or the CPU too (not only under a count of the devices)."""
    import os

    from dp2ddp.findings import Finding
    from dp2ddp.project import importers_of, wraps_without_a_device_count

    helpers = {os.path.realpath(f.path): f for f in out.files if f.role == "helper" and f.result.changed}
    if not helpers:
        return
    for real, scripts in importers_of(entry, set(helpers)).items():
        if not wraps_without_a_device_count(real):
            continue  # one GPU had the bare model from it too: the other scripts see what they saw there
        names = ", ".join(f"{os.path.basename(p)}:{line}" for p, line in scripts[:6]) + (
            f" and {len(scripts) - 6} more" if len(scripts) > 6 else "")
        f = helpers[real]
        f.result.migration.findings.append(Finding(
            "DDP175", f"{f.rel} is also imported by scripts this migration leaves as they were ({names}): with the "
            "rewritten module they get the bare model where they had a DataParallel wrapper, so their checkpoints lose "
            "`module.` (a loader that keeps only the keys it knows would load nothing); migrate them too "
            "(rewrite OTHER.py --with-helpers), or keep the original module for them", line=1))


def _trainers(entry: str, helpers: set) -> list:
    """``(path relative to the entry's folder, real path)`` of the project modules without
    DataParallel where the entry's calls train on loaders made there
    (:func:`dp2ddp.model.foreign_training.foreign_training`): migrated with it, for their loaders."""
    import os

    from dp2ddp.model.project_defs import file_model
    from dp2ddp.model.foreign_training import foreign_training

    em = file_model(entry)
    base = os.path.dirname(os.path.abspath(entry))
    out = []
    for f in foreign_training(em) if em is not None else ():
        real = os.path.realpath(f.module)
        if real not in helpers and (os.path.relpath(f.module, base), real) not in out:
            out.append((os.path.relpath(f.module, base), real))
    return out


def _saving_trainers(entry: str) -> dict:
    """The project modules that hold the saves of a training class the entry makes
    (:func:`dp2ddp.model.writing_classes.training_class_saves`: ``Trainer(...)`` whose base saves
    checkpoints with no rank test), as ``(path relative to the entry's folder, real path)``
    -> the ``self.`` attributes the class's family reads in other modules: migrated with the
    entry, so that their saves run on rank 0 there instead of being refused (DDP110)."""
    import os

    from dp2ddp.model.project_defs import file_model
    from dp2ddp.model.writing_classes import training_class_saves

    em = file_model(entry)
    base = os.path.dirname(os.path.abspath(entry))
    out: dict = {}
    for t in training_class_saves(em) if em is not None else ():
        if t.module:
            key = (os.path.relpath(t.module, base), os.path.realpath(t.module))
            out[key] = out.get(key, frozenset()) | t.shared_attrs
    return out


def _plain_keys(entry: str) -> dict:
    """Per project module (its real path): :attr:`Options.plain_keys`, the ``state_dict`` and
    ``load_state_dict`` calls on a wrapper the entry hands in whose keys the key policy keeps
    without ``module.`` (:func:`dp2ddp.model.handed_wrappers.handed_key_policies`)."""
    import os

    from dp2ddp.model.checkpoint_keys import PLAIN
    from dp2ddp.model.handed_wrappers import handed_key_policies
    from dp2ddp.model.project_defs import file_model

    em = file_model(entry)
    out: dict = {}
    for use, policy in handed_key_policies(em) if em is not None else ():
        if policy.default == PLAIN and not use.own and not use.bare_elsewhere:  # type: ignore[attr-defined]
            out.setdefault(os.path.realpath(use.module), set()).add((use.subject.lineno, use.subject.col_offset,
                                                                    policy.reason))  # type: ignore[attr-defined]
    return out


def _handed_params(entry: str) -> dict:
    """Per project module (its real path): the parameters the entry script hands training
    values to, as :attr:`Options.handed` lists them."""
    import os

    from dp2ddp.model.project_defs import file_model
    from dp2ddp.model.training_feeds import handed_params

    em = file_model(entry)
    out: dict = {}
    for h in handed_params(em) if em is not None else ():
        out.setdefault(os.path.realpath(h.module.path), set()).add((getattr(h.function, "name", ""), h.function.lineno, h.param))
    return out


__all__ = ["migrate_project", "Options", "Migration", "Result", "plan", "migrate_source", "migrate_bytes", "migrate_file", "quick_reject", "InputError"]

