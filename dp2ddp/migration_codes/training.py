"""Migration codes of the training step: gradient accumulation, losses whose scale or batch
changes under DDP, per-sample noise, a forward before training."""

from __future__ import annotations

from typing import Tuple

from dp2ddp.migration_codes.code import IMPORTS, MigrationCode

CODES: Tuple[MigrationCode, ...] = (
    MigrationCode(
        "DDP174", "second-order-backward", "error",
        "a backward pass that builds a graph of the gradients (`create_graph`) in a script that trains the wrapped "
        "model; the file is left unchanged",
        "Second-order methods (a Hessian-vector product in a second-order optimizer, a gradient penalty) call "
        "`loss.backward(create_graph=True)` or `torch.autograd.grad(..., create_graph=True)`. DistributedDataParallel "
        "all-reduces the first-order gradients in hooks during the backward; the higher-order gradients that flow "
        "through it are not synchronised across ranks (torch warns that DDP with `create_graph=True` is not "
        "well-supported), and its reducer can fail outright (\"a leaf Variable that requires grad is being used in an "
        "in-place operation\"). A gradient penalty with respect to an input (WGAN-GP, R1) backpropagates through the "
        "model's parameters again and reaches only some of them (a last layer's bias gets no gradient): the reducer waits "
        "for gradients that never come, and the next forward fails (\"Expected to have finished reduction in the prior "
        "iteration\"), with `find_unused_parameters=True` too. The replicas would train apart. A flag that may be true on some run counts "
        "(`create_graph=create_graph` from the optimizer's choice); `create_graph=False` does not.",
        "Keep DataParallel for this script, or migrate the second-order step by hand (compute the Hessian-vector "
        "products on the bare module, `model.module`, and all-reduce what they feed).",
        "No fix: the file is left unchanged.",
        IMPORTS + "model = nn.DataParallel(nn.Linear(4, 1))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loss = model(torch.randn(8, 4)).pow(2).mean()\nloss.backward(create_graph=True)\nopt.step()\n",
    ),
    MigrationCode(
        "DDP180", "step-decided-by-the-loss", "error",
        "an optimizer step (or a backward pass) that runs only when a test of the loss passes; the file is left unchanged",
        "Trainers skip a step whose loss is not a finite number or too large (`if is_valid_number(loss.item()): "
        "optimizer.step()`), or skip the whole batch before its backward pass (`if bool(loss == 0): continue`). Under "
        "DataParallel the one process tested the loss of the whole batch. Under DDP each rank "
        "holds the loss of its own share: one rank may step where another skips, and from then on the replicas hold "
        "different parameters, which DDP never brings back together (it averages gradients, not parameters); a rank that "
        "skips its backward leaves the others waiting in the gradient all-reduce (gloo stops, NCCL hangs). The test may "
        "also sit in a project class the model is handed to (a solver's `train_step`). A NaN on "
        "one rank also reaches the others through the averaged gradients.",
        "Where the test reads the loss once, on every path, the migration makes every rank test the ranks' losses "
        "averaged (DDP181). Otherwise test a value every rank agrees on: all-reduce the loss first (`value = "
        "loss.detach().clone(); "
        "dist.all_reduce(value); value /= dist.get_world_size()`), which is the original's loss of the whole batch "
        "where the loss is a mean, and test that; or take the risk with `--accept DDP180`.",
        "No fix: the file is left unchanged.",
        IMPORTS + "model = nn.DataParallel(nn.Linear(4, 1))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = torch.utils.data.DataLoader(torch.randn(64, 4), batch_size=16)\nfor x in loader:\n"
        "    loss = model(x).pow(2).mean()\n    opt.zero_grad()\n    loss.backward()\n"
        "    if torch.isfinite(loss) and loss < 10:\n        opt.step()\n",
    ),
    MigrationCode(
        "DDP181", "loss-test-of-every-rank", "info",
        "an optimizer step (or a backward pass) under a test of the loss now tests the ranks' losses averaged",
        "Trainers skip a step whose loss is not a finite number or too large (`if is_valid_number(loss.item()): "
        "optimizer.step()`). Under DataParallel the one process tested the loss of the whole batch; under DDP each "
        "rank holds the loss of its own share, and a rank that stepped where another skipped would leave the replicas "
        "apart for good. The migration reads the loss in the test through `loss_of_every_rank(...)`, written once into "
        "the script: the ranks' losses all-reduced and averaged (the whole batch's loss where it is a mean, or a sum "
        "the migration scales), so every rank tests one value and steps or skips alike.",
        "Nothing to do. A test that reads the loss more than once, or only on some paths (`a and b`, `x if c else y`), "
        "is refused instead (DDP180).",
        "The read of the loss in the test becomes `loss_of_every_rank(loss)`; one all-reduce per step.",
        IMPORTS + "model = nn.DataParallel(nn.Linear(4, 1))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = torch.utils.data.DataLoader(torch.randn(64, 4), batch_size=16)\nfor x in loader:\n"
        "    loss = model(x).pow(2).mean()\n    opt.zero_grad()\n    loss.backward()\n"
        "    if torch.isfinite(loss):\n        opt.step()\n",
    ),
    MigrationCode(
        "DDP178", "in-batch-permutation", "info",
        "a permutation of the batch (mixup's or CutMix's `index = torch.randperm(x.size(0))`) pairs samples within "
        "each rank's share",
        "Under DataParallel the step's batch was the global one, so mixup mixed every sample with another of the "
        "whole batch. Under DDP each rank permutes its own share: every sample is still mixed with a random other "
        "one, the same training in law (it is what distributed mixup does), but the numbers are not the "
        "original's: verify sees the draws in the step and judges the losses as a moving average within "
        "`--stochastic-rtol`, not against the float-noise envelope.",
        "Nothing to do where the pairs may come from each rank's share; gather the batch (inputs and targets) from "
        "every rank before permuting it if they must be the original's. A permutation inside a Dataset or Sampler "
        "class shuffles data and is not reported.",
        "No fix: the draw is left as it was (it draws alike on every rank, from the streams the migration keeps "
        "alike); the summary says so.",
        IMPORTS + "model = nn.DataParallel(nn.Linear(4, 1))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = torch.utils.data.DataLoader(torch.randn(64, 4), batch_size=16)\nfor x in loader:\n"
        "    index = torch.randperm(x.size(0))\n    model(0.5 * x + 0.5 * x[index]).sum().backward()\n    opt.step()\n",
    ),
    MigrationCode(
        "DDP179", "noise-drawn-per-item", "error",
        "random numbers drawn in a loop over the items of the batch; the file is left unchanged",
        "A denoising trainer's `for n in range(noise.size(0)): noise[n] = torch.FloatTensor(s).normal_(0, std[n])` "
        "drew one field per item of the global batch under DataParallel. Under DDP the loop runs over the rank's "
        "share, and the ranks' random streams are seeded alike (so that random choices steering control flow agree): "
        "every rank would draw the same numbers for its items, and the global batch would hold world-size copies of "
        "them. No edit of the draw itself gives each rank the original's: it would have to skip the other ranks' "
        "draws first. The same holds for a method of an object that draws for the batch's items from a generator the "
        "object keeps, seeded once (`mixup.get_lambda(batch_size=len(x))` over `self.random_state = "
        "np.random.RandomState(1234)`): every rank's object draws alike.",
        "Draw the batch's noise in one call sized by the batch (`torch.randn(n, c, h, w) * std.view(-1, 1, 1, 1)`), "
        "which dp2ddp migrates (DDP162); or take the risk with `--accept DDP179`.",
        "No fix: the file is left unchanged.",
        IMPORTS + "model = nn.DataParallel(nn.Linear(4, 1))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = torch.utils.data.DataLoader(torch.randn(64, 4), batch_size=16)\nfor x in loader:\n"
        "    noise = torch.zeros(x.size())\n    for i in range(x.size(0)):\n        noise[i] = torch.randn(4)\n"
        "    model(x + noise).sum().backward()\n    opt.step()\n",
    ),
    MigrationCode(
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
        IMPORTS + "model = nn.DataParallel(nn.Linear(4, 1))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = torch.utils.data.DataLoader(torch.randn(64, 4), batch_size=16)\nfor x in loader:\n"
        "    n = x.size(0)\n    z = torch.randn(n, 4)\n    model(x + z).sum().backward()\n    opt.step()\n",
        "    # dp2ddp: every rank draws the same noise for the global batch and keeps its own share (DataParallel drew one per item)\n"
        "    z = torch.randn(n * dist.get_world_size(), 4).chunk(dist.get_world_size())[dist.get_rank()]\n",
    ),
    MigrationCode(
        "DDP176", "valid-count-mean-shared-name", "error",
        "a loss averaged over its valid targets (`ignore_index`) shares its name with another loss the configuration picks",
        "`criterion = nn.CTCLoss()` on one branch and `criterion = nn.CrossEntropyLoss(ignore_index=0)` on another (a "
        "text recogniser's CTC and attention heads): every call of `criterion` may compute either. DDP163 weights "
        "each rank's mean by its share of the valid targets, which is right for the cross-entropy and wrong for the "
        "CTC loss (a mean of per-sample losses, the same on equal shares): weighting it would change its step.",
        "Give each loss a name of its own (`ctc_loss`, `attn_loss`), so that only the ignore_index loss's calls are "
        "weighted, then migrate.",
        "No fix.",
        IMPORTS + "model = nn.DataParallel(nn.Linear(4, 3))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "ctc = False\nif ctc:\n    criterion = nn.CTCLoss(zero_infinity=True)\nelse:\n"
        "    criterion = nn.CrossEntropyLoss(ignore_index=0)\nx, y = torch.randn(8, 4), torch.randint(0, 3, (8,))\n"
        "loss = criterion(model(x), y)\nloss.backward()\nopt.step()\n",
    ),
    MigrationCode(
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
        IMPORTS + "model = nn.DataParallel(nn.Linear(4, 3))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "criterion = nn.CrossEntropyLoss(ignore_index=0)\nx, y = torch.randn(8, 4), torch.randint(0, 3, (8,))\n"
        "loss = criterion(model(x), y)\nloss.backward()\nopt.step()\n",
        "loss = valid_mean(criterion(model(x), y), y, 0)\n",
    ),
    MigrationCode(
        "DDP169", "count-mean", "info",
        "a loss divided by a count the step sums from its batch (`mask.sum()`): the count becomes every rank's, over the world size",
        "`(per_token * mask).sum() / mask.sum()` (the valid tokens of a padded batch), `loss / (iou > t).sum()` (the "
        "matched anchors) or `(loss * w).sum() / w.sum()` computed on DataParallel's gathered outputs divided by the "
        "whole batch's count. Under DDP each rank divides its share's sum by its share's count, whose value differs from "
        "rank to rank, and the gradients are averaged over the ranks: a mean of means, the shares weighted alike, not "
        "by their counts.",
        "The count passes through `global_count(...)` (written once into the script): the counts all-reduced once a "
        "step, divided by the world size. Each rank's loss is then its share's sum times the world size over the "
        "whole batch's count, and the ranks' averaged gradient is the original's (as fairseq normalises by its global "
        "token count). A count is a `.sum()`/`count_nonzero()` (under `max(1, ...)`, `.clamp(min=...)`, `float()` if "
        "it is) of a comparison, of a name bound to one, or of a field of the loop's batch: never of something that "
        "may carry a gradient.",
        "Safe: one all-reduce of a number per step, reached by every rank. A count computed elsewhere (a function of "
        "another module, the model's `forward`) is not found: `verify` compares the losses.",
        IMPORTS + "model = nn.DataParallel(nn.Linear(4, 3))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))\n"
        "per_sample = nn.functional.cross_entropy(model(x), y, reduction='none')\nmask = (y != 0).float()\n"
        "loss = (per_sample * mask).sum() / mask.sum()\nloss.backward()\nopt.step()\n",
        "loss = (per_sample * mask).sum() / global_count(mask.sum())\n",
    ),
    MigrationCode(
        "DDP182", "mean-over-batch-size", "info",
        "a mean loss divided by its batch's size again: the size becomes the whole batch's",
        "Segmentation trainers in the DeepLab manner divide a loss that is already a mean over the batch by the "
        "batch's size once more (`batch_average`: `loss = criterion(out, y); loss /= n`). DataParallel divided the "
        "whole batch's mean by the whole batch's size. Under DDP each rank divides its share's mean by its share's "
        "size, world_size times smaller, and the gradients are averaged over the ranks: every step would be "
        "world_size times the original's, silently. (A sum divided by its batch's size is a mean, right as it is: "
        "left alone.)",
        "The size passes through `whole_batch_size(...)` (written once into the script): this rank's share's size times "
        "the world size, which is the whole batch's, since every rank's share is as large (the migration's loaders "
        "pad a batch that does not split evenly). The step is then the original's.",
        "Safe: no collective. A mean is a `torch.nn` loss with the mean reduction (a class followed to its calls, or "
        "a functional), `.mean()` or `torch.mean(x)`; the size is `x.size(0)`, `len(x)`, `x.shape[0]` or a name bound "
        "to one (`n, c, h, w = x.size()`). Divided together with a term dp2ddp cannot name as a mean, the file is "
        "refused instead (DDP183). A division in another module's loss class is not found: `verify` compares the "
        "losses.",
        IMPORTS + "model = nn.DataParallel(nn.Conv2d(3, 2, 1))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "criterion = nn.CrossEntropyLoss()\nx, y = torch.randn(4, 3, 8, 8), torch.randint(0, 2, (4, 8, 8))\n"
        "n = x.size(0)\nloss = criterion(model(x), y)\nloss /= n\nloss.backward()\nopt.step()\n",
        "loss /= whole_batch_size(n)\n",
    ),
    MigrationCode(
        "DDP183", "mean-over-batch-size-mixed", "error",
        "a mean loss divided by its batch's size together with a term that may be a sum; the file is left unchanged",
        "`(criterion(out, y) + extra) / x.size(0)`: the mean's division must become the whole batch's size (DDP182), "
        "because each rank's share is world_size times smaller; a sum over the samples divided by its batch's size "
        "is a mean and right as it is. dp2ddp cannot tell which `extra` is, and either edit would change one of the "
        "two terms' steps.",
        "Divide each term on its own (`criterion(out, y) / x.size(0) + extra / x.size(0)`), or make the other term "
        "a named mean or sum, then migrate. `--accept DDP183` writes the migration without the change.",
        "No fix: the file is left unchanged.",
        IMPORTS + "model = nn.DataParallel(nn.Linear(4, 3))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "criterion = nn.CrossEntropyLoss()\nx, y = torch.randn(8, 4), torch.randint(0, 3, (8,))\nout = model(x)\n"
        "loss = (criterion(out, y) + out.abs().max()) / x.size(0)\nloss.backward()\nopt.step()\n",
    ),
    MigrationCode(
        "DDP184", "dataset-seeds-by-worker-id", "error",
        "a dataset seeds its random streams from the DataLoader worker's id alone; the file is left unchanged",
        "Optical-flow and detection datasets seed NumPy, `random` and torch inside `__getitem__` on their first call in "
        "a worker: `np.random.seed(get_worker_info().id)`. Under DataParallel one process ran the workers, each with a "
        "stream of its own. Under DDP every rank runs workers 0..k-1 and seeds them alike, after whatever per-rank seed "
        "the migration gave them: every rank draws the same crops, flips and noise for its share, and a global batch "
        "holds each augmentation world-size times.",
        "Seed from `torch.initial_seed()` in the worker (`np.random.seed(torch.initial_seed() % 2**32)`), which the "
        "migrated loader makes differ per rank and worker, then migrate; or take the risk with `--accept DDP184`. A "
        "`worker_init_fn` that seeds from the worker id is handled (the migrated loader moves its streams apart per "
        "rank); a seed inside the dataset runs after it and cannot be.",
        "No fix: the file is left unchanged.",
        IMPORTS + "import numpy as np\nfrom torch.utils.data import DataLoader, Dataset, get_worker_info\n\n\n"
        "class Crops(Dataset):\n    def __len__(self):\n        return 32\n\n    def __getitem__(self, i):\n"
        "        info = get_worker_info()\n        if info is not None:\n            np.random.seed(info.id)\n"
        "        return torch.tensor(np.random.rand(4), dtype=torch.float32)\n\n\n"
        "model = nn.DataParallel(nn.Linear(4, 1))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x in DataLoader(Crops(), batch_size=8, num_workers=2):\n    loss = model(x).pow(2).mean()\n"
        "    opt.zero_grad()\n    loss.backward()\n    opt.step()\n",
    ),
    MigrationCode(
        "DDP185", "handed-count-mean", "error",
        "a loss handed to a project module's training code averages over a count of its batch; the file is left "
        "unchanged",
        "Detection trainers hand their loss to a trainer class or function of the project: `Trainer(model, model_fn, "
        "optimizer)`, where `model_fn` (often a closure a decorator returns) divides its terms by a count of the batch, "
        "`loss.sum() / torch.clamp(mask.sum(), min=1.0)` (the positive anchors, the valid points), or uses a loss with "
        "`ignore_index`. The trainer calls it on each rank's share under DDP: every rank divides by its own share's "
        "count and the gradients are averaged, the shares weighted alike, another step than DataParallel's, which "
        "divided by the whole batch's count. The rewrite of the script cannot put the count of every rank's share "
        "inside code it only hands on. The same holds for such a loss the script's own step calls from a project "
        "module (DeepLab's `SegmentationLosses(...).build_loss(mode)`, whose `nn.CrossEntropyLoss(ignore_index=255)` "
        "averages over the valid pixels): every method or class the factory may return counts.",
        "Divide by the count of every rank's share where the loss is computed (all-reduce the count, over the world "
        "size, as fairseq and mmdetection do), or make that function part of the script, then migrate; or take the "
        "risk with `--accept DDP185`. The same division in the script's own training step is migrated (DDP169).",
        "No fix: the file is left unchanged.",
        IMPORTS + "from trainer import Trainer\n\n\n"
        "def masked_step(model, batch):\n    x, y = batch\n"
        "    per_sample = nn.functional.cross_entropy(model(x), y, reduction='none')\n    mask = (y != 0).float()\n"
        "    return (per_sample * mask).sum() / torch.clamp(mask.sum(), min=1.0)\n\n\n"
        "model = nn.DataParallel(nn.Linear(4, 3))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randint(0, 3, (16,)))\n"
        "Trainer(model, masked_step, opt).fit(torch.utils.data.DataLoader(data, batch_size=8, shuffle=True))\n",
    ),
    MigrationCode(
        "DDP118", "sum-reduction-scale", "error",
        "a summed loss (`reduction=\"sum\"`, `size_average=False`) that dp2ddp cannot keep at DataParallel's scale; "
        "the file is left unchanged",
        "DataParallel sums over the whole batch; under DDP each process sums its share and the gradients are averaged "
        "across processes, so each step would be 1/world_size of the original's. dp2ddp scales a summed loss by the "
        "world size (DDP164) only where every backward it reaches differentiates a sum of summed losses; here another "
        "term is added (scaling the whole loss would scale a mean too), the same call computes a loss the "
        "configuration may pick as a mean, or dp2ddp cannot follow the loss to a backward. The message names which.",
        "Multiply the summed loss by `dist.get_world_size()` where it is computed (or divide it by its batch's size "
        "to make it a mean), then migrate. `--accept DDP118` writes the migration anyway (it then trains at "
        "1/world_size of the step). Lint rule DDP015 reports the same places.",
        "No fix: the file is left unchanged.",
        IMPORTS + "model = nn.DataParallel(nn.Linear(4, 1))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "criterion = nn.MSELoss(reduction=\"sum\")\nx, y = torch.randn(8, 4), torch.randn(8, 1)\nout = model(x)\n"
        "loss = criterion(out, y) + out.abs().mean()\nloss.backward()\nopt.step()\n",
    ),
    MigrationCode(
        "DDP164", "whole-sum", "info",
        "a summed loss (`reduction=\"sum\"`) is multiplied by the world size, so each step is DataParallel's",
        "DataParallel summed the loss over the whole batch. Under DDP each rank sums its share and the gradients are "
        "averaged over the ranks: without a scale each step would be 1/world_size of the original's.",
        "Every backward the loss reaches differentiates a sum of summed losses (times factors the same on every "
        "rank): each passes through `whole_sum(loss)` (written once into the script), the loss times "
        "`dist.get_world_size()`. The gradient is the original's exactly; the loss averaged over the ranks is the "
        "original's (each rank's own printed value is its share times the world size).",
        "Safe: no communication. Sums divided by their batch's size (means), summed losses under `torch.no_grad()` "
        "or read only as numbers, and an attack's input gradients (`torch.autograd.grad`, an optimizer over plain "
        "tensors) are left alone.",
        IMPORTS + "model = nn.DataParallel(nn.Linear(4, 1))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "criterion = nn.MSELoss(reduction=\"sum\")\nx, y = torch.randn(8, 4), torch.randn(8, 1)\n"
        "loss = criterion(model(x), y)\nloss.backward()\nopt.step()\n",
        "loss = whole_sum(criterion(model(x), y))\n",
    ),
    MigrationCode(
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
        IMPORTS + "from torch.utils.data import DataLoader, TensorDataset\n\n"
        "loader = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4, shuffle=True)\n"
        "model = nn.DataParallel(nn.Linear(4, 1))\nmodel(next(iter(loader))[0])\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor (x,) in loader:\n    model(x).sum().backward()\n    opt.step()\n",
    ),
    MigrationCode(
        "DDP154", "in-batch-loss-gathered", "info",
        "a loss that couples the samples of a batch gets every rank's share of the batch",
        "A contrastive loss (SupCon, NT-Xent, InfoNCE with in-batch negatives) compares every sample of the batch with "
        "every other; a Dice or IoU loss divides totals over the whole batch. Under DataParallel it ran on the "
        "gathered outputs; under DDP each process would compute it on its own share (fewer negatives, other totals: "
        "another loss, another model).",
        "Each input of the loss call (names the training step assigns) goes through `GatherBatch.apply(...)`, a small "
        "autograd function written once into the script: forward, `all_gather` of every rank's share in rank order "
        "(the original's global batch, since each rank holds a contiguous slice of it); backward, the gradients of "
        "every rank's (identical) loss summed and this rank's share kept, so that DDP's average of the parameters' "
        "gradients is the original's gradient.",
        "Safe where every rank's share has the same size (the sharded loaders pad the last batch to make it so); the "
        "loss runs over the global batch on every rank (world-size times its cost). An input that is not a value of "
        "the training step (a queue of negatives, a parameter) is not gathered: the file is refused (DDP153).",
        IMPORTS + "def contrastive_loss(z):\n    logits = z @ z.T\n"
        "    return nn.functional.cross_entropy(logits, torch.arange(len(z)))\n\n\n"
        "model = nn.DataParallel(nn.Linear(4, 8))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for (x,) in torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 4)), batch_size=8):\n"
        "    features = model(x)\n    loss = contrastive_loss(features)\n    loss.backward()\n    opt.step()\n",
        "    loss = contrastive_loss(GatherBatch.apply(features))\n",
    ),
    MigrationCode(
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
        IMPORTS + "model = nn.DataParallel(nn.Linear(4, 2))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = torch.utils.data.DataLoader(torch.randn(32, 4), batch_size=8)\nfor i, x in enumerate(loader):\n"
        "    if i == 0:\n        with torch.no_grad():\n            model.module(x * 2)\n        continue\n"
        "    model(x).sum().backward()\n    opt.step()\n",
        "            model.module(GatherBatch.apply(x * 2))\n",
    ),
    MigrationCode(
        "DDP153", "in-batch-loss", "error",
        "a loss the training reaches couples the samples of a batch (`features @ features.T`, a ratio of totals over the batch) and gathers nothing from the other ranks, where dp2ddp cannot gather its inputs",
        "Under DataParallel a contrastive loss (SupCon, NT-Xent, InfoNCE) runs on the gathered outputs: every sample "
        "meets every other; a Dice, IoU or count-normalised detection loss (`loss_l /= num_pos.sum()`) divides totals "
        "over the whole batch. Under DDP each process computes it on its own share: fewer negatives, other totals, "
        "another loss, and a migration that trains a different model while exiting 0. Where the loss's inputs are "
        "values of the training step that are one tensor of the batch each, the migration gathers them (DDP154); "
        "an input that is state (a queue of negatives) or that the loss takes apart as a sequence (a tuple of "
        "outputs, a list of per-image targets) cannot be gathered that way, and the file is refused.",
        "Gather every rank's features before the loss (an all_gather that keeps the gradients, as SimCLR's "
        "GatherLayer), or all-reduce the totals the loss divides (a count of positives summed over the ranks, "
        "divided by the world size), then migrate.",
        "No fix.",
        "import torch\nimport torch.nn as nn\n\n\ndef contrastive_loss(z):\n    sim = torch.matmul(z, z.T)\n"
        "    return -torch.log_softmax(sim, dim=1).diagonal().mean()\n\n\n"
        "model = nn.DataParallel(nn.Linear(4, 8))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for step in range(2):\n    opt.zero_grad()\n    loss = contrastive_loss(model(torch.randn(8, 4)))\n"
        "    loss.backward()\n    opt.step()\n",
    ),
    MigrationCode(
        "DDP188", "gather-backward-not-summed", "error",
        "the script's own distributed path gathers with a backward that keeps this rank's slice of its own gradient, "
        "summed over no rank",
        "A contrastive loss computed on every rank's embeddings gathers them with an autograd Function "
        "(`GatherLayer`): each rank computes the whole loss from the gathered batch, so the gradient of a rank's "
        "embeddings is the sum of every rank's gradient for that slice. A backward that returns "
        "`grads[dist.get_rank()]` without an `all_reduce` first keeps 1/world of it, and DDP's averaging leaves every "
        "gradient through the gather at 1/world of what the one DataParallel process computed: a silent change of "
        "the learning rate (Adam hides most of it; under SGD the losses part from the second step). The migration "
        "would switch that path on (the script's world size under torchrun).",
        "Sum before slicing in the backward (`all = torch.stack(grads); dist.all_reduce(all); return all[rank]`), "
        "or gather with `torch.distributed.nn.functional.all_gather`, whose backward does; then migrate.",
        "No fix: the file is left unchanged.",
        "import argparse\nimport torch\nimport torch.distributed as dist\nimport torch.nn as nn\n\n\n"
        "class GatherLayer(torch.autograd.Function):\n    @staticmethod\n    def forward(ctx, x):\n"
        "        out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]\n        dist.all_gather(out, x)\n"
        "        return tuple(out)\n\n    @staticmethod\n    def backward(ctx, *grads):\n"
        "        return grads[dist.get_rank()]\n\n\n"
        "p = argparse.ArgumentParser()\np.add_argument(\"--nodes\", type=int, default=1)\n"
        "p.add_argument(\"--rank\", type=int, default=0)\nargs = p.parse_args()\n"
        "if args.nodes > 1:\n    dist.init_process_group(\"gloo\", rank=args.rank, world_size=args.nodes)\n"
        "    model = nn.parallel.DistributedDataParallel(nn.Linear(4, 8))\nelse:\n"
        "    model = nn.DataParallel(nn.Linear(4, 8))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for step in range(2):\n    z = model(torch.randn(8, 4))\n    if args.nodes > 1:\n"
        "        z = torch.cat(GatherLayer.apply(z))\n    loss = (z @ z.T).logsumexp(1).mean()\n"
        "    opt.zero_grad()\n    loss.backward()\n    opt.step()\n",
    ),
    # ---- the migrated run does no more work than a hand migration (issue 20): DDP140-DDP149
    MigrationCode(
        "DDP140", "accumulation-no-sync", "info",
        "gradient accumulation: the passes that do not step the optimizer run under `model.no_sync()`",
        "Where `optimizer.step()` follows only every k-th backward pass, DDP would still all-reduce the gradients in "
        "every backward pass: k all-reduces per step where one is needed.",
        "The statements from the forward to the backward of each pass go under `with contextlib.nullcontext() if "
        "<step condition> else model.no_sync():`; the condition is the loop's own, read before the forward (a counter "
        "incremented in between, `step += 1`, is read as `step + 1`). The loss scaling (`loss = loss / accum`) stays.",
        "Safe: DDP all-reduces the locally accumulated sum in the pass that syncs, the same averaged gradient as "
        "before; anything that reads the gradients between micro-steps keeps every pass in sync instead (DDP142).",
        IMPORTS + "model = nn.DataParallel(nn.Linear(4, 1))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for i in range(8):\n    loss = model(torch.randn(8, 4)).sum() / 4\n    loss.backward()\n"
        "    if (i + 1) % 4 == 0:\n        opt.step()\n        opt.zero_grad()\n",
        "for i in range(8):\n\n    # dp2ddp: all-reduce the gradients only in the backward pass an optimizer step follows\n"
        "    with contextlib.nullcontext() if (i + 1) % 4 == 0 else model.no_sync():\n"
        "        loss = model(torch.randn(8, 4)).sum() / 4\n        loss.backward()\n",
    ),
    MigrationCode(
        "DDP141", "accumulation-step-unreadable", "error",
        "the optimizer steps after only some backward passes, on a condition dp2ddp cannot read before the forward",
        "DDP must know before a pass's forward whether its backward all-reduces (`no_sync()`); a step condition that "
        "reads what the pass computes (`if step_now(loss):`), a call of the script, or a name set after the forward "
        "cannot be known there, and guessing would step on unsynchronised gradients.",
        "Compute the condition from values known before the forward (the loop index, a counter), or restructure the "
        "loop, and run `dp2ddp rewrite` again.",
        "No fix: the file is left byte-for-byte as it was.",
        IMPORTS + "model = nn.DataParallel(nn.Linear(4, 1))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for i in range(8):\n    loss = model(torch.randn(8, 4)).sum()\n    loss.backward()\n"
        "    done = i + 1\n    if done % 4 == 0:\n        opt.step()\n",
    ),
    MigrationCode(
        "DDP142", "accumulation-kept-in-sync", "warning",
        "an accumulation loop whose every backward pass keeps all-reducing",
        "Gradients read between micro-steps (`clip_grad_norm_` outside the step's `if`, `p.grad`) must be the "
        "averaged ones the original saw; or dp2ddp cannot tell which wrapped model's forward the pass runs.",
        "Nothing changes: each backward pass all-reduces, as DDP does by default (correct, not faster). To "
        "accumulate without all-reducing, clip under the step's `if` and run the forward of one wrapped model per pass.",
        "Safe: the migration is the plain DDP one.",
        IMPORTS + "model = nn.DataParallel(nn.Linear(4, 1))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for i in range(8):\n    loss = model(torch.randn(8, 4)).sum() / 4\n    loss.backward()\n"
        "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
        "    if (i + 1) % 4 == 0:\n        opt.step()\n        opt.zero_grad()\n",
    ),
)
