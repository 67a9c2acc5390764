"""Test harness only (tests/test_behaviour.py): facts from outside the script under test.

* ``CHECK ddp-at-first-step <rank> <bool>``: whether a DistributedDataParallel object
  exists when the first optimizer step runs;
* ``CHECK params <rank> <sha1>``: a hash of the parameters the first optimizer updates (its
  groups at exit: one added mid-training counts), at exit (equal on every rank when the
  replicas are in sync).

It also gives gloo worker threads time to finish before the interpreter finalizes (the
torch 2.13 exit race, as tests/exit_race_guard does)."""

import atexit
import os
import sys
import time

_state = {"first": True, "params": None}


def _emit(name, value):
    sys.stderr.write(f"CHECK {name} {os.environ.get('RANK', '-')} {value}\n")
    sys.stderr.flush()


def _install():
    try:
        from torch.optim.optimizer import register_optimizer_step_pre_hook
    except Exception:  # pragma: no cover - torch missing
        return

    def pre(optimizer, args, kwargs):
        if _state["first"]:
            _state["first"] = False
            import gc

            from torch.nn.parallel import DistributedDataParallel

            _emit("ddp-at-first-step", any(isinstance(o, DistributedDataParallel) for o in gc.get_objects()))
            _state["params"] = [p for g in optimizer.param_groups for p in g["params"]]
            _state["optimizer"] = optimizer  # its groups at exit: a group added later counts too

    register_optimizer_step_pre_hook(pre)


def _finish():
    params = _state["params"]
    optimizer = _state.get("optimizer")
    if optimizer is not None:
        params = [p for g in optimizer.param_groups for p in g["params"]]
    if params:
        import hashlib

        h = hashlib.sha1()
        for p in params:
            h.update(p.detach().cpu().contiguous().numpy().tobytes())
        _emit("params", h.hexdigest())
    if "torch.distributed" in sys.modules:
        time.sleep(0.2)


if os.environ.get("DP2DDP_BEHAVIOUR_PROBE") == "1":
    _install()
atexit.register(_finish)
