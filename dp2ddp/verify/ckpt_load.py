"""Load checkpoints the way the user's own code would: run by verify as
``python -I ckpt_load.py JOBS.json`` in a fresh process -- no process group, neither dp2ddp
nor its probe importable, the run's copy of the project on ``sys.path`` -- never imported.

For each checkpoint it tries ``torch.load(path, map_location="cpu")`` with the installed
torch's defaults; if the original needs ``weights_only=False`` (it pickles whole modules),
both sides are loaded that way, as the original's own loading code must do. It writes one
JSON line per file: how it loaded (or why not), the structure (nested keys; tensors as
shape and dtype; a pickled module as its state_dict) and, where asked, the tensors
flattened into a weights-only file for verify to compare values.

This file is standard library plus torch; verify reads its output, nothing else.
"""

import json
import os
import re
import sys

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


class _NoDp2ddp:
    """Refuse dp2ddp and its probe: a checkpoint must load without them."""

    def find_spec(self, name, path=None, target=None):
        if name == "dp2ddp" or name.startswith("dp2ddp.") or name.startswith("_dp2ddp"):
            raise ImportError("%s is not available where the checkpoint is used" % name)
        return None


def _first_line(text):
    """The line of an error that says what failed (torch's weights-only refusal puts it
    after a paragraph of advice), without terminal colour codes."""
    lines = [x.strip() for x in ANSI.sub("", str(text)).strip().splitlines() if x.strip()]
    telling = [x for x in lines if x.startswith("WeightsUnpickler error")]
    return (telling or lines or [""])[0][:300]


def _structure(obj, torch, flat, prefix, depth=0):
    if isinstance(obj, torch.Tensor):
        if flat is not None and obj.layout == torch.strided:
            flat[prefix or "."] = obj.detach().cpu()
        return {"t": [list(obj.shape), str(obj.dtype).replace("torch.", "")]}
    if depth > 20:
        return {"v": type(obj).__name__}
    if isinstance(obj, torch.nn.Module):
        sd = obj.state_dict()
        return {"m": type(obj).__module__ + "." + type(obj).__qualname__,
                "s": _structure(dict(sd), torch, flat, prefix, depth + 1)}
    if isinstance(obj, dict):
        items = []
        for k, v in obj.items():
            key = k if isinstance(k, (str, int)) and not isinstance(k, bool) else repr(k)
            items.append([key, _structure(v, torch, flat, "%s/%s" % (prefix, key) if prefix else str(key), depth + 1)])
        return {"d": items}
    if isinstance(obj, (list, tuple)):
        return {"l": [_structure(v, torch, flat, "%s/%d" % (prefix, i) if prefix else str(i), depth + 1)
                      for i, v in enumerate(obj)]}
    if hasattr(obj, "state_dict") and callable(obj.state_dict) and type(obj).__module__.startswith("torch.optim"):
        return {"m": type(obj).__module__ + "." + type(obj).__qualname__,
                "s": _structure(obj.state_dict(), torch, flat, prefix, depth + 1)}
    return {"v": type(obj).__name__}


def _load(torch, path, mode):
    kwargs = {"map_location": "cpu"}
    if mode == "full":
        kwargs["weights_only"] = False
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file  # noqa: raises ImportError where not installed

        return load_file(path)
    return torch.load(path, **kwargs)


def main():
    sys.meta_path.insert(0, _NoDp2ddp())
    jobs = json.load(open(sys.argv[1]))
    for p in reversed(jobs.get("path", [])):
        sys.path.insert(0, p)
    if jobs.get("cwd"):
        os.chdir(jobs["cwd"])
    import torch

    for job in jobs["files"]:
        sys.stdout.write(json.dumps(load_one(torch, job)) + "\n")
        sys.stdout.flush()


def load_one(torch, job):
    """One checkpoint: how it loads (``default``, ``full`` or ``failed``, with the errors),
    its structure, and its tensors flattened into ``job["flat"]`` when asked."""
    out = {"path": job["path"]}
    obj = None
    for mode in (["default", "full"] if job.get("mode") != "full" else ["full"]):
        try:
            obj = _load(torch, job["path"], mode)
            out["load"] = mode
            break
        except Exception as e:  # noqa: BLE001 - how it fails is the finding
            out.setdefault("errors", {})[mode] = "%s: %s" % (type(e).__name__, _first_line(e))
    if "load" not in out:
        out["load"] = "failed"
        return out
    flat = {} if job.get("flat") else None
    try:
        out["structure"] = _structure(obj, torch, flat, "")
    except Exception as e:  # noqa: BLE001
        out["structure_error"] = "%s: %s" % (type(e).__name__, _first_line(e))
    if flat:
        try:
            torch.save(flat, job["flat"])
            out["flat"] = job["flat"]
        except Exception as e:  # noqa: BLE001
            out["flat_error"] = "%s: %s" % (type(e).__name__, _first_line(e))
    return out


if __name__ == "__main__":
    main()
