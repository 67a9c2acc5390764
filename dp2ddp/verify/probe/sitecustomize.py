"""dp2ddp verify probe loader (put on PYTHONPATH by `dp2ddp verify`; never import it yourself).

Activates the probe in the processes verify means to measure, then hands over to any
other ``sitecustomize`` further down ``sys.path`` so the user's environment still works.
"""
import os
import sys


def _dp2ddp_activate():
    role = os.environ.get("DP2DDP_VERIFY_ROLE")
    if not role:
        return  # not a verify run
    import _dp2ddp_verify_probe

    if os.environ.get("DP2DDP_VERIFY_ACTIVE") or (role == "migrated" and "LOCAL_RANK" not in os.environ):
        # a child of a probed process (a spawned DataLoader worker, a subprocess) or the
        # torchrun agent: not measured, but the user's files are guarded there too
        _dp2ddp_verify_probe.guard()
        return
    _dp2ddp_verify_probe.activate(role)


def _dp2ddp_chain():
    here = os.path.dirname(os.path.abspath(__file__))
    import importlib.machinery
    import importlib.util

    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    _dp2ddp_activate()
except Exception as e:  # the probe must never break the user's script
    sys.stderr.write("dp2ddp verify: probe failed to start: %r\n" % (e,))
_dp2ddp_chain()
