"""Every code the migration prints (DDP1xx), documented once.

Lint rules (DDP0xx) document themselves in :mod:`dp2ddp.rules`; :mod:`dp2ddp.registry`
joins both into the one registry that `check --select`, ``# noqa``, the docs
(``docs/rules.md``) and the tests read. Severity: ``info`` says what the migration
changed; ``warning`` says what it left for a human (exit code 1); ``error`` says why the
file was left unchanged as a whole (exit code 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple


@dataclass(frozen=True)
class MigrationCode:
    code: str
    name: str
    severity: str  # info | warning | error
    summary: str
    why: str
    fix: str  # what the migration does, or what a human should do
    fix_safety: str
    example: str = ""  # a DataParallel script that draws this code
    example_after: str = ""  # what the migration makes of it ("" for warnings and errors)


def _c(*args, **kwargs) -> MigrationCode:
    return MigrationCode(*args, **kwargs)


_IMPORTS = "import torch\nimport torch.nn as nn\n\n"
_STEP = (
    "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "loss = model(torch.randn(8, 4)).sum()\nloss.backward()\nopt.step()\n"
)


def _script(body: str) -> str:
    """An example as a whole (tiny) training script: the imports, the lines that matter,
    one training step."""
    return _IMPORTS + "model = nn.Linear(4, 1)\n" + body + _STEP


_EVAL = (
    _IMPORTS + "from torch.utils.data import DataLoader, TensorDataset\n\n"
    "model = nn.DataParallel(nn.Linear(4, 3))\n"
    "test_loader = DataLoader(TensorDataset(torch.randn(40, 4), torch.randint(0, 3, (40,))), batch_size=8)\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "model(torch.randn(8, 4)).sum().backward()\nopt.step()\n"
)


CODES: Tuple[MigrationCode, ...] = (
    _c(
        "DDP100", "wrap-migrated", "info",
        "a `DataParallel` wrap becomes a `DistributedDataParallel` wrap",
        "DDP runs one process per device; the wrapper must exist before the first forward of training on every rank.",
        "`DataParallel(m, device_ids=..., output_device=...)` becomes `DistributedDataParallel(m, device_ids=[current "
        "device] if CUDA else None)`; the module is placed on its device first (`DP(m).cuda()` -> `DDP(m.cuda())`, a "
        "following `m.to(device)` is absorbed).",
        "Safe: the wrap stays where it was or moves just below the placement of the same module.",
        _script("model = nn.DataParallel(model).cuda()\n"),
        "model = DistributedDataParallel(model.cuda(), device_ids=[torch.cuda.current_device()] if torch.cuda.is_available() else None)\n",
    ),
    _c(
        "DDP101", "wrap-not-migratable", "error",
        "a `DataParallel` use that dp2ddp cannot migrate; the file is left unchanged",
        "Some uses have no DDP equivalent (`dim != 0`, unknown arguments) or cannot be followed (a subclass, an alias, "
        "DataParallel passed as a value). A half-migrated script is worse than the original.",
        "Migrate the named line by hand, or restructure it into a plain `model = DataParallel(model)` wrap and run "
        "`dp2ddp rewrite` again.",
        "No fix: the file is left byte-for-byte as it was.",
        _script("model = nn.DataParallel(model, dim=1)\n"),
    ),
    _c(
        "DDP102", "partial-wrap-widened", "info",
        "a partial wrap (`model.features = DP(model.features)`) becomes one wrap of the whole model",
        "DDP must average the gradients of every trained parameter; wrapping a part would leave the rest to drift apart.",
        "The sub-module assignment is dropped and the whole model is wrapped once after its placement.",
        "Safe for training; the model's attribute structure (`model.features`) stays as it was.",
        _IMPORTS + "model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))\nmodel.features = model[0]\nmodel.features = torch.nn.DataParallel(model.features)\nmodel.to(\"cpu\")\n" + _STEP,
    ),
    _c(
        "DDP103", "guarded-wrap-hoisted", "info",
        "a wrap under a condition (`if torch.cuda.device_count() > 1:`) moves out of it",
        "Under DDP every rank must wrap, also with one GPU or on CPU, or the ranks train apart.",
        "The wrap is placed after the `if`; uses of the wrapped name that the original made on the bare module (its own "
        "methods and attributes, `state_dict` keys) go through `.module`, so the script behaves as it did on one device.",
        "Safe: on one device the original had no wrapper, so checkpoints keep keys without the `module.` prefix.",
        _script("if torch.cuda.device_count() > 1:\n    model = nn.DataParallel(model)\n"),
    ),
    _c(
        "DDP104", "distributed-path-incomplete", "error",
        "the script already has a distributed path that dp2ddp cannot complete; the file is left unchanged",
        "A script with its own `init_process_group`/`mp.spawn`/`--local_rank` path beside a DataParallel fallback is "
        "migrated by completing that path for torchrun; where it depends on something dp2ddp cannot rewrite, the "
        "message names it.",
        "Complete the named part by hand (usually: read RANK/WORLD_SIZE/LOCAL_RANK from the environment), then remove "
        "the DataParallel fallback.",
        "No fix: the file is left byte-for-byte as it was.",
    ),
    _c(
        "DDP105", "loader-not-sharded", "error",
        "a training loader that dp2ddp cannot shard between the ranks; the file is left unchanged",
        "Unsharded, every rank trains on the whole data set: the work is repeated, not split, and the effective batch "
        "and learning-rate schedule change. dp2ddp refuses rather than write that migration.",
        "Shard it by hand: a loader with `batch_size=None` gets a `DistributedSampler`, or a `batch_size` (over an "
        "`IterableDataset`, `shard_loader` then splits every batch of the stream); an `IterableDataset`'s loader is "
        "migrated without `--keep-batch-size`; a loader returned inside a tuple kept whole is unpacked into names "
        "first. `--accept DDP105` writes the migration anyway and marks the line.",
        "No fix.",
    ),
    _c(
        "DDP106", "set-epoch-not-placed", "warning",
        "no epoch loop found for a loader that the script's own `DistributedSampler` shards",
        "`DistributedSampler` shuffles with `seed + epoch`; without `set_epoch(epoch)` every epoch repeats the same order. "
        "(Loaders the migration shards need no `set_epoch`: `shard_loader` reshuffles on every pass.)",
        "Call `loader.sampler.set_epoch(epoch)` at the start of every epoch.",
        "No fix.",
    ),
    _c(
        "DDP107", "data-parallel-unresolved", "warning",
        "code names DataParallel in a way dp2ddp cannot resolve (a star import, `getattr`, a class of another package)",
        "dp2ddp migrates what it can prove is `torch.nn.DataParallel`; it never reports \"nothing to migrate\" for a "
        "file that may still use it.",
        "Import DataParallel explicitly (`from torch.nn import DataParallel`, `import torch.nn as nn`) and run again, "
        "or migrate the named line by hand.",
        "No fix.",
        "from modeling import *\n\nmodel = torch.nn.DataParallel(model)\n",
    ),
    _c(
        "DDP108", "eval-loader-whole", "info",
        "an evaluation `DataLoader` stays whole on every rank",
        "Each rank evaluates the full set: the results are exact and equal on every rank; only the time is repeated.",
        "None needed. Shard it with `DistributedSampler(shuffle=False)` and all-reduce the metrics to split the work.",
        "Safe.",
    ),
    _c(
        "DDP160", "eval-sharded", "info",
        "`--shard-eval`: an evaluation loop whose results are sums runs on each rank's own whole batches",
        "Every rank evaluating the whole set repeats the same work world-size times. A loop over an evaluation "
        "`DataLoader` of the script whose accumulators are only added to (`correct += ...`, `test_loss += "
        "loss.item()`, `total += y.size(0)`: bound to a number or a zero tensor before the loop, read only after "
        "it), that runs under `torch.no_grad()` and lets nothing else out of an iteration, can be split exactly.",
        "The loop iterates `EvalPass(loader)` (helpers written once into the script): rank r evaluates the original's "
        "batches r, r + world, ..., so each batch's values are the original's (no padding, no duplicates) and "
        "`len()` stays the loader's. The accumulators are handed to the pass before the loop (`.track(...)`) and taken "
        "back after it (`.total(...)`): every rank's additions are gathered and added up in the original's order of "
        "batches, so sums of floats come out to the last bit as the original's (an all-reduce of per-rank partial "
        "sums would not); an `enumerate` index read after the loop gets the original's last value "
        "(`.last_index(...)`). A loader with fewer batches than ranks, or whose order is not fixed, is read whole on "
        "every rank at run time, and the sums are then left as they are.",
        "Safe: the values after the loop are the original's on every rank; the loop runs on every rank that runs "
        "it, and each rank evaluates at least one batch (DDP syncs buffers on the first forward after training).",
        _EVAL + "correct = 0\nwith torch.no_grad():\n    for x, y in test_loader:\n"
        "        correct += (model(x).argmax(1) == y).sum().item()\nprint(correct)\n",
        "test_loader_pass = EvalPass(test_loader)  # dp2ddp: this rank's whole batches of the loader (--shard-eval)\n"
        "correct = test_loader_pass.track(correct)\nfor x, y in test_loader_pass:\n"
        "    correct += (model(x).argmax(1) == y).sum().item()\n"
        "correct = test_loader_pass.total(correct)  # dp2ddp: every rank's sums, in the original's order\n",
    ),
    _c(
        "DDP162", "per-sample-noise", "info",
        "noise a training step draws per item of the batch: each rank keeps its rows of the global batch's draw",
        "A GAN's `noise = torch.randn(b_size, nz, 1, 1)` in the training loop drew one row per item of the global "
        "batch under DataParallel. Under DDP each rank's `b_size` is its share and the ranks' random streams are "
        "seeded alike, so every rank would draw the same rows: the global batch would hold world-size copies of them "
        "and train on less noise than the original.",
        "The draw's first size dimension (the size of a value the step makes: `x.size(0)`, `x.shape[0]`, `len(x)`, or "
        "a name bound to one in the loop) is multiplied by the world size and the result cut in world-size parts, "
        "`.chunk(dist.get_world_size())[dist.get_rank()]`: every rank draws the original's rows from the same "
        "stream and keeps those that go with the samples `shard_loader` gives it (its contiguous slice of each "
        "global batch). A draw shaped like a batch tensor (`torch.randn_like(img)`, `torch.randn(img.size())`, "
        "`torch.FloatTensor(img.size()).normal_(0, s)`) is made world-size times on every rank, which keeps draw "
        "number `rank`: `[torch.randn_like(img) for _ in range(dist.get_world_size())][dist.get_rank()]`.",
        "Safe: the streams stay alike on every rank (random choices that steer control flow still agree); each "
        "rank draws world-size times as many numbers, which is cheap beside a forward pass. Draws inside the model's "
        "`forward` are left alone (they ran on every replica under DataParallel too).",
        _IMPORTS + "model = nn.DataParallel(nn.Linear(4, 1))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = torch.utils.data.DataLoader(torch.randn(64, 4), batch_size=16)\nfor x in loader:\n"
        "    n = x.size(0)\n    z = torch.randn(n, 4)\n    model(x + z).sum().backward()\n    opt.step()\n",
        "    # dp2ddp: every rank draws the same noise for the global batch and keeps its own share (DataParallel drew one per item)\n"
        "    z = torch.randn(n * dist.get_world_size(), 4).chunk(dist.get_world_size())[dist.get_rank()]\n",
    ),
    _c(
        "DDP163", "valid-count-mean", "info",
        "a loss averaged over the valid targets (`ignore_index`) of the batch: each rank's mean is weighted by its share of them",
        "`nn.CrossEntropyLoss(ignore_index=pad)` computed on DataParallel's gathered outputs averaged over the valid "
        "targets of the whole batch (padding tokens, ignored pixels left out). Under DDP each rank averages over its "
        "own share's valid targets, whose count differs from rank to rank, and the gradients are averaged over the "
        "ranks: the shares would weigh alike, not by their valid targets, and the step would differ from the original's.",
        "The loss passes through `valid_mean(loss, target, ignore_index)` (written once into the script): this "
        "rank's mean times `count * world_size / total_count`, the counts of valid targets all-reduced once a step. "
        "The gradient is the original's exactly; the loss averaged over the ranks is the original's (each rank's own "
        "printed value is its weighted share).",
        "Safe: one all-reduce of a number per step, reached by every rank. Losses computed inside the model's "
        "`forward` (each DataParallel replica averaged its own share already), under `torch.no_grad()`, with a class "
        "`weight=` or another reduction are left alone.",
        _IMPORTS + "model = nn.DataParallel(nn.Linear(4, 3))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "criterion = nn.CrossEntropyLoss(ignore_index=0)\nx, y = torch.randn(8, 4), torch.randint(0, 3, (8,))\n"
        "loss = criterion(model(x), y)\nloss.backward()\nopt.step()\n",
        "loss = valid_mean(criterion(model(x), y), y, 0)\n",
    ),
    _c(
        "DDP161", "eval-kept-whole", "warning",
        "`--shard-eval`: an evaluation loop stays whole on every rank, with the reason",
        "Only a loop whose results are provably sums can be split between the ranks. This one leaves something else "
        "behind (a list of predictions appended, a confusion matrix or a metric object updated in place, a running "
        "value printed or logged inside the loop, a file written), may stop early (`break`, `return`), computes "
        "gradients (an evaluation under attack), runs with gradients on (not under `torch.no_grad()`), or runs under "
        "a condition that may differ between ranks.",
        "Nothing changes: every rank evaluates the whole set, which is correct (the time is repeated). To split it, "
        "keep the loop's results in accumulators that are only added to and read after the loop, or gather the "
        "predictions yourself (`dist.all_gather_object`).",
        "Safe: the loop is the default migration's.",
        _EVAL + "preds = []\nwith torch.no_grad():\n    for x, y in test_loader:\n"
        "        preds.append(model(x).argmax(1))\nprint(torch.cat(preds).float().mean())\n",
    ),
    _c(
        "DDP109", "fixed-device-left", "warning",
        "a fixed device (`\"cuda:1\"`, `.cuda(2)`, `CUDA_VISIBLE_DEVICES`) that dp2ddp leaves as it is",
        "Under DDP each rank uses its own GPU (`LOCAL_RANK`); a fixed index puts every rank on the same GPU.",
        "Use `\"cuda\"` (the current device after the set-up's `set_device`) or `torch.cuda.current_device()`.",
        "No fix.",
    ),
    _c(
        "DDP110", "writer-left-on-every-rank", "error",
        "a writer that dp2ddp cannot restrict to rank 0; the file is left unchanged",
        "Every rank would write its own copy of a log or an event file, or the same file at once; a project helper "
        "that removes or renames and recreates a folder on every rank deletes or moves away what rank 0 wrote (found "
        "through the project modules such a helper calls in turn). A migration that writes N copies "
        "is refused rather than written (`--accept DDP110` writes it anyway).",
        "Restrict it to rank 0 (`if dist.get_rank() == 0:`), or split the writing out of a helper that also keeps "
        "state, then migrate. (What dp2ddp can restrict it does: writers in the script, project helpers that only "
        "write — called on rank 0 —, and helpers that create a folder without `exist_ok` — run on rank 0 first, "
        "the other ranks after a barrier.)",
        "No fix.",
    ),
    _c(
        "DDP111", "wrapper-use-unresolved", "warning",
        "a use of the wrapped model that dp2ddp cannot route through `.module`",
        "Under DDP the name holds the wrapper: attributes and methods of the model itself are on `.module`.",
        "Use `model.module.<attr>` (or keep the bare model under its own name) where the named line reads the model.",
        "No fix.",
    ),
    _c(
        "DDP112", "unfreeze-after-wrap", "error",
        "parameters frozen when the model is wrapped are unfrozen later; the file is left unchanged",
        "DDP only synchronises parameters that require grad when the wrapper is built: parameters unfrozen later train "
        "apart on every rank, silently.",
        "Build the DDP wrapper after the last change of `requires_grad`, or wrap again after unfreezing.",
        "No fix: the file is left byte-for-byte as it was.",
    ),
    _c(
        "DDP113", "print-split", "info",
        "a `print` whose arguments do work (a call of the script, a forward) is split: the work on every rank, the print on rank 0",
        "Only rank 0 prints, but what the arguments compute may be a collective (a DDP forward, an evaluation that "
        "all-reduces) that every rank must join.",
        "The calls run on every rank into locals; the `print` of those locals runs on rank 0.",
        "Safe: evaluation order is kept.",
        _IMPORTS + "\ndef evaluate(model):\n    return model(torch.randn(8, 4)).sum().item()\n\n\nmodel = nn.DataParallel(nn.Linear(4, 1))\n" + _STEP + "print(f\"eval loss = {evaluate(model):.4f}\")\n",
    ),
    _c(
        "DDP115", "inference-only", "error",
        "a script without a training step: nothing to migrate; the file is left unchanged",
        "DDP synchronises gradients; a script that never calls `.backward()` or `optimizer.step()` gains nothing from "
        "it, and DataParallel there only splits batches over the GPUs of one process.",
        "Keep DataParallel, or run one process per GPU on a shard of the data by hand.",
        "No fix: the file is left byte-for-byte as it was.",
        _IMPORTS + "model = nn.DataParallel(nn.Linear(4, 1))\nwith torch.no_grad():\n    preds = model(torch.randn(8, 4))\n",
    ),
    _c(
        "DDP116", "library-module", "error",
        "a library module: the process group belongs to the script that runs; the file is left unchanged",
        "A module with no entry point (no `__main__` guard, no module-level code that runs) is imported by scripts; "
        "setting up a process group at import would surprise every caller.",
        "Migrate the entry script; here, build `DistributedDataParallel` only when `torch.distributed.is_initialized()`.",
        "No fix: the file is left byte-for-byte as it was.",
        _IMPORTS + "\ndef build(model):\n    return nn.DataParallel(model).cuda()\n",
    ),
    _c(
        "DDP117", "parameters-replaced-after-wrap", "error",
        "a method that replaces parameters (`resize_token_embeddings`) runs after the wrap; the file is left unchanged",
        "DataParallel replicates the module on every forward and sees new parameters; DistributedDataParallel "
        "registers its parameters when it is built, so parameters that replace them later are never synchronised.",
        "Call the method before the model is wrapped.",
        "No fix: the file is left byte-for-byte as it was.",
        _IMPORTS + "\ndef train(model, tokenizer):\n    model = nn.DataParallel(model)\n    model.module.resize_token_embeddings(len(tokenizer))\n    model(torch.randn(8, 4)).sum().backward()\n\n\nif __name__ == \"__main__\":\n    train(load_model(), load_tokenizer())\n",
    ),
    _c(
        "DDP118", "sum-reduction-scale", "warning",
        "a `reduction=\"sum\"` loss: under DDP each step is 1/world_size of DataParallel's",
        "DataParallel sums over the whole batch; under DDP each process sums its share and the gradients are averaged "
        "across processes.",
        "Multiply the loss (or the learning rate) by `dist.get_world_size()` to keep DataParallel's steps, or use the "
        "mean. Lint rule DDP015 reports the same places.",
        "No fix: whether the sum is wanted is the script's decision.",
        _script("criterion = nn.MSELoss(reduction=\"sum\")\nmodel = nn.DataParallel(model)\n"),
    ),
    _c(
        "DDP120", "process-group-set-up", "info",
        "the process group is set up from torchrun's environment and destroyed at exit",
        "DDP needs a process group; the script must still run as plain `python` (a world of one).",
        "Reads `LOCAL_RANK`, selects the GPU, picks `nccl` with CUDA and `gloo` otherwise, falls back to an in-process "
        "store without torchrun; `destroy_process_group` runs when the entry point returns or at exit.",
        "Safe.",
    ),
    _c(
        "DDP121", "distributed-path-completed", "info",
        "the script's own distributed path now runs under torchrun",
        "Scripts with `--local_rank`, `mp.spawn` or a `RANK == -1` fallback already know DDP; they need the rank and "
        "world size from torchrun's environment and a CPU (gloo) path.",
        "`--local_rank` defaults to `LOCAL_RANK`, spawned workers are called directly under torchrun, `nccl` becomes "
        "`nccl` with CUDA and `gloo` otherwise, `set_device` and `device_ids` only with CUDA.",
        "Safe: without torchrun the script runs as before.",
    ),
    _c(
        "DDP122", "dp-wrap-removed", "info",
        "a DataParallel wrap that DDP does not need is removed",
        "An evaluation-only re-wrap (`if n_gpu > 1 and not isinstance(model, DataParallel)`) or the DataParallel "
        "fallback of a script that has its own DDP path: under DDP each rank evaluates with its own module.",
        "The wrap (and an `if` left empty by it) is removed.",
        "Safe.",
    ),
    _c(
        "DDP123", "functional-data-parallel", "info",
        "`nn.parallel.data_parallel(module, inputs, ...)` becomes a plain call, and the model that owns it is wrapped in DDP",
        "The functional form splits each batch over GPUs inside `forward`; under DDP each process runs its own batch.",
        "`data_parallel(self.main, x, ids)` becomes `self.main(x)`; every instance of the owning model class is "
        "wrapped in `DistributedDataParallel` where it is created.",
        "Safe: on one device the original had no wrapper, so checkpoints keep keys without the `module.` prefix.",
    ),
    _c(
        "DDP124", "module-access", "info",
        "uses of the model's own attributes and methods go through `.module`",
        "The DDP wrapper has the `nn.Module` API but not the model's own attributes (`model.num_classes`, "
        "`model.predict(x)`).",
        "`model.predict(x)` -> `model.module.predict(x)`; `state_dict`/`load_state_dict` too after a guarded wrap.",
        "Safe.",
    ),
    _c(
        "DDP125", "find-unused-parameters", "info",
        "`find_unused_parameters=True`: the script changes `requires_grad` after the wrap",
        "DDP waits for a gradient of every parameter it was built with; a parameter frozen later never gets one and "
        "the next iteration fails with \"Expected to have finished reduction in the prior iteration\".",
        "The wrap gets `find_unused_parameters=True` (a graph traversal per iteration, a small cost).",
        "Safe.",
    ),
    _c(
        "DDP126", "dp-helper-call-removed", "info",
        "a call that hands the wrapper to a project function asserting `isinstance(model, DataParallel)` is removed",
        "Such a helper (`patch_replication_callback(model)` of the SyncBatchNorm ports) patches DataParallel's "
        "per-forward replication; DDP replicates once and is not a DataParallel, so the assertion would fail.",
        "The statement goes; a project function that names DataParallel without asserting it is left with a DDP111 "
        "warning.",
        "Safe: the helper could only raise under DDP.",
    ),
    _c(
        "DDP127", "flag-guarded-wrap-kept", "info",
        "a wrap under a flag of its function's caller (`if parallel:`) stays under it, as DDP",
        "A factory such as `make_model(..., parallel=False)` wraps only when asked; when the script wraps the model "
        "unconditionally elsewhere (its training function), moving the factory's wrap out of its `if` would wrap twice.",
        "`DataParallel(m)` becomes `DistributedDataParallel(m, ...)` in place; the `if` stays. Only when another "
        "unconditional wrap exists; a lone flag-guarded wrap moves out of its `if` (DDP103).",
        "Safe: every rank passes the same flag, so either all ranks construct the wrapper or none does.",
    ),
    _c(
        "DDP130", "loader-sharded", "info",
        "a training `DataLoader` is sharded between the ranks by `shard_loader`",
        "Each rank must see its own share of the data, and a new order every epoch.",
        "The loader value is passed through `shard_loader` where it is made (`shard_loader(DataLoader(...))`, or "
        "`loader = shard_loader(loader)` after a project helper returns it), whatever its sampler, batch sampler or "
        "`**kwargs`. `shard_loader` (written once into the script) replaces the loader's batch sampler: every rank runs "
        "the original batch sampler under one seed per pass and keeps its slice of each batch, so the global batch, the "
        "order, `len(loader)` and the steps per epoch stay the original's, and the shuffle changes on every pass (no "
        "`set_epoch`). A batch that does not split evenly is padded with its own first samples. With "
        "`--keep-batch-size` each rank takes whole batches in turn. `num_workers` is divided by the processes on this "
        "machine, never below 1. Over an `IterableDataset` (with a `batch_size`) `shard_loader` wraps the dataset "
        "instead (`ShardedStream`): every rank reads the whole stream, each DataLoader worker its part as before "
        "(`num_workers` stays), cuts it into the original's batches and keeps its slice of each, padded alike; the "
        "stream's randomness is drawn alike on every rank.",
        "Safe.",
    ),
    _c(
        "DDP131", "set-epoch-added", "info",
        "`loader.sampler.set_epoch(epoch)` at the start of every epoch, for the script's own `DistributedSampler`",
        "Without it every epoch shuffles the same way.",
        "Inserted as the first statement of the epoch loop.",
        "Safe.",
    ),
    _c(
        "DDP137", "whole-model-saved-bare", "info",
        "a wrapped model saved whole (`torch.save(model)`, `{\"net\": net}`) is saved as its bare module",
        "A pickled `DistributedDataParallel` object only loads where its class and a process group exist: the project's "
        "evaluation script could no longer read the file.",
        "`torch.save(model, p)` -> `torch.save(model.module, p)`; a wrapper inside the saved dict, list or tuple (also one "
        "built earlier, `state = {\"net\": net}`) -> `net.module`. The file holds the model as on one device.",
        "Safe where the file's readers use the model (`model = torch.load(p); model(x)`); a reader that takes `.module` of "
        "the loaded object needs `.module` dropped.",
        _script("model = nn.DataParallel(model)\ntorch.save(model, \"model.pth\")\n"),
    ),
    _c(
        "DDP138", "wrapper-replaced-by-checkpoint", "error",
        "the wrapped model is replaced by an object loaded from a checkpoint; the file is left unchanged",
        "The migration saves the bare model (DDP137), so `net = checkpoint[\"net\"]` after the wrap would put a plain "
        "module where the DistributedDataParallel wrapper was: gradients would no longer be averaged across ranks.",
        "Save and load the `state_dict()` instead (`net.load_state_dict(checkpoint[\"net\"])`), then migrate.",
        "No fix.",
        _script("model = nn.DataParallel(model)\nmodel = torch.load(\"model.pth\")\n"),
    ),
    _c(
        "DDP139", "forward-before-training", "error",
        "the wrapped model runs on a training batch between the wrap and training in a way dp2ddp cannot give the "
        "global batch; the file is left unchanged",
        "Layers that initialise from their first batch (ActNorm, data-dependent initialisation) do it in such a forward. "
        "DataParallel ran it on the whole batch; under DDP each rank runs it on its own share after the wrapper "
        "broadcast rank 0's parameters, so the replicas start apart and never meet. Where the forward runs under "
        "`torch.no_grad()` (or through `model.module`) on tensor expressions, its inputs are gathered instead (DDP155); "
        "through the wrapper with gradients on, no backward would follow it and DDP's reduction would stay pending.",
        "Run that forward on the bare model under `torch.no_grad()` (or before the wrap), then migrate.",
        "No fix.",
        _IMPORTS + "from torch.utils.data import DataLoader, TensorDataset\n\n"
        "loader = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4, shuffle=True)\n"
        "model = nn.DataParallel(nn.Linear(4, 1))\nmodel(next(iter(loader))[0])\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor (x,) in loader:\n    model(x).sum().backward()\n    opt.step()\n",
    ),
    _c(
        "DDP150", "checkpoint-keys", "info",
        "the `state_dict` keys the migration writes for a wrapped model, and why",
        "A DataParallel wrapper writes `module.`-prefixed keys; one device wrote plain keys. The project's own loaders "
        "read one or the other, and `verify` judges the migration's checkpoints by the same policy.",
        "As the project's loaders outside the script read them (an evaluation script that loads into the bare model: "
        "plain keys, through `.module`; one that loads into a wrapper: `module.`); with none found, as the original "
        "wrote them (an unconditional DataParallel wrap: `module.`; one that needed several GPUs: plain). Saves and the "
        "script's own loads of that model go through `.module` together, or not at all.",
        "Safe.",
        _script("if torch.cuda.device_count() > 1:\n    model = nn.DataParallel(model)\ntorch.save(model.state_dict(), \"m.pt\")\n"),
    ),
    _c(
        "DDP151", "data-parallel-in-project-module", "error",
        "the script has no DataParallel of its own, but a project module it calls wraps the model in DataParallel",
        "Migrating the script alone would leave the helper's DataParallel in place, and migrating the helper alone "
        "would leave nobody to set up the process group: \"nothing to migrate\" would be a silent miss.",
        "Migrate them together: `dp2ddp rewrite train.py --with-helpers` (with `--diff`, `--in-place` or `-o DIR`).",
        "No fix.",
    ),
    _c(
        "DDP152", "mixed-path-per-process-batch", "error",
        "the script's own distributed path feeds its DistributedSampler loader `batch_size` per process and never divides it by the world size",
        "The DataParallel path read `batch_size` as the global batch (split across the GPUs); the script's own "
        "distributed path, which runs under torchrun after the migration, reads the same value per process: the "
        "global batch grows world-size times, and with it the learning-rate scale and the steps per epoch.",
        "Divide it on that path (`args.batch_size //= world_size` where the process group starts), or pass "
        "`--keep-batch-size` to accept the per-process batch.",
        "No fix.",
        "import argparse\nimport torch\nimport torch.distributed as dist\nimport torch.nn as nn\n"
        "from torch.utils.data import DataLoader, TensorDataset\nfrom torch.utils.data.distributed import DistributedSampler\n\n"
        "p = argparse.ArgumentParser()\np.add_argument('--batch_size', type=int, default=16)\n"
        "p.add_argument('--nodes', type=int, default=1)\np.add_argument('--nr', type=int, default=0)\nargs = p.parse_args()\n"
        "if args.nodes > 1:\n    dist.init_process_group('gloo', rank=args.nr, world_size=args.nodes)\n"
        "ds = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))\n"
        "sampler = DistributedSampler(ds) if args.nodes > 1 else None\n"
        "loader = DataLoader(ds, batch_size=args.batch_size, sampler=sampler, shuffle=sampler is None)\n"
        "model = nn.Linear(4, 1)\n"
        "model = nn.parallel.DistributedDataParallel(model) if args.nodes > 1 else nn.DataParallel(model)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x, y in loader:\n    opt.zero_grad()\n    nn.functional.mse_loss(model(x), y).backward()\n    opt.step()\n",
    ),
    _c(
        "DDP154", "in-batch-loss-gathered", "info",
        "a loss that compares the samples of a batch with each other gets every rank's share of the batch",
        "A contrastive loss (SupCon, NT-Xent, InfoNCE with in-batch negatives) compares every sample of the batch with "
        "every other. Under DataParallel it ran on the gathered outputs; under DDP each process would compute it on "
        "its own share (fewer negatives: another loss, another model).",
        "Each input of the loss call (names the training step assigns) goes through `GatherBatch.apply(...)`, a small "
        "autograd function written once into the script: forward, `all_gather` of every rank's share in rank order "
        "(the original's global batch, since each rank holds a contiguous slice of it); backward, the gradients of "
        "every rank's (identical) loss summed and this rank's share kept, so that DDP's average of the parameters' "
        "gradients is the original's gradient.",
        "Safe where every rank's share has the same size (the sharded loaders pad the last batch to make it so); the "
        "loss runs over the global batch on every rank (world-size times its cost). An input that is not a value of "
        "the training step (a queue of negatives, a parameter) is not gathered: the file is refused (DDP153).",
        _IMPORTS + "def contrastive_loss(z):\n    logits = z @ z.T\n"
        "    return nn.functional.cross_entropy(logits, torch.arange(len(z)))\n\n\n"
        "model = nn.DataParallel(nn.Linear(4, 8))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for (x,) in torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 4)), batch_size=8):\n"
        "    features = model(x)\n    loss = contrastive_loss(features)\n    loss.backward()\n    opt.step()\n",
        "    loss = contrastive_loss(GatherBatch.apply(features))\n",
    ),
    _c(
        "DDP155", "init-forward-gathered", "info",
        "a forward on the first training batch before training (data-dependent initialisation) sees the global batch",
        "Layers that initialise themselves from the first batch they see (ActNorm in flow models, data-dependent "
        "init, LSUV) do it in a forward before training, or under a first-pass test through `model.module` (glow). "
        "DataParallel ran it on the whole batch; under DDP each rank would run it on its own share after the wrapper "
        "broadcast rank 0's parameters: the replicas would start apart and stay apart.",
        "Each input of that forward made from a batch goes through `GatherBatch.apply(...)` (written once into the "
        "script, see DDP154): every rank runs the initialisation on the global batch, the data the original used, "
        "and the replicas start alike.",
        "Safe: the forward is the same computation on the same data on every rank; it costs world-size times one "
        "forward, once. A forward through the wrapper with gradients on, or with inputs that are not tensor "
        "expressions, is refused instead (DDP139).",
        _IMPORTS + "model = nn.DataParallel(nn.Linear(4, 2))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = torch.utils.data.DataLoader(torch.randn(32, 4), batch_size=8)\nfor i, x in enumerate(loader):\n"
        "    if i == 0:\n        with torch.no_grad():\n            model.module(x * 2)\n        continue\n"
        "    model(x).sum().backward()\n    opt.step()\n",
        "            model.module(GatherBatch.apply(x * 2))\n",
    ),
    _c(
        "DDP153", "in-batch-loss", "error",
        "a loss the training reaches compares the samples of a batch with each other (`features @ features.T`) and gathers nothing from the other ranks",
        "Under DataParallel a contrastive loss (SupCon, NT-Xent, InfoNCE) runs on the gathered outputs: every sample "
        "meets every other. Under DDP each process computes it on its own share, so each sample meets a fraction of "
        "the negatives: another loss, and a migration that trains a different model while exiting 0.",
        "Gather every rank's features before the loss (an all_gather that keeps the gradients, as SimCLR's "
        "GatherLayer), then migrate.",
        "No fix.",
        "import torch\nimport torch.nn as nn\n\n\ndef contrastive_loss(z):\n    sim = torch.matmul(z, z.T)\n"
        "    return -torch.log_softmax(sim, dim=1).diagonal().mean()\n\n\n"
        "model = nn.DataParallel(nn.Linear(4, 8))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for step in range(2):\n    opt.zero_grad()\n    loss = contrastive_loss(model(torch.randn(8, 4)))\n"
        "    loss.backward()\n    opt.step()\n",
    ),
    _c(
        "DDP132", "save-on-rank-zero", "info",
        "checkpoint and file writes run on rank 0 only",
        "Every rank would write the same file at the same time.",
        "`torch.save`, `np.save`, copies and other whole-file writes go under `if dist.get_rank() == 0:`; a file that "
        "other ranks read afterwards gets a `dist.barrier()`; folders are created with `exist_ok=True` on every rank.",
        "Safe.",
    ),
    _c(
        "DDP133", "print-on-rank-zero", "info",
        "progress printing runs on rank 0 only",
        "N ranks would print every line N times.",
        "`print(...)` goes under `if dist.get_rank() == 0:` (`--print-all-ranks` keeps it on every rank).",
        "Safe.",
    ),
    _c(
        "DDP134", "rank-device", "info",
        "explicit CUDA device 0 becomes the rank's device",
        "DataParallel gathers on GPU 0; under DDP each rank owns the GPU `set_device` selected.",
        "`\"cuda:0\"` -> `\"cuda\"`, `.cuda(0)` -> `.cuda()`, a literal `torch.cuda.set_device(0)` is dropped.",
        "Safe.",
    ),
    _c(
        "DDP135", "writer-on-rank-zero", "info",
        "TensorBoard, wandb, tqdm, log and result files act on rank 0 only",
        "Each rank would create its own event file, run, bar or log file, or write the same file at once.",
        "A `SummaryWriter` is created on rank 0 (`None` elsewhere) and every use of it is guarded; `wandb.init` gets "
        "`mode=\"disabled\"` on other ranks; tqdm gets `disable=` on other ranks; log and result files opened for "
        "writing go to `os.devnull` on other ranks.",
        "Safe: calls on other ranks do nothing and do not raise.",
    ),
    _c(
        "DDP136", "map-location", "info",
        "`torch.load` gets a `map_location`",
        "Without it every rank loads the checkpoint onto the GPU it was saved from (GPU 0).",
        "A checkpoint that feeds `load_state_dict` is loaded to `\"cpu\"` (the state is copied to the model's device); "
        "anything else is mapped onto the rank's device.",
        "Safe.",
    ),
    # ---- the migrated run does no more work than a hand migration (issue 20): DDP140-DDP149
    _c(
        "DDP140", "accumulation-no-sync", "info",
        "gradient accumulation: the passes that do not step the optimizer run under `model.no_sync()`",
        "Where `optimizer.step()` follows only every k-th backward pass, DDP would still all-reduce the gradients in "
        "every backward pass: k all-reduces per step where one is needed.",
        "The statements from the forward to the backward of each pass go under `with contextlib.nullcontext() if "
        "<step condition> else model.no_sync():`; the condition is the loop's own, read before the forward (a counter "
        "incremented in between, `step += 1`, is read as `step + 1`). The loss scaling (`loss = loss / accum`) stays.",
        "Safe: DDP all-reduces the locally accumulated sum in the pass that syncs, the same averaged gradient as "
        "before; anything that reads the gradients between micro-steps keeps every pass in sync instead (DDP142).",
        _IMPORTS + "model = nn.DataParallel(nn.Linear(4, 1))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for i in range(8):\n    loss = model(torch.randn(8, 4)).sum() / 4\n    loss.backward()\n"
        "    if (i + 1) % 4 == 0:\n        opt.step()\n        opt.zero_grad()\n",
        "for i in range(8):\n\n    # dp2ddp: all-reduce the gradients only in the backward pass an optimizer step follows\n"
        "    with contextlib.nullcontext() if (i + 1) % 4 == 0 else model.no_sync():\n"
        "        loss = model(torch.randn(8, 4)).sum() / 4\n        loss.backward()\n",
    ),
    _c(
        "DDP141", "accumulation-step-unreadable", "error",
        "the optimizer steps after only some backward passes, on a condition dp2ddp cannot read before the forward",
        "DDP must know before a pass's forward whether its backward all-reduces (`no_sync()`); a step condition that "
        "reads what the pass computes (`if step_now(loss):`), a call of the script, or a name set after the forward "
        "cannot be known there, and guessing would step on unsynchronised gradients.",
        "Compute the condition from values known before the forward (the loop index, a counter), or restructure the "
        "loop, and run `dp2ddp rewrite` again.",
        "No fix: the file is left byte-for-byte as it was.",
        _IMPORTS + "model = nn.DataParallel(nn.Linear(4, 1))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for i in range(8):\n    loss = model(torch.randn(8, 4)).sum()\n    loss.backward()\n"
        "    done = i + 1\n    if done % 4 == 0:\n        opt.step()\n",
    ),
    _c(
        "DDP142", "accumulation-kept-in-sync", "warning",
        "an accumulation loop whose every backward pass keeps all-reducing",
        "Gradients read between micro-steps (`clip_grad_norm_` outside the step's `if`, `p.grad`) must be the "
        "averaged ones the original saw; or dp2ddp cannot tell which wrapped model's forward the pass runs.",
        "Nothing changes: each backward pass all-reduces, as DDP does by default (correct, not faster). To "
        "accumulate without all-reducing, clip under the step's `if` and run the forward of one wrapped model per pass.",
        "Safe: the migration is the plain DDP one.",
        _IMPORTS + "model = nn.DataParallel(nn.Linear(4, 1))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for i in range(8):\n    loss = model(torch.randn(8, 4)).sum() / 4\n    loss.backward()\n"
        "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
        "    if (i + 1) % 4 == 0:\n        opt.step()\n        opt.zero_grad()\n",
    ),
    _c(
        "DDP143", "hand-batches-split", "info",
        "a loop that cuts its own batches by index gives each process its share of every batch",
        "`for i in range(0, len(x), bs): xb = x[i:i + bs]` (or a `get_batch(source, i)` helper, or "
        "`for xb, yb in zip(x.split(bs), y.split(bs))`) would feed every process the whole batch under DDP: each rank "
        "would repeat the others' work.",
        "Each cut becomes `rank_share(x[i:i + bs])` (a function the migration defines in the script; an iterable of "
        "batches cut from tensors becomes `map(rank_share, ...)`): part `rank` "
        "of `world size` equal parts, as DataParallel scattered it. The global batch and the number of steps are "
        "the original's; a batch that does not divide by the world size is padded by repeating its own first items.",
        "Safe for training: every rank cuts the same global batch (the data must be the same on every rank, e.g. "
        "seeded); a padded batch counts its repeated items twice in that step's mean.",
        _IMPORTS + "x, y = torch.randn(64, 4), torch.randn(64, 1)\nmodel = nn.DataParallel(nn.Linear(4, 1))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor i in range(0, len(x), 16):\n"
        "    loss = nn.functional.mse_loss(model(x[i:i + 16]), y[i:i + 16])\n    loss.backward()\n    opt.step()\n",
        "for i in range(0, len(x), 16):\n    loss = nn.functional.mse_loss(model(rank_share(x[i:i + 16])), "
        "rank_share(y[i:i + 16]))\n",
    ),
    _c(
        "DDP144", "batch-dim-split", "info",
        "`DataParallel(model, dim=d)`: each process trains on its share of dimension `d`",
        "A sequence-first model (`(seq_len, batch)` tensors) is wrapped with `dim=1`; DDP splits nothing, so the "
        "batches must be shared on that dimension where the script makes them.",
        "The tensor the training loop cuts its steps from is shared once before the loop (`train_data_share = "
        "rank_share(train_data, dim=1)`: this process's columns); state the forward returns and the next step feeds "
        "back (an RNN's hidden state) starts from this process's share of its initial value. A loop fed by a "
        "DataLoader needs nothing more: the loader is sharded by sample. Anything else refuses the file (DDP101).",
        "Safe for training: the steps, the global batch and its columns are the original's; evaluation stays whole "
        "on every rank.",
        _IMPORTS + "data = torch.randn(40, 8, 4)  # (seq_len, batch, features)\n"
        "model = nn.DataParallel(nn.Linear(4, 1), dim=1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for i in range(0, data.size(0), 10):\n    loss = model(data[i:i + 10]).pow(2).mean()\n"
        "    loss.backward()\n    opt.step()\n",
        "data_share = rank_share(data, dim=1)  # dp2ddp: this process's columns of the batch dimension\n"
        "for i in range(0, data.size(0), 10):\n    loss = model(data_share[i:i + 10]).pow(2).mean()\n",
    ),
    _c(
        "DDP145", "hand-batches-whole", "warning",
        "a loop that cuts its own batches still gives every process the whole batch",
        "dp2ddp shares the batches a loop cuts from a tensor that stays the same through the loop; this one is cut "
        "from an expression, or from a tensor the loop changes, or the script has its own distributed path.",
        "Nothing changes: every rank computes on the whole batch (correct gradients, no speed-up). Cut the batches "
        "from a tensor bound before the loop, or feed them through a DataLoader.",
        "Safe: the migration is the plain DDP one.",
        _IMPORTS + "x, y = torch.randn(64, 4), torch.randn(64, 1)\nmodel = nn.DataParallel(nn.Linear(4, 1))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor i in range(0, len(x), 16):\n"
        "    x = x * 1.0\n    loss = nn.functional.mse_loss(model(x[i:i + 16]), y[i:i + 16])\n    loss.backward()\n"
        "    opt.step()\n",
    ),
)

BY_CODE: Dict[str, MigrationCode] = {c.code: c for c in CODES}
