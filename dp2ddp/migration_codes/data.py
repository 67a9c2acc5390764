"""Migration codes of the data: training loaders sharded between the ranks, their epochs,
evaluation loaders kept whole or shared out (``--shard-eval``), batches a loop cuts by
hand."""

from __future__ import annotations

from typing import Tuple

from dp2ddp.migration_codes.code import EVAL, IMPORTS, MigrationCode

# a mixed script: a DataParallel path and its own distributed one, whose process group `{start}` starts
_MIXED = (
    "import argparse\nimport torch\nimport torch.distributed as dist\nimport torch.nn as nn\n"
    "from torch.utils.data import DataLoader, TensorDataset\nfrom torch.utils.data.distributed import DistributedSampler\n\n"
    "p = argparse.ArgumentParser()\np.add_argument('--batch_size', type=int, default=16)\n"
    "p.add_argument('--nodes', type=int, default=1)\np.add_argument('--nr', type=int, default=0)\nargs = p.parse_args()\n"
    "{start}"
    "ds = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))\n"
    "sampler = DistributedSampler(ds) if args.nodes > 1 else None\n"
    "loader = DataLoader(ds, batch_size=args.batch_size, sampler=sampler, shuffle=sampler is None)\n"
    "model = nn.Linear(4, 1)\n"
    "model = nn.parallel.DistributedDataParallel(model) if args.nodes > 1 else nn.DataParallel(model)\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "for x, y in loader:\n    opt.zero_grad()\n    nn.functional.mse_loss(model(x), y).backward()\n    opt.step()\n"
)

CODES: Tuple[MigrationCode, ...] = (
    MigrationCode(
        "DDP105", "loader-not-sharded", "error",
        "a training loader that dp2ddp cannot shard between the ranks; the file is left unchanged",
        "Unsharded, every rank trains on the whole data set: the work is repeated, not split, and the effective batch "
        "and learning-rate schedule change. dp2ddp refuses rather than write that migration. The same holds for a "
        "training loop over a count whose batch comes from no DataLoader: a call dp2ddp cannot read "
        "(`sess.run(train_iter)` of a TensorFlow pipeline, another module's `fetch(it)`), or a function that draws "
        "the batch's positions at random (`get_batch()` indexing a corpus at `torch.randint` positions): every rank "
        "would pull a whole batch of its own.",
        "Shard it by hand: a loader with `batch_size=None` gets a `DistributedSampler`, or a `batch_size` (over an "
        "`IterableDataset`, `shard_loader` then splits every batch of the stream); an `IterableDataset`'s loader is "
        "migrated without `--keep-batch-size`; a loader returned inside a tuple kept whole is unpacked into names "
        "first. `--accept DDP105` writes the migration anyway and marks the line.",
        "No fix.",
    ),
    MigrationCode(
        "DDP106", "set-epoch-not-placed", "warning",
        "no epoch loop found for a loader that the script's own `DistributedSampler` shards",
        "`DistributedSampler` shuffles with `seed + epoch`; without `set_epoch(epoch)` every epoch repeats the same order. "
        "(Loaders the migration shards need no `set_epoch`: `shard_loader` reshuffles on every pass.)",
        "Call `loader.sampler.set_epoch(epoch)` at the start of every epoch.",
        "No fix.",
    ),
    MigrationCode(
        "DDP108", "eval-loader-whole", "info",
        "an evaluation `DataLoader` stays whole on every rank",
        "Each rank evaluates the full set: the results are exact and equal on every rank; only the time is repeated.",
        "None needed. Shard it with `DistributedSampler(shuffle=False)` and all-reduce the metrics to split the work.",
        "Safe.",
    ),
    MigrationCode(
        "DDP160", "eval-sharded", "info",
        "`--shard-eval`: an evaluation loop whose results are sums or collected lists runs on each rank's own whole batches",
        "Every rank evaluating the whole set repeats the same work world-size times. A loop over an evaluation "
        "`DataLoader` of the script whose accumulators are only added to (`correct += ...`, `test_loss += "
        "loss.item()`, `total += y.size(0)`: bound to a number or a zero tensor before the loop, read only after "
        "it) or only appended to (`preds.append(out.argmax(1))`, `targets.extend(y.tolist())`: bound to an empty "
        "list before the loop, read only after it), that runs under `torch.no_grad()` and lets nothing else out of "
        "an iteration, can be split exactly.",
        "The loop iterates `EvalPass(loader)` (helpers written once into the script): rank r evaluates the original's "
        "batches r, r + world, ..., so each batch's values are the original's (no padding, no duplicates) and "
        "`len()` stays the loader's. The accumulators are handed to the pass before the loop (`.track(...)`) and taken "
        "back after it (`.total(...)`): every rank's additions are gathered and added up, and every rank's items "
        "appended to the list, in the original's order of batches, so sums of floats come out to the last bit as the "
        "original's (an all-reduce of per-rank partial sums would not) and the lists hold the original's items in its "
        "order (tensors back on the device they were made on); an `enumerate` index read after the loop gets the original's last value "
        "(`.last_index(...)`). A loader with fewer batches than ranks, or whose order is not fixed, is read whole on "
        "every rank at run time, and the sums are then left as they are.",
        "Safe: the values after the loop are the original's on every rank; the loop runs on every rank that runs "
        "it, and each rank evaluates at least one batch (DDP syncs buffers on the first forward after training).",
        EVAL + "correct = 0\nwith torch.no_grad():\n    for x, y in test_loader:\n"
        "        correct += (model(x).argmax(1) == y).sum().item()\nprint(correct)\n",
        "test_loader_pass = EvalPass(test_loader)  # dp2ddp: this rank's whole batches of the loader (--shard-eval)\n"
        "correct = test_loader_pass.track(correct)\nfor x, y in test_loader_pass:\n"
        "    correct += (model(x).argmax(1) == y).sum().item()\n"
        "correct = test_loader_pass.total(correct)  # dp2ddp: every rank's sums, in the original's order\n",
    ),
    MigrationCode(
        "DDP168", "inference-sharded", "info",
        "a script that only evaluates migrates with every evaluation loop shared out between the ranks",
        "A script with no training step gains from DDP's processes only where each evaluates its own part of the "
        "data; repeating the whole inference on every rank would be slower than DataParallel.",
        "Every evaluation loop over a DataLoader of the script is shared out by whole batches as with `--shard-eval` "
        "(DDP160, without the option): each rank evaluates its own batches and the loop's sums and collected lists "
        "are put together after it, in the original's order, on every rank. Where any loop cannot be, the file is "
        "refused instead (DDP115). A wrap the script keeps is built with `broadcast_buffers=False`: nothing trains, "
        "the weights and buffers are broadcast once when it is built, and no forward then waits for the other "
        "ranks (a rank with no batch in a pass cannot miss a collective). A loop over a loader that a call dp2ddp "
        "cannot read returns (a project's `get_loaders()`) is shared out at run time where its order is fixed.",
        "Safe: the values after every loop are the original's on every rank.",
        IMPORTS + "from torch.utils.data import DataLoader, TensorDataset\n\n"
        "model = nn.DataParallel(nn.Linear(4, 3))\n"
        "test_loader = DataLoader(TensorDataset(torch.randn(40, 4), torch.randint(0, 3, (40,))), batch_size=8)\n"
        "preds = []\nwith torch.no_grad():\n    for x, y in test_loader:\n"
        "        preds.append(model(x).argmax(1))\nprint(torch.cat(preds).float().mean())\n",
    ),
    MigrationCode(
        "DDP161", "eval-kept-whole", "warning",
        "`--shard-eval`: an evaluation loop stays whole on every rank, with the reason",
        "Only a loop whose results are provably sums can be split between the ranks. This one leaves something else "
        "behind (a list that does not start empty or is read inside the loop, a confusion matrix or a metric object updated in place, a running "
        "value printed or logged inside the loop, a file written), may stop early (`break`, `return`), computes "
        "gradients (an evaluation under attack), runs with gradients on (not under `torch.no_grad()`), or runs under "
        "a condition that may differ between ranks.",
        "Nothing changes: every rank evaluates the whole set, which is correct (the time is repeated). To split it, "
        "keep the loop's results in accumulators that are only added to and read after the loop, or gather the "
        "predictions yourself (`dist.all_gather_object`).",
        "Safe: the loop is the default migration's.",
        EVAL + "preds = []\nwith torch.no_grad():\n    for x, y in test_loader:\n"
        "        preds.append(model(x).argmax(1))\n        print(len(preds))\nprint(torch.cat(preds).float().mean())\n",
    ),
    MigrationCode(
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
    MigrationCode(
        "DDP131", "set-epoch-added", "info",
        "`loader.sampler.set_epoch(epoch)` at the start of every epoch, for the script's own `DistributedSampler`",
        "Without it every epoch shuffles the same way.",
        "Inserted as the first statement of the epoch loop.",
        "Safe.",
    ),
    MigrationCode(
        "DDP152", "mixed-path-per-process-batch", "error",
        "the script's own distributed path feeds its DistributedSampler loader `batch_size` per process and never divides it by the world size",
        "The DataParallel path read `batch_size` as the global batch (split across the GPUs); the script's own "
        "distributed path, which runs under torchrun after the migration, reads the same value per process: the "
        "global batch grows world-size times, and with it the learning-rate scale and the steps per epoch.",
        "Where the process group is started once, before the loader, in the loader's own function, the migration "
        "divides the value there itself (DDP172). Otherwise divide it on that path (`args.batch_size //= world_size` "
        "where the process group starts), or pass `--keep-batch-size` to accept the per-process batch.",
        "No fix.",
        _MIXED.format(start=(
            "def setup(args):\n    if args.nodes > 1:\n        dist.init_process_group('gloo', rank=args.nr, world_size=args.nodes)\n"
            "setup(args)\n")),
    ),
    MigrationCode(
        "DDP172", "mixed-path-batch-divided", "info",
        "the script's own distributed path reads `batch_size` per process: under torchrun it is divided by the world size where the process group starts",
        "The DataParallel path read `batch_size` as the global batch (split across the GPUs); the script's own "
        "distributed path, which runs under torchrun after the migration, reads the same value per process. Undivided, "
        "the global batch would grow world-size times (DDP152).",
        "Right after the statement that starts the process group (in the function that builds the loader, before it), "
        "`if \"LOCAL_RANK\" in os.environ:` divides the value by `dist.get_world_size()`, and stops with a message "
        "where it does not divide evenly. The script's own scaling of the value on a path of its own (imagenet's "
        "`args.batch_size = int(args.batch_size / ngpus_per_node)` under `if args.gpu is not None:`) is put under "
        "`if \"LOCAL_RANK\" not in os.environ:`, so the value is divided once. Launches without torchrun are unchanged.",
        "Safe: the global batch, the steps per epoch and what the loader reads are the DataParallel run's; everything "
        "after the division reads the per-process value, as the script's own distributed path expects.",
        _MIXED.format(start="if args.nodes > 1:\n    dist.init_process_group('gloo', rank=args.nr, world_size=args.nodes)\n"),
    ),
    MigrationCode(
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
        IMPORTS + "x, y = torch.randn(64, 4), torch.randn(64, 1)\nmodel = nn.DataParallel(nn.Linear(4, 1))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor i in range(0, len(x), 16):\n"
        "    loss = nn.functional.mse_loss(model(x[i:i + 16]), y[i:i + 16])\n    loss.backward()\n    opt.step()\n",
        "for i in range(0, len(x), 16):\n    loss = nn.functional.mse_loss(model(rank_share(x[i:i + 16])), "
        "rank_share(y[i:i + 16]))\n",
    ),
    MigrationCode(
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
        IMPORTS + "data = torch.randn(40, 8, 4)  # (seq_len, batch, features)\n"
        "model = nn.DataParallel(nn.Linear(4, 1), dim=1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for i in range(0, data.size(0), 10):\n    loss = model(data[i:i + 10]).pow(2).mean()\n"
        "    loss.backward()\n    opt.step()\n",
        "data_share = rank_share(data, dim=1)  # dp2ddp: this process's columns of the batch dimension\n"
        "for i in range(0, data.size(0), 10):\n    loss = model(data_share[i:i + 10]).pow(2).mean()\n",
    ),
    MigrationCode(
        "DDP145", "hand-batches-whole", "warning",
        "a loop that cuts its own batches still gives every process the whole batch",
        "dp2ddp shares the batches a loop cuts from a tensor that stays the same through the loop; this one is cut "
        "from an expression, or from a tensor the loop changes, or the script has its own distributed path.",
        "Nothing changes: every rank computes on the whole batch (correct gradients, no speed-up). Cut the batches "
        "from a tensor bound before the loop, or feed them through a DataLoader.",
        "Safe: the migration is the plain DDP one.",
        IMPORTS + "x, y = torch.randn(64, 4), torch.randn(64, 1)\nmodel = nn.DataParallel(nn.Linear(4, 1))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor i in range(0, len(x), 16):\n"
        "    x = x * 1.0\n    loss = nn.functional.mse_loss(model(x[i:i + 16]), y[i:i + 16])\n    loss.backward()\n"
        "    opt.step()\n",
    ),
)
