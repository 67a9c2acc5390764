"""The probe `dp2ddp verify` loads into every measured process (original and each rank).

It never edits the user's code. It:

* seeds ``random``, NumPy and torch identically in every run;
* records each optimizer step of every optimizer the script creates (the loss that was
  back-propagated since the previous step, the learning rate, the samples of the loader
  that fed it, a timestamp) as one JSON line in ``$DP2DDP_VERIFY_OUT/<role>-rank<R>.jsonl``;
  the steps of the *primary* optimizer (the first to step, or one created after it
  stopped stepping: a new optimizer per fold) are the run's steps, and also the heartbeat
  verify's hang detection watches;
* records which dataset indices every DataLoader pass served (the indices its index
  sampler hands out, whatever the sharding: ``DistributedSampler``, dp2ddp's
  ``ShardedBatches``, a custom sampler or none), as a bitset per pass: verify proves the
  data partition from it;
* in the original run, makes the order of samples the migrated run's: a shuffling
  ``RandomSampler`` follows the migrated ``DistributedSampler``'s order
  (``DistributedSampler(num_replicas=1, seed=S)`` at the migrated epochs), and a loader the
  migration shards with ``ShardedBatches`` iterates its batch sampler under the same
  seeding (``seed + epoch``, the global random streams left untouched)
  (``$DP2DDP_VERIFY_SAMPLERS``);
* stops the run after K primary steps (``SystemExit(0)`` from the step hook, so the
  script's own ``finally``/``atexit`` clean-up still runs), or, in the run that collects
  the data evidence, once the training loader has begun its second epoch (bounded);
* with ``$DP2DDP_VERIFY_CHUNKS=W`` (the noise-envelope run of the original): DataParallel
  splits each batch into W chunks as it scatters over W devices, so the gradients are sums
  over chunks (DDP's reduction order without DDP); without DataParallel, each gradient
  element is perturbed at every step by W roundings (``eps`` of its dtype) of its own
  magnitude plus the tensor's RMS: the reduction-order noise of a W-rank all-reduce, which
  moves a cancelled (near-zero) element by a rounding of the terms summed, not of the sum;
  with ``$DP2DDP_VERIFY_REDRAW=1`` too (the original's training step draws random numbers:
  a GAN's noise, dropout's masks), the global streams are reseeded elsewhere at the first
  training forward, so the steps draw other numbers, as each migrated rank draws its own:
  how far the losses move on that alone;
* at exit, hashes the parameters the optimizers update;
* dumps Python stacks on SIGUSR1 (faulthandler) and writes uncaught tracebacks;
* notes the files the process opens for writing, with the line of the user's code that
  opened or saved them (an audit hook on ``open``/``os.rename`` and a ``torch.save``
  wrapper, since ``torch.save`` writes a path from C++);
* guards the user's files: before anything writes through one of the links the scratch
  folder holds to the user's files (a large input, a linked folder), the link is replaced
  by a copy of what it points to (copy on write), and a write into the user's project
  itself is refused (``$DP2DDP_VERIFY_MIRROR``, ``$DP2DDP_VERIFY_PROJECT``). That guard also
  runs in every child process (DataLoader workers, subprocesses).

Everything here is standard library until torch is imported by the script itself.

Per step the probe runs four small hooks (backward, DataLoader ``__next__`` and
``_next_index``, optimizer step); they only append plain values: no syscalls, no JSON and no
writes, which the flush thread does (benchmarks/bench_probe.py measures what is left). The
audit hook costs one dict lookup per audit event.
"""

import array
import base64
import atexit
import collections
import faulthandler
import functools
import json
import os
import random
import shutil
import signal
import stat
import sys
import threading
import time
import traceback
import weakref
import zlib

_S = None  # the probe state, once activated
_G = None  # the write guard, in every process of a verify run


FLUSH_S = 0.2  # longest a step record waits in the buffer
HEAD = 64  # indices kept from the start of each pass (order evidence)
PRINT_BYTES = 4096  # bytes of each stream sample that its fingerprint reads
PRINTS_MAX = 1 << 20  # fingerprints kept per pass of a stream
EVIDENCE_PASSES = 3  # passes per loader whose bitset is recorded
EVIDENCE_BYTES = 8 << 20  # bitsets recorded per process at most
EVIDENCE_MAX_N = 1 << 28  # larger index spaces: counts only
FOLD = 1 << 22  # indices buffered before they are folded into the pass's bitset


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
        self.extend = int(env.get("DP2DDP_VERIFY_EXTEND", "0") or 0)  # at most this many steps for the evidence
        self.stop_at = self.limit
        self.chunks = int(env.get("DP2DDP_VERIFY_CHUNKS", "0") or 0)
        self.redraw = env.get("DP2DDP_VERIFY_REDRAW") == "1"
        self.redrawn = False
        self.chunked = False  # the envelope run: DataParallel split a batch into chunks
        self.bn_chunked = False  # the envelope run without DataParallel: BatchNorm normalised per chunk
        self.outer_split = False  # the envelope run without DataParallel: the model's outermost call split instead
        self.rng_marks = []  # the default generator's state at the first steps (random draws in a step?)
        self.seed = int(env.get("DP2DDP_VERIFY_SEED", "0") or 0)
        # the global random streams at start: rank 0's are the original run's; every other rank
        # starts elsewhere, as torchrun's processes do (each seeds itself from the OS), so a
        # migration whose ranks must draw alike (an unseeded split) has to make them alike itself
        self.stream_seed = self.seed + 1000003 * self.rank
        self.samplers = _sampler_plans(env.get("DP2DDP_VERIFY_SAMPLERS", ""))
        self.claimed = set()  # indices of the plans samplers have taken
        self.aligning = False  # inside an aligned batch sampler: RandomSampler runs as it is
        self.item_passes = {}  # id(dataset) -> passes of loaders over it begun (items are seeded by it)
        base = os.path.join(self.out, "%s-rank%d" % (role, self.rank))
        self.fd = os.open(base + ".jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.buf = collections.deque()  # records not yet written: dicts, or _step_line tuples
        self.stack_file = open(base + ".stack", "w")
        self.fatal_file = open(base + ".fatal", "w")
        self.step = 0  # steps of the primary optimizer
        self.clock = 0  # steps of every optimizer
        self.losses = []  # losses back-propagated since the last step: floats (CPU) or device tensors
        self.fetched = {}  # samples fetched since the last step, per loader (id of its index sampler)
        self.last = None  # the loader of the most recent training batch
        self.last_batch = 0  # the samples of the most recent training batch
        self.handler_files = set()  # files a logging.FileHandler opened
        self.emitted = {}  # file -> records logging.FileHandlers wrote to it
        self.regrouped = False  # the envelope run: a forward over views concatenated was chunked as DDP shares it
        self.fed = None  # the loader of the most recent batch when the step's last backward ran
        self.unjudged = {}  # samples fetched while the wrapped model was in eval mode, per loader
        self.unjudged_last = None  # the loader of the most recent of those
        self.wrapper = None  # a weak reference to the DataParallel/DDP module that ran most recently
        self.trained = []  # loaders that fed a primary step, in the order of their first
        self.pending = []  # (step tuple without loss, pinned host tensor, event) waiting for the device
        self.opts = {}  # id(optimizer) -> _Opt (an id freed and reused is a new optimizer)
        self.all_opts = []  # every _Opt, in the order of creation
        self.primary = None  # the _Opt whose steps are counted
        self.modules = set()  # kinds of modules seen in the first step's forward
        self.forward_hook = None
        self.forward_after = None  # with forward_hook until the first step: the depth of module calls
        self.forwards = [0, 0]  # outermost module calls before the first step, and the samples they took
        self.depth = 0  # module calls of the main thread in progress (forward_hook / forward_after)
        self.finished = False
        self.passes = {}  # loader key -> its current _Pass
        self.pass_count = 0  # loader passes begun in this process
        self.npasses = {}  # loader key -> passes begun
        self.evidence = 0  # bitset bytes recorded so far
        self.kept = []  # (weak reference, parameters) of every optimizer that stepped, for the digest
        self.writes = {}  # absolute path -> [site, primary step of the last write]
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


class _Opt:
    """An optimizer the script created: its index (creation order, the same in both runs),
    when it was created and last stepped (on the clock of all optimizer steps), and where."""

    __slots__ = ("index", "born", "last", "ref", "site", "kind", "steps")

    def __init__(self, opt, index, born, site):
        import weakref

        self.index, self.born, self.last, self.site = index, born, -1, site
        self.ref = weakref.ref(opt)
        self.kind = type(opt).__name__
        self.steps = 0


def _step_line(i, t, samples, nbw, loss, modules, o=0, lr=None, ev="step"):
    """One step's JSON line, formatted directly (json.dumps costs about 3x more, in the flush
    thread, which shares the GIL with the training loop)."""
    if modules is not None:  # the first step only
        rec = {"ev": ev, "i": i, "t": t, "samples": samples, "nbw": nbw, "modules": modules, "o": o, "lr": lr, "loss": loss}
        return json.dumps(rec, separators=(",", ":"))
    return '{"ev":"%s","i":%d,"t":%r,"samples":%d,"nbw":%d,"o":%d,"lr":%s,"loss":%s}' % (
        ev, i, t, samples, nbw, o, _num(lr), _num(loss))


def _num(x):
    if x is None:
        return "null"
    return repr(x) if x - x == 0 else json.dumps(x)  # NaN, Infinity as json writes them


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
    guard()
    os.environ["DP2DDP_VERIFY_ACTIVE"] = str(os.getpid())
    _S = _State(role)
    os.register_at_fork(after_in_child=_forked)
    threading.Thread(target=_flusher, name="dp2ddp-verify-flush", daemon=True).start()
    faulthandler.enable(file=_S.fatal_file, all_threads=True)
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, file=_S.stack_file, all_threads=True, chain=False)
    random.seed(_S.stream_seed)
    _S.emit(
        {
            "ev": "start",
            "t": time.time(),
            "pid": os.getpid(),
            "rank": _S.rank,
            "world": _S.world,
            "local_rank": _S.local_rank,
            "argv": list(sys.argv),
            "cwd": os.getcwd(),
        }
    )
    _install_excepthook()
    _install_audit()
    _install_log_handlers()
    _install_stdout()
    atexit.register(_settle)  # atexit runs last-in first-out: this one after _finish
    atexit.register(_report_writes)  # after the script's own atexit handlers and _finish
    atexit.register(_finish, "exit")
    hooks = {"numpy": _on_numpy, "torch": _on_torch}  # numpy first: torch imports it
    for name in [n for n in hooks if n in sys.modules]:
        # imported before the probe started (a .pth file, or a process forked from a Python
        # that had imported it, as dp2ddp's tests launch runs): hooked now, as it would have been
        callback = hooks.pop(name)
        try:
            callback(sys.modules[name])
        except Exception as e:
            sys.stderr.write("dp2ddp verify: probe could not hook %s: %r\n" % (name, e))
    if hooks:
        sys.meta_path.insert(0, _PostImport(hooks))


# --------------------------------------------------------------------------- sites

_SKIP_FILES = ()


def _skip_files():
    global _SKIP_FILES
    import sysconfig

    paths = sysconfig.get_paths()
    skip = {os.path.dirname(os.path.abspath(__file__)) + os.sep}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        if paths.get(key):
            skip.add(os.path.realpath(paths[key]) + os.sep)
            skip.add(os.path.abspath(paths[key]) + os.sep)
    for p in sys.path:  # site-packages of a venv on another prefix
        if p.endswith("site-packages") or p.endswith("dist-packages"):
            skip.add(os.path.abspath(p) + os.sep)
    _SKIP_FILES = tuple(sorted(skip)) + ("<",)
    return _SKIP_FILES


def _site(depth=2):
    """[file, line] of the innermost frame in the user's code (not the standard library,
    installed packages or this probe) calling us, or None."""
    skip = _SKIP_FILES or _skip_files()
    try:
        f = sys._getframe(depth)
    except ValueError:
        return None
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(skip):
            return [os.path.abspath(name), f.f_lineno]
        f = f.f_back
    return None


# --------------------------------------------------------------------------- the guard

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
MAX_WRITES = 5000


class _Guard:
    """Keeps the user's files as they are. The scratch folder (``mirror``) mirrors the
    user's project with links to what it did not copy (large inputs, big or tool folders):
    before a write through such a link, the link becomes a copy of its target (a folder:
    a real folder whose entries link on). A write into the project itself (a hard-coded
    absolute path) is refused with PermissionError; Python's bytecode cache skips such a
    write silently."""

    def __init__(self, mirror, project, lock, scratch=""):
        self.mirror = mirror.rstrip(os.sep)
        self.scratch = (scratch or mirror).rstrip(os.sep) + os.sep
        self.project = project.rstrip(os.sep) if project else ""
        self.lock = lock
        self.env = tuple({os.path.realpath(sys.prefix) + os.sep, os.path.abspath(sys.prefix) + os.sep})
        self.blocked = []

    def inside(self, p):
        return p.startswith(self.mirror + os.sep)

    def check(self, path, final, keep=True):
        """Before a write of ``path``: own every link on the way (``final``: the last
        component too; ``keep``: copy its content, else just drop the link)."""
        try:
            if isinstance(path, int):
                return
            p = os.path.abspath(os.fsdecode(os.fspath(path)))
        except Exception:
            return
        if self.inside(p):
            self._own(p, final, keep)
        elif p.startswith(self.scratch):
            return  # verify's own records
        elif self.project and (p == self.project or p.startswith(self.project + os.sep)) and not p.startswith(self.env):
            if "__pycache__" not in p:
                self.blocked.append(p)
            raise PermissionError(
                "dp2ddp verify: %s is in your project, which verify never writes; the run works in a "
                "scratch copy of it (write relative paths, or under the script's folder)" % p)

    def _own(self, p, final, keep):
        rel = p[len(self.mirror) + 1:].split(os.sep)
        if not final:
            rel = rel[:-1]
        cur = self.mirror
        for i, part in enumerate(rel):
            if part in ("", "."):
                continue
            nxt = os.path.join(cur, part)
            try:
                st = os.lstat(nxt)
            except OSError:
                return  # does not exist (yet): nothing of the user's below it
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(nxt)
                if not os.path.isabs(target):
                    target = os.path.normpath(os.path.join(cur, target))
                if not self.inside(target):
                    last = i == len(rel) - 1
                    if "__pycache__" in rel[: i + 1]:
                        raise PermissionError("dp2ddp verify: no bytecode cache in a linked folder")
                    self._copy(nxt, target, last and final, keep)
            cur = nxt

    def _copy(self, link, target, last, keep):
        import fcntl

        with open(self.lock, "a") as lk:
            fcntl.flock(lk, fcntl.LOCK_EX)
            try:
                if not os.path.islink(link):
                    return  # another process owned it meanwhile
                tmp = "%s.dp2ddp-cow-%d" % (link, os.getpid())
                if os.path.isdir(target) and not last:
                    os.mkdir(tmp)
                    for e in os.scandir(target):
                        os.symlink(os.path.join(target, e.name), os.path.join(tmp, e.name))
                    os.unlink(link)
                    os.rename(tmp, link)
                elif os.path.isdir(target):
                    os.unlink(link)  # the folder itself is written (chmod, rmtree): a real one
                    os.mkdir(link)
                    for e in os.scandir(target):
                        os.symlink(os.path.join(target, e.name), os.path.join(link, e.name))
                elif keep and os.path.exists(target):
                    shutil.copy2(target, tmp)
                    os.replace(tmp, link)
                else:
                    os.unlink(link)  # truncated or replaced anyway: the new file starts empty
            finally:
                fcntl.flock(lk, fcntl.LOCK_UN)


def guard():
    """Install the write guard (every process of a verify run, once)."""
    global _G
    if _G is not None:
        return
    mirror = os.environ.get("DP2DDP_VERIFY_MIRROR")
    if not mirror:
        return
    env = os.environ
    lock = env.get("DP2DDP_VERIFY_LOCK") or os.path.join(mirror, ".dp2ddp-lock")
    _G = _Guard(mirror, env.get("DP2DDP_VERIFY_PROJECT", ""), lock, env.get("DP2DDP_VERIFY_SCRATCH", ""))
    _install_audit()


_AUDIT = []


def _install_log_handlers():
    """``logging.FileHandler``: the files it opens, and the records it writes, per file. A
    handler made on every rank of a migration and disabled on all but rank 0 opens its file
    to append and writes nothing there (verify tells it from a log every rank writes)."""
    import logging

    cls = logging.FileHandler
    if getattr(cls, "_dp2ddp_counted", False):
        return
    real_open, real_emit = cls._open, cls.emit

    def _open(self):
        s = _S
        if s is not None:
            s.handler_files.add(os.path.abspath(self.baseFilename))
        return real_open(self)

    def emit(self, record):
        s = _S
        if s is not None:
            p = os.path.abspath(self.baseFilename)
            s.emitted[p] = s.emitted.get(p, 0) + 1
        return real_emit(self, record)

    cls._open, cls.emit = _open, emit
    cls._dp2ddp_counted = True


def _install_audit():
    if not _AUDIT:
        _AUDIT.append(True)
        sys.addaudithook(_audit)


def _open_event(args):
    path, mode, flags = args
    appending = False
    if mode is None:
        if not flags & _WRITE_FLAGS:
            return
        keep = not flags & os.O_TRUNC
        appending = keep and bool(flags & os.O_APPEND)
    elif not isinstance(mode, str) or not ("w" in mode or "a" in mode or "x" in mode or "+" in mode):
        return
    else:
        keep = "w" not in mode
        appending = "a" in mode and "+" not in mode
    if isinstance(path, int):
        return
    g = _G
    if g is not None:
        g.check(path, True, keep)
    s = _S
    if s is not None and s.on:
        _note_write(path, append=appending)


def _rename_event(args):
    g = _G
    if g is not None:
        g.check(args[0], False)
        g.check(args[1], False)
    s = _S
    if s is not None and s.on:
        _note_write(args[1])


def _parent_event(args):
    if _G is not None:
        _G.check(args[0], False)


def _path_event(args):
    if _G is not None:
        _G.check(args[0], True)


def _link_event(args):
    if _G is not None:
        _G.check(args[1], False)


_EVENTS = {
    "open": _open_event,
    "os.rename": _rename_event,
    "os.remove": _parent_event,
    "os.rmdir": _parent_event,
    "os.mkdir": _parent_event,
    "os.truncate": _path_event,
    "os.chmod": _path_event,
    "os.chown": _path_event,
    "os.utime": _path_event,
    "shutil.rmtree": _path_event,
    "sqlite3.connect": _path_event,
    "os.symlink": _link_event,
    "os.link": _link_event,
}


def _audit(event, args):
    """Audit hook: writes about to happen (files opened for writing, renamed into place,
    removed, ...): the guard owns the links on their way, the probe notes the files. Every
    other event costs one dict lookup."""
    handler = _EVENTS.get(event)
    if handler is not None:
        handler(args)


def _note_write(path, step_of_save=False, append=False):
    s = _S
    if isinstance(path, int) or len(s.writes) >= MAX_WRITES:
        return
    try:
        p = os.path.normpath(os.path.join(os.getcwd(), os.fsdecode(os.fspath(path))))
    except Exception:
        return
    w = s.writes.get(p)
    if w is None:
        s.writes[p] = [_site(3), s.step, append, 1]
    else:
        w[1] = s.step
        w[2] = w[2] and append  # opened only to append, every time (a log handler made on every rank)
        w[3] += 1


def _report_writes():
    s = _S
    if s is None or not s.on or not s.writes:
        return
    try:
        s.emit({"ev": "writes", "t": time.time(), "paths": sorted(s.writes),
                "sites": {p: w[0] for p, w in s.writes.items() if w[0]},
                "steps": {p: w[1] for p, w in s.writes.items()},
                # opened once, to append, by a logging.FileHandler that wrote no record: nothing written
                "appends": sorted(p for p, w in s.writes.items() if len(w) > 3 and w[2] and w[3] == 1
                                  and p in s.handler_files and not s.emitted.get(p))})
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
        np.random.seed(_S.stream_seed % 2**32)
    except Exception:
        pass


def _on_torch(torch):
    import torch.utils.data
    from torch.nn.modules.batchnorm import _BatchNorm
    from torch.nn.modules.dropout import _DropoutNd
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
    from torch.optim.optimizer import Optimizer, register_optimizer_step_post_hook
    from torch.utils.data import dataloader

    _S.emit({"ev": "torch", "t": time.time()})
    torch.manual_seed(_S.stream_seed)
    register_optimizer_step_post_hook(_on_step)

    real_opt_init = Optimizer.__init__

    @functools.wraps(real_opt_init)
    def opt_init(self, *args, **kwargs):
        real_opt_init(self, *args, **kwargs)
        s = _S
        if s.on:
            info = s.opts.get(id(self))
            if info is None or info.ref() is not self:
                _new_opt(s, self, _site())

    Optimizer.__init__ = opt_init

    real_save = torch.save

    @functools.wraps(real_save)
    def save(obj, f, *args, **kwargs):
        # torch.save writes a path through C++: neither the audit hook nor the guard sees it
        if isinstance(f, (str, bytes, os.PathLike)):
            if _G is not None:
                _G.check(f, True, keep=False)
            if _S.on:
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
        try:
            batch = real_next(self)
        except StopIteration:
            # a stream's pass ends here (its batch sampler never runs out): complete
            if _S.on:
                p = _S.passes.get(id(getattr(self, "_index_sampler", None)))
                if p is not None and p.iterable and p.it is getattr(self, "_sampler_iter", None):
                    p.close(True)
            raise
        # Counted per loader (its index sampler is one object for the loader's life), so
        # that a step counts only the loader that fed it (see _on_step): the migration
        # keeps evaluation loaders whole on every rank, and counting their batches would
        # make the migrated run's global batch look larger than the original's. Batches
        # fetched under torch.no_grad() feed no backward: not counted at all, nor those
        # fetched while the wrapped model is in eval mode (an evaluation pass whose loop
        # fetches outside no_grad, SpanBERT's between two steps of a list of batches read
        # before training).
        s = _S
        counts = self.__dict__.get("_dp2ddp_counts")
        n = counts.popleft() if counts else None  # the samples its index sampler named for this batch
        wrapper = s.wrapper() if s.wrapper is not None else None
        if s.on and is_grad_enabled():
            key = id(getattr(self, "_index_sampler", None))
            took = n if n is not None else _batch_size(batch, Tensor)
            if wrapper is None or wrapper.training:
                fetched = s.fetched
                fetched[key] = fetched.get(key, 0) + took
                s.last = key
                s.last_batch = took
            else:
                # The model is in eval mode now, but many loops fetch first and call
                # model.train() after (Bert-Multi-Label's train_epoch after a validation):
                # the wrapper's next forward judges these (see _judge_unjudged).
                unjudged = s.unjudged
                unjudged[key] = unjudged.get(key, 0) + took
                s.unjudged_last = key
            p = s.passes.get(key)
            if p is not None and p.iterable and p.k < EVIDENCE_PASSES:
                p.fingerprint(batch, torch)  # a stream names no sample: what it served, by content
        return batch

    dataloader._BaseDataLoaderIter.__next__ = __next__

    real_next_index = dataloader._BaseDataLoaderIter._next_index

    @functools.wraps(real_next_index)
    def _next_index(self):
        # The indices the loader's index sampler hands out: what this process serves.
        s = _S
        try:
            idx = real_next_index(self)
        except StopIteration:
            if s.on:
                p = s.passes.get(id(self._index_sampler))
                if p is not None and p.it is self._sampler_iter:
                    p.close(True)
            raise
        if s.on and self._dataset_kind != dataloader._DatasetKind.Iterable:
            # a batch of a map-style dataset holds the samples its indices name, however the
            # collate function lays them out (a tuple of per-image tensors for a detection
            # model): __next__ counts those, in the order the indices went out (workers
            # return their batches in that order)
            counts = self.__dict__.get("_dp2ddp_counts")
            if counts is None:
                counts = self.__dict__["_dp2ddp_counts"] = collections.deque()
            counts.append(len(idx) if type(idx) is list else 1)
        if s.on:
            p = s.passes.get(id(self._index_sampler))
            if p is None or p.it is not self._sampler_iter:
                p = _begin_pass(self)
                p.first_len = len(idx) if type(idx) is list else 1
                # a stream's batches (its batch sampler hands out [None] * size): no sample is named
                p.iterable = self._dataset_kind == dataloader._DatasetKind.Iterable
            if p.iterable:
                pass
            elif type(idx) is list:
                try:
                    p.arr.extend(idx)
                except (TypeError, OverflowError):
                    p.bad = True
            else:
                p.add(idx)
            p.batches += 1
            if len(p.arr) > FOLD:
                p.fold()
        return idx

    dataloader._BaseDataLoaderIter._next_index = _next_index

    real_loader_init = dataloader.DataLoader.__init__

    @functools.wraps(real_loader_init)
    def loader_init(self, *args, **kwargs):
        real_loader_init(self, *args, **kwargs)
        if _S.on:
            object.__setattr__(self, "_dp2ddp_site", _site())

    dataloader.DataLoader.__init__ = loader_init

    real_iter_init = dataloader._BaseDataLoaderIter.__init__

    @functools.wraps(real_iter_init)
    def iter_init(self, loader, *args, **kwargs):
        s = _S
        if s.on:
            self._dp2ddp_site = loader.__dict__.get("_dp2ddp_site")
            if s.role == "original" and "_dp2ddp_aligned" not in loader.__dict__:
                _align_loader(loader, torch)
            # before the workers fork: they seed the items of this pass by it (_patch_item_seeds)
            key = id(loader.dataset)
            s.item_passes[key] = s.item_passes.get(key, 0) + 1
            if loader.generator is None:
                return _seed_from_a_copy(real_iter_init, self, loader, args, kwargs, torch)
        return real_iter_init(self, loader, *args, **kwargs)

    dataloader._BaseDataLoaderIter.__init__ = iter_init

    _patch_item_seeds(torch)
    if _S.role == "original":
        _patch_random_sampler(torch)
        if _S.chunks > 1:
            _patch_chunks(torch)
    else:
        _patch_distributed_sampler(torch)

    bn = _BatchNorm
    drop = _DropoutNd
    wrappers = {"DataParallel": "dp", "DistributedDataParallel": "ddp"}

    def forward_pre_hook(module, args):
        if not _S.on:
            return None
        if threading.current_thread() is threading.main_thread():
            # an outermost call of a module with parameters: what an inference-only script runs
            # its model on (a transform such as Normalize, called per sample, has none)
            if _S.depth == 0 and next(module.parameters(), None) is not None:
                if _S.redraw and not _S.redrawn and module.training:
                    _redraw(_S)  # the first training forward: its dropout masks, and what the step draws next
                first = args[0] if args else None
                _S.forwards[0] += 1
                _S.forwards[1] += int(first.shape[0]) if getattr(first, "ndim", 0) else 0
            _S.depth += 1
        if isinstance(module, bn) and module.training and type(module).__name__ != "SyncBatchNorm":
            _S.modules.add("batchnorm")
        elif isinstance(module, drop) and module.training and getattr(module, "p", 0) > 0:
            _S.modules.add("dropout")
        else:
            kind = wrappers.get(type(module).__name__)
            if kind:
                _S.modules.add(kind)
        return None

    def forward_after(module, args, output):
        if _S.on and threading.current_thread() is threading.main_thread():
            _S.depth = max(_S.depth - 1, 0)
        return None

    # Only during the first step (removed by _on_step): a global hook costs on every module call.
    _S.forward_hook = register_module_forward_pre_hook(forward_pre_hook)
    _S.forward_after = register_module_forward_hook(forward_after, always_call=True)

    # A script may call ``model.forward(x)`` on the wrapper itself (SimSiam does): no hook
    # runs for the wrapper then, only for what it calls. Its forward says it ran.
    from torch.nn.parallel import DataParallel, DistributedDataParallel

    for cls, kind in ((DataParallel, "dp"), (DistributedDataParallel, "ddp")):
        real_forward = cls.forward

        def forward(self, *args, _real=real_forward, _kind=kind, **kwargs):
            if _S.on:
                _S.modules.add(_kind)
                _S.wrapper = weakref.ref(self)
                if _S.unjudged:
                    _judge_unjudged(_S, self.training and torch.is_grad_enabled())
            return _real(self, *args, **kwargs)

        functools.update_wrapper(forward, real_forward)
        cls.forward = forward


def _judge_unjudged(s, training):
    """Batches fetched while the wrapped model was in eval mode, judged by the forward that
    follows them: a training forward (train mode, gradients on) takes them, and they count
    as fetched for the step; an evaluation forward drops them, with any an evaluation pass
    left behind (SpanBERT's evaluation between two steps of a list of batches read before
    training must not become the next step's loader)."""
    if training:
        fetched = s.fetched
        for key, n in s.unjudged.items():
            fetched[key] = fetched.get(key, 0) + n
        s.last = s.unjudged_last
    s.unjudged = {}
    s.unjudged_last = None


def _loss_value(t):
    """What the step keeps of a back-propagated loss: a CPU loss becomes a float at once
    (``item()`` costs less than ``detach()``, and holds no graph); a device loss stays a
    detached tensor, so that nothing waits for the device before the step."""
    if t.numel() != 1:
        t = t.detach().float().mean()
    return t.item() if t.is_cpu else t.detach()


def _first_tensor(batch, tensor_type, depth=0):
    if isinstance(batch, tensor_type):
        return batch
    if depth > 3:
        return None
    if isinstance(batch, (list, tuple)) and batch:
        return _first_tensor(batch[0], tensor_type, depth + 1)
    if isinstance(batch, dict) and batch:
        return _first_tensor(next(iter(batch.values())), tensor_type, depth + 1)
    return None


_WEIGHTS = {}


def _print_weights(n, torch):
    """Fixed odd int64 weights, the same in every process (a generator of its own: the
    script's random state is not touched)."""
    w = _WEIGHTS.get(n)
    if w is None:
        g = torch.Generator().manual_seed(0x5EED)
        w = _WEIGHTS[n] = torch.randint(1, 1 << 62, (n,), generator=g, dtype=torch.int64) | 1
    return w


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


# --------------------------------------------------------------------------- data evidence


class _Pass:
    """One pass of a loader's index sampler in this process: the indices served (folded into
    a bitset of the dataset's length, with a count of those served again), the first HEAD of
    them and a CRC of their order."""

    def __init__(self, it, key, k, n, length, kind, site, sharded):
        self.it, self.key, self.k, self.n, self.length, self.kind, self.site = it, key, k, n, length, kind, site
        self.sharded = sharded  # ShardedBatches: seed and epoch of this pass
        self.arr = array.array("q")
        self.head = []
        self.crc = 0
        self.served = 0
        self.batches = 0
        self.seen = None  # a torch bool tensor, once folded
        self.dups = 0
        self.first_len = 0  # indices in the first batch
        self.bad = False  # indices that are not integers: counts only
        self.iterable = False
        self.closed = False
        self.prints = None  # a stream's samples, by content (array of int64 fingerprints)

    def fingerprint(self, batch, torch):
        """The fingerprints of a stream batch's samples (rows of its first tensor): an int64
        sum of the first PRINT_BYTES bytes of each row, each times a fixed odd weight --
        integer arithmetic, so the same bytes give the same print in every process. Never
        worth a crash: a batch without a CPU tensor is skipped."""
        try:
            t = _first_tensor(batch, torch.Tensor)
            if t is None or t.dim() == 0 or t.device.type != "cpu" or t.is_sparse:
                return
            rows = t.detach().reshape(t.shape[0], -1).contiguous()
            if rows.dtype == torch.bool:
                rows = rows.to(torch.uint8)
            raw = rows.view(torch.uint8)[:, :PRINT_BYTES].to(torch.int64)
            w = _print_weights(raw.shape[1], torch)
            prints = (raw * w).sum(1)
            if self.prints is None:
                self.prints = array.array("q")
            if len(self.prints) < PRINTS_MAX:
                self.prints.extend(prints.tolist())
        except Exception:
            self.prints = None
            self.iterable_unprinted = True

    def add(self, idx):
        if idx is None:
            self.iterable = True
            return
        try:
            self.arr.append(idx)
        except (TypeError, OverflowError):
            self.bad = True

    def fold(self):
        """Fold the buffered indices into the bitset (torch's bincount: C speed)."""
        import zlib

        import torch

        arr, self.arr = self.arr, array.array("q")
        if not arr:
            return
        if len(self.head) < HEAD:
            self.head.extend(arr[: HEAD - len(self.head)])
        self.crc = zlib.crc32(memoryview(arr).cast("B"), self.crc)
        self.served += len(arr)
        if self.bad:
            return
        t = torch.frombuffer(arr, dtype=torch.int64)
        lo, hi = int(t.min()), int(t.max())
        size = max(self.n or 0, hi + 1)
        if lo < 0 or size > EVIDENCE_MAX_N:
            self.bad = True
            self.seen = None
            return
        counts = torch.bincount(t, minlength=size)
        now = counts > 0
        if self.seen is None:
            self.seen = now
        else:
            if self.seen.numel() < size:
                self.seen = torch.cat([self.seen, torch.zeros(size - self.seen.numel(), dtype=torch.bool)])
            self.dups += int((self.seen[:size] & now).sum())
            self.seen[:size] |= now
        self.dups += int((counts - 1).clamp_(min=0).sum())

    def close(self, complete):
        if self.closed:
            return
        self.closed = True
        if not complete and self.length and self.batches >= self.length and not self.iterable:
            complete = True  # every batch was served; the loop stopped before asking for one more
        s = _S
        if s.passes.get(self.key) is self:
            del s.passes[self.key]
        try:
            self.fold()
            rec = {"ev": "pass", "key": self.key, "k": self.k, "complete": complete, "n": self.n,
                   "len": self.length, "batches": self.batches, "served": self.served, "head": self.head,
                   "crc": self.crc, "kind": self.kind, "site": self.site, "step": s.step}
            if self.sharded:
                rec["sharded"] = self.sharded
            if self.iterable:
                rec["iterable"] = True
                if self.prints is not None and not getattr(self, "iterable_unprinted", False) and s.evidence < EVIDENCE_BYTES:
                    data = zlib.compress(self.prints.tobytes())
                    s.evidence += len(data)
                    rec["prints"] = base64.b64encode(data).decode()
            if self.bad:
                rec["unrecorded"] = True
            elif self.seen is not None:
                rec["unique"] = int(self.seen.sum())
                rec["dups"] = self.dups
                if self.k < EVIDENCE_PASSES and s.evidence < EVIDENCE_BYTES:
                    bits = _pack(self.seen)
                    s.evidence += len(bits)
                    rec["bits"] = bits
            self.seen = None
            s.emit(rec)
        except Exception as e:  # evidence is never worth a crash of the script
            s.emit({"ev": "pass", "key": self.key, "k": self.k, "error": repr(e)})


def _pack(seen):
    """A bool tensor as base64 of the zlib-compressed bitset (bit i of byte i // 8, LSB first)."""
    import base64
    import zlib

    import torch

    n = seen.numel()
    pad = (-n) % 8
    bits = torch.cat([seen, torch.zeros(pad, dtype=torch.bool)]) if pad else seen
    weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)
    packed = (bits.view(-1, 8).to(torch.uint8) * weights).sum(1, dtype=torch.uint8)
    return base64.b64encode(zlib.compress(packed.numpy().tobytes(), 6)).decode("ascii")


def _begin_pass(it):
    """A new pass of the loader whose iterator is ``it`` (its sampler iterator is new)."""
    s = _S
    sampler = it._index_sampler
    key = id(sampler)
    old = s.passes.get(key)
    if old is not None:
        old.close(False)  # left before its end (a break, or the run stopped)
    k = s.npasses.get(key, 0)
    s.npasses[key] = k + 1
    try:
        n = len(it._dataset)
    except Exception:
        n = None
    try:
        length = len(sampler)
    except Exception:
        length = None
    inner = getattr(sampler, "sampler", None)
    kind = type(sampler).__name__
    sharded = None
    if kind == "ShardedBatches" or hasattr(sampler, "batches") and hasattr(sampler, "seed") and hasattr(sampler, "epoch"):
        # the epoch this pass used: ShardedBatches advances it once it has drawn the batches
        sharded = {"seed": _int(getattr(sampler, "seed", 0)), "epoch": _int(getattr(sampler, "epoch", 1)) - 1,
                   "mode": getattr(sampler, "mode", "split")}
        kind = "ShardedBatches"
        if s.role == "migrated":
            s.emit({"ev": "sampler", "kind": "sharded", "id": key, "seed": sharded["seed"], "epoch": sharded["epoch"],
                    "n": n, "batches": length, "mode": sharded["mode"]})
    elif inner is not None and kind in ("BatchSampler", "_Aligned"):
        kind = type(inner).__name__
    p = _Pass(it._sampler_iter, key, k, n, length, kind, it.__dict__.get("_dp2ddp_site"), sharded)
    s.passes[key] = p
    s.pass_count += 1
    return p


def _int(x):
    try:
        return int(x)
    except Exception:
        return 0


# --------------------------------------------------------------------------- the original's order


def _sampler_plans(text):
    """The migrated run's shuffling samplers, in the order of their first iteration:
    ``[{"n": len(dataset), "seed": S, "epochs": [...]}, ...]`` for DistributedSamplers, and
    ``{"kind": "sharded", "n", "batches", "seed", "epochs"}`` for loaders sharded by
    ShardedBatches (verify reads them from the migrated run's records and hands them over
    as JSON)."""
    try:
        plans = json.loads(text) if text else []
    except ValueError:
        return []
    return [p for p in plans if isinstance(p, dict)] if isinstance(plans, list) else []


def _claim_plan(n, kind="distributed", batches=None):
    """The plan for a sampler iterated for the first time: the first plan of that kind not
    yet claimed whose dataset has the same length (the migrated run's sampler of the same
    loader), else none: for a RandomSampler, the first plan's seed (the migration's sampler
    seed) and epochs 0, 1, 2, ...; for a loader, None (it is left as it is)."""
    s = _S
    for i, p in enumerate(s.samplers):
        if i in s.claimed or p.get("kind", "distributed") != kind or p.get("n") != n:
            continue
        if batches is not None and p.get("batches") not in (None, batches):
            continue
        s.claimed.add(i)
        epochs = [int(e) for e in (p.get("epochs") or [])]
        return {"seed": int(p.get("seed") or 0), "epochs": epochs, "k": 0, "epoch": None}
    if kind != "distributed":
        return None
    first = next((p for p in s.samplers if p.get("kind", "distributed") == "distributed"), None)
    seed = int(first.get("seed") or 0) if first else 0
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


class _Aligned:
    """The original's batch sampler, iterated the way the migration's ShardedBatches iterates
    it on every rank: all of a pass's batches drawn at once under ``seed + epoch`` (torch,
    ``random`` and NumPy seeded, their global states restored), so that the global batch of
    step k is the migration's. In one process the batches stay whole."""

    def __init__(self, batches, plan, torch):
        self.batches, self.plan, self.torch = batches, plan, torch
        self.sampler = getattr(batches, "sampler", None)

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        # a generator, as ShardedBatches' own __iter__ is: a DataLoader with workers calls
        # iter() on its batch sampler twice for its first pass (its iterator's __init__, then
        # _reset) and draws from the second only; the plan advances once a pass draws
        torch, s = self.torch, _S
        epoch = _next_epoch(self.plan)
        seed = self.plan["seed"] + epoch
        np = sys.modules.get("numpy")
        states = random.getstate(), np.random.get_state() if np is not None else None
        s.aligning = True
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                random.seed(seed)
                if np is not None:
                    np.random.seed(seed % 2**32)
                drawn = [list(b) for b in self.batches]
        finally:
            s.aligning = False
            random.setstate(states[0])
            if np is not None:
                np.random.set_state(states[1])
        s.emit({"ev": "sampler", "kind": "aligned", "seed": self.plan["seed"], "epoch": epoch, "n": len(drawn)})
        yield from drawn


def _align_loader(loader, torch):
    """At a loader's first iteration in the original: if the migration sharded the loader of
    the same dataset length and number of batches with ShardedBatches, iterate its batch
    sampler as ShardedBatches does (:class:`_Aligned`)."""
    object.__setattr__(loader, "_dp2ddp_aligned", True)
    batches = loader.__dict__.get("batch_sampler")
    if batches is None or not any(p.get("kind") == "sharded" for p in _S.samplers):
        return
    try:
        n, length = len(loader.dataset), len(batches)
    except Exception:
        return
    plan = _claim_plan(n, "sharded", length)
    if plan is not None:
        object.__setattr__(loader, "batch_sampler", _Aligned(batches, plan, torch))


ITEMS_WATCHED = 16  # the first items of each dataset: every stream seeded, and watched for draws
REWATCH = 256  # afterwards one item in this many is watched again


class _Streams:
    """The random streams (torch's CPU generator, ``random``, NumPy) one dataset's items
    draw from, learnt by watching: its first items, and one in ``REWATCH`` afterwards, are
    fetched with every stream seeded and each stream's state compared after the item with
    its state just after the seed. Other items seed only the streams seen drawn from.
    Seeding a stream costs microseconds an item (NumPy's save and restore, ~0.1 ms, once a
    batch): on a dataset that draws nothing (tensors in memory) that is most of a short step,
    and it buys nothing there."""

    def __init__(self):
        self.used = set()
        self.items = 0

    def fetch(self, dataset, indices, npass, torch):
        np = sys.modules.get("numpy")
        gen = torch.default_generator
        saved = {}
        items = []
        try:
            for idx in indices:
                self.items += 1
                watch = self.items <= ITEMS_WATCHED or self.items % REWATCH == 0
                streams = ("torch", "random", "numpy") if watch else self.used
                if not streams:
                    items.append(dataset[idx])
                    continue
                seed = zlib.crc32(("%d|%s|%d|%r" % (_S.seed, type(dataset).__name__, npass, idx)).encode())
                fresh = {}
                for name in streams:
                    if name == "torch":
                        if name not in saved:
                            saved[name] = gen.get_state()
                        gen.manual_seed(seed)
                        if watch:
                            fresh[name] = gen.get_state()
                    elif name == "random":
                        if name not in saved:
                            saved[name] = random.getstate()
                        random.seed(seed)
                        if watch:
                            fresh[name] = random.getstate()
                    elif np is not None:
                        if name not in saved:
                            saved[name] = np.random.get_state()
                        np.random.seed(seed)
                        if watch:
                            fresh[name] = np.random.get_state()
                items.append(dataset[idx])
                if watch:
                    if not torch.equal(gen.get_state(), fresh["torch"]):
                        self.used.add("torch")
                    if random.getstate() != fresh["random"]:
                        self.used.add("random")
                    if np is not None:
                        now, then = np.random.get_state(), fresh["numpy"]
                        if now[2:] != then[2:] or not np.array_equal(now[1], then[1]):
                            self.used.add("numpy")
        finally:
            for name, state in saved.items():
                if name == "torch":
                    gen.set_state(state)
                elif name == "random":
                    random.setstate(state)
                else:
                    np.random.set_state(state)
        return items


def _patch_item_seeds(torch):
    """Each item of a map-style dataset is made with the random streams (torch's CPU
    generator, ``random``, NumPy) seeded from (seed, dataset, pass, index), and the streams
    are left as they were before the batch. A random crop or flip of item 5 is then the same
    whichever process fetches it: the original's one process, the rank that owns it in the
    migration, or a worker of either. Without this, the original draws the augmentations of
    a whole batch from one stream while each rank draws its share from its own copy of it:
    the losses could only agree statistically, and a difference the migration made would
    hide among them. Only the streams a dataset is seen to draw from are seeded
    (``_Streams``). Datasets that fetch whole batches (``__getitems__``) are left as they are."""
    from torch.utils.data._utils import fetch

    real_fetch = fetch._MapDatasetFetcher.fetch
    streams = {}  # id(dataset) -> _Streams

    @functools.wraps(real_fetch)
    def fetch_items(self, possibly_batched_index):
        ds = self.dataset
        # the migration's per-rank draws (ShardedBatches.apart) step aside: items are seeded here
        if _S is None or (self.auto_collation and getattr(ds, "__getitems__", None) and not getattr(ds, "dp2ddp_apart", False)):
            return real_fetch(self, possibly_batched_index)
        npass = _S.item_passes.get(id(ds), 0)
        seen = streams.get(id(ds))
        if seen is None:
            seen = streams[id(ds)] = _Streams()
        if self.auto_collation:
            return self.collate_fn(seen.fetch(ds, possibly_batched_index, npass, torch))
        return self.collate_fn(seen.fetch(ds, (possibly_batched_index,), npass, torch)[0])

    fetch._MapDatasetFetcher.fetch = fetch_items


def _seed_from_a_copy(real_iter_init, it, loader, args, kwargs, torch):
    """A pass of a loader without a generator of its own draws its workers' base seed from the
    global torch stream; the migration's shard_loader gives a loader with workers a generator
    of its own (its ranks' workers draw apart), so the original's later draws in the step (a
    GAN's noise) would come from a stream one draw ahead of the migrated ranks' at every
    epoch, and no step's draws could line up (pytorch/examples' dcgan with --workers 2). In
    every run the seed is drawn from a copy of the stream instead: the same seed, the stream
    left where it was."""
    copy = torch.Generator()
    copy.set_state(torch.random.get_rng_state())
    loader.generator = copy
    try:
        return real_iter_init(it, loader, *args, **kwargs)
    finally:
        loader.generator = None


def _patch_random_sampler(torch):
    from torch.utils.data import RandomSampler

    real_iter = RandomSampler.__iter__

    def __iter__(self):
        if self.replacement or self._num_samples is not None or not _S.on or _S.aligning:
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


# --------------------------------------------------------------------------- the noise envelope


def _patch_chunks(torch):
    """The envelope run: DataParallel scatters each batch into ``chunks`` parts along
    dimension 0 (as over that many devices) and gathers the outputs; autograd then sums the
    parts' gradients -- DDP's arithmetic (per-part BatchNorm statistics included) in one
    process. Without DataParallel (a script that wraps only on GPUs), each gradient is
    perturbed at every step instead, by W roundings of each element's magnitude plus the
    tensor's RMS (reduction-order noise: one rounding of each element alone is far below
    what Adam makes of the near-zero elements a different summation order moves)."""
    from torch.nn.parallel import DataParallel
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    W = _S.chunks
    real_forward = DataParallel.forward

    def each(obj, fn):
        """``obj`` with ``fn`` applied to every tensor in it (through lists, tuples, dicts)."""
        if isinstance(obj, torch.Tensor):
            return fn(obj)
        if isinstance(obj, (list, tuple)):
            out = [each(x, fn) for x in obj]
            return type(obj)(out) if not hasattr(obj, "_fields") else type(obj)(*out)
        if isinstance(obj, dict):
            return type(obj)((k, each(v, fn)) for k, v in obj.items())
        return obj

    def split(obj, i, n):
        def part(t):
            if t.dim() == 0 or t.size(0) < W:
                return t
            return t.chunk(W, dim=0)[i] if len(t.chunk(W, dim=0)) == W else t

        return each(obj, part)

    def gather(outs):
        first = outs[0]
        if isinstance(first, torch.Tensor):
            if first.dim() == 0:
                return torch.stack(outs).mean()
            return torch.cat(outs, dim=0)
        if isinstance(first, (list, tuple)):
            out = [gather([o[j] for o in outs]) for j in range(len(first))]
            return type(first)(out) if not hasattr(first, "_fields") else type(first)(*out)
        if isinstance(first, dict):
            return type(first)((k, gather([o[k] for o in outs])) for k in first)
        return first

    def forward(self, *inputs, **kwargs):
        # on GPUs DataParallel scatters over its devices already: the chunks are its own there,
        # and the envelope perturbs the gradients instead
        if not _S.on or self.device_ids:
            return real_forward(self, *inputs, **kwargs)
        _S.modules.add("dp")
        sizes = {x.size(0) for x in _tensors(inputs, torch) if x.dim()}
        if len(sizes) != 1 or next(iter(sizes)) < W:
            return self.module(*inputs, **kwargs)
        _S.chunked = True
        n = next(iter(sizes))
        # (an evaluation forward is no training step: its batch, a multiple of the training
        # batch or not, holds no views to regroup, and BatchNorm uses its running statistics)
        views = views_order(n) if self.training and torch.is_grad_enabled() else None
        if views is not None:
            inputs, kwargs = take(inputs, views[0], n), take(kwargs, views[0], n)
        outs = [self.module(*split(inputs, i, W), **split(kwargs, i, W)) for i in range(W)]
        return take(gather(outs), views[1], n) if views is not None else gather(outs)

    def views_order(n):
        """A forward over k views of each sample concatenated (``model(torch.cat([v1, v2]))``:
        n = k x the batch's samples): DataParallel's chunks would hold the first views and the
        second views, DDP's shares hold every view of each rank's samples, and BatchNorm
        normalises each chunk on its own. ``(order, inverse)``: the rows in DDP's grouping (chunk
        c = every view of share c) and back; ``None`` where n is not such a multiple."""
        b = _S.last_batch
        if not b or n == b or n % b or b % W or n // b < 2:
            return None
        k, share = n // b, b // W
        order = torch.tensor([j * b + c * share + i for c in range(W) for j in range(k) for i in range(share)])
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(n)
        _S.regrouped = True
        return order, inverse

    def take(obj, index, n):
        return each(obj, lambda t: t.index_select(0, index.to(t.device)) if t.dim() and t.size(0) == n else t)

    DataParallel.forward = forward
    _patch_outer_split(torch, W, split, gather, views_order, take)
    gen = torch.Generator()
    gen.manual_seed(12345)

    def perturb(optimizer, args, kwargs):
        if not _S.on or _S.chunked:
            return
        with torch.no_grad():
            for g in optimizer.param_groups:
                for p in g["params"]:
                    if p.grad is not None and p.grad.is_floating_point() and not p.grad.is_sparse:
                        g = p.grad
                        eps = torch.finfo(g.dtype).eps
                        sign = torch.randint(0, 2, g.shape, generator=gen).to(g) * 2 - 1
                        # W ranks' partial sums added in another order: each element moves by
                        # about a rounding of the terms summed, not of the (possibly cancelled)
                        # sum: eps relative to the element, plus eps of the tensor's RMS, W times
                        rms = g.detach().float().pow(2).mean().sqrt().to(g.dtype)
                        g.add_(sign * (g.abs() + rms) * (eps * W))

    register_optimizer_step_pre_hook(perturb)
    _patch_batchnorm_chunks(torch, W)


def _patch_outer_split(torch, W, split, gather, views_order=None, take=None):
    """The envelope run of a script that wraps its model only on GPUs (no DataParallel runs
    here): the outermost call of a module with parameters, in training mode with gradients
    on, is split into W chunks along dimension 0 and its outputs gathered, as DataParallel
    would have split it -- the arithmetic of W ranks, each its share, in one process. A
    gradient perturbation alone is far narrower than the noise of another summation order
    under Adam (MPRNet: 2.6e-07 against the 2.0e-05 that a run split by hand differs by).
    A module whose outputs are not batch-major (a chunk's output of another length) is run
    whole from then on; where nothing was split, the gradients are perturbed instead."""
    from torch.nn.parallel import DataParallel

    Module = torch.nn.Module
    real_call = Module.__call__
    state = {"depth": 0, "whole": set()}
    main = threading.main_thread()

    def batch_major(out, n):
        return all(t.dim() == 0 or t.size(0) == n for t in _tensors(out, torch))

    def nested(self, args, kwargs):
        state["depth"] += 1
        try:
            return real_call(self, *args, **kwargs)
        finally:
            state["depth"] -= 1

    def __call__(self, *args, **kwargs):
        if (state["depth"] or not _S.on or not self.training or isinstance(self, DataParallel)
                or id(self) in state["whole"] or threading.current_thread() is not main
                or not torch.is_grad_enabled() or next(self.parameters(), None) is None):
            return nested(self, args, kwargs)
        sizes = {x.size(0) for x in _tensors((args, kwargs), torch) if x.dim()}
        if len(sizes) != 1 or next(iter(sizes)) < W:
            return nested(self, args, kwargs)
        n = next(iter(sizes))
        counts = [len(c) for c in torch.arange(n).chunk(W)]
        if len(counts) != W:
            return nested(self, args, kwargs)
        was = _S.chunked
        _S.chunked = True  # BatchNorm and the gradient perturbation step aside: the chunks are the ranks
        views = views_order(n) if views_order is not None else None  # (views concatenated: DDP's grouping)
        if views is not None:
            args, kwargs = take(args, views[0], n), take(kwargs, views[0], n)
        outs = [nested(self, split(args, i, W), split(kwargs, i, W)) for i in range(W)]
        if all(batch_major(o, c) for o, c in zip(outs, counts)):
            _S.outer_split = True
            return take(gather(outs), views[1], n) if views is not None else gather(outs)
        if views is not None:
            args, kwargs = take(args, views[1], n), take(kwargs, views[1], n)
        _S.chunked = was
        state["whole"].add(id(self))
        return nested(self, args, kwargs)

    functools.update_wrapper(__call__, real_call)
    Module.__call__ = __call__


def _patch_batchnorm_chunks(torch, W):
    """Without DataParallel's chunks (a script that wraps only on GPUs), each BatchNorm in
    training normalises the batch in W chunks along dimension 0, each with its own
    statistics, as W ranks do; the running statistics keep chunk 0's update (DDP broadcasts
    rank 0's buffers at the next forward). The loss over the whole batch is then the mean
    of the chunks' losses and its gradient the mean of theirs: DDP's arithmetic."""
    from torch.nn.modules.batchnorm import _BatchNorm

    real = _BatchNorm.forward

    def forward(self, input):
        if (not _S.on or _S.chunked or not self.training or not isinstance(input, torch.Tensor)
                or input.dim() < 2 or input.size(0) < W or type(self).__name__ == "SyncBatchNorm"):
            return real(self, input)
        parts = input.chunk(W, dim=0)
        if len(parts) != W:
            return real(self, input)
        _S.bn_chunked = True
        names = [n for n in ("running_mean", "running_var", "num_batches_tracked") if getattr(self, n, None) is not None]
        before = {n: getattr(self, n).detach().clone() for n in names}
        outs = [real(self, parts[0])]
        kept = {n: getattr(self, n) for n in names}  # chunk 0's update, in the module's own tensors
        for part in parts[1:]:
            # the other chunks update copies (the op saved the module's tensors for backward:
            # they must not change in place), which are then dropped
            for n in names:
                setattr(self, n, before[n].clone())
            outs.append(real(self, part))
        for n in names:
            setattr(self, n, kept[n])
        return torch.cat(outs, dim=0)

    _BatchNorm.forward = forward


def _tensors(obj, torch, depth=0):
    if isinstance(obj, torch.Tensor):
        return [obj]
    if depth > 3:
        return []
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in _tensors(x, torch, depth + 1)]
    if isinstance(obj, dict):
        return [t for x in obj.values() for t in _tensors(x, torch, depth + 1)]
    return []


# --------------------------------------------------------------------------- steps


def _on_step(optimizer, args, kwargs):
    s = _S
    if s.finished or not s.on:
        return
    info = s.opts.get(id(optimizer))
    if info is None or info.ref() is not optimizer:  # created before torch was hooked, or bypassing __init__
        info = _new_opt(s, optimizer, None)
    s.clock += 1
    prim = s.primary
    if info is not prim:
        if prim is None or info.born >= prim.last:
            # the first optimizer to step, or one created after the primary stopped
            # stepping (a new optimizer per fold): its steps are the run's steps now
            s.primary = prim = info
            if info.steps == 0:
                _remember(s, optimizer)
        else:
            _secondary(s, info, optimizer)
            return
    info.last = s.clock
    info.steps += 1
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
    key = s.last if fed is None else fed
    samples = fetched.get(key, 0) if fetched else 0
    if samples and key not in s.trained:
        s.trained.append(key)
    modules = _first_step(s, key, samples) if s.step == 1 else None
    if s.step <= _RNG_STEPS:
        _mark_rng(s)
    if s.redraw and not s.redrawn:
        _redraw(s)
    if s.pending:
        _drain(block=False)
    loss = _step_loss(losses)
    lr = _lr(optimizer)
    rec = (s.step, t, samples, len(losses), loss, modules, info.index, lr)  # formatted by _step_line
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
    if s.stop_at and s.step >= s.stop_at:
        _finish("limit")
        raise SystemExit(0)


_RNG_STEPS = 4


def _redraw(s):
    """The envelope run of an original whose training step draws random numbers: from the
    first training forward (or, where none was seen, the first step) on, the global streams
    (torch's CPU and CUDA generators, ``random``, NumPy) draw from another seed. The data's
    order and the items' own draws are seeded apart (the aligned samplers, the items'
    streams), so they stay the original's."""
    s.redrawn = True
    seed = s.stream_seed + 7_777_777
    try:
        import torch

        torch.manual_seed(seed)
    except Exception:  # noqa: BLE001 - evidence, never a failure of the run
        pass
    random.seed(seed)
    np = sys.modules.get("numpy")
    if np is not None:
        try:
            np.random.seed(seed % 2**32)
        except Exception:  # noqa: BLE001
            pass


def _mark_rng(s):
    """The default CPU generator's state at this step: where it moves between consecutive
    steps (not only where a loader starts a pass), the step itself draws random numbers
    (mixup's permutation, a GAN's noise, augmentations in the main process). Each rank then
    draws its own from its own stream where the original drew the whole batch's: the
    losses can only agree statistically."""
    try:
        import hashlib

        import torch

        state = hashlib.blake2b(torch.random.get_rng_state().numpy().tobytes(), digest_size=8).hexdigest()
        s.rng_marks.append((state, s.pass_count))
    except Exception:  # noqa: BLE001 - evidence, never a failure of the run
        pass


def _new_opt(s, optimizer, site):
    info = _Opt(optimizer, len(s.all_opts), s.clock, site)
    s.opts[id(optimizer)] = info
    s.all_opts.append(info)
    return info


def _secondary(s, info, optimizer):
    """A step of another optimizer (a GAN's generator): recorded, not counted."""
    info.last = s.clock
    info.steps += 1
    if info.steps == 1:
        _remember(s, optimizer)
    losses, s.losses = s.losses, []
    loss = _step_loss(losses)
    if loss is not None and type(loss) is not float:
        loss = float(loss)  # rare enough (a second optimizer on a device) to synchronise
    s.buf.append((s.step, time.time(), 0, len(losses), loss, None, info.index, _lr(optimizer), "ostep"))


def _step_loss(losses):
    if not losses:
        return None
    if len(losses) == 1:
        return losses[0]
    return _mean_loss(losses)


def _lr(optimizer):
    try:
        lr = optimizer.param_groups[0].get("lr")
        return lr if type(lr) is float else (float(lr) if lr is not None else None)
    except Exception:
        return None


def _remember(s, optimizer):
    """The parameters of every optimizer, kept for the digest: a script whose optimizer is a
    local of its train() has dropped it by exit (the model keeps them alive anyway)."""
    s.kept.append((s.opts[id(optimizer)].ref, [p for g in optimizer.param_groups for p in g["params"]]))


def _first_step(s, key, samples):
    """Stop watching module calls (a global forward hook costs on every call); work out how
    far the run goes for the data evidence; return the kinds of modules seen."""
    if s.forward_hook is not None:
        s.forward_hook.remove()
        s.forward_hook = None
    if s.forward_after is not None:
        s.forward_after.remove()
        s.forward_after = None
    if s.extend and s.limit:
        s.stop_at = _evidence_steps(s, key, samples)
    return sorted(s.modules)


def _evidence_steps(s, key, samples):
    """The step at which the training loader has begun its second pass: its batches per
    pass over its batches per step, plus one -- at least --steps, at most the extension's
    bound (then --steps, and the record says why). Every rank computes it from the same
    lengths, so every rank stops at the same step."""
    p = s.passes.get(key)
    if p is None or not p.length or not samples:
        s.emit({"ev": "evidence", "why": "no sized training loader", "stop": s.limit})
        return s.limit
    bps = max(1, round(samples / (p.first_len or samples)))
    need = -(-p.length // bps) + 1
    if need <= s.limit:
        stop = s.limit
    elif need <= s.extend:
        stop = need
    else:
        s.emit({"ev": "evidence", "why": "epoch too long", "need": need, "stop": s.limit, "bound": s.extend})
        return s.limit
    s.emit({"ev": "evidence", "need": need, "stop": stop, "bound": s.extend})
    return stop


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
    for ref, kept in _S.kept:
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
    for p in list(s.passes.values()):
        p.close(False)
    rec = {"ev": "end", "t": time.time(), "why": why, "steps": s.step, "modules": sorted(s.modules),
           "trained": list(s.trained), "stop_at": s.stop_at,
           "optimizers": [{"index": o.index, "kind": o.kind, "site": o.site, "steps": o.steps}
                          for o in s.all_opts if o.steps]}
    if not s.step:
        rec["forwards"] = {"calls": s.forwards[0], "samples": s.forwards[1]}
    if _OUT is not None:
        rec["stdout"] = "".join(_OUT.kept)
        rec["stdout_cut"] = _OUT.cut
    if _G is not None and _G.blocked:
        rec["blocked"] = sorted(set(_G.blocked))[:20]
    # a loader that starts a pass draws its shuffle's seed: not the step's own draw
    drawn = sum(1 for a, b in zip(s.rng_marks, s.rng_marks[1:]) if a[0] != b[0] and a[1] == b[1])
    if drawn >= 2:
        rec["random_steps"] = drawn  # the training step draws from the default generator
        rec["rng"] = [m[0] for m in s.rng_marks]  # its state at the first steps: aligned with the other run's?
    if s.chunks > 1:
        rec["envelope"] = "chunks" if s.chunked else "perturb"
        if s.regrouped:
            rec["regrouped"] = True
        if s.outer_split:
            rec["split_at"] = "model"  # no DataParallel here: the model's outermost call was split
        if s.bn_chunked and not s.chunked:
            rec["bn_chunks"] = True
    if s.redrawn:
        rec["redrawn"] = True
    try:
        rec.update(_param_digest())
    except Exception as e:
        rec["digest_error"] = repr(e)
    gpu = _gpu_memory()
    if gpu:
        rec["gpu"] = gpu
    s.emit(rec)


def _gpu_memory():
    """Peak GPU memory of this process on each CUDA device it used (bytes, as the caching
    allocator counts them): only when the script itself initialised CUDA (nothing here starts
    a CUDA context)."""
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return None
        out = []
        for d in range(torch.cuda.device_count()):
            peak = torch.cuda.max_memory_allocated(d)
            if peak:
                out.append({"device": d, "name": torch.cuda.get_device_name(d), "peak_allocated": peak,
                            "peak_reserved": torch.cuda.max_memory_reserved(d)})
        return out or None
    except Exception:
        return None


def _settle():
    """Let gloo's worker threads finish before Python finalizes. torch 2.13 keeps a Python
    object in the state every all-reduce started inside ``backward()`` captures; the worker
    thread frees the last one just after the main thread moved on, which needs the GIL, and a
    thread asking for the GIL once finalization began is ended with ``pthread_exit`` — the
    process aborts ("terminate called without an active exception"). Sleeping here, still
    before finalization, hands the GIL over. See README, Known issues."""
    if _S is not None and _S.on and "torch.distributed" in sys.modules:
        time.sleep(0.2)


# --------------------------------------------------------------------------- printed output


STDOUT_KEEP = 256 * 1024  # characters of what the process prints, kept for verify's comparison


class _StdoutTee:
    """``sys.stdout`` as the script found it, keeping (up to :data:`STDOUT_KEEP` characters)
    what the process writes there: an inference-only script's printed results are what
    verify compares."""

    def __init__(self, real):
        self._real = real
        self.kept = []
        self.size = 0
        self.cut = False

    def write(self, text):
        if isinstance(text, str) and _S is not None and _S.on and not self.cut:
            room = STDOUT_KEEP - self.size
            if len(text) > room:
                text, self.cut = text[:room], True
            self.kept.append(text)
            self.size += len(text)
        return self._real.write(text)

    def __getattr__(self, name):
        return getattr(self._real, name)


_OUT = None


def _install_stdout():
    global _OUT
    if sys.stdout is not None:
        _OUT = _StdoutTee(sys.stdout)
        sys.stdout = _OUT


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
