"""The facts about a script's own distributed path that the mixed-script migration asks
(dp2ddp/model/own_path.py, dp2ddp/model/cuda_only.py, dp2ddp/model/ranks.py), on small scripts."""

from __future__ import annotations

import ast
import textwrap

from dp2ddp.model.core import build
from dp2ddp.model.cuda_only import cuda_asserts, cuda_calls, cuda_device_arguments, cuda_test, rank_devices, under_cuda_test
from dp2ddp.model.names import INIT, SPAWN
from dp2ddp.model.own_path import (
    activation_tests,
    env_decided,
    init_arguments,
    init_source,
    master_env_stores,
    namespace_origin,
    option_stores,
    parsed_namespaces,
    rank_env_reads,
    spawn_flags,
    spellings,
    switch_tests,
    wrap_assignments,
)
from dp2ddp.model.ranks import local_rank_arguments, local_rank_dest


def _m(src: str):
    return build(textwrap.dedent(src))


def _init(m):
    (call,) = m.calls(INIT)
    return call


def _src(m, node):
    return None if node is None else m.source(node)


# --------------------------------------------------------------------------- init_process_group


def test_init_arguments_by_position_and_keyword():
    m = _m("""
        import datetime, torch.distributed as dist
        dist.init_process_group("nccl", "tcp://h:1", datetime.timedelta(60), world_size=ws, rank=r)
    """)
    got = {k: m.source(v) for k, v in init_arguments(m, _init(m)).items()}
    assert got == {"backend": '"nccl"', "init_method": '"tcp://h:1"', "timeout": "datetime.timedelta(60)",
                   "world_size": "ws", "rank": "r"}


def test_init_arguments_leave_defaults_out():
    m = _m("""
        import torch.distributed as dist
        dist.init_process_group(backend="gloo")
    """)
    got = init_arguments(m, _init(m))
    assert list(got) == ["backend"] and m.source(got["backend"]) == '"gloo"'


def test_init_arguments_none_where_the_call_does_not_bind():
    """Unpacked arguments, or a call Python itself rejects (``backend`` twice)."""
    for args in ("**kw", "*xs", '"nccl", backend="gloo"', "a, b, c, d, e, f, g, h, i, j, k"):
        m = _m(f"import torch.distributed as dist\ndist.init_process_group({args})\n")
        assert init_arguments(m, _init(m)) is None, args


def test_init_arguments_over_lines():
    m = _m("""
        import torch.distributed as dist
        def main(args):
            dist.init_process_group(
                args.backend,  # the backend
                device_id=args.gpu,
                rank=args.rank,
            )
    """)
    got = {k: m.source(v) for k, v in init_arguments(m, _init(m)).items()}
    assert got == {"backend": "args.backend", "rank": "args.rank", "device_id": "args.gpu"}


def test_init_sources():
    m = _m("""
        import os, argparse, torch.distributed as dist
        p = argparse.ArgumentParser()
        args = p.parse_args()
        def main():
            rank = args.nr * 8 + 1
            dist.init_process_group("nccl", init_method="tcp://10.0.0.1:1", world_size=args.world_size, rank=rank)
        def other():
            dist.init_process_group(init_method="env://", world_size=int(os.environ["WORLD_SIZE"]), rank=2)
        def third(n):
            dist.init_process_group(world_size=n * 2)
    """)
    first, second, third = m.calls(INIT)
    kinds = {(i, name): init_source(m, call, name) for i, call in enumerate((first, second, third))
             for name in ("init_method", "world_size", "rank")}
    assert kinds[0, "init_method"].kind == "address"
    ws = kinds[0, "world_size"]
    assert ws.kind == "option" and m.source(ws.origin) == "args = p.parse_args()"
    rank = kinds[0, "rank"]
    assert rank.kind == "assigned" and [m.source(a) for a in rank.assigns] == ["rank = args.nr * 8 + 1"]
    assert kinds[1, "init_method"].kind == "environment"
    assert kinds[1, "world_size"].kind == "environment"
    assert kinds[1, "rank"].kind == "literal"
    assert kinds[2, "world_size"].kind == "computed"
    assert kinds[2, "init_method"] is None and kinds[2, "rank"] is None


def test_init_source_of_a_spawned_workers_parameter():
    """A parameter of a function ``mp.spawn`` starts is the spawn's to pass; the same
    parameter of a function nobody spawns is computed by the script."""
    src = """
        import torch.distributed as dist, torch.multiprocessing as mp
        def worker(i, world):
            dist.init_process_group("gloo", world_size=world, rank=i)
        {launch}
    """
    spawned = _m(src.format(launch="mp.spawn(worker, args=(2,), nprocs=2)"))
    assert init_source(spawned, _init(spawned), "world_size").kind == "worker"
    called = _m(src.format(launch="worker(0, 2)"))
    assert init_source(called, _init(called), "world_size").kind == "computed"


# --------------------------------------------------------------------------- parsed arguments


def test_namespace_origin_through_a_function_and_a_spawn():
    m = _m("""
        import argparse, torch.multiprocessing as mp
        def get_args():
            return argparse.ArgumentParser().parse_args()
        def worker(gpu, ngpus, args):
            print(args.world_size)
        def main():
            args = get_args()
            mp.spawn(worker, args=(2, args), nprocs=2)
    """)
    (attr,) = [a for a in m.nodes(ast.Attribute) if a.attr == "world_size"]
    assert m.source(namespace_origin(m, attr)) == "args = get_args()"


def test_namespace_origin_none_where_two_statements_make_it():
    m = _m("""
        import argparse
        p = argparse.ArgumentParser()
        args = p.parse_args() if True else None
        print(args.rank)
    """)
    (attr,) = [a for a in m.nodes(ast.Attribute) if a.attr == "rank"]
    assert namespace_origin(m, attr) is None


def test_option_stores_of_one_namespace():
    m = _m("""
        import argparse
        args = argparse.ArgumentParser().parse_args()
        other = object()
        args.world_size = 4
        args.rank = 1
        other.world_size = 3
        args.world_size, x = 1, 2
    """)
    origin = m.nodes(ast.Assign)[0]
    got = [(m.source(a), attr) for a, attr in option_stores(m, origin, ["world_size"])]
    assert got == [("args.world_size = 4", "world_size")]


def test_parsed_namespaces():
    m = _m("""
        import argparse
        p = argparse.ArgumentParser()
        opt, unknown = p.parse_known_args()
        cfg = p.parse_args()
    """)
    assert parsed_namespaces(m) == {"opt", "cfg"}
    assert parsed_namespaces(_m("x = 1\n")) == {"args"}


# --------------------------------------------------------------------------- what switches the path on


def test_activation_tests_through_the_one_call_of_the_function():
    """BasicSR: the init sits in a helper that one branch calls."""
    m = _m("""
        import torch.distributed as dist
        def init_dist():
            if use_env:
                dist.init_process_group("nccl")
        def main(args):
            if args.launcher == "none":
                pass
            else:
                init_dist()
        if __name__ == "__main__":
            main(None)
    """)
    got = [(m.source(t), b) for t, b in activation_tests(m, _init(m))]
    assert got == [("use_env", "body"), ('args.launcher == "none"', "orelse")]


def test_activation_tests_pass_a_lambda():
    m = _m("""
        import torch.distributed as dist
        if args.dist_on:
            start = lambda: dist.init_process_group("nccl")
    """)
    assert [m.source(t) for t, _ in activation_tests(m, _init(m))] == ["args.dist_on"]


def test_spawn_flags():
    m = _m("""
        import torch.multiprocessing as mp
        def main(args, cfg):
            if cfg.enabled and args.x:
                if args.multiprocessing_distributed:
                    mp.spawn(main, nprocs=2)
    """)
    (spawn,) = m.calls(SPAWN)
    assert [m.source(f) for f in spawn_flags(m, spawn)] == ["args.multiprocessing_distributed"]


def test_env_decided_follows_assignments_to_a_fixpoint():
    m = _m("""
        import os, argparse
        p = argparse.ArgumentParser()
        p.add_argument("--local_rank", dest="lr", type=int, default=-1)
        args = p.parse_args()
        world = int(os.environ.get("WORLD_SIZE", 1))
        distributed = world > 1
        args.distributed = args.lr != -1
        single = args.config == "one"
        flip = world > 1
        if args.config:
            flip = False
    """)
    got = env_decided(m, {})
    assert {"args.lr", "world", "distributed", "args.distributed"} <= got
    assert "single" not in got and "flip" not in got  # flip: one assignment does not read the environment


def test_env_decided_counts_the_adapted_options():
    m = _m("""
        import argparse
        args = argparse.ArgumentParser().parse_args()
        on = args.world_size > 1
    """)
    origin = m.nodes(ast.Assign)[0]
    assert "on" not in env_decided(m, {})
    assert {"args.world_size", "on"} <= env_decided(m, {origin: {"world_size"}})


def test_spellings_and_rank_env_reads():
    m = _m("""
        import os
        a = os.environ["LOCAL_RANK"]
        b = os.getenv("WORLD_SIZE")
        c = os.environ.get("rank", 0)
        if args.local_rank != -1 and on:
            pass
    """)
    assert [m.source(n) for n in rank_env_reads(m)] == ['os.environ["LOCAL_RANK"]', 'os.environ.get("rank", 0)']
    assert spellings(m, m.nodes(ast.If)[0].test) == {"args.local_rank", "args", "on"}


def test_local_rank_dest():
    m = _m("""
        import argparse
        p = argparse.ArgumentParser()
        p.add_argument("--local_rank", type=int, dest="gpu_index")
        p.add_argument("--local-rank", type=int, default=0)
    """)
    assert [local_rank_dest(call) for call, _flag, _env in local_rank_arguments(m)] == ["gpu_index", "local_rank"]


# --------------------------------------------------------------------------- CUDA on the distributed path


def test_cuda_tests_and_what_they_guard():
    m = _m("""
        import torch
        if torch.cuda.is_available():
            a = x.cuda()
        if not torch.cuda.is_available():
            b = x.cuda()
        else:
            c = x.cuda()
        d = x.cuda() if args.cuda else x
        e = use_gpu and x.cuda()
        if device == "cuda" and n > 1:
            f = x.cuda()
        if n > 1:
            g = x.cuda()
        def helper():
            h = x.cuda()
    """)
    guarded = {}
    for a in m.nodes(ast.Assign):  # the x.cuda() call of each assignment
        call = next(n for n in ast.walk(a.value) if isinstance(n, ast.Call) and m.source(n) == "x.cuda()")
        guarded[m.source(a.targets[0])] = under_cuda_test(m, call)
    assert guarded == {"a": True, "b": False, "c": True, "d": True, "e": True, "f": True, "g": False, "h": False}
    assert cuda_test(m, ast.parse("torch.cuda.is_available() and ok", mode="eval").body)
    assert not cuda_test(m, ast.parse("torch.cuda.is_available() or ok", mode="eval").body)


def test_cuda_calls_outside_a_cuda_test():
    m = _m("""
        import torch
        model.cuda()
        batch[0].cuda()
        make().cuda()
        torch.zeros(1).cuda()
        if torch.cuda.is_available():
            self.net.cuda()
    """)
    assert [m.source(c) for c in cuda_calls(m)] == ["model.cuda()", "batch[0].cuda()"]


def test_cuda_asserts_and_rank_devices():
    m = _m("""
        import torch
        assert torch.cuda.device_count() > rank
        assert rank >= 0
        d1 = torch.device("cuda", rank)
        d2 = torch.device("cuda:%d" % rank)
        d3 = f"cuda:{rank}"
        d4 = "cuda:{}".format(rank)
        d5 = torch.device("cpu")
        if torch.cuda.is_available():
            assert torch.cuda.is_available()
            d6 = torch.device("cuda", rank)
    """)
    assert [m.source(a.test) for a in cuda_asserts(m)] == ["torch.cuda.device_count() > rank"]
    assert [(m.source(n), kind) for n, kind in rank_devices(m)] == [
        ('torch.device("cuda", rank)', "device"),  # not torch.device("cuda:%d" % rank): neither it nor its string
        ('f"cuda:{rank}"', "string"),
        ('"cuda:{}".format(rank)', "string"),
    ]


def test_cuda_device_arguments_of_a_wrap():
    m = _m("""
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        a = DDP(net, device_ids=[rank], output_device=rank)
        b = DDP(net, device_ids=None, output_device=rank if torch.cuda.is_available() else None)
    """)
    a, b = [asg.value for asg in m.nodes(ast.Assign)]
    assert [m.source(v) for v in cuda_device_arguments(m, a)] == ["[rank]", "rank"]
    assert cuda_device_arguments(m, b) == []


# --------------------------------------------------------------------------- its own wraps and settings


def test_switch_tests_wherever_the_script_repeats_them():
    m = _m("""
        if args.distributed:
            init()
        sampler = make() if args.distributed else None
        while args.distributed:
            break
        x = [args.distributed]
        if not args.local:
            pass
        else:
            init()
        if not args.local:
            pass
    """)
    first, second, _ = m.nodes(ast.If)
    got = [(m.source(t), b, m.position(t)[0]) for t, b in switch_tests(m, [(first.test, "body"), (second.test, "orelse")])]
    assert got == [("args.distributed", "body", 2), ("args.distributed", "body", 4), ("args.distributed", "body", 5),
                   ("not args.local", "orelse", 8), ("not args.local", "orelse", 12)]
    assert switch_tests(m, []) == []


def test_wrap_assignments_follow_a_helper_to_its_call_sites():
    m = _m("""
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        def smart_DDP(model):
            return DDP(model)
        def train(cuda, rank):
            if cuda and rank == -1:
                model = torch.nn.DataParallel(model)
            elif cuda:
                model = smart_DDP(model)
            for _ in range(2):
                if rank != -1:
                    ema = smart_DDP(ema)
            print(smart_DDP(model))
    """)
    (wrap,) = [c for c in m.nodes(ast.Call) if m.source(c.func) == "DDP"]
    got = [(m.source(a), top and m.position(top)[0]) for a, top in wrap_assignments(m, wrap)]
    assert got == [("model = smart_DDP(model)", 7), ("ema = smart_DDP(ema)", 12)]


def test_master_env_stores():
    m = _m("""
        import os
        os.environ["MASTER_ADDR"] = "localhost"
        os.environ["MASTER_PORT"] = str(port)
        os.environ["NCCL_DEBUG"] = "INFO"
        env["MASTER_PORT"] = "1"
    """)
    assert [m.position(a)[0] for a in master_env_stores(m)] == [3, 4]
