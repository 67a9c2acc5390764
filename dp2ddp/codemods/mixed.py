"""Scripts that already have a distributed path beside a DataParallel fallback.

HF examples of the ``n_gpu`` era (``--local_rank``), pytorch/examples imagenet
(``--multiprocessing-distributed``, ``mp.spawn``, ``--dist-url``), yolov5
(``LOCAL_RANK = int(os.getenv("LOCAL_RANK", -1))``) and their many descendants already
know DDP. Their migration completes that path for torchrun instead of adding a second
one:

* the DataParallel fallback (and evaluation re-wraps) is removed (:mod:`wrap_ddp`);
* the path is switched on by torchrun's environment: ``--local_rank`` defaults to
  ``LOCAL_RANK``; arguments that feed ``init_process_group`` (``args.dist_url``,
  ``args.world_size``, ``args.rank``) are set from the environment right after the
  arguments are parsed, and so is a flag that would spawn processes; a spawned worker
  is called directly when torchrun already started this process;
* it runs on CPU like every migrated script: ``nccl`` becomes ``nccl`` with CUDA and
  ``gloo`` otherwise, ``set_device`` and ``device_ids`` only with CUDA;
* after the script's own wrap, a model that no path wrapped (a CPU branch) is wrapped;
* the process group is destroyed at exit.

Where the path depends on something dp2ddp cannot set (a rank computed from the
script's own arithmetic, an initialisation in another module) the file is refused with
the reason (DDP104).

This module holds the plan (:class:`MixedPlan`, made by :func:`detect_mode`) and the edits
(those that need no plan are in :mod:`mixed_edits`);
what it asks about the script is the model's: :mod:`dp2ddp.model.own_path` (the path it
has), :mod:`dp2ddp.model.cuda_only` (what assumes CUDA), :mod:`dp2ddp.model.ranks` (its
``--local_rank``), :mod:`dp2ddp.model.launch` (its ``mp.spawn``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from dp2ddp.codemods.context import Context
from dp2ddp.codemods.mixed_edits import (apex_ddp, cuda_call, cuda_device, ddp_devices, ensure_wrapped, guard_set_device, init_call,
                                         master_env, paren)
from dp2ddp.engine import Finding, InsertAfter, Replace
from dp2ddp.model.cuda_only import cuda_asserts, cuda_calls, rank_devices
from dp2ddp.model.launch import inits_elsewhere, spawn_parameters, spawns as launch_spawns
from dp2ddp.model.names import APEX_DDP, CUDA_SET_DEVICE, DDP, INIT, LAUNCH_MODULES, SPAWN
from dp2ddp.model.own_path import (activation_tests, env_decided, init_arguments, init_source, master_env_stores, namespace_origin,
                                   option_stores, rank_env_reads, spawn_flags, spellings, switch_tests)
from dp2ddp.model.ranks import env_read, local_rank_arguments

_ENV = {"init_method": '"env://"', "world_size": 'int({os}.environ["WORLD_SIZE"])', "rank": 'int({os}.environ["RANK"])'}


@dataclass
class MixedPlan:
    adapter: Dict[ast.stmt, List[Tuple[str, str]]] = field(default_factory=dict)  # `args = parse_args()` -> [(attr, value template)]
    edits_nodes: list = field(default_factory=list)
    overrides: list = field(default_factory=list)  # (assignment, init argument): computed by the script, env under torchrun
    predicates: list = field(default_factory=list)  # (test, branch) that switch the distributed path on
    # (test, branch) that torchrun's environment switches on already (``if opt.local_rank != -1:``
    # once --local_rank defaults to LOCAL_RANK): not edited, but on under torchrun like the others
    env_switched: list = field(default_factory=list)
    spawn_targets: dict = field(default_factory=dict)  # mp.spawn target function -> the spawn call


NEEDS = (MixedPlan,)  # made by detect_mode, which runs before every transform


def detect_mode(ctx: Context) -> List[Finding]:
    """Decide plain or mixed; in mixed mode, check that the distributed path can be completed."""
    m = ctx.m
    inits = m.calls(INIT)
    spawns = m.calls(SPAWN)
    launch = m.refs(LAUNCH_MODULES)
    if not (inits or spawns or launch):
        elsewhere = inits_elsewhere(m)
        if elsewhere:
            # its own distributed path starts the process group in a project module: the
            # migration's own start would meet that one (initialised twice) on that path
            call, rel, line = elsewhere[0]
            return [ctx.block(call, "DDP104", (
                f"{m.source(call.func)}() starts the process group in a project module ({rel}:{line}): the script "
                "has its own distributed path, which dp2ddp completes only where the process group starts in this "
                "file; a second start would fail on that path. Run that path under torchrun as it is, or migrate "
                "by hand"))]
        # DistributedDataParallel alone (a branch for a launcher this file does not set up):
        # a DataParallel script; its own DDP branch stays as it is
        return []
    ctx.mode = "mixed"
    out: List[Finding] = []
    if launch:
        return [ctx.block(launch[0], "DDP104", "the script starts torch.distributed.launch itself; run it under torchrun and migrate it by hand")]
    if not inits:
        where = spawns[0]
        return [
            ctx.block(
                where,
                "DDP104",
                "the script builds its distributed path but initialises the process group outside this file; "
                "dp2ddp cannot check that it reads torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK)",
            )
        ]
    plan = MixedPlan()
    spawn_targets = {}
    for sp in launch_spawns(m):
        if sp.target is None:
            return [ctx.block(sp.call, "DDP104", "mp.spawn of a function dp2ddp cannot find in this file; migrate the launch by hand")]
        spawn_targets[sp.target] = sp.call
    for init in inits:
        star = next((k for k in init.keywords if k.arg is None), None)
        if star is not None or any(isinstance(a, ast.Starred) for a in init.args):
            return [ctx.block(init, "DDP104", f"init_process_group({m.source(init)[len(m.source(init.func)) + 1:-1][:60]}): dp2ddp cannot see "
                              "which arguments reach it through **kwargs; pass backend/init_method/world_size/rank explicitly")]
        for name in ("init_method", "world_size", "rank"):
            src = init_source(m, init, name)
            if src is None or src.kind in ("environment", "worker"):  # worker: a parameter the spawn rewrite passes
                continue
            value = src.node
            if src.kind == "address":
                plan.edits_nodes.append(("literal_init_method", value))
            elif src.kind == "literal":
                return [ctx.block(value, "DDP104", f"init_process_group({name}={m.source(value)}) is fixed in the script; under torchrun it must come from the environment")]
            elif src.kind == "option":
                plan.adapter.setdefault(src.origin, []).append((value.attr, _ENV[name]))  # type: ignore[arg-type, attr-defined]
            elif src.kind == "assigned":
                plan.overrides.extend((a, name) for a in src.assigns)
            else:
                return [
                    ctx.block(
                        value,
                        "DDP104",
                        f"init_process_group({name}={m.source(value)}): the script computes the {name.replace('_', ' ')} itself; "
                        f"under torchrun it must be {_ENV[name].format(os='os')} — set it by hand, then remove the DataParallel fallback",
                    )
                ]
        backend = (init_arguments(m, init) or {}).get("backend")
        origin = namespace_origin(m, backend) if backend is not None else None
        if origin is not None:
            plan.adapter.setdefault(origin, []).append((backend.attr, "backend"))  # type: ignore[union-attr]
    # a flag that decides whether the script spawns its own processes
    for target, sp in spawn_targets.items():
        flags = spawn_flags(m, sp)
        origin = namespace_origin(m, flags[0]) if flags else None
        if origin is not None:
            plan.adapter.setdefault(origin, []).append((flags[0].attr, "False"))
            continue
        if not (isinstance(m.parent(sp), ast.Expr) and ctx.bridge.alone_on_line(m.parent(sp))):
            return [ctx.block(sp, "DDP104", "mp.spawn in a form dp2ddp cannot redirect to torchrun; migrate the launch by hand")]
    # attribute stores of the adapted arguments after they are made: they get the env value too
    for origin, items in plan.adapter.items():
        attrs = {a: n for a, v in items for n, t in _ENV.items() if t == v}  # option -> the init argument it feeds
        plan.overrides.extend((a, attrs[attr]) for a, attr in option_stores(m, origin, attrs))
    derived = env_decided(m, {origin: {a for a, _ in items} for origin, items in plan.adapter.items()})
    for init in inits:
        for test, branch in activation_tests(m, init):
            if spellings(m, test) & derived:
                plan.env_switched.append((test, branch))
                continue
            if any(isinstance(n, ast.Call) for n in ast.walk(test)):
                return [ctx.block(test, "DDP104", f"the distributed path is switched on by `{m.source(test)}`, which torchrun's environment does not decide; switch it on from RANK/WORLD_SIZE by hand")]
            plan.predicates.append((test, branch))
    if not (plan.adapter or local_rank_arguments(m) or spawn_targets or rank_env_reads(m)):
        out.append(
            ctx.block(
                inits[0],
                "DDP104",
                "dp2ddp cannot tell what switches this script's distributed path on (no --local_rank argument, no "
                "RANK/LOCAL_RANK/WORLD_SIZE read, no init_process_group argument it can set)",
            )
        )
    plan.spawn_targets = spawn_targets
    ctx.provide(plan)
    return out


# --------------------------------------------------------------------------- the edits


def propose(ctx: Context) -> List[Finding]:
    if ctx.mode != "mixed":
        return []
    m = ctx.m
    from dp2ddp.model.gathers import unsummed_gathers

    for node, where in unsummed_gathers(m):
        # the migration switches the script's own distributed path on: its gather would then run
        return [ctx.block(node, "DDP188", (
            f"the script's distributed path gathers with a backward that returns this rank's slice of its own "
            f"gradient, summed over no rank ({where}): every rank computes the loss of the whole gathered batch, so "
            "under DDP every gradient through that gather would be 1/world of the original's; sum the gradients over "
            "the ranks before slicing (dist.all_reduce, or torch.distributed.nn.functional.all_gather), then migrate"))]
    plan = ctx.need(MixedPlan)
    out: List[Finding] = []
    os_ = ctx.name("os")
    torch = ctx.name("torch")
    cuda = f"{torch}.cuda.is_available()"
    # (--local_rank defaults to torchrun's LOCAL_RANK: dp2ddp.codemods.local_rank_flag, in every mode)
    # arguments set from torchrun's environment right after parsing
    for stmt, items in plan.adapter.items():
        ns = m.source(stmt.targets[0].elts[0] if isinstance(stmt.targets[0], ast.Tuple) else stmt.targets[0])  # type: ignore[attr-defined]
        lines = [f'if "LOCAL_RANK" in {os_}.environ:  # dp2ddp: started by torchrun: rank and world size come from it']
        seen = set()
        for attr, value in items:
            if attr in seen:
                continue
            seen.add(attr)
            if value == "backend":
                lines.append(f'    {ns}.{attr} = "nccl" if {cuda} else "gloo"')
            else:
                lines.append(f"    {ns}.{attr} = {value.format(os=os_)}")
        lines.append(f"    if {cuda}:")
        lines.append(f'        {torch}.cuda.set_device(int({os_}.environ["LOCAL_RANK"]))')
        block = ctx.stmt("\n".join(lines) + "\n")
        out.append(ctx.note(stmt, "DDP121", f"{ns}: rank, world size and init method come from torchrun's environment", [InsertAfter(ctx.bridge.statement(stmt), (block,))]))
    # literal init methods
    for kind, node in plan.edits_nodes:
        if kind == "literal_init_method":
            out.append(ctx.note(node, "DDP121", "init_method is env:// under torchrun",
                                [Replace(ctx.cst(node), ctx.expr('"env://" if "LOCAL_RANK" in {os}.environ else {v}', os=os_, v=node))]))
    for init in m.calls(INIT):
        out.extend(init_call(ctx, init, cuda))
    for call in m.calls(CUDA_SET_DEVICE):
        f = guard_set_device(ctx, call, cuda)
        if f is not None:
            out.append(f)
    ensured = set()
    out.extend(apex_ddp(ctx))
    for call in m.calls(APEX_DDP):
        out.extend(ensure_wrapped(ctx, call, ensured))
    for call in m.calls(DDP):
        f = ddp_devices(ctx, call, cuda)
        if f is not None:
            out.append(f)
        out.extend(ensure_wrapped(ctx, call, ensured))
    for target, sp in ctx.need(MixedPlan).spawn_targets.items():
        f = _spawn(ctx, target, sp)
        if f is not None:
            out.append(f)
    for assign, name in plan.overrides:
        env = _ENV[name].format(os=os_)
        value = assign.value
        if env_read(m, value):
            continue  # already torchrun's value
        text = m.source(value)
        if not isinstance(value, (ast.Name, ast.Attribute, ast.Call, ast.Constant, ast.Subscript)):
            text = f"({text})"
        out.append(ctx.note(assign, "DDP121", f"{m.source(assign.targets[0])}: torchrun's {name.replace('_', ' ')} when it started this process",
                            [Replace(ctx.cst(value), ctx.expr('{e} if "LOCAL_RANK" in {os}.environ else {v}', e=env, os=os_, v=text))]))
    # each test on the way to init_process_group gets the polarity of its own branch; the
    # same test elsewhere (``if args.distributed:`` around the sampler) the polarity of the
    # innermost one (the first found)
    for node, branch in switch_tests(m, plan.predicates):
        if branch == "body":
            new = ctx.expr('{t} or "LOCAL_RANK" in {os}.environ', t=paren(m, node), os=os_)
        else:
            new = ctx.expr('{t} and "LOCAL_RANK" not in {os}.environ', t=paren(m, node), os=os_)
        out.append(ctx.note(node, "DDP121", f"`{m.source(node)}` switches the distributed path on; under torchrun it is on", [Replace(ctx.cst(node), new)]))
    out.extend(cuda_call(ctx, call, cuda) for call in cuda_calls(m))
    out.extend(ctx.note(node, "DDP121", "the CUDA assertion holds only with CUDA (the distributed path runs on CPU too)",
                        [Replace(ctx.cst(node.test), ctx.expr("not {c} or {t}", c=cuda, t=paren(m, node.test)))]) for node in cuda_asserts(m))
    out.extend(cuda_device(ctx, node, kind, cuda) for node, kind in rank_devices(m))
    out.extend(master_env(ctx, assign) for assign in master_env_stores(m) if ctx.bridge.alone_on_line(assign))
    return out


def _spawn(ctx: Context, target: ast.AST, sp: ast.Call) -> Optional[Finding]:
    m = ctx.m
    plan = ctx.need(MixedPlan)
    if any((c.attr, "False") in {x for items in plan.adapter.values() for x in items} for c in spawn_flags(m, sp)):
        return None  # the spawning flag is switched off under torchrun
    stmt = m.parent(sp)
    os_ = ctx.name("os")
    spawn = next(s for s in launch_spawns(m) if s.call is sp)
    call_args = [f'int({os_}.environ["LOCAL_RANK"])']
    passed = spawn_parameters(m, spawn, target)
    if passed is not None:
        for pname, el in passed:
            if pname is not None and "world" in pname.lower():
                call_args.append(f'int({os_}.environ["WORLD_SIZE"])')
            else:
                call_args.append(m.source(el))
    elif spawn.args is not None:
        call_args.append("*" + m.source(spawn.args))
    text = (
        f'if "LOCAL_RANK" in {os_}.environ:  # dp2ddp: torchrun started this process: run the worker here\n'
        f"    {target.name}({', '.join(call_args)})\n"  # type: ignore[attr-defined]
        f"else:\n    pass\n"
    )
    new = ctx.stmt(text)
    node = ctx.bridge.statement(stmt)

    def wrap(u, new=new):
        inner = u.with_changes(leading_lines=())
        orelse = new.orelse.with_changes(body=new.orelse.body.with_changes(body=[inner]))
        return new.with_changes(orelse=orelse, leading_lines=u.leading_lines)

    return ctx.note(sp, "DDP121", f"under torchrun, {target.name}() runs in this process instead of mp.spawn", [Replace(node, wrap)])  # type: ignore[attr-defined]


__all__ = ["detect_mode", "propose"]
