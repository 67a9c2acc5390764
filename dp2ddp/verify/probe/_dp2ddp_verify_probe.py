"""The probe `dp2ddp verify` loads into every measured process (original and each rank).

It never edits the user's code. It:

* seeds ``random``, NumPy and torch identically in every run;
* records each optimizer step (the loss that was back-propagated, the samples of the
  loader that fed it, a timestamp) as one JSON line in
  ``$DP2DDP_VERIFY_OUT/<role>-rank<R>.jsonl``; those lines are also the heartbeat verify's
  hang detection watches;
* in the original run, replaces the order of ``RandomSampler`` by the order of
  ``DistributedSampler(num_replicas=1, seed=S)`` at the epochs the migrated run's sampler
  was iterated with (``$DP2DDP_VERIFY_SAMPLERS``), which is the order of the union of the
  migrated ranks' batches;
* stops the run after K optimizer steps (``SystemExit(0)`` from the step hook, so the
  script's own ``finally``/``atexit`` clean-up still runs);
* at exit, hashes the parameters the optimizers update;
* dumps Python stacks on SIGUSR1 (faulthandler) and writes uncaught tracebacks;
* notes the files the process opens for writing (an audit hook on ``open`` and
  ``os.rename``, and ``torch.save``, whose C++ writer Python does not see) and reports
  them at exit, so verify can tell which ranks wrote a file.

Everything here is standard library until torch is imported by the script itself.

Per step the probe runs three hooks (backward, DataLoader ``__next__``, optimizer step);
they only append plain values and add to one small dict (samples per loader): no
syscalls (a fork handler replaces the pid check), no JSON and no writes, which the flush
thread does (benchmarks/bench_probe.py measures what is left). The audit hook costs
nothing unless the step itself raises audit events (a DataLoader with workers raises ~16
a batch: unpickling, sockets; each a call, a compare and a return, ~0.6 us measured here).
"""

import atexit
import collections
import faulthandler
import functools
import json
import os
import random
import signal
import sys
import threading
import time
import traceback

_S = None  # the probe state, once activated


FLUSH_S = 0.2  # longest a step record waits in the buffer


class _State:
    def __init__(self, role):
        env = os.environ
        self.role = role
        self.on = True  # False in a forked child (DataLoader worker, ...): it must not record
        self.out = env["DP2DDP_VERIFY_OUT"]
        self.rank = int(env.get("RANK", "0"))
        self.world = int(env.get("WORLD_SIZE", "1"))
        self.local_rank = int(env.get("LOCAL_RANK", "0"))
        self.limit = int(env.get("DP2DDP_VERIFY_STEPS", "0") or 0)
        self.seed = int(env.get("DP2DDP_VERIFY_SEED", "0") or 0)
        self.samplers = _sampler_plans(env.get("DP2DDP_VERIFY_SAMPLERS", ""))
        self.claimed = set()  # indices of the plans RandomSamplers have taken
        base = os.path.join(self.out, "%s-rank%d" % (role, self.rank))
        self.fd = os.open(base + ".jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.buf = collections.deque()  # records not yet written: dicts, or _step_line tuples
        self.stack_file = open(base + ".stack", "w")
        self.fatal_file = open(base + ".fatal", "w")
        self.step = 0
        self.losses = []  # losses back-propagated since the last step: floats (CPU) or device tensors
        self.fetched = {}  # samples fetched since the last step, per loader (id of its index sampler)
        self.last = None  # the loader of the most recent training batch
        self.fed = None  # the loader of the most recent batch when the step's last backward ran
        self.pending = []  # (step tuple without loss, pinned host tensor, event) waiting for the device
        self.primary = None  # id of the optimizer whose steps are counted
        self.primary_ref = None  # weak reference to it: the fast path of _on_step
        self.optimizers = []  # weak references
        self.kept_params = []  # the parameters of each, as seen at its first step
        self.modules = set()  # kinds of modules seen in the first step's forward
        self.forward_hook = None
        self.finished = False
        self.writes = set()  # absolute paths opened for writing (or renamed into place)
        self.lock = threading.Lock()  # serialises writes (main thread and flush thread)

    def emit(self, rec):
        # Step records are batched: one write per step cost ~2 % of a 2 ms step. The step
        # hook appends to the deque without the lock (deque.append is atomic); a daemon
        # thread writes the batch every FLUSH_S seconds (also while the rank is stuck in a
        # collective or a sleep), and any other record writes it at once, so the runner
        # sees progress within FLUSH_S -- far below its timeouts.
        self.buf.append(rec)
        self.flush()

    def flush(self):
        with self.lock:
            buf, lines = self.buf, []
            while buf:
                r = buf.popleft()
                lines.append(_step_line(*r) if type(r) is tuple else json.dumps(r, separators=(",", ":")))
            if lines:
                os.write(self.fd, ("\n".join(lines) + "\n").encode())


def _step_line(i, t, samples, nbw, loss, modules):
    """One step's JSON line, formatted directly (json.dumps costs about 3x more, in the flush
    thread, which shares the GIL with the training loop)."""
    if modules is not None:  # the first step only
        rec = {"ev": "step", "i": i, "t": t, "samples": samples, "nbw": nbw, "modules": modules, "loss": loss}
        return json.dumps(rec, separators=(",", ":"))
    if loss is None:
        text = "null"
    else:
        text = repr(loss) if loss - loss == 0 else json.dumps(loss)  # NaN, Infinity as json writes them
    return '{"ev":"step","i":%d,"t":%r,"samples":%d,"nbw":%d,"loss":%s}' % (i, t, samples, nbw, text)


def _flusher():
    while True:
        time.sleep(FLUSH_S)
        s = _S
        if s is None or not s.on:
            return
        try:
            s.flush()
        except OSError:
            return


def _forked():
    _S.on = False


def activate(role):
    global _S
    if _S is not None:
        return
    os.environ["DP2DDP_VERIFY_ACTIVE"] = str(os.getpid())
    _S = _State(role)
    os.register_at_fork(after_in_child=_forked)
    threading.Thread(target=_flusher, name="dp2ddp-verify-flush", daemon=True).start()
    faulthandler.enable(file=_S.fatal_file, all_threads=True)
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, file=_S.stack_file, all_threads=True, chain=False)
    random.seed(_S.seed)
    _S.emit(
        {
            "ev": "start",
            "t": time.time(),
            "pid": os.getpid(),
            "rank": _S.rank,
            "world": _S.world,
            "local_rank": _S.local_rank,
            "argv": list(sys.argv),
        }
    )
    _install_excepthook()
    sys.addaudithook(_audit)
    atexit.register(_settle)  # atexit runs last-in first-out: this one after _finish
    atexit.register(_report_writes)  # after the script's own atexit handlers and _finish
    atexit.register(_finish, "exit")
    sys.meta_path.insert(0, _PostImport({"torch": _on_torch, "numpy": _on_numpy}))


# --------------------------------------------------------------------------- writes

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
MAX_WRITES = 5000


def _audit(event, args):
    """Audit hook: files opened for writing (``open``: builtins/io open with a mode string,
    ``os.open`` with flags) and renamed into place (``os.rename``/``os.replace``: atomic
    writes). Every other event returns at the first compare."""
    if event == "open":
        s = _S
        if s is None or not s.on:
            return
        path, mode, flags = args
        if mode is None:
            if not flags & _WRITE_FLAGS:
                return
        elif not isinstance(mode, str) or not ("w" in mode or "a" in mode or "x" in mode or "+" in mode):
            return
        _note_write(path)
    elif event == "os.rename":
        s = _S
        if s is not None and s.on:
            _note_write(args[1])


def _note_write(path):
    s = _S
    if isinstance(path, int) or len(s.writes) >= MAX_WRITES:
        return
    try:
        p = os.fsdecode(os.fspath(path))
        s.writes.add(os.path.normpath(os.path.join(os.getcwd(), p)))
    except Exception:
        pass


def _report_writes():
    s = _S
    if s is None or not s.on or not s.writes:
        return
    try:
        s.emit({"ev": "writes", "t": time.time(), "paths": sorted(s.writes)})
    except Exception:
        pass


# --------------------------------------------------------------------------- imports


class _PostImport:
    """Run a callback right after a module (torch, numpy) has been imported by the script."""

    def __init__(self, callbacks):
        self.callbacks = dict(callbacks)

    def find_spec(self, name, path=None, target=None):
        if name not in self.callbacks:
            return None
        callback = self.callbacks.pop(name)
        import importlib.util

        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            if self.callbacks:
                sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        real_exec = loader.exec_module

        def exec_module(module):
            real_exec(module)
            try:
                callback(module)
            except Exception as e:
                sys.stderr.write("dp2ddp verify: probe could not hook %s: %r\n" % (name, e))

        loader.exec_module = exec_module
        return spec


def _on_numpy(np):
    try:
        np.random.seed(_S.seed)
    except Exception:
        pass


def _on_torch(torch):
    import torch.utils.data
    from torch.nn.modules.batchnorm import _BatchNorm
    from torch.nn.modules.dropout import _DropoutNd
    from torch.nn.modules.module import register_module_forward_pre_hook
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.utils.data import dataloader

    _S.emit({"ev": "torch", "t": time.time()})
    torch.manual_seed(_S.seed)
    register_optimizer_step_post_hook(_on_step)

    real_save = torch.save

    @functools.wraps(real_save)
    def save(obj, f, *args, **kwargs):
        # torch.save writes a path through C++: the audit hook would not see it
        if _S.on and isinstance(f, (str, bytes, os.PathLike)):
            _note_write(f)
        return real_save(obj, f, *args, **kwargs)

    torch.save = save

    Tensor = torch.Tensor
    is_grad_enabled = torch.is_grad_enabled
    real_backward = torch.autograd.backward

    @functools.wraps(real_backward)  # also sets __wrapped__, which the benchmark uses
    def backward(tensors, *args, **kwargs):
        if _S.on:
            _S.fed = _S.last  # the loader whose batch this loss most likely came from
            t = tensors
            if isinstance(t, (list, tuple)):
                t = t[0] if len(t) else None
            if isinstance(t, Tensor):
                _S.losses.append(_loss_value(t))
        return real_backward(tensors, *args, **kwargs)

    torch.autograd.backward = backward

    real_next = dataloader._BaseDataLoaderIter.__next__

    @functools.wraps(real_next)
    def __next__(self):
        batch = real_next(self)
        # Counted per loader (its index sampler is one object for the loader's life), so
        # that a step counts only the loader that fed it (see _on_step): the migration
        # keeps evaluation loaders whole on every rank, and counting their batches would
        # make the migrated run's global batch look larger than the original's. Batches
        # fetched under torch.no_grad() feed no backward: not counted at all.
        s = _S
        if s.on and is_grad_enabled():
            key = id(getattr(self, "_index_sampler", None))
            fetched = s.fetched
            fetched[key] = fetched.get(key, 0) + _batch_size(batch, Tensor)
            s.last = key
        return batch

    dataloader._BaseDataLoaderIter.__next__ = __next__

    # Both runs draw a RandomSampler's order from its own pass count (DistributedSampler's
    # order at that epoch, never the global random stream): the migration's shard_loader
    # runs the original's RandomSampler on every rank, so its batches then are the
    # original's at the same pass, and a DistributedSampler migration is aligned by its plans.
    _patch_random_sampler(torch)
    if _S.role != "original":
        _patch_distributed_sampler(torch)

    bn = _BatchNorm
    drop = _DropoutNd
    wrappers = {"DataParallel": "dp", "DistributedDataParallel": "ddp"}

    def forward_pre_hook(module, args):
        if not _S.on:
            return None
        if isinstance(module, bn) and module.training and type(module).__name__ != "SyncBatchNorm":
            _S.modules.add("batchnorm")
        elif isinstance(module, drop) and module.training and getattr(module, "p", 0) > 0:
            _S.modules.add("dropout")
        else:
            kind = wrappers.get(type(module).__name__)
            if kind:
                _S.modules.add(kind)
        return None

    # Only during the first step (removed by _on_step): a global hook costs on every module call.
    _S.forward_hook = register_module_forward_pre_hook(forward_pre_hook)


def _loss_value(t):
    """What the step keeps of a back-propagated loss: a CPU loss becomes a float at once
    (``item()`` costs less than ``detach()``, and holds no graph); a device loss stays a
    detached tensor, so that nothing waits for the device before the step."""
    if t.numel() != 1:
        t = t.detach().float().mean()
    return t.item() if t.is_cpu else t.detach()


def _batch_size(batch, tensor_type, depth=0):
    if isinstance(batch, tensor_type):
        return batch.size(0) if batch.dim() else 1
    if depth > 3:
        return 0
    if isinstance(batch, (list, tuple)) and batch:
        return _batch_size(batch[0], tensor_type, depth + 1)
    if isinstance(batch, dict) and batch:
        return _batch_size(next(iter(batch.values())), tensor_type, depth + 1)
    return 0


def _sampler_plans(text):
    """The migrated run's shuffling DistributedSamplers, in the order of their first
    iteration: ``[{"n": len(dataset), "seed": S, "epochs": [...]}, ...]`` (verify reads them
    from the migrated run's records and hands them over as JSON)."""
    try:
        plans = json.loads(text) if text else []
    except ValueError:
        return []
    return [p for p in plans if isinstance(p, dict)] if isinstance(plans, list) else []


def _claim_plan(n):
    """The plan for a RandomSampler iterated for the first time: the first plan not yet
    claimed whose dataset has the same length (the migrated run's sampler of the same
    loader), else none: the first plan's seed (the migration's sampler seed) and epochs
    0, 1, 2, ..."""
    s = _S
    for i, p in enumerate(s.samplers):
        if i not in s.claimed and p.get("n") == n:
            s.claimed.add(i)
            epochs = [int(e) for e in (p.get("epochs") or [])]
            return {"seed": int(p.get("seed") or 0), "epochs": epochs, "k": 0, "epoch": None}
    seed = int(s.samplers[0].get("seed") or 0) if s.samplers else 0
    return {"seed": seed, "epochs": [], "k": 0, "epoch": None}


def _next_epoch(plan):
    """The epoch of the plan's next iteration: the epoch the migrated run's sampler had at
    its k-th iteration (the script's own ``set_epoch``, which may start at 1 or at a
    resumed epoch) while those epochs increase; else the previous epoch + 1, as a correct
    ``set_epoch`` would have it. So a migration that forgets ``set_epoch`` (epochs 0, 0,
    ...) still meets an original that reshuffles every epoch, and the losses show it."""
    k, prev, planned = plan["k"], plan["epoch"], plan["epochs"]
    plan["k"] = k + 1
    if k < len(planned) and (prev is None or planned[k] > prev):
        epoch = planned[k]
    else:
        epoch = 0 if prev is None else prev + 1
    plan["epoch"] = epoch
    return epoch


def _patch_random_sampler(torch):
    from torch.utils.data import RandomSampler

    real_iter = RandomSampler.__iter__

    def __iter__(self):
        if self.replacement or self._num_samples is not None or not _S.on:
            yield from real_iter(self)
            return
        n = len(self.data_source)
        plan = self.__dict__.get("_dp2ddp_plan")
        if plan is None:
            plan = self._dp2ddp_plan = _claim_plan(n)
        epoch = _next_epoch(plan)
        seed = plan["seed"]
        _S.emit({"ev": "sampler", "kind": "random", "id": id(self), "seed": seed, "epoch": epoch, "n": n})
        # == DistributedSampler(num_replicas=1, rank=0, shuffle=True, seed=seed) at this epoch
        # (which, like the migration's sampler, draws nothing from the global random stream)
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        yield from torch.randperm(n, generator=g).tolist()

    RandomSampler.__iter__ = __iter__


def _patch_distributed_sampler(torch):
    from torch.utils.data.distributed import DistributedSampler

    real_iter = DistributedSampler.__iter__

    def __iter__(self):
        if _S.on:
            _S.emit(
                {
                    "ev": "sampler",
                    "kind": "distributed",
                    "id": id(self),
                    "seed": self.seed,
                    "epoch": self.epoch,
                    "shuffle": bool(self.shuffle),
                    "n": len(self.dataset),
                    "replicas": self.num_replicas,
                }
            )
        return real_iter(self)

    DistributedSampler.__iter__ = __iter__


# --------------------------------------------------------------------------- steps


def _on_step(optimizer, args, kwargs):
    s = _S
    if s.finished or not s.on:
        return
    ref = s.primary_ref
    if ref is None or ref() is not optimizer:
        if not _is_primary(s, optimizer):
            return  # a second optimizer (GAN, ...): the primary one counts the steps
    t = time.time()
    s.step += 1
    losses, s.losses = s.losses, []
    # The samples of this step: those of the loader that fed it, i.e. of the most recent
    # batch when the step's last backward ran (the most recent batch at all when no
    # backward ran since the last step), summed over every batch that loader gave since
    # the last step (gradient accumulation). Batches of other loaders since the last step
    # (an evaluation between two steps, whole on every migrated rank) are not this step's.
    fetched, s.fetched = s.fetched, {}
    fed, s.fed = s.fed, None
    samples = fetched.get(s.last if fed is None else fed, 0) if fetched else 0
    modules = _first_step(s) if s.step == 1 else None
    if s.pending:
        _drain(block=False)
    if not losses:
        loss = None
    elif len(losses) == 1:
        loss = losses[0]
    else:
        loss = _mean_loss(losses)
    rec = (s.step, t, samples, len(losses), loss, modules)  # formatted by _step_line
    if loss is not None and type(loss) is not float:  # on a device: do not synchronise it
        import torch

        host = torch.empty((), dtype=loss.dtype, pin_memory=True)
        host.copy_(loss, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record()
        s.pending.append((rec, host, ev))
    elif s.pending:
        s.pending.append((rec, None, None))
    else:
        s.buf.append(rec)  # written by the flush thread
    if s.limit and s.step >= s.limit:
        _finish("limit")
        raise SystemExit(0)


def _is_primary(s, optimizer):
    """Slow path of _on_step: remember every optimizer (for the digest); the first one to
    step is the primary one, by id, as a weak reference for the fast path."""
    import weakref

    if s.primary is None:
        s.primary = id(optimizer)
    if not any(r() is optimizer for r in s.optimizers):
        s.optimizers.append(weakref.ref(optimizer))
        # the parameters themselves too: a script whose optimizer is a local of its train()
        # has dropped it by exit, when the digest is taken (the model keeps them alive anyway)
        s.kept_params.append([p for g in optimizer.param_groups for p in g["params"]])
    if id(optimizer) != s.primary:
        return False
    s.primary_ref = weakref.ref(optimizer)
    return True


def _first_step(s):
    """Stop watching module calls (a global forward hook costs on every call); return the kinds seen."""
    if s.forward_hook is not None:
        s.forward_hook.remove()
        s.forward_hook = None
    return sorted(s.modules)


def _mean_loss(losses):
    """The mean loss of a step with several backward calls (gradient accumulation), in
    float32: a float when all were CPU losses, else a tensor on their device."""
    import torch

    device = next((x.device for x in losses if type(x) is not float), None)
    if device is None:
        return float(torch.tensor(losses, dtype=torch.float32).mean())
    return torch.stack([torch.as_tensor(x, dtype=torch.float32, device=device) for x in losses]).mean()


def _drain(block):
    s = _S
    while s.pending:
        rec, host, ev = s.pending[0]
        if ev is not None:
            if not block and not ev.query():
                return
            ev.synchronize()
            rec = rec[:4] + (float(host),) + rec[5:]
        s.pending.pop(0)
        s.buf.append(rec)


def _param_digest():
    import hashlib

    import torch

    h = hashlib.sha256()
    count = 0
    sq = 0.0
    seen = set()
    for ref, kept in zip(_S.optimizers, _S.kept_params):
        opt = ref()
        params = [p for g in opt.param_groups for p in g["params"]] if opt is not None else kept
        if params:
            for p in params:
                if id(p) in seen:
                    continue
                seen.add(id(p))
                t = p.detach().cpu().contiguous().reshape(-1)
                sq += float(t.double().pow(2).sum()) if t.is_floating_point() else 0.0
                try:
                    h.update(t.view(torch.uint8).numpy().tobytes())
                except Exception:
                    h.update(repr(t.tolist()).encode())
                count += 1
    return {"hash": h.hexdigest() if count else None, "params": count, "norm": sq ** 0.5}


def _finish(why):
    s = _S
    if s is None or s.finished or not s.on:
        return
    s.finished = True
    try:
        _drain(block=True)
    except Exception:
        pass
    rec = {"ev": "end", "t": time.time(), "why": why, "steps": s.step, "modules": sorted(s.modules)}
    try:
        rec.update(_param_digest())
    except Exception as e:
        rec["digest_error"] = repr(e)
    s.emit(rec)


def _settle():
    """Let gloo's worker threads finish before Python finalizes. torch 2.13 keeps a Python
    object in the state every all-reduce started inside ``backward()`` captures; the worker
    thread frees the last one just after the main thread moved on, which needs the GIL, and a
    thread asking for the GIL once finalization began is ended with ``pthread_exit`` — the
    process aborts ("terminate called without an active exception"). Sleeping here, still
    before finalization, hands the GIL over. See README, Known issues."""
    if _S is not None and _S.on and "torch.distributed" in sys.modules:
        time.sleep(0.2)


# --------------------------------------------------------------------------- errors


def _install_excepthook():
    real = sys.excepthook

    def excepthook(etype, value, tb):
        try:
            if _S.on:
                _S.emit(
                    {
                        "ev": "error",
                        "t": time.time(),
                        "type": etype.__name__,
                        "message": str(value),
                        "traceback": "".join(traceback.format_exception(etype, value, tb)),
                    }
                )
        except Exception:
            pass
        real(etype, value, tb)

    sys.excepthook = excepthook
