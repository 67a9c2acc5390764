"""Migration codes of the wrap and of the file as a whole: DataParallel made
DistributedDataParallel (or refused), the process group, a script's own distributed path,
uses of the wrapped model."""

from __future__ import annotations

from typing import Tuple

from dp2ddp.migration_codes.code import IMPORTS, STEP, MigrationCode, script

CODES: Tuple[MigrationCode, ...] = (
    MigrationCode(
        "DDP100", "wrap-migrated", "info",
        "a `DataParallel` wrap becomes a `DistributedDataParallel` wrap",
        "DDP runs one process per device; the wrapper must exist before the first forward of training on every rank.",
        "`DataParallel(m, device_ids=..., output_device=...)` becomes `DistributedDataParallel(m, device_ids=[current "
        "device] if CUDA else None)`; the module is placed on its device first (`DP(m).cuda()` -> `DDP(m.cuda())`, a "
        "following `m.to(device)` is absorbed).",
        "Safe: the wrap stays where it was or moves just below the placement of the same module.",
        script("model = nn.DataParallel(model).cuda()\n"),
        "model = DistributedDataParallel(model.cuda(), device_ids=[torch.cuda.current_device()] if torch.cuda.is_available() else None)\n",
    ),
    MigrationCode(
        "DDP101", "wrap-not-migratable", "error",
        "a `DataParallel` use that dp2ddp cannot migrate; the file is left unchanged",
        "Some uses have no DDP equivalent (`dim != 0`, unknown arguments) or cannot be followed (a subclass, an alias, "
        "DataParallel passed as a value). A half-migrated script is worse than the original.",
        "Migrate the named line by hand, or restructure it into a plain `model = DataParallel(model)` wrap and run "
        "`dp2ddp rewrite` again.",
        "No fix: the file is left byte-for-byte as it was.",
        script("model = nn.DataParallel(model, dim=1)\n"),
    ),
    MigrationCode(
        "DDP102", "partial-wrap-widened", "info",
        "a partial wrap (`model.features = DP(model.features)`) becomes one wrap of the whole model",
        "DDP must average the gradients of every trained parameter; wrapping a part would leave the rest to drift apart.",
        "The sub-module assignment is dropped and the whole model is wrapped once after its placement.",
        "Safe for training; the model's attribute structure (`model.features`) stays as it was.",
        IMPORTS + "model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))\nmodel.features = model[0]\nmodel.features = torch.nn.DataParallel(model.features)\nmodel.to(\"cpu\")\n" + STEP,
    ),
    MigrationCode(
        "DDP103", "guarded-wrap-hoisted", "info",
        "a wrap under a condition (`if torch.cuda.device_count() > 1:`) moves out of it",
        "Under DDP every rank must wrap, also with one GPU or on CPU, or the ranks train apart.",
        "The wrap is placed after the `if`; uses of the wrapped name that the original made on the bare module (its own "
        "methods and attributes, `state_dict` keys) go through `.module`, so the script behaves as it did on one device.",
        "Safe: on one device the original had no wrapper, so checkpoints keep keys without the `module.` prefix.",
        script("if torch.cuda.device_count() > 1:\n    model = nn.DataParallel(model)\n"),
    ),
    MigrationCode(
        "DDP104", "distributed-path-incomplete", "error",
        "the script already has a distributed path that dp2ddp cannot complete; the file is left unchanged",
        "A script with its own `init_process_group`/`mp.spawn`/`--local_rank` path beside a DataParallel fallback is "
        "migrated by completing that path for torchrun; where it depends on something dp2ddp cannot rewrite, the "
        "message names it.",
        "Complete the named part by hand (usually: read RANK/WORLD_SIZE/LOCAL_RANK from the environment), then remove "
        "the DataParallel fallback.",
        "No fix: the file is left byte-for-byte as it was.",
    ),
    MigrationCode(
        "DDP107", "data-parallel-unresolved", "warning",
        "code names DataParallel in a way dp2ddp cannot resolve (a star import, `getattr`, a class of another package)",
        "dp2ddp migrates what it can prove is `torch.nn.DataParallel`; it never reports \"nothing to migrate\" for a "
        "file that may still use it.",
        "Import DataParallel explicitly (`from torch.nn import DataParallel`, `import torch.nn as nn`) and run again, "
        "or migrate the named line by hand.",
        "No fix.",
        "from modeling import *\n\nmodel = torch.nn.DataParallel(model)\n",
    ),
    MigrationCode(
        "DDP111", "wrapper-use-unresolved", "warning",
        "a use of the wrapped model that dp2ddp cannot route through `.module`",
        "Under DDP the name holds the wrapper: attributes and methods of the model itself are on `.module`.",
        "Use `model.module.<attr>` (or keep the bare model under its own name) where the named line reads the model.",
        "No fix.",
    ),
    MigrationCode(
        "DDP112", "unfreeze-after-wrap", "info",
        "parameters frozen when the model is wrapped are unfrozen later: the wrapper is built over every parameter",
        "DDP averages the gradients only of the parameters that require grad when the wrapper is built: a backbone "
        "frozen at the wrap and unfrozen at a later epoch (gradual unfreezing) would train apart on every rank, "
        "silently.",
        "The wrap goes through `wrap_every_parameter(DistributedDataParallel, model, ..., "
        "find_unused_parameters=True)`, written once into the script: the frozen parameters are unfrozen while the "
        "wrapper is built and frozen again right after, so DDP registers them; while frozen they get no gradient and "
        "are skipped, once unfrozen their gradients are averaged like the others'.",
        "Safe: the parameters train exactly as in the original (the same `requires_grad` at every step); the cost is "
        "find_unused_parameters' graph traversal on every step.",
    ),
    MigrationCode(
        "DDP115", "inference-only", "error",
        "a script without a training step whose evaluation cannot be shared out between the ranks; the file is left unchanged",
        "DDP synchronises gradients; a script that never calls `.backward()` or `optimizer.step()` gains from its "
        "processes only where each evaluates its own part of the data. dp2ddp migrates such a script when every "
        "evaluation loop over a DataLoader of the script can be shared out exactly (DDP168: results that are sums or "
        "lists it appends to, under `torch.no_grad()`, nothing else escaping an iteration). Here one cannot (the "
        "message names the loop and the reason: a `break` other than one first in the loop at a batch number "
        "(`if batch_idx >= n: break` with `n` the same on every rank, where each rank stops as the original did), a "
        "loader whose value dp2ddp cannot follow, a print inside "
        "the loop), or there is no such loop: every rank would repeat the whole inference that DataParallel split "
        "between the GPUs of one process. A wrapper that is never called, only saved, is refused too: it is there "
        "for the `module.` keys of what it saves.",
        "Keep DataParallel, or make the evaluation a loop whose results are sums or lists it appends to.",
        "No fix: the file is left byte-for-byte as it was.",
        IMPORTS + "model = nn.DataParallel(nn.Linear(4, 1))\nwith torch.no_grad():\n    preds = model(torch.randn(8, 4))\n",
    ),
    MigrationCode(
        "DDP116", "library-module", "error",
        "a library module: the process group belongs to the script that runs; the file is left unchanged",
        "A module with no entry point (no `__main__` guard, no module-level code that runs: a package's `__init__.py`, "
        "a module that only settles its environment at import, `matplotlib.use(\"Agg\")` or `sys.path.append(...)`) "
        "is imported by scripts; setting up a process group at import would surprise every caller. One that only "
        "tests for DataParallel (`isinstance(model, nn.DataParallel)`) and wraps nothing is refused too: its callers "
        "hand it their models, and its checks change with their scripts, in one project migration.",
        "Migrate the entry script with its helpers (`dp2ddp rewrite train.py --with-helpers`); here, build "
        "`DistributedDataParallel` only when `torch.distributed.is_initialized()`.",
        "No fix: the file is left byte-for-byte as it was.",
        IMPORTS + "\ndef build(model):\n    return nn.DataParallel(model).cuda()\n",
    ),
    MigrationCode(
        "DDP177", "dataparallel-only-tested", "error",
        "a script that wraps no model in DataParallel, and calls no project module that does, only tests for one; "
        "the file is left unchanged",
        "Its model comes from elsewhere: loaded whole (`model = torch.load(path)`, pickled by a DataParallel run, as "
        "kospeech's inference script loads it) or handed in. Nothing in it runs DataParallel, so a process group "
        "would buy nothing, and a test rewritten to name DistributedDataParallel would no longer match the "
        "DataParallel object it loads: the model stays wrapped (`model.recognize(...)` then fails). A script whose "
        "model comes from a project module that wraps it is refused with DDP151 instead.",
        "Nothing to migrate here: migrate the script that trains. A checkpoint its migration writes whole holds the "
        "bare module (dp2ddp saves `.module`), which this test lets through as it is.",
        "No fix: the file is left byte-for-byte as it was.",
        IMPORTS + "model = torch.load(\"model.pt\")\nif isinstance(model, nn.DataParallel):\n    model = model.module\n"
        "print(model(torch.randn(2, 4)))\n",
    ),
    MigrationCode(
        "DDP117", "parameters-replaced-after-wrap", "error",
        "a method that replaces parameters (`resize_token_embeddings`, a layer assigned into the wrapped model, a "
        "method of the model's own class that changes its layers: a progressive GAN's `grow_network()`) runs after the "
        "wrap; the file is left unchanged",
        "DataParallel replicates the module on every forward and sees new parameters; DistributedDataParallel "
        "registers its parameters when it is built, so parameters that replace them later are never synchronised. "
        "A method of the model's class counts where it deletes or rebinds a layer `__init__` made (`self.model = "
        "new_model`) or calls `self.add_module`/`register_module`/`register_parameter`; the message names the call "
        "and that line.",
        "Call the method before the model is wrapped; a model that grows during training needs a new "
        "DistributedDataParallel after each change, by hand.",
        "No fix: the file is left byte-for-byte as it was.",
        IMPORTS + "\ndef train(model, tokenizer):\n    model = nn.DataParallel(model)\n    model.module.resize_token_embeddings(len(tokenizer))\n    model(torch.randn(8, 4)).sum().backward()\n\n\nif __name__ == \"__main__\":\n    train(load_model(), load_tokenizer())\n",
    ),
    MigrationCode(
        "DDP119", "trained-outside-wrap", "error",
        "a module trained beside the wrapped model, outside its DataParallel wrap; the file is left unchanged",
        "Under DataParallel one process holds one copy of every module, so a module trained beside the wrapped "
        "model (a center loss's centres with their own optimizer, a classifier on frozen features, a discriminator "
        "left unwrapped) or updated from the batch (a memory bank's buffer written row by row from each sample) sees "
        "the whole batch. Under DistributedDataParallel every rank holds its own copy, and only the wrapped module's "
        "gradients are averaged (and only its buffers broadcast): each rank would train or update its copy on its own "
        "share of the data, and the copies drift apart while the run exits 0.",
        "Make the module a sub-module of the wrapped model, or wrap it in DataParallel too (the migration then makes "
        "it a DistributedDataParallel of its own); a buffer updated from the batch needs the update's inputs gathered "
        "from every rank first (`torch.distributed.all_gather`), by hand.",
        "No fix: the file is left byte-for-byte as it was.",
        IMPORTS + "model = nn.DataParallel(nn.Linear(4, 3))\ncenters = nn.Linear(3, 3)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nopt_c = torch.optim.SGD(centers.parameters(), lr=0.5)\n"
        "loss = centers(model(torch.randn(8, 4))).sum()\nloss.backward()\nopt.step()\nopt_c.step()\n",
    ),
    MigrationCode(
        "DDP120", "process-group-set-up", "info",
        "the process group is set up from torchrun's environment and destroyed at exit",
        "DDP needs a process group; the script must still run as plain `python` (a world of one).",
        "Reads `LOCAL_RANK`, selects the GPU, picks `nccl` with CUDA and `gloo` otherwise, falls back to an in-process "
        "store without torchrun; `destroy_process_group` runs when the entry point returns or at exit.",
        "Safe.",
    ),
    MigrationCode(
        "DDP121", "distributed-path-completed", "info",
        "the script's own distributed path now runs under torchrun",
        "Scripts with `--local_rank`, `mp.spawn` or a `RANK == -1` fallback already know DDP; they need the rank and "
        "world size from torchrun's environment and a CPU (gloo) path.",
        "`--local_rank` defaults to `LOCAL_RANK`, spawned workers are called directly under torchrun, `nccl` becomes "
        "`nccl` with CUDA and `gloo` otherwise, `set_device` and `device_ids` only with CUDA.",
        "Safe: without torchrun the script runs as before.",
    ),
    MigrationCode(
        "DDP122", "dp-wrap-removed", "info",
        "a DataParallel wrap that DDP does not need is removed, or a mixed script's fallback wraps over a world of one",
        "An evaluation-only re-wrap (`if n_gpu > 1 and not isinstance(model, DataParallel)`) or the DataParallel "
        "fallback of a script that has its own DDP path: under DDP each rank evaluates with its own module, and under "
        "torchrun the script's own path wraps. Where the fallback wraps the whole model where it trains, plain `python` "
        "(no process group: the own path is off) still reaches it, and a bare model there would save checkpoints "
        "without the `module.` keys the original's wrapper wrote (its `--resume` of one would fail).",
        "The wrap (and an `if` left empty by it) is removed; a training fallback of the whole model "
        "(`model = DataParallel(model)`) becomes `model = wrap_alone(model)`: written once into the script, it leaves "
        "the model as it is under the script's own process group, and otherwise starts a world of one and wraps the "
        "model in DistributedDataParallel there.",
        "Safe: the checkpoints keep the original's keys on every path.",
    ),
    MigrationCode(
        "DDP123", "functional-data-parallel", "info",
        "`nn.parallel.data_parallel(module, inputs, ...)` becomes a plain call, and the model that owns it is wrapped in DDP",
        "The functional form splits each batch over GPUs inside `forward`; under DDP each process runs its own batch.",
        "`data_parallel(self.main, x, ids)` becomes `self.main(x)`; every instance of the owning model class is "
        "wrapped in `DistributedDataParallel` where it is created.",
        "Safe: on one device the original had no wrapper, so checkpoints keep keys without the `module.` prefix.",
    ),
    MigrationCode(
        "DDP124", "module-access", "info",
        "uses of the model's own attributes and methods go through `.module`",
        "The DDP wrapper has the `nn.Module` API but not the model's own attributes (`model.num_classes`, "
        "`model.predict(x)`).",
        "`model.predict(x)` -> `model.module.predict(x)`; `state_dict`/`load_state_dict` too after a guarded wrap.",
        "Safe.",
    ),
    MigrationCode(
        "DDP125", "find-unused-parameters", "info",
        "`find_unused_parameters=True`: the script changes `requires_grad` after the wrap, or trains passes over a list of settings",
        "DDP waits for a gradient of every parameter it was built with; a parameter frozen later never gets one, nor "
        "does one a pass leaves unused (a training loop over a list of settings, `for width in widths:`, may set the "
        "model up differently for each item: a BatchNorm per width), and "
        "the next iteration fails with \"Expected to have finished reduction in the prior iteration\".",
        "The wrap gets `find_unused_parameters=True` (a graph traversal per iteration, a small cost).",
        "Safe.",
    ),
    MigrationCode(
        "DDP126", "dp-helper-call-removed", "info",
        "a call that hands the wrapper to a project function asserting `isinstance(model, DataParallel)` is removed",
        "Such a helper (`patch_replication_callback(model)` of the SyncBatchNorm ports) patches DataParallel's "
        "per-forward replication; DDP replicates once and is not a DataParallel, so the assertion would fail.",
        "The statement goes; for a project function that names DataParallel without asserting it, see DDP165 and "
        "DDP166.",
        "Safe: the helper could only raise under DDP.",
    ),
    MigrationCode(
        "DDP127", "flag-guarded-wrap-kept", "info",
        "a wrap under a flag of its function's caller (`if parallel:`) stays under it, as DDP",
        "A factory such as `make_model(..., parallel=False)` wraps only when asked; when the script wraps the model "
        "unconditionally elsewhere (its training function), moving the factory's wrap out of its `if` would wrap twice.",
        "`DataParallel(m)` becomes `DistributedDataParallel(m, ...)` in place; the `if` stays. Only when another "
        "unconditional wrap exists; a lone flag-guarded wrap moves out of its `if` (DDP103).",
        "Safe: every rank passes the same flag, so either all ranks construct the wrapper or none does.",
    ),
    MigrationCode(
        "DDP128", "scheduler-on-a-shard-sum", "error",
        "a learning-rate scheduler stepped, or the training stopped early, on a sum of what the training batches gave; the file is left unchanged",
        "`scheduler.step(total / len(loader))` after `total += loss.item()` in the training loop: under DataParallel "
        "the sum runs over every batch of the epoch. Under DDP each rank adds up its own share of every batch, so "
        "each rank's value differs from the others' and from the original's: a `ReduceLROnPlateau` would cut the "
        "learning rate at other epochs than the original's, and on some ranks and not others, whose parameters then "
        "drift apart; an early stop on it (`if bad_epochs >= patience: break`, the counter set under a test of the sum) "
        "would end the training on some ranks while the others wait for them in their next all-reduce.",
        "All-reduce the sum over the ranks before the step (averaged where its terms are batch means, added up where "
        "they are sums over samples), or step on a value every rank computes alike (a validation loss over the whole "
        "set), then migrate.",
        "No fix: the file is left byte-for-byte as it was.",
        IMPORTS + "model = nn.DataParallel(nn.Linear(4, 1))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)\n"
        "loader = torch.utils.data.DataLoader(torch.randn(64, 4), batch_size=16)\n"
        "for epoch in range(2):\n    total = 0.0\n    for x in loader:\n        loss = model(x).pow(2).mean()\n"
        "        opt.zero_grad()\n        loss.backward()\n        opt.step()\n        total += loss.item()\n"
        "    sched.step(total / len(loader))\n",
    ),
    MigrationCode(
        "DDP151", "data-parallel-in-project-module", "error",
        "the script has no DataParallel of its own, but a project module it calls wraps the model in DataParallel",
        "Migrating the script alone would leave the helper's DataParallel in place, and migrating the helper alone "
        "would leave nobody to set up the process group: \"nothing to migrate\" would be a silent miss.",
        "Migrate them together: `dp2ddp rewrite train.py --with-helpers` (with `--diff`, `--in-place` or `-o DIR`).",
        "No fix.",
    ),
    MigrationCode(
        "DDP191", "partial-wrap-keys-on-one-branch", "warning",
        "one branch wraps a part of the model (`model.features`) and another the whole: the migration's keys on the "
        "first branch's path differ from the original's",
        "pytorch/examples' and bearpaw's imagenet scripts wrap `model.features` for AlexNet and VGG and the whole model "
        "otherwise. The migration wraps the whole model once on every path (every trained parameter is averaged), so on "
        "the AlexNet/VGG path the saved keys become `module.features.*` where the original wrote `features.module.*`. "
        "The training is right; the checkpoints of that path do not load across the original and the migration "
        "(a strict `load_state_dict` fails, loudly).",
        "Rename the keys once where old checkpoints of that path must load (`features.module.` -> `module.features.`), "
        "or load them into the bare model's `features` yourself.",
        "The migration is written; the warning names the save and the branch.",
        "import torch\nimport torch.nn as nn\n\n"
        "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.features = nn.Linear(4, 8)\n        self.classifier = nn.Linear(8, 2)\n\n"
        "    def forward(self, x):\n        return self.classifier(self.features(x))\n\n\n"
        "arch = \"alexnet\"\nmodel = Net()\nif arch == \"alexnet\":\n    model.features = nn.DataParallel(model.features)\n"
        "else:\n    model = nn.DataParallel(model)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "model(torch.randn(8, 4)).sum().backward()\nopt.step()\ntorch.save(model.state_dict(), \"ckpt.pth\")\n",
    ),
    MigrationCode(
        "DDP175", "migrated-helper-shared-with-other-scripts", "warning",
        "a project module this migration rewrites is imported by other scripts of the project that it does not migrate",
        "A helper such as `define_net()` that returned a DataParallel wrapper returns a DDP wrapper where a process "
        "group runs and the bare model elsewhere. The other scripts that import it (an evaluation script, the second "
        "stage of a distillation) start no process group: with the rewritten helper they get the bare model, whose "
        "checkpoint keys lose `module.`, and a loader that keeps only the keys it knows loads nothing, silently.",
        "Migrate each of those scripts too (`dp2ddp rewrite OTHER.py --with-helpers`), or keep the original helper for "
        "them. The warning names each script and the line that imports the helper.",
        "No fix: the helper is rewritten as the entry needs; the warning says which scripts it leaves behind.",
    ),
    MigrationCode(
        "DDP165", "dp-unwrapping-helper-handed-module", "info",
        "a project function that unwraps only a DataParallel is handed `model.module`",
        "A helper such as `save_model(model, opt, path)` that starts with `if isinstance(model, nn.DataParallel): "
        "model = model.module` (or whose two branches do the same, `return model.module.state_dict()` and "
        "`return model.state_dict()`) saves the bare model's keys under DataParallel. Handed the DDP wrapper, which is not a "
        "DataParallel, it would save the wrapper's `module.` keys instead, and the project's own loader would fail.",
        "The call passes `model.module`: the model the helper unwrapped to under DataParallel. Its module is left as "
        "it was (run with `--with-helpers` to migrate the helper's type check instead).",
        "Safe: the helper did nothing with the wrapper before unwrapping it, so it sees the same bare model.",
    ),
    MigrationCode(
        "DDP129", "rewrap-after-dtype-change", "info",
        "the model's dtype is converted on the wrapper after the wrap: the module is wrapped again right after",
        "DataParallel replicates the model at every forward, so `model.half()` after the wrap took effect at the next "
        "step. DistributedDataParallel builds its gradient buckets for the dtype the parameters have when it is made: "
        "after the conversion the ranks' gradients would no longer be averaged, and the replicas drift apart.",
        "Right after the conversion (`if args.half: model.half()`), the converted module is wrapped again: "
        "`model = DistributedDataParallel(model.module, ...)`. A conversion elsewhere (in another function, inside an "
        "expression) is refused (DDP101).",
        "Safe: the new wrapper holds the same module and parameter objects (an optimizer made before still steps "
        "them) and broadcasts rank 0's values, which every rank already has.",
        IMPORTS + "model = nn.DataParallel(nn.Linear(4, 1))\nmodel.double()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loss = model(torch.randn(8, 4, dtype=torch.float64)).sum()\nloss.backward()\nopt.step()\n",
    ),
    MigrationCode(
        "DDP167", "loss-through-module-refused", "error",
        "a loss is computed by a forward through `.module` of the wrapper; the file is left unchanged",
        "Under DataParallel `model.module(x)` or `model.module.compute_loss(x, y)` runs the bare model on one GPU, and "
        "the optimizer steps its gradients. DistributedDataParallel averages gradients over the ranks only after a "
        "forward through the wrapper itself: through `.module`, each rank keeps the gradients of its own share and "
        "the replicas drift apart, with no error.",
        "Call the wrapper (`model(x)`); a method that computes the loss (`compute_loss`) can become the model's "
        "`forward`, or a wrapper module's whose `forward` calls it. Then migrate.",
        "No fix: the file is left byte-for-byte as it was.",
        IMPORTS + "model = nn.DataParallel(nn.Linear(4, 1))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loss = model.module(torch.randn(8, 4)).sum()\nloss.backward()\nopt.step()\n",
    ),
    MigrationCode(
        "DDP166", "dp-only-helper", "error",
        "the wrapper is handed to a project function written for DataParallel; the file is left unchanged",
        "A helper that tests `isinstance(model, nn.DataParallel)` (to read its `device_ids`, to unwrap it somewhere "
        "in its body, or asserting it) takes its other branch, or fails, when handed a DistributedDataParallel "
        "wrapper; the migrated script would behave differently with no error.",
        "Migrate the script with its helpers (`dp2ddp rewrite train.py --with-helpers`): the helper's type checks "
        "then name DistributedDataParallel too. Or make the helper accept both wrappers "
        "(`isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel))`).",
        "No fix: the file is left byte-for-byte as it was.",
    ),
)
