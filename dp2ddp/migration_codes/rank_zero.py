"""Migration codes of what one rank does for all: saves, prints and writers on rank 0,
devices per rank, checkpoints and their keys."""

from __future__ import annotations

from typing import Tuple

from dp2ddp.migration_codes.code import IMPORTS, STEP, MigrationCode, script

CODES: Tuple[MigrationCode, ...] = (
    MigrationCode(
        "DDP109", "fixed-device-left", "warning",
        "a fixed device (`\"cuda:1\"`, `.cuda(2)`, `CUDA_VISIBLE_DEVICES`) that dp2ddp leaves as it is",
        "Under DDP each rank uses its own GPU (`LOCAL_RANK`); a fixed index puts every rank on the same GPU.",
        "Use `\"cuda\"` (the current device after the set-up's `set_device`) or `torch.cuda.current_device()`.",
        "No fix.",
    ),
    MigrationCode(
        "DDP110", "writer-left-on-every-rank", "error",
        "a writer that dp2ddp cannot restrict to rank 0; the file is left unchanged",
        "Every rank would write its own copy of a log or an event file, or the same file at once; a project helper "
        "that removes or renames and recreates a folder on every rank deletes or moves away what rank 0 wrote (found "
        "through the project modules such a helper calls in turn). A migration that writes N copies "
        "is refused rather than written (`--accept DDP110` writes it anyway).",
        "Restrict it to rank 0 (`if dist.get_rank() == 0:`), or split the writing out of a helper that also keeps "
        "state, then migrate. (What dp2ddp can restrict it does: writers in the script, project helpers that only "
        "write — called on rank 0 —, helpers that create a folder without `exist_ok` — run on rank 0 first, "
        "the other ranks after a barrier —, and set-up calls that make the run's folder — run on rank 0, their result "
        "sent to every rank, DDP114.)",
        "No fix.",
    ),
    MigrationCode(
        "DDP114", "setup-on-rank-zero", "info",
        "a project call that makes the run's folder (`args = get_args()`, `ConfigParser.from_args(...)`) runs on rank 0; "
        "every rank gets its result",
        "A folder named by the clock, made without `exist_ok`, or made after moving an earlier run's away cannot be "
        "made by every rank: each would make its own, crash with `FileExistsError`, or move another's away. Rank 0 makes it once and every rank must use that one.",
        "`x = setup(a)` -> `x = run_on_rank_zero(setup, a)`: rank 0 runs the call, the others receive its result "
        "(pickled through the process group) and what it changed in the process that training reads (random seeds and "
        "states, cudnn flags, `torch.use_deterministic_algorithms`, environment variables); an error or exit on rank 0 "
        "ends every rank, and a result that cannot be pickled stops every rank with that message. A call that keeps "
        "other state (a module global, `sys.path`, the working directory), trains, or changes an argument the script "
        "reads later is refused (DDP110). Why this is sound: docs/design-setup-calls.md.",
        "Safe where the result is a configuration (plain values, paths, dicts); the other ranks' copy is not the same "
        "object as anything else rank 0 holds. Logging set up by the call is rank 0's alone.",
    ),
    MigrationCode(
        "DDP113", "print-split", "info",
        "a `print` whose arguments do work (a call of the script, a forward) is split: the work on every rank, the print on rank 0",
        "Only rank 0 prints, but what the arguments compute may be a collective (a DDP forward, an evaluation that "
        "all-reduces) that every rank must join.",
        "The calls run on every rank into locals; the `print` of those locals runs on rank 0.",
        "Safe: evaluation order is kept.",
        IMPORTS + "\ndef evaluate(model):\n    return model(torch.randn(8, 4)).sum().item()\n\n\nmodel = nn.DataParallel(nn.Linear(4, 1))\n" + STEP + "print(f\"eval loss = {evaluate(model):.4f}\")\n",
    ),
    MigrationCode(
        "DDP137", "whole-model-saved-bare", "info",
        "a wrapped model saved whole (`torch.save(model)`, `{\"net\": net}`) is saved as its bare module",
        "A pickled `DistributedDataParallel` object only loads where its class and a process group exist: the project's "
        "evaluation script could no longer read the file.",
        "`torch.save(model, p)` -> `torch.save(model.module, p)`; a wrapper inside the saved dict, list or tuple (also one "
        "built earlier, `state = {\"net\": net}`) -> `net.module`; a project function that saves the wrapper it is "
        "handed whole and uses it for nothing else (`utils.save_checkpoint(model, path)` with `torch.save(state, "
        "filename)`) is handed `model.module`. The file holds the model as on one device.",
        "Safe where the file's readers use the model (`model = torch.load(p); model(x)`); a reader that takes `.module` of "
        "the loaded object needs `.module` dropped.",
        script("model = nn.DataParallel(model)\ntorch.save(model, \"model.pth\")\n"),
    ),
    MigrationCode(
        "DDP138", "wrapper-replaced-by-checkpoint", "error",
        "the wrapped model is replaced by an object loaded from a checkpoint; the file is left unchanged",
        "The migration saves the bare model (DDP137), so `net = checkpoint[\"net\"]` after the wrap would put a plain "
        "module where the DistributedDataParallel wrapper was: gradients would no longer be averaged across ranks.",
        "Save and load the `state_dict()` instead (`net.load_state_dict(checkpoint[\"net\"])`), then migrate.",
        "No fix.",
        script("model = nn.DataParallel(model)\nmodel = torch.load(\"model.pth\")\n"),
    ),
    MigrationCode(
        "DDP187", "loose-load-into-the-wrapper", "error",
        "the wrapper is handed to a project function that loads a state dict into it with `strict=False`; the file is "
        "left unchanged",
        "A resume helper such as `load_checkpoint(path, model, optimizer)` calling `model.load_state_dict(sd, "
        "strict=False)` skips every key that does not match, with no error. The original handed it a DataParallel "
        "wrapper where its wrap ran and the bare model where it did not (the CPU, one GPU), so each run loaded the keys "
        "it had written. The DDP wrapper is there on every run and takes only `module.` keys: a checkpoint with plain "
        "keys (one the original wrote on the CPU or one GPU) would load nothing, and the run would go on from random "
        "weights while the optimizer and the epoch were restored. dp2ddp does not edit that module here, so it cannot "
        "route the load.",
        "Load with `strict=True` in the helper (a mismatch then fails loudly, and the script's own loads accept either "
        "form, DDP170), or strip the `module.` prefix and load into the bare model, then migrate.",
        "No fix: the file is left unchanged.",
    ),
    MigrationCode(
        "DDP189", "handed-wrapper-keys-in-unedited-module", "error",
        "a project module saves or loads the `state_dict` of the wrapper the script hands it, whose keys must stay "
        "without `module.`, and this migration does not edit that module; the file is left unchanged",
        "A training class of another module (`Trainer(model, opt, loader)`, keeping the wrapper as `self.model`) or a "
        "function (`train(model, loader)`) saves `self.model.state_dict()` or resumes with "
        "`self.model.load_state_dict(...)`. The original wrapped the model only with several GPUs, so one GPU and the "
        "CPU wrote plain keys, and the project's own evaluation loads them into a bare model (the key policy, "
        "DDP150). The DDP wrapper is there on every run: saved through it, the keys gain `module.`, the evaluation "
        "fails, and the migration's resume cannot read the original's checkpoints. dp2ddp does not edit that module "
        "in this migration, so it cannot route those calls.",
        "Migrate with `--with-helpers` where the plan edits that module (its calls then go to the bare model behind "
        "the DDP wrapper, and its loads take either key form), or call `state_dict`/`load_state_dict` on "
        "`self.model.module` there by hand, then migrate.",
        "No fix: the file is left unchanged.",
    ),
    MigrationCode(
        "DDP190", "rank-zero-writes-its-share-of-the-batch", "info",
        "a file written from the training batch, now on rank 0 only, holds rank 0's share of that batch",
        "A training loop that saves an image grid of the batch it is iterating (`vutils.save_image(real, "
        "'real_samples.png')`, dcgan's shape) or the batch itself wrote every sample of the batch. Under DDP each rank "
        "holds its share of the batch (the loader is sharded between the ranks), and the write runs on rank 0 only: "
        "the file holds 1/world of the samples. The training is unchanged; `verify` reports the smaller grid.",
        "Where the whole batch matters in the file, gather it on every rank before the write (`parts = "
        "[torch.empty_like(real) for _ in range(dist.get_world_size())]; dist.all_gather(parts, real)`) and write "
        "`torch.cat(parts)` on rank 0.",
        "The write is guarded as every other (DDP132); nothing is gathered.",
        "import torch\nimport torch.nn as nn\nfrom torch.utils.data import DataLoader, TensorDataset\n"
        "from torchvision.utils import save_image\n\n"
        "loader = DataLoader(TensorDataset(torch.randn(64, 3, 8, 8)), batch_size=16, shuffle=True)\n"
        "model = nn.DataParallel(nn.Conv2d(3, 3, 3, padding=1))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for i, (real,) in enumerate(loader):\n    loss = model(real).pow(2).mean()\n    opt.zero_grad()\n"
        "    loss.backward()\n    opt.step()\n    if i == 0:\n        save_image(real, \"real_samples.png\")\n",
    ),
    MigrationCode(
        "DDP150", "checkpoint-keys", "info",
        "the `state_dict` keys the migration writes for a wrapped model, and why",
        "A DataParallel wrapper writes `module.`-prefixed keys; one device wrote plain keys. The project's own loaders "
        "read one or the other, and `verify` judges the migration's checkpoints by the same policy.",
        "As the project's loaders outside the script read them (an evaluation script that loads into the bare model: "
        "plain keys, through `.module`; one that loads into a wrapper: `module.`); with none found, as the original "
        "wrote them where its wrap ran on every GPU machine (unconditional, or under a CUDA test such as "
        "`if device == 'cuda':`: `module.`), plain where a one-GPU run had no wrapper (under a device count such as "
        "`if torch.cuda.device_count() > 1:`) or none ever existed (a functional `data_parallel`). The script's own "
        "loads of that model accept either form (DDP170).",
        "Safe.",
        script("if torch.cuda.device_count() > 1:\n    model = nn.DataParallel(model)\ntorch.save(model.state_dict(), \"m.pt\")\n"),
    ),
    MigrationCode(
        "DDP170", "load-either-keys", "info",
        "a state_dict loaded into the wrapped model after the wrap goes into the bare model with either key form",
        "A checkpoint of a DataParallel script has `module.` keys where its wrap ran (on GPUs) and plain keys where it "
        "did not (on CPU, or one GPU under a device-count test). Loaded into the DDP wrapper it needs the first, into "
        "the bare model the second: a resume or an evaluation fails with missing keys on the other kind of file.",
        "`net.load_state_dict(sd)` becomes `load_either_keys(net.module)(sd)`: `load_either_keys` (written once "
        "into the script) takes the `module.` prefix off when every key has it (torch's "
        "`consume_prefix_in_state_dict_if_present`, on a copy, its version metadata kept) and loads into the bare "
        "model. Only the called attribute changes, so the arguments stay as written.",
        "Safe: a state_dict whose keys are not all prefixed is passed as it is, and `strict` still reports what "
        "does not fit.",
        script("model = nn.DataParallel(model)\nmodel.load_state_dict(torch.load('m.pt'))\n"),
        "load_either_keys(model.module)(torch.load('m.pt'",
    ),
    MigrationCode(
        "DDP171", "unplaced-model", "warning",
        "a model that is never placed on a GPU, wrapped in DataParallel only under a device count: its migration "
        "fails at the wrap on a GPU machine",
        "With several GPUs, DataParallel raises at the first forward of a model whose parameters are not on `cuda:0`; "
        "with one GPU the wrap does not run and the script trains on the CPU. Its migration wraps on every rank and, "
        "with CUDA, starts NCCL: `DistributedDataParallel(..., device_ids=[...])` refuses a CPU module (seen on an "
        "H100, docs/gpu.md). Moving the model at the wrap would leave the script's CPU tensors (targets) behind.",
        "Place the model on its device before the wrap (`model.cuda()`, `model.to(device)`), as DataParallel needs "
        "with several GPUs anyway; then migrate again. A wrap that always runs, or runs under a CUDA test, is placed "
        "by the migration itself, as DataParallel placed the module on its one device.",
        "The file is written (it trains on CPU, with gloo); on a GPU machine it raises at the wrap.",
        script("if torch.cuda.device_count() > 1:\n    model = nn.DataParallel(model)\n"),
    ),
    MigrationCode(
        "DDP132", "save-on-rank-zero", "info",
        "checkpoint and file writes run on rank 0 only",
        "Every rank would write the same file at the same time.",
        "`torch.save`, `np.save`, copies and other whole-file writes go under `if dist.get_rank() == 0:`; a file that "
        "other ranks read afterwards gets a `dist.barrier()`; folders are created with `exist_ok=True` on every rank.",
        "Safe.",
    ),
    MigrationCode(
        "DDP133", "print-on-rank-zero", "info",
        "progress printing runs on rank 0 only",
        "N ranks would print every line N times.",
        "`print(...)` goes under `if dist.get_rank() == 0:` (`--print-all-ranks` keeps it on every rank).",
        "Safe.",
    ),
    MigrationCode(
        "DDP134", "rank-device", "info",
        "explicit CUDA device 0 becomes the rank's device",
        "DataParallel gathers on GPU 0; under DDP each rank owns the GPU `set_device` selected.",
        "`\"cuda:0\"` -> `\"cuda\"`, `.cuda(0)` -> `.cuda()`, a literal `torch.cuda.set_device(0)` is dropped.",
        "Safe.",
    ),
    MigrationCode(
        "DDP135", "writer-on-rank-zero", "info",
        "TensorBoard, wandb, tqdm, log and result files act on rank 0 only",
        "Each rank would create its own event file, run, bar or log file, or write the same file at once.",
        "A `SummaryWriter` is created on rank 0 (`None` elsewhere) and every use of it is guarded; `wandb.init` gets "
        "`mode=\"disabled\"` on other ranks; tqdm gets `disable=` on other ranks; log and result files opened for "
        "writing go to `os.devnull` on other ranks.",
        "Safe: calls on other ranks do nothing and do not raise.",
    ),
    MigrationCode(
        "DDP173", "writer-stand-in-off-rank-zero", "info",
        "a SummaryWriter whose uses cannot all be put under a rank test is made on rank 0, with a stand-in that writes "
        "nothing on the other ranks",
        "Kept in a dict (`writer_dict = {'writer': SummaryWriter(...), 'train_global_steps': 0}`, the HRNet family's "
        "shape) or handed on as a value, the writer's uses happen in code the migration cannot guard line by line; left "
        "on every rank, each rank would write its own event file.",
        "`SummaryWriter(...) if dist.get_rank() == 0 else WritesNothing()`, with `WritesNothing` written once into the "
        "script: its `add_*`, `flush` and `close` do nothing, and any other attribute raises an error that names it.",
        "Safe: rank 0 writes what the original wrote; the other ranks write nothing, and a use of the writer other than "
        "writing stops loudly there instead of going on with a wrong value.",
        "import torch\nimport torch.nn as nn\nfrom torch.utils.tensorboard import SummaryWriter\n\n"
        "writer_dict = {'writer': SummaryWriter('runs'), 'steps': 0}\n\n\n"
        "def log(writer_dict, value):\n    writer = writer_dict['writer']\n    writer.add_scalar('loss', value, writer_dict['steps'])\n"
        "    writer_dict['steps'] += 1\n\n\n"
        "model = nn.DataParallel(nn.Linear(4, 1))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loss = model(torch.randn(8, 4)).sum()\nloss.backward()\nopt.step()\nlog(writer_dict, loss.item())\n",
    ),
    MigrationCode(
        "DDP136", "map-location", "info",
        "`torch.load` gets a `map_location`",
        "Without it every rank loads the checkpoint onto the GPU it was saved from (GPU 0).",
        "A checkpoint that feeds `load_state_dict` is loaded to `\"cpu\"` (the state is copied to the model's device); "
        "anything else is mapped onto the rank's device.",
        "Safe.",
    ),
    MigrationCode(
        "DDP186", "fails-own-check", "error",
        "the migration would not pass `dp2ddp check`; the file is left unchanged",
        "Every migration is checked with `check`'s default rules before it is written; each transform is meant to "
        "leave nothing for them to find. A finding there is a case the migration missed, such as a `torch.save` "
        "inside a lambda that the script calls later (`save = lambda tag: torch.save(...)`): it would run on every "
        "rank. The message names the rule, the statement, and the line of the input it comes from where that line "
        "stands once in the input.",
        "Migrate that statement by hand (a `def` in place of the lambda, called under `if dist.get_rank() == 0:`), then "
        "migrate; please report the file. `--accept DDP186` writes the migration anyway.",
        "No fix: the file is left unchanged.",
        IMPORTS + "model = nn.DataParallel(nn.Linear(4, 1))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "save = lambda tag: torch.save(model.state_dict(), 'net_%s.pth' % tag)\n"
        "for epoch in range(2):\n    loss = model(torch.randn(8, 4)).sum()\n    opt.zero_grad()\n    loss.backward()\n"
        "    opt.step()\n    save(epoch)\n",
    ),
)
