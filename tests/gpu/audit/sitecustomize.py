"""GPU test harness only (tests/gpu): notes what a script does with CUDA and the process group.

Put first on ``PYTHONPATH`` with ``$DP2DDP_GPU_AUDIT`` naming a folder; each process whose
``torch.distributed`` or DDP was used writes ``<pid>.json`` there at exit: the backend and
``device_id`` each ``init_process_group`` was given, the device of every module
``DistributedDataParallel`` wrapped with its ``device_ids``, whether CUDA was initialised and
its peak memory. Then hands over to the next ``sitecustomize`` on ``sys.path`` (the exit-race
guard), as the verify probe's loader does.
"""
import atexit
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys

_OUT = os.environ.get("DP2DDP_GPU_AUDIT")
_REC = {"pid": os.getpid(), "argv": sys.argv[:1], "rank": os.environ.get("RANK"), "init": [], "ddp": [], "dp": []}


def _patch_distributed(module):
    real = module.init_process_group

    def init_process_group(*args, **kwargs):
        backend = kwargs.get("backend", args[0] if args else None)
        device_id = kwargs.get("device_id")
        _REC["init"].append({"backend": str(backend) if backend is not None else None,
                             "device_id": str(device_id) if device_id is not None else None})
        return real(*args, **kwargs)

    module.init_process_group = init_process_group


def _patch_ddp(module):
    cls = module.DistributedDataParallel
    real = cls.__init__

    def __init__(self, mod, *args, **kwargs):
        params = [p for p in mod.parameters()]
        device_ids = kwargs.get("device_ids", args[0] if args else None)
        _REC["ddp"].append({"param_device": str(params[0].device) if params else None,
                            "devices": sorted({str(p.device) for p in params}),
                            "device_ids": [str(d) for d in device_ids] if device_ids is not None else None})
        return real(self, mod, *args, **kwargs)

    cls.__init__ = __init__


def _patch_dp(module):
    cls = module.DataParallel
    real = cls.__init__

    def __init__(self, mod, *args, **kwargs):
        _REC["dp"].append({"devices": sorted({str(p.device) for p in mod.parameters()})})
        return real(self, mod, *args, **kwargs)

    cls.__init__ = __init__


_WANT = {"torch.distributed": _patch_distributed, "torch.nn.parallel.distributed": _patch_ddp,
         "torch.nn.parallel.data_parallel": _patch_dp}


class _After(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name not in _WANT:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                loader, patch = spec.loader, _WANT[name]
                real_exec = loader.exec_module

                def exec_module(module, _real=real_exec, _patch=patch):
                    _real(module)
                    _patch(module)

                loader.exec_module = exec_module
                return spec
        return None


def _write():
    torch = sys.modules.get("torch")
    if torch is None:
        return
    try:
        _REC["cuda_initialized"] = bool(torch.cuda.is_initialized())
        if _REC["cuda_initialized"]:
            _REC["peak_allocated"] = torch.cuda.max_memory_allocated()
    except Exception as e:  # noqa: BLE001 - a report, never a failure of the script
        _REC["cuda_error"] = repr(e)
    with open(os.path.join(_OUT, f"{os.getpid()}.json"), "w") as f:
        json.dump(_REC, f)


if _OUT:
    sys.meta_path.insert(0, _After())
    atexit.register(_write)


def _chain():
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_chain()
