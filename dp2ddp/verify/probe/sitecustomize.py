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

    # only the folders after this one: the next sitecustomize down the path, not one above
    # it that handed over to this one
    at = [i for i, p in enumerate(sys.path) if os.path.abspath(p or ".") == here]
    rest = [p for p in sys.path[at[0] + 1 if at else 0:] if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


if not getattr(sys, "_dp2ddp_probe_site", False):
    # Once per process: another sitecustomize that hands over to "any other sitecustomize on
    # the path" (the realrun shim's) loads this one again, and each would load the other
    # until the recursion limit.
    sys._dp2ddp_probe_site = True
    try:
        _dp2ddp_activate()
    except Exception as e:  # the probe must never break the user's script
        sys.stderr.write("dp2ddp verify: probe failed to start: %r\n" % (e,))
    _dp2ddp_chain()
