"""DataParallel (1 GPU) against the migration's DistributedDataParallel (1 NCCL process) on a
GPU, and the `dp2ddp verify` probe's cost per step there.

Targets: **DDP(1 process) >= 0.98x DP(1 GPU)** in samples/s; **probe <= 2 %** of a step.

One process, launched under ``torchrun --standalone --nproc_per_node=1`` with the probe
loaded as ``dp2ddp verify`` loads it, trains each workload three ways in turn, on the same
device and at the same moment:

* ``dp``: ``nn.DataParallel(model)`` (all visible GPUs: here one), as the original script;
* ``ddp``: ``DistributedDataParallel(copy, device_ids=[torch.cuda.current_device()])`` after
  ``init_process_group("nccl", device_id=...)``, as the migrated script does, the probe's
  hooks taken out (the real functions put back);
* ``ddp+probe``: the same DDP model with the probe's hooks in place (backward, the
  DataLoader's ``__next__`` and ``_next_index``, the optimizer step hook: the pinned-memory
  copy of every loss, the index record).

Each measured group runs one block of every arm (``--block`` steps, more where a step is
short: at least ``--block-s`` seconds), the arms' order
rotated from group to group (so a drift of clocks or temperature hits all alike); a block
is timed between two ``torch.cuda.synchronize()``. Reported per workload: samples/s of each
arm (median block), the speed-up ddp/dp and the probe's overhead (ddp+probe / ddp - 1),
each the median of the per-group ratios with a 95 % interval (t over groups).

Workloads (synthetic data already on the device, fed through a DataLoader of indices so that
the probe's loader hooks run): ``resnet50``, a ResNet-50-shaped CNN (bottleneck blocks
3-4-6-3, 25.6 M parameters) on 3x224x224 images, batch 64; ``transformer``, a 6-layer
encoder language model (d 512, 8 heads, ff 2048, vocabulary 8192) on sequences of 256
tokens, batch 32. Each in fp32 and in bf16 autocast (``amp``).

    python benchmarks/bench_gpu.py [--json benchmarks/results/gpu-<device>.json] [--groups 10] [--block 10]
    python benchmarks/bench_gpu.py --quick --device cpu   # the harness itself, on a CPU (tiny models, gloo)

Exit status 0 when both targets are met on every workload (the interval's median), 1 otherwise.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "dp2ddp" / "verify" / "probe"
DDP_TARGET = 0.98
PROBE_TARGET = 0.02
# --variants: DDP options the migration does not write, measured beside it to see what its cost is
VARIANTS = {"view": {"gradient_as_bucket_view": True}, "nobcast": {"broadcast_buffers": False},
            "static": {"static_graph": True}}


# --------------------------------------------------------------------------- the child


def _models(quick: bool):
    import torch.nn as nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            cout = width * 4
            self.body = nn.Sequential(
                nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout),
            )
            self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else nn.Identity())
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.relu(self.body(x) + self.skip(x))

    def resnet(blocks, base, classes=1000):
        layers = [nn.Conv2d(3, base, 7, 2, 3, bias=False), nn.BatchNorm2d(base), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
        cin = base
        for i, n in enumerate(blocks):
            width = base * 2 ** i
            for j in range(n):
                layers.append(Bottleneck(cin, width, 2 if j == 0 and i > 0 else 1))
                cin = width * 4
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
        return nn.Sequential(*layers)

    class LM(nn.Module):
        def __init__(self, vocab, d, heads, ff, depth):
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True, norm_first=True)
            self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
            self.head = nn.Linear(d, vocab)

        def forward(self, tokens):
            return self.head(self.encoder(self.embed(tokens)))

    if quick:  # the harness on a CPU: the same shapes of code, tiny
        return {
            "resnet50": (lambda: resnet([1, 1, 1, 1], 8, 10), "image", 8, (3, 32, 32), 10),
            "transformer": (lambda: LM(512, 64, 4, 128, 2), "tokens", 8, (32,), 512),
        }
    return {
        "resnet50": (lambda: resnet([3, 4, 6, 3], 64), "image", 64, (3, 224, 224), 1000),
        "transformer": (lambda: LM(8192, 512, 8, 2048, 6), "tokens", 32, (256,), 8192),
    }


def _probe_switch(torch):
    """``use(enabled)`` puts the probe's hooks in place or the real functions back (as
    benchmarks/bench_probe.py's in-process A/B does); None when the probe is not loaded."""
    import inspect

    from torch.optim import optimizer as optim_mod
    from torch.utils.data import dataloader

    probe = sys.modules.get("_dp2ddp_verify_probe")
    if probe is None or probe._S is None:
        return None
    hooks = optim_mod._global_optimizer_post_hooks
    key = next((k for k, v in hooks.items() if v is probe._on_step), None)
    if key is None:
        return None
    it_cls = dataloader._BaseDataLoaderIter
    on = (torch.autograd.backward, it_cls.__next__, it_cls._next_index)
    off = tuple(inspect.unwrap(f) for f in on)

    def use(enabled):
        torch.autograd.backward, it_cls.__next__, it_cls._next_index = on if enabled else off
        if enabled:
            hooks[key] = probe._on_step
        else:
            hooks.pop(key, None)

    return use


def child(args) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, TensorDataset

    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:  # as the migrated script's set-up does
        torch.cuda.set_device(local_rank)
        dist.init_process_group(backend="nccl", device_id=torch.device("cuda", local_rank))
        device = torch.device("cuda", local_rank)
        torch.backends.cudnn.benchmark = True
    else:
        dist.init_process_group(backend="gloo")
        device = torch.device("cpu")
    use_probe = _probe_switch(torch)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    results = {}
    precisions = [p for p in (["fp32", "amp"] if cuda else ["fp32"]) if not args.precisions or p in args.precisions]
    for name, (make, kind, batch, shape, classes) in _models(args.quick).items():
        if args.workloads and name not in args.workloads:
            continue
        batch = args.batch or batch
        for precision in precisions:
            torch.manual_seed(0)
            base = make().to(device)
            ids = [torch.cuda.current_device()] if cuda else None
            arms = {"dp": nn.DataParallel(copy.deepcopy(base)),
                    "ddp": DistributedDataParallel(copy.deepcopy(base), device_ids=ids)}
            for variant in args.variants:  # what DDP's own options change (not what the migration writes)
                arms[f"ddp:{variant}"] = DistributedDataParallel(copy.deepcopy(base), device_ids=ids, **VARIANTS[variant])
            del base
            opts = {k: torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9) for k, m in arms.items()}
            pool = batch * 4
            if kind == "image":
                xs = torch.randn(pool, *shape, device=device)
                ys = torch.randint(0, classes, (pool,), device=device)
            else:
                xs = torch.randint(0, classes, (pool, *shape), device=device)
                ys = torch.randint(0, classes, (pool, *shape), device=device)
            loaders = {k: DataLoader(TensorDataset(torch.arange(pool)), batch_size=batch, shuffle=True, drop_last=True)
                       for k in list(arms) + ["ddp+probe"]}
            iters = {k: iter(v) for k, v in loaders.items()}

            def step(arm):
                model, opt = arms["ddp" if arm == "ddp+probe" else arm], opts["ddp" if arm == "ddp+probe" else arm]
                try:
                    (idx,) = next(iters[arm])
                except StopIteration:
                    iters[arm] = iter(loaders[arm])
                    (idx,) = next(iters[arm])
                idx = idx.to(device, non_blocking=True)
                x, y = xs[idx], ys[idx]
                opt.zero_grad(set_to_none=True)
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "amp"):
                    out = model(x)
                    loss = F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), y.reshape(-1))
                loss.backward()
                opt.step()

            names = list(arms) + (["ddp+probe"] if use_probe else [])

            def block(arm, n):
                if use_probe:
                    use_probe(arm == "ddp+probe")
                sync()
                t0 = time.perf_counter()
                for _ in range(n):
                    step(arm)
                sync()
                return (time.perf_counter() - t0) / n

            for arm in names:  # warm-up: cudnn's search, the allocator, the first NCCL calls
                block(arm, args.warmup)
            # steps per block: at least --block, and enough for ~--block-s seconds (a short step's
            # blocks are otherwise at the mercy of the host's scheduling)
            steps = max(args.block, min(100, -(-args.block_s // block("dp", args.warmup))))
            steps = int(steps)
            times = {arm: [] for arm in names}
            for g in range(args.groups):
                order = names[g % len(names):] + names[:g % len(names)]
                for arm in order:
                    times[arm].append(block(arm, steps))
            if use_probe:
                use_probe(True)
            med = {arm: statistics.median(v) for arm, v in times.items()}
            per = batch
            res = {
                "batch": batch,
                "steps_per_block": steps,
                "step_ms": {arm: round(v * 1e3, 3) for arm, v in med.items()},
                "samples_per_s": {arm: round(per / v, 2) for arm, v in med.items()},
                "ddp_over_dp": _ratio_summary([d / t for d, t in zip(times["dp"], times["ddp"])]),
                "blocks_s": {arm: [round(v, 6) for v in vs] for arm, vs in times.items()},
            }
            for arm in names:
                if arm.startswith("ddp:"):
                    res[f"{arm}_over_dp"] = _ratio_summary([d / t for d, t in zip(times["dp"], times[arm])])
            if use_probe:
                res["probe_overhead"] = _ratio_summary([p / t - 1 for p, t in zip(times["ddp+probe"], times["ddp"])], ratio=False)
            if cuda:
                res["peak_memory_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
                torch.cuda.reset_peak_memory_stats()
            results[f"{name}-{precision}" + (f"-b{batch}" if args.batch else "")] = res
            print(f"{name}-{precision}: {json.dumps({k: res[k] for k in ('step_ms', 'ddp_over_dp')})}", flush=True)
            del arms, opts, xs, ys
            if cuda:
                torch.cuda.empty_cache()
    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "probe": bool(use_probe),
           "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
           "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
           "cudnn": torch.backends.cudnn.version() if cuda else None,
           "tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "tf32_cudnn": torch.backends.cudnn.allow_tf32}
    print("RESULT " + json.dumps({"env": env, "workloads": results}), flush=True)
    dist.destroy_process_group()


def _ratio_summary(values, ratio=True):
    """Median of per-group values and a 95 % interval: of the geometric mean for ratios (as
    verify's speed-up), of the mean for overheads (t over groups)."""
    import math

    sys.path.insert(0, str(ROOT))
    from dp2ddp.verify.speed import interval, t975

    if ratio:
        ci = interval(values)
    elif len(values) > 1:
        half = t975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
        ci = (statistics.fmean(values) - half, statistics.fmean(values) + half)
    else:
        ci = None
    return {"median": round(statistics.median(values), 5), "ci95": [round(v, 5) for v in ci] if ci else None,
            "groups": len(values)}


# --------------------------------------------------------------------------- the parent


def _nvidia_smi() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:
        return ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the results here (default: print only)")
    ap.add_argument("--groups", type=int, default=10, help="measured groups (one block of every arm each)")
    ap.add_argument("--block", type=int, default=10, help="steps per block")
    ap.add_argument("--block-s", type=float, default=0.3, help="at least this many seconds per block")
    ap.add_argument("--warmup", type=int, default=5, help="steps of every arm before the groups")
    ap.add_argument("--quick", action="store_true", help="tiny models: a check of the harness")
    ap.add_argument("--device", choices=["auto", "cpu"], default="auto", help="cpu: hide the GPUs")
    ap.add_argument("--variants", default="", help="comma-separated DDP options measured beside: " + ",".join(VARIANTS))
    ap.add_argument("--workloads", default="", help="comma-separated subset of resnet50,transformer")
    ap.add_argument("--precisions", default="", help="comma-separated subset of fp32,amp")
    ap.add_argument("--batch", type=int, default=0, help="batch size of every workload (default: each its own)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    args.workloads = [w for w in args.workloads.split(",") if w]
    args.precisions = [p for p in args.precisions.split(",") if p]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant {unknown[0]} (known: {', '.join(VARIANTS)})")
    if args.child:
        child(args)
        return 0
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a time limit's TERM: the child is still reaped
    env = {k: v for k, v in os.environ.items() if not k.startswith("DP2DDP_VERIFY")}
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    with tempfile.TemporaryDirectory() as out:
        env["PYTHONPATH"] = os.pathsep.join([str(PROBE), str(ROOT), env.get("PYTHONPATH", "")])
        env.update(DP2DDP_VERIFY_ROLE="migrated", DP2DDP_VERIFY_OUT=out, DP2DDP_VERIFY_STEPS="0", PYTHONUNBUFFERED="1")
        env.setdefault("OMP_NUM_THREADS", "4")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", __file__, "--child",
               "--groups", str(args.groups), "--block", str(args.block), "--warmup", str(args.warmup),
               "--block-s", str(args.block_s), "--batch", str(args.batch)]
        cmd += ["--quick"] if args.quick else []
        for flag in ("variants", "workloads", "precisions"):
            if getattr(args, flag):
                cmd += [f"--{flag}", ",".join(getattr(args, flag))]
        # the child's lines are passed on as they come: a run stopped by a time limit still
        # leaves the workloads it finished in the log
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
        lines = []
        try:
            for line in p.stdout:
                lines.append(line)
                if not line.startswith("RESULT"):
                    sys.stdout.write(line)
                    sys.stdout.flush()
            err = p.stderr.read()
            p.wait()
        finally:
            if p.poll() is None:
                os.killpg(p.pid, 9)
        if p.returncode:
            sys.stderr.write(err[-6000:])
            return 2
        stdout = "".join(lines)
        recorded = sum(1 for f in Path(out).glob("*.jsonl") for line in f.read_text().splitlines() if '"ev":"step"' in line)
    data = json.loads(next(x for x in stdout.splitlines() if x.startswith("RESULT"))[7:])
    data["command"] = "python benchmarks/bench_gpu.py " + " ".join(argv if argv is not None else sys.argv[1:])
    data["env"]["nvidia_smi"] = _nvidia_smi()
    data["env"]["python"] = platform.python_version()
    data["probe_steps_recorded"] = recorded
    data["targets"] = {"ddp_over_dp": DDP_TARGET, "probe_overhead": PROBE_TARGET}
    ok = True
    print(f"\n{data['env']['device']}  torch {data['env']['torch']}  CUDA {data['env']['cuda']}  "
          f"{args.groups} groups; a block per arm in each: >= {args.block} steps and >= {args.block_s:g} s")
    print(f"{'workload':<20} {'dp samples/s':>13} {'ddp samples/s':>14} {'ddp/dp (95% CI)':>26} {'probe overhead (95% CI)':>30}")
    for name, r in data["workloads"].items():
        sp, pr = r["ddp_over_dp"], r.get("probe_overhead")
        ci = sp["ci95"] or [float("nan")] * 2
        probe = (f"{pr['median'] * 100:+.2f} % ({pr['ci95'][0] * 100:+.2f}..{pr['ci95'][1] * 100:+.2f})"
                 if pr and pr["ci95"] else "-")
        print(f"{name:<20} {r['samples_per_s']['dp']:>13.1f} {r['samples_per_s']['ddp']:>14.1f} "
              f"{sp['median']:>9.4f} ({ci[0]:.4f}..{ci[1]:.4f}) {probe:>30}")
        for key, v in r.items():
            if key.startswith("ddp:") and key.endswith("_over_dp"):
                vci = v["ci95"] or [float("nan")] * 2
                print(f"  {key[:-8]:<18} {'':>13} {'':>14} {v['median']:>9.4f} ({vci[0]:.4f}..{vci[1]:.4f})")
        ok &= sp["median"] >= DDP_TARGET and (pr is None or pr["median"] <= PROBE_TARGET)
    print(f"targets: ddp/dp >= {DDP_TARGET}, probe <= {PROBE_TARGET:.0%}: {'met' if ok else 'NOT met'}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(data, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
