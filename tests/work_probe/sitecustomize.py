"""Test and benchmark harness only (tests/test_work.py, benchmarks/bench_work.py): what a
run does, counted from outside the script under test.

With ``DP2DDP_WORK_OUT=<folder>`` each process writes ``<folder>/rank<RANK>.json`` at exit:

* ``steps``: optimizer steps (``register_optimizer_step_pre_hook``);
* ``reductions``: gradient all-reduces DDP launched (a communication hook registered on every
  ``DistributedDataParallel`` as it is built counts its first bucket: one per synchronising
  backward pass), ``buckets``: every bucket it reduced;
* ``samples`` / ``forwards``: the batch size (dimension ``DP2DDP_WORK_DIM``, default 0, of the
  first tensor argument) and number of the training forwards of DDP or DataParallel wrappers;
  ``eval_samples`` / ``eval_forwards``: the same of their forwards with gradients off
  (evaluation);
* ``train_s``: seconds from the first training forward to the last optimizer step, and
  ``train_cpu_s``: the CPU time this process used in that span (less sensitive to what
  else the machine runs);
* ``params``: a hash of the parameters the first optimizer updates, at exit; the
  parameters themselves go to ``<folder>/rank<RANK>.pt``.

It also gives gloo worker threads time to finish before the interpreter finalizes (the
torch 2.13 exit race, as tests/exit_race_guard does).
"""

import atexit
import json
import os
import sys
import time

_out = os.environ.get("DP2DDP_WORK_OUT")
_facts = {"steps": 0, "reductions": 0, "buckets": 0, "samples": 0, "forwards": 0, "eval_samples": 0, "eval_forwards": 0}
_times = {"first": None, "last": None, "first_cpu": None, "last_cpu": None}
_state = {"params": None}


def _first_tensor(obj):
    import torch

    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, (list, tuple)):
        for o in obj:
            t = _first_tensor(o)
            if t is not None:
                return t
    if isinstance(obj, dict):
        for o in obj.values():
            t = _first_tensor(o)
            if t is not None:
                return t
    return None


def _install():
    import torch
    from torch.nn.parallel import DataParallel, DistributedDataParallel
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    dim = int(os.environ.get("DP2DDP_WORK_DIM", "0"))

    def pre(optimizer, args, kwargs):
        _facts["steps"] += 1
        _times["last"] = time.perf_counter()
        _times["last_cpu"] = time.process_time()
        if _state["params"] is None:
            _state["params"] = [p for g in optimizer.param_groups for p in g["params"]]

    register_optimizer_step_pre_hook(pre)

    def counting(forward):
        def wrapped(self, *inputs, **kwargs):
            if self.training and torch.is_grad_enabled():
                t = _first_tensor((inputs, kwargs))
                if t is not None and t.dim() > dim:
                    _facts["samples"] += t.size(dim)
                _facts["forwards"] += 1
                if _times["first"] is None:
                    _times["first"] = time.perf_counter()
                    _times["first_cpu"] = time.process_time()
            elif not torch.is_grad_enabled():
                t = _first_tensor((inputs, kwargs))
                if t is not None and t.dim() > dim:
                    _facts["eval_samples"] += t.size(dim)
                _facts["eval_forwards"] += 1
            return forward(self, *inputs, **kwargs)

        return wrapped

    DistributedDataParallel.forward = counting(DistributedDataParallel.forward)
    DataParallel.forward = counting(DataParallel.forward)

    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def hook(state, bucket):
        _facts["buckets"] += 1
        if bucket.index() == 0:
            _facts["reductions"] += 1
        return allreduce_hook(None, bucket)

    init = DistributedDataParallel.__init__

    def ddp_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.register_comm_hook(None, hook)

    DistributedDataParallel.__init__ = ddp_init


def _finish():
    if _out and (any(_facts.values()) or "RANK" in os.environ):  # not torchrun's own process
        import hashlib

        facts = dict(_facts)
        params = _state["params"]
        if params:
            import torch

            h = hashlib.sha1()
            for p in params:
                h.update(p.detach().cpu().contiguous().numpy().tobytes())
            facts["params"] = h.hexdigest()
            os.makedirs(_out, exist_ok=True)
            torch.save([p.detach().cpu() for p in params], os.path.join(_out, f"rank{os.environ.get('RANK', '-')}.pt"))
        if _times["first"] is not None and _times["last"] is not None:
            facts["train_s"] = _times["last"] - _times["first"]
            facts["train_cpu_s"] = _times["last_cpu"] - _times["first_cpu"]
        os.makedirs(_out, exist_ok=True)
        with open(os.path.join(_out, f"rank{os.environ.get('RANK', '-')}.json"), "w") as f:
            json.dump(facts, f)
    if "torch.distributed" in sys.modules:
        time.sleep(0.2)


if _out:
    _install()
atexit.register(_finish)
