"""Generate real-style PyTorch training scripts for the benchmarks (our own code).

* :func:`generate` (``python benchmarks/gen_script.py [LINES]``): one large DataParallel
  script, many helpers around one training loop (`bench_rewrite.py`).
* :func:`corpus` (``python benchmarks/gen_script.py --corpus DIR [--lines N]``): a tree of
  varied training scripts, several hundred lines each, written the way the common
  trainers are — an ImageNet-example style (`main_worker`, `AverageMeter`, a DataParallel
  or DDP branch), an NLP-finetuning style (``--local_rank``, paired barriers around data
  caching, ``if n_gpu > 1: loss = loss.mean()``, gradient accumulation, TensorBoard), an
  image-model trainer style (EMA, AMP scaler, checkpoint saver, ``distribute_bn``), a
  detector style (``RANK``/``LOCAL_RANK`` from the environment, a ``zero_first``
  context manager, callbacks, early stopping) and a flat CIFAR style — with their models,
  datasets, metrics and utilities. Deterministic for a seed.
"""

from __future__ import annotations

import os
import random
import sys
import textwrap
from typing import Dict, List

# --------------------------------------------------------------------------- generate(): one big script

HEADER = '''"""Generated benchmark script: many helpers around one DataParallel training loop."""
import argparse
import os

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

'''

HELPER = '''
def helper_{i}(x, scale={i}):
    """Helper number {i}."""
    # a comment that must survive
    total = 0
    for j in range(scale % 7 + 1):
        if j % 2 == 0:
            total += j * x
        else:
            total -= j
    values = [total, x, scale]
    return sum(values) / (len(values) or 1)

'''

MAIN = '''
def train(model, loader, optimizer, epoch, device):
    model.train()
    for step, (x, y) in enumerate(loader):
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            print("epoch", epoch, "step", step, loss.item())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    dataset = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    train_loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=2)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to(device)
    if torch.cuda.device_count() > 1:
        model = nn.DataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(args.epochs):
        train(model, train_loader, optimizer, epoch, device)
        os.makedirs("ckpt", exist_ok=True)
        torch.save(model.state_dict(), "ckpt/model.pt")


if __name__ == "__main__":
    main()
'''


def generate(lines: int = 1000) -> str:
    parts = [HEADER]
    i = 0
    while sum(p.count("\n") for p in parts) + MAIN.count("\n") < lines:
        parts.append(HELPER.format(i=i))
        i += 1
    parts.append(MAIN)
    return "".join(parts)


# --------------------------------------------------------------------------- corpus(): many varied scripts


def _d(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


class _Gen:
    def __init__(self, rng: random.Random) -> None:
        self.r = rng

    def pick(self, *options):
        return self.r.choice(options)

    def n(self, lo: int, hi: int) -> int:
        return self.r.randint(lo, hi)

    # ---------------------------------------------------------------- shared blocks
    def license(self) -> str:
        who = self.pick("The Authors", "Research Team", "Vision Group", "NLP Lab")
        year = self.n(2017, 2023)
        return f"# Copyright (c) {year} {who}. All rights reserved.\n# Licensed under the Apache License, Version 2.0.\n"

    def meters(self) -> str:
        return _d(
            '''
            class AverageMeter(object):
                """Computes and stores the average and current value"""

                def __init__(self, name, fmt=":f"):
                    self.name = name
                    self.fmt = fmt
                    self.reset()

                def reset(self):
                    self.val = 0
                    self.avg = 0
                    self.sum = 0
                    self.count = 0

                def update(self, val, n=1):
                    self.val = val
                    self.sum += val * n
                    self.count += n
                    self.avg = self.sum / self.count

                def __str__(self):
                    fmtstr = "{name} {val" + self.fmt + "} ({avg" + self.fmt + "})"
                    return fmtstr.format(**self.__dict__)


            class ProgressMeter(object):
                def __init__(self, num_batches, meters, prefix=""):
                    self.batch_fmtstr = self._get_batch_fmtstr(num_batches)
                    self.meters = meters
                    self.prefix = prefix

                def display(self, batch):
                    entries = [self.prefix + self.batch_fmtstr.format(batch)]
                    entries += [str(meter) for meter in self.meters]
                    print("\\t".join(entries))

                def _get_batch_fmtstr(self, num_batches):
                    num_digits = len(str(num_batches // 1))
                    fmt = "{:" + str(num_digits) + "d}"
                    return "[" + fmt + "/" + fmt.format(num_batches) + "]"


            def accuracy(output, target, topk=(1,)):
                """Computes the accuracy over the k top predictions for the specified values of k"""
                with torch.no_grad():
                    maxk = max(topk)
                    batch_size = target.size(0)
                    _, pred = output.topk(maxk, 1, True, True)
                    pred = pred.t()
                    correct = pred.eq(target.view(1, -1).expand_as(pred))
                    res = []
                    for k in topk:
                        correct_k = correct[:k].reshape(-1).float().sum(0, keepdim=True)
                        res.append(correct_k.mul_(100.0 / batch_size))
                    return res
            '''
        )

    def model_block(self, i: int) -> str:
        kind = self.pick("conv", "resblock", "mlp", "attention", "lstm")
        c = self.pick(16, 32, 64, 128)
        if kind == "conv":
            return _d(
                f'''
                class ConvNet{i}(nn.Module):
                    def __init__(self, num_classes={self.pick(10, 100, 1000)}, width={c}):
                        super(ConvNet{i}, self).__init__()
                        self.features = nn.Sequential(
                            nn.Conv2d(3, width, kernel_size=3, padding=1, bias=False),
                            nn.BatchNorm2d(width),
                            nn.ReLU(inplace=True),
                            nn.MaxPool2d(2),
                            nn.Conv2d(width, width * 2, kernel_size=3, padding=1, bias=False),
                            nn.BatchNorm2d(width * 2),
                            nn.ReLU(inplace=True),
                            nn.AdaptiveAvgPool2d((1, 1)),
                        )
                        self.classifier = nn.Linear(width * 2, num_classes)
                        for m in self.modules():
                            if isinstance(m, nn.Conv2d):
                                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                            elif isinstance(m, nn.BatchNorm2d):
                                nn.init.constant_(m.weight, 1)
                                nn.init.constant_(m.bias, 0)

                    def forward(self, x):
                        x = self.features(x)
                        x = torch.flatten(x, 1)
                        return self.classifier(x)
                '''
            )
        if kind == "resblock":
            return _d(
                f'''
                class Bottleneck{i}(nn.Module):
                    expansion = 4

                    def __init__(self, inplanes, planes, stride=1, downsample=None):
                        super().__init__()
                        self.conv1 = nn.Conv2d(inplanes, planes, kernel_size=1, bias=False)
                        self.bn1 = nn.BatchNorm2d(planes)
                        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
                        self.bn2 = nn.BatchNorm2d(planes)
                        self.conv3 = nn.Conv2d(planes, planes * self.expansion, kernel_size=1, bias=False)
                        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
                        self.relu = nn.ReLU(inplace=True)
                        self.downsample = downsample
                        self.stride = stride

                    def forward(self, x):
                        residual = x
                        out = self.relu(self.bn1(self.conv1(x)))
                        out = self.relu(self.bn2(self.conv2(out)))
                        out = self.bn3(self.conv3(out))
                        if self.downsample is not None:
                            residual = self.downsample(x)
                        out += residual
                        return self.relu(out)
                '''
            )
        if kind == "mlp":
            return _d(
                f'''
                class Head{i}(nn.Module):
                    """Projection head ({c} hidden units)."""

                    def __init__(self, in_dim, out_dim={self.pick(128, 256, 512)}, hidden={c}, dropout={self.pick(0.1, 0.2, 0.5)}):
                        super().__init__()
                        self.net = nn.Sequential(
                            nn.Linear(in_dim, hidden),
                            nn.LayerNorm(hidden),
                            nn.GELU(),
                            nn.Dropout(dropout),
                            nn.Linear(hidden, out_dim),
                        )

                    def forward(self, x):
                        return self.net(x)
                '''
            )
        if kind == "attention":
            return _d(
                f'''
                class SelfAttention{i}(nn.Module):
                    def __init__(self, dim={c * 4}, heads={self.pick(4, 8, 12)}, qkv_bias=False, attn_drop=0.0):
                        super().__init__()
                        self.heads = heads
                        self.scale = (dim // heads) ** -0.5
                        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
                        self.attn_drop = nn.Dropout(attn_drop)
                        self.proj = nn.Linear(dim, dim)

                    def forward(self, x):
                        b, n, c = x.shape
                        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
                        q, k, v = qkv[0], qkv[1], qkv[2]
                        attn = (q @ k.transpose(-2, -1)) * self.scale
                        attn = attn.softmax(dim=-1)
                        attn = self.attn_drop(attn)
                        x = (attn @ v).transpose(1, 2).reshape(b, n, c)
                        return self.proj(x)
                '''
            )
        return _d(
            f'''
            class RNNModel{i}(nn.Module):
                """Container module with an encoder, a recurrent module, and a decoder."""

                def __init__(self, ntoken, ninp={c * 2}, nhid={c * 4}, nlayers=2, dropout=0.5, tie_weights=False):
                    super(RNNModel{i}, self).__init__()
                    self.drop = nn.Dropout(dropout)
                    self.encoder = nn.Embedding(ntoken, ninp)
                    self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
                    self.decoder = nn.Linear(nhid, ntoken)
                    if tie_weights:
                        if nhid != ninp:
                            raise ValueError("When using the tied flag, nhid must be equal to emsize")
                        self.decoder.weight = self.encoder.weight
                    self.nhid = nhid
                    self.nlayers = nlayers

                def forward(self, input, hidden):
                    emb = self.drop(self.encoder(input))
                    output, hidden = self.rnn(emb, hidden)
                    output = self.drop(output)
                    decoded = self.decoder(output)
                    return decoded, hidden

                def init_hidden(self, bsz):
                    weight = next(self.parameters())
                    return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))
            '''
        )

    def dataset_block(self, i: int) -> str:
        return _d(
            f'''
            class SampleDataset{i}(Dataset):
                """Reads (input, label) pairs from a list file."""

                def __init__(self, root, split="train", transform=None, max_items={self.n(1000, 90000)}):
                    self.root = root
                    self.split = split
                    self.transform = transform
                    self.items = []
                    list_file = os.path.join(root, split + ".txt")
                    if os.path.isfile(list_file):
                        with open(list_file) as f:
                            for line in f:
                                path, label = line.strip().split()
                                self.items.append((os.path.join(root, path), int(label)))
                    self.items = self.items[:max_items]

                def __len__(self):
                    return len(self.items)

                def __getitem__(self, index):
                    path, label = self.items[index]
                    sample = torch.load(path) if path.endswith(".pt") else torch.zeros(3, 32, 32)
                    if self.transform is not None:
                        sample = self.transform(sample)
                    return sample, label
            '''
        )

    def util_block(self, i: int) -> str:
        kind = self.pick("lr", "seed", "logger", "params", "collate")
        if kind == "lr":
            return _d(
                f'''
                def adjust_learning_rate_{i}(optimizer, epoch, args, warmup={self.n(0, 5)}):
                    """Decays the learning rate with half-cycle cosine after warmup"""
                    if epoch < warmup:
                        lr = args.lr * epoch / max(warmup, 1)
                    else:
                        lr = args.lr * 0.5 * (1.0 + math.cos(math.pi * (epoch - warmup) / (args.epochs - warmup)))
                    for param_group in optimizer.param_groups:
                        if "lr_scale" in param_group:
                            param_group["lr"] = lr * param_group["lr_scale"]
                        else:
                            param_group["lr"] = lr
                    return lr
                '''
            )
        if kind == "seed":
            return _d(
                f'''
                def set_seed_{i}(seed, deterministic=False):
                    random.seed(seed)
                    np.random.seed(seed)
                    torch.manual_seed(seed)
                    if torch.cuda.is_available():
                        torch.cuda.manual_seed_all(seed)
                    if deterministic:
                        torch.backends.cudnn.deterministic = True
                        torch.backends.cudnn.benchmark = False
                '''
            )
        if kind == "logger":
            return _d(
                f'''
                def create_logger_{i}(output_dir, name="train", level=logging.INFO):
                    os.makedirs(output_dir, exist_ok=True)
                    logger = logging.getLogger(name)
                    logger.setLevel(level)
                    fmt = "[%(asctime)s %(name)s] (%(filename)s %(lineno)d): %(levelname)s %(message)s"
                    console = logging.StreamHandler(sys.stdout)
                    console.setFormatter(logging.Formatter(fmt=fmt, datefmt="%Y-%m-%d %H:%M:%S"))
                    logger.addHandler(console)
                    file_handler = logging.FileHandler(os.path.join(output_dir, "log_{i}.txt"), mode="a")
                    file_handler.setFormatter(logging.Formatter(fmt=fmt, datefmt="%Y-%m-%d %H:%M:%S"))
                    logger.addHandler(file_handler)
                    return logger
                '''
            )
        if kind == "params":
            return _d(
                f'''
                def param_groups_{i}(model, weight_decay={self.pick(0.05, 1e-4, 0.01)}, skip_list=()):
                    decay, no_decay = [], []
                    for name, param in model.named_parameters():
                        if not param.requires_grad:
                            continue
                        if param.ndim <= 1 or name.endswith(".bias") or name in skip_list:
                            no_decay.append(param)
                        else:
                            decay.append(param)
                    return [{{"params": no_decay, "weight_decay": 0.0}}, {{"params": decay, "weight_decay": weight_decay}}]
                '''
            )
        return _d(
            f'''
            def collate_{i}(batch, pad_value=0):
                """Pads variable-length sequences to the longest in the batch."""
                inputs = [b[0] for b in batch]
                labels = torch.tensor([b[1] for b in batch])
                longest = max(x.size(0) for x in inputs)
                padded = torch.full((len(inputs), longest), pad_value, dtype=torch.long)
                for j, x in enumerate(inputs):
                    padded[j, : x.size(0)] = x
                return padded, labels
            '''
        )

    def args_block(self, extra: List[str]) -> str:
        lines = [
            'parser = argparse.ArgumentParser(description="Training")',
            'parser.add_argument("data", metavar="DIR", nargs="?", default="data", help="path to dataset")',
            f'parser.add_argument("--epochs", default={self.n(10, 300)}, type=int, metavar="N")',
            f'parser.add_argument("-b", "--batch-size", default={self.pick(32, 64, 128, 256)}, type=int, metavar="N")',
            f'parser.add_argument("--lr", "--learning-rate", default={self.pick(0.1, 0.01, 3e-4, 5e-5)}, type=float, dest="lr")',
            'parser.add_argument("--momentum", default=0.9, type=float, metavar="M")',
            f'parser.add_argument("--wd", "--weight-decay", default={self.pick(1e-4, 5e-4, 0.05)}, type=float, dest="weight_decay")',
            'parser.add_argument("-j", "--workers", default=4, type=int, metavar="N")',
            'parser.add_argument("--resume", default="", type=str, metavar="PATH")',
            'parser.add_argument("--seed", default=None, type=int)',
            'parser.add_argument("--output-dir", default="output", type=str)',
            'parser.add_argument("--print-freq", default=10, type=int)',
        ]
        return "\n".join(lines + extra) + "\n"

    # ---------------------------------------------------------------- styles
    def imports(self, extra: str = "") -> str:
        return _d(
            '''
            import argparse
            import logging
            import math
            import os
            import random
            import shutil
            import sys
            import time

            import numpy as np
            import torch
            import torch.nn as nn
            import torch.nn.functional as F
            import torch.optim
            from torch.utils.data import DataLoader, Dataset
            '''
        ) + extra

    def body(self, n_models: int, n_utils: int, n_datasets: int) -> str:
        parts = [self.meters()]
        parts += [self.model_block(i) for i in range(n_models)]
        parts += [self.dataset_block(i) for i in range(n_datasets)]
        parts += [self.util_block(i) for i in range(n_utils)]
        return "\n\n".join(parts)

    def style_examples(self, k: int) -> str:
        """The ImageNet example: main / main_worker, a DDP branch and a DataParallel fallback."""
        extra = self.imports("import torch.distributed as dist\nimport torch.multiprocessing as mp\n")
        args = self.args_block(
            [
                'parser.add_argument("--world-size", default=-1, type=int)',
                'parser.add_argument("--rank", default=-1, type=int)',
                'parser.add_argument("--dist-url", default="env://", type=str)',
                'parser.add_argument("--dist-backend", default="nccl", type=str)',
                'parser.add_argument("--gpu", default=None, type=int)',
                'parser.add_argument("--multiprocessing-distributed", action="store_true")',
            ]
        )
        main = _d(
            f'''
            best_acc1 = 0


            def main():
                args = parser.parse_args()
                if args.seed is not None:
                    random.seed(args.seed)
                    torch.manual_seed(args.seed)
                if args.dist_url == "env://" and args.world_size == -1:
                    args.world_size = int(os.environ["WORLD_SIZE"])
                args.distributed = args.world_size > 1 or args.multiprocessing_distributed
                ngpus_per_node = torch.cuda.device_count()
                if args.multiprocessing_distributed:
                    args.world_size = ngpus_per_node * args.world_size
                    mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))
                else:
                    main_worker(args.gpu, ngpus_per_node, args)


            def main_worker(gpu, ngpus_per_node, args):
                global best_acc1
                args.gpu = gpu
                if args.distributed:
                    if args.dist_url == "env://" and args.rank == -1:
                        args.rank = int(os.environ["RANK"])
                    if args.multiprocessing_distributed:
                        args.rank = args.rank * ngpus_per_node + gpu
                    dist.init_process_group(backend=args.dist_backend, init_method=args.dist_url,
                                            world_size=args.world_size, rank=args.rank)
                model = ConvNet0()
                if args.distributed:
                    if args.gpu is not None:
                        torch.cuda.set_device(args.gpu)
                        model.cuda(args.gpu)
                        args.batch_size = int(args.batch_size / ngpus_per_node)
                        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
                    else:
                        model.cuda()
                        model = torch.nn.parallel.DistributedDataParallel(model)
                elif args.gpu is not None:
                    torch.cuda.set_device(args.gpu)
                    model = model.cuda(args.gpu)
                else:
                    model = torch.nn.DataParallel(model).cuda()
                criterion = nn.CrossEntropyLoss().cuda(args.gpu)
                optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
                if args.resume:
                    if os.path.isfile(args.resume):
                        checkpoint = torch.load(args.resume)
                        args.start_epoch = checkpoint["epoch"]
                        best_acc1 = checkpoint["best_acc1"]
                        model.load_state_dict(checkpoint["state_dict"])
                        optimizer.load_state_dict(checkpoint["optimizer"])
                train_dataset = SampleDataset0(args.data, "train")
                val_dataset = SampleDataset0(args.data, "val")
                if args.distributed:
                    train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset)
                else:
                    train_sampler = None
                train_loader = DataLoader(train_dataset, batch_size=args.batch_size, shuffle=(train_sampler is None),
                                          num_workers=args.workers, pin_memory=True, sampler=train_sampler)
                val_loader = DataLoader(val_dataset, batch_size=args.batch_size, shuffle=False, num_workers=args.workers)
                for epoch in range({self.n(0, 1)}, args.epochs):
                    if args.distributed:
                        train_sampler.set_epoch(epoch)
                    train(train_loader, model, criterion, optimizer, epoch, args)
                    acc1 = validate(val_loader, model, criterion, args)
                    is_best = acc1 > best_acc1
                    best_acc1 = max(acc1, best_acc1)
                    if not args.multiprocessing_distributed or (args.multiprocessing_distributed and args.rank % ngpus_per_node == 0):
                        save_checkpoint({{"epoch": epoch + 1, "state_dict": model.state_dict(), "best_acc1": best_acc1,
                                          "optimizer": optimizer.state_dict()}}, is_best)


            def train(train_loader, model, criterion, optimizer, epoch, args):
                batch_time = AverageMeter("Time", ":6.3f")
                losses = AverageMeter("Loss", ":.4e")
                top1 = AverageMeter("Acc@1", ":6.2f")
                progress = ProgressMeter(len(train_loader), [batch_time, losses, top1], prefix="Epoch: [{{}}]".format(epoch))
                model.train()
                end = time.time()
                for i, (images, target) in enumerate(train_loader):
                    if args.gpu is not None:
                        images = images.cuda(args.gpu, non_blocking=True)
                    target = target.cuda(args.gpu, non_blocking=True)
                    output = model(images)
                    loss = criterion(output, target)
                    acc1, = accuracy(output, target, topk=(1,))
                    losses.update(loss.item(), images.size(0))
                    top1.update(acc1[0], images.size(0))
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    batch_time.update(time.time() - end)
                    end = time.time()
                    if i % args.print_freq == 0:
                        progress.display(i)


            def validate(val_loader, model, criterion, args):
                losses = AverageMeter("Loss", ":.4e")
                top1 = AverageMeter("Acc@1", ":6.2f")
                model.eval()
                with torch.no_grad():
                    for i, (images, target) in enumerate(val_loader):
                        if args.gpu is not None:
                            images = images.cuda(args.gpu, non_blocking=True)
                        target = target.cuda(args.gpu, non_blocking=True)
                        output = model(images)
                        loss = criterion(output, target)
                        acc1, = accuracy(output, target, topk=(1,))
                        losses.update(loss.item(), images.size(0))
                        top1.update(acc1[0], images.size(0))
                print(" * Acc@1 {{top1.avg:.3f}}".format(top1=top1))
                return top1.avg


            def save_checkpoint(state, is_best, filename="checkpoint.pth.tar"):
                torch.save(state, filename)
                if is_best:
                    shutil.copyfile(filename, "model_best.pth.tar")


            if __name__ == "__main__":
                main()
            '''
        )
        return "\n\n".join([self.license() + extra, args, self.body(self.n(2, 4), self.n(2, 5), 1), main])

    def style_hf(self, k: int) -> str:
        """NLP finetuning: --local_rank, paired barriers, n_gpu loss.mean(), accumulation."""
        extra = self.imports("from torch.utils.data import RandomSampler, SequentialSampler\nfrom torch.utils.data.distributed import DistributedSampler\nfrom torch.utils.tensorboard import SummaryWriter\nfrom tqdm import tqdm, trange\n")
        args = self.args_block(
            [
                'parser.add_argument("--local_rank", type=int, default=-1, help="For distributed training: local_rank")',
                'parser.add_argument("--gradient_accumulation_steps", type=int, default=1)',
                'parser.add_argument("--max_grad_norm", default=1.0, type=float)',
                'parser.add_argument("--logging_steps", type=int, default=50)',
                'parser.add_argument("--save_steps", type=int, default=500)',
                'parser.add_argument("--evaluate_during_training", action="store_true")',
                'parser.add_argument("--no_cuda", action="store_true")',
                'parser.add_argument("--do_train", action="store_true")',
                'parser.add_argument("--do_eval", action="store_true")',
            ]
        )
        main = _d(
            f'''
            logger = logging.getLogger(__name__)


            def load_and_cache_examples(args, evaluate=False):
                if args.local_rank not in [-1, 0] and not evaluate:
                    torch.distributed.barrier()  # only the first process processes the dataset
                cached = os.path.join(args.data, "cached_{{}}".format("dev" if evaluate else "train"))
                if os.path.exists(cached):
                    features = torch.load(cached)
                else:
                    features = [torch.randint(0, 100, ({self.n(32, 512)},)) for _ in range(64)]
                    if args.local_rank in [-1, 0]:
                        torch.save(features, cached)
                if args.local_rank == 0 and not evaluate:
                    torch.distributed.barrier()
                return SampleDataset0(args.data, "dev" if evaluate else "train")


            def train(args, train_dataset, model):
                if args.local_rank in [-1, 0]:
                    tb_writer = SummaryWriter()
                args.train_batch_size = args.batch_size * max(1, args.n_gpu)
                train_sampler = RandomSampler(train_dataset) if args.local_rank == -1 else DistributedSampler(train_dataset)
                train_dataloader = DataLoader(train_dataset, sampler=train_sampler, batch_size=args.train_batch_size)
                optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, eps=1e-8)
                if args.n_gpu > 1:
                    model = torch.nn.DataParallel(model)
                if args.local_rank != -1:
                    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.local_rank],
                                                                      output_device=args.local_rank)
                global_step = 0
                tr_loss, logging_loss = 0.0, 0.0
                model.zero_grad()
                train_iterator = trange(int(args.epochs), desc="Epoch", disable=args.local_rank not in [-1, 0])
                for _ in train_iterator:
                    epoch_iterator = tqdm(train_dataloader, desc="Iteration", disable=args.local_rank not in [-1, 0])
                    for step, batch in enumerate(epoch_iterator):
                        model.train()
                        batch = tuple(t.to(args.device) for t in batch)
                        outputs = model(batch[0])
                        loss = F.cross_entropy(outputs, batch[1])
                        if args.n_gpu > 1:
                            loss = loss.mean()  # mean() to average on multi-gpu parallel training
                        if args.gradient_accumulation_steps > 1:
                            loss = loss / args.gradient_accumulation_steps
                        loss.backward()
                        tr_loss += loss.item()
                        if (step + 1) % args.gradient_accumulation_steps == 0:
                            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                            optimizer.step()
                            model.zero_grad()
                            global_step += 1
                            if args.local_rank in [-1, 0] and args.logging_steps > 0 and global_step % args.logging_steps == 0:
                                if args.local_rank == -1 and args.evaluate_during_training:
                                    results = evaluate(args, model)
                                    for key, value in results.items():
                                        tb_writer.add_scalar("eval_{{}}".format(key), value, global_step)
                                tb_writer.add_scalar("loss", (tr_loss - logging_loss) / args.logging_steps, global_step)
                                logging_loss = tr_loss
                            if args.local_rank in [-1, 0] and args.save_steps > 0 and global_step % args.save_steps == 0:
                                output_dir = os.path.join(args.output_dir, "checkpoint-{{}}".format(global_step))
                                if not os.path.exists(output_dir):
                                    os.makedirs(output_dir)
                                model_to_save = model.module if hasattr(model, "module") else model
                                torch.save(model_to_save.state_dict(), os.path.join(output_dir, "model.bin"))
                                logger.info("Saving model checkpoint to %s", output_dir)
                if args.local_rank in [-1, 0]:
                    tb_writer.close()
                return global_step, tr_loss / max(global_step, 1)


            def evaluate(args, model, prefix=""):
                eval_dataset = load_and_cache_examples(args, evaluate=True)
                eval_dataloader = DataLoader(eval_dataset, sampler=SequentialSampler(eval_dataset), batch_size=args.batch_size)
                if args.n_gpu > 1 and not isinstance(model, torch.nn.DataParallel):
                    model = torch.nn.DataParallel(model)
                eval_loss = 0.0
                nb_eval_steps = 0
                for batch in tqdm(eval_dataloader, desc="Evaluating"):
                    model.eval()
                    with torch.no_grad():
                        outputs = model(batch[0].to(args.device))
                        eval_loss += F.cross_entropy(outputs, batch[1].to(args.device)).mean().item()
                    nb_eval_steps += 1
                return {{"loss": eval_loss / max(nb_eval_steps, 1)}}


            def main():
                args = parser.parse_args()
                if args.local_rank == -1 or args.no_cuda:
                    device = torch.device("cuda" if torch.cuda.is_available() and not args.no_cuda else "cpu")
                    args.n_gpu = torch.cuda.device_count()
                else:
                    torch.cuda.set_device(args.local_rank)
                    device = torch.device("cuda", args.local_rank)
                    torch.distributed.init_process_group(backend="nccl")
                    args.n_gpu = 1
                args.device = device
                logging.basicConfig(level=logging.INFO if args.local_rank in [-1, 0] else logging.WARN)
                if args.local_rank not in [-1, 0]:
                    torch.distributed.barrier()
                model = Head0({self.pick(768, 1024)}, {self.pick(2, 3, 5)})
                if args.local_rank == 0:
                    torch.distributed.barrier()
                model.to(args.device)
                if args.do_train:
                    train_dataset = load_and_cache_examples(args, evaluate=False)
                    global_step, tr_loss = train(args, train_dataset, model)
                    logger.info(" global_step = %s, average loss = %s", global_step, tr_loss)
                if args.do_eval and args.local_rank in [-1, 0]:
                    result = evaluate(args, model)
                    logger.info("eval %s", result)


            if __name__ == "__main__":
                main()
            '''
        )
        return "\n\n".join([self.license() + extra, args, self.body(self.n(1, 3), self.n(3, 6), 1).replace("class Head", "class Head_"), self.model_block(0).replace("class ", "class Head0Base"), _d('''
            class Head0(nn.Module):
                def __init__(self, dim, classes):
                    super().__init__()
                    self.fc = nn.Linear(dim, classes)

                def forward(self, x):
                    return self.fc(x.float().mean(-1, keepdim=True).expand(-1, self.fc.in_features))
            '''), main])

    def style_timm(self, k: int) -> str:
        """An image-model trainer: EMA, AMP, a checkpoint saver, distribute_bn."""
        extra = self.imports("import torch.distributed as dist\nfrom collections import OrderedDict\nfrom contextlib import suppress\nfrom copy import deepcopy\n")
        args = self.args_block(
            [
                'parser.add_argument("--model-ema", action="store_true", default=False)',
                'parser.add_argument("--model-ema-decay", type=float, default=0.9998)',
                'parser.add_argument("--amp", action="store_true", default=False)',
                'parser.add_argument("--sync-bn", action="store_true")',
                'parser.add_argument("--dist-bn", type=str, default="reduce")',
                'parser.add_argument("--clip-grad", type=float, default=None)',
                'parser.add_argument("--checkpoint-hist", type=int, default=10)',
            ]
        )
        main = _d(
            '''
            _logger = logging.getLogger("train")


            class ModelEma:
                def __init__(self, model, decay=0.9999, device=""):
                    self.ema = deepcopy(model)
                    self.ema.eval()
                    self.decay = decay
                    for p in self.ema.parameters():
                        p.requires_grad_(False)

                def update(self, model):
                    needs_module = hasattr(model, "module") and not hasattr(self.ema, "module")
                    with torch.no_grad():
                        msd = model.state_dict()
                        for k, ema_v in self.ema.state_dict().items():
                            if needs_module:
                                k = "module." + k
                            model_v = msd[k].detach()
                            ema_v.copy_(ema_v * self.decay + (1.0 - self.decay) * model_v)


            class CheckpointSaver:
                def __init__(self, model, optimizer, args=None, checkpoint_dir="", max_history=10):
                    self.model = model
                    self.optimizer = optimizer
                    self.args = args
                    self.checkpoint_files = []
                    self.best_metric = None
                    self.checkpoint_dir = checkpoint_dir
                    self.max_history = max_history

                def save_checkpoint(self, epoch, metric=None):
                    save_path = os.path.join(self.checkpoint_dir, "checkpoint-%d.pth.tar" % epoch)
                    state = {"epoch": epoch, "state_dict": get_state_dict(self.model), "optimizer": self.optimizer.state_dict()}
                    if metric is not None:
                        state["metric"] = metric
                    torch.save(state, save_path)
                    self.checkpoint_files.append((save_path, metric))
                    if len(self.checkpoint_files) > self.max_history:
                        old, _ = self.checkpoint_files.pop(0)
                        os.remove(old)
                    if metric is not None and (self.best_metric is None or metric > self.best_metric):
                        self.best_metric = metric
                        shutil.copyfile(save_path, os.path.join(self.checkpoint_dir, "model_best.pth.tar"))
                    return self.best_metric


            def get_state_dict(model):
                return (model.module if hasattr(model, "module") else model).state_dict()


            def reduce_tensor(tensor, n):
                rt = tensor.clone()
                dist.all_reduce(rt, op=dist.ReduceOp.SUM)
                rt /= n
                return rt


            def distribute_bn(model, world_size, reduce=False):
                for bn_name, bn_buf in model.named_buffers(recurse=True):
                    if ("running_mean" in bn_name) or ("running_var" in bn_name):
                        if reduce:
                            torch.distributed.all_reduce(bn_buf, op=dist.ReduceOp.SUM)
                            bn_buf /= float(world_size)
                        else:
                            torch.distributed.broadcast(bn_buf, 0)


            def train_one_epoch(epoch, model, loader, optimizer, loss_fn, args, amp_autocast=suppress, loss_scaler=None, model_ema=None):
                losses_m = AverageMeter("loss")
                model.train()
                for batch_idx, (input, target) in enumerate(loader):
                    input, target = input.cuda(), target.cuda()
                    with amp_autocast():
                        output = model(input)
                        loss = loss_fn(output, target)
                    if not args.distributed:
                        losses_m.update(loss.item(), input.size(0))
                    optimizer.zero_grad()
                    if loss_scaler is not None:
                        loss_scaler.scale(loss).backward()
                        loss_scaler.step(optimizer)
                        loss_scaler.update()
                    else:
                        loss.backward()
                        if args.clip_grad is not None:
                            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad)
                        optimizer.step()
                    if model_ema is not None:
                        model_ema.update(model)
                    if batch_idx % args.print_freq == 0:
                        if args.distributed:
                            reduced_loss = reduce_tensor(loss.data, args.world_size)
                            losses_m.update(reduced_loss.item(), input.size(0))
                        if args.rank == 0:
                            _logger.info("Train: {} [{}/{}] Loss: {:.4f}".format(epoch, batch_idx, len(loader), losses_m.avg))
                return OrderedDict([("loss", losses_m.avg)])


            def validate(model, loader, loss_fn, args):
                top1_m = AverageMeter("acc1")
                model.eval()
                with torch.no_grad():
                    for batch_idx, (input, target) in enumerate(loader):
                        output = model(input.cuda())
                        acc1, = accuracy(output, target.cuda(), topk=(1,))
                        if args.distributed:
                            acc1 = reduce_tensor(acc1, args.world_size)
                        top1_m.update(acc1.item(), output.size(0))
                return OrderedDict([("top1", top1_m.avg)])


            def main():
                args = parser.parse_args()
                args.distributed = "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1
                args.world_size = 1
                args.rank = 0
                if args.distributed:
                    args.local_rank = int(os.environ.get("LOCAL_RANK", 0))
                    torch.cuda.set_device(args.local_rank)
                    dist.init_process_group(backend="nccl", init_method="env://")
                    args.world_size = dist.get_world_size()
                    args.rank = dist.get_rank()
                model = ConvNet0()
                model.cuda()
                if args.distributed and args.sync_bn:
                    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
                optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
                model_ema = ModelEma(model, decay=args.model_ema_decay) if args.model_ema else None
                if args.distributed:
                    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.local_rank])
                dataset_train = SampleDataset0(args.data, "train")
                dataset_eval = SampleDataset0(args.data, "val")
                sampler = torch.utils.data.distributed.DistributedSampler(dataset_train) if args.distributed else None
                loader_train = DataLoader(dataset_train, batch_size=args.batch_size, shuffle=sampler is None, sampler=sampler,
                                          num_workers=args.workers, pin_memory=True, drop_last=True)
                loader_eval = DataLoader(dataset_eval, batch_size=args.batch_size, num_workers=args.workers)
                saver = None
                if args.rank == 0:
                    os.makedirs(args.output_dir, exist_ok=True)
                    saver = CheckpointSaver(model, optimizer, args=args, checkpoint_dir=args.output_dir, max_history=args.checkpoint_hist)
                loss_fn = nn.CrossEntropyLoss().cuda()
                for epoch in range(args.epochs):
                    if args.distributed and hasattr(loader_train.sampler, "set_epoch"):
                        loader_train.sampler.set_epoch(epoch)
                    train_metrics = train_one_epoch(epoch, model, loader_train, optimizer, loss_fn, args, model_ema=model_ema)
                    if args.distributed and args.dist_bn in ("broadcast", "reduce"):
                        distribute_bn(model, args.world_size, args.dist_bn == "reduce")
                    eval_metrics = validate(model, loader_eval, loss_fn, args)
                    if saver is not None:
                        saver.save_checkpoint(epoch, metric=eval_metrics["top1"])
                if args.distributed:
                    dist.destroy_process_group()


            if __name__ == "__main__":
                main()
            '''
        )
        return "\n\n".join([self.license() + extra, args, self.body(self.n(2, 4), self.n(2, 5), 1), main])

    def style_yolo(self, k: int) -> str:
        """A detector trainer: RANK/LOCAL_RANK from the environment, zero_first, callbacks."""
        extra = self.imports("import torch.distributed as dist\nfrom contextlib import contextmanager\nfrom copy import deepcopy\nfrom pathlib import Path\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n")
        main = _d(
            '''
            LOCAL_RANK = int(os.getenv("LOCAL_RANK", -1))
            RANK = int(os.getenv("RANK", -1))
            WORLD_SIZE = int(os.getenv("WORLD_SIZE", 1))
            LOGGER = logging.getLogger("detector")


            @contextmanager
            def torch_distributed_zero_first(local_rank: int):
                # Decorator to make all processes in distributed training wait for each local_master to do something
                if local_rank not in [-1, 0]:
                    dist.barrier(device_ids=[local_rank])
                yield
                if local_rank == 0:
                    dist.barrier(device_ids=[0])


            def is_parallel(model):
                return type(model) in (nn.parallel.DataParallel, nn.parallel.DistributedDataParallel)


            def de_parallel(model):
                return model.module if is_parallel(model) else model


            class EarlyStopping:
                def __init__(self, patience=30):
                    self.best_fitness = 0.0
                    self.best_epoch = 0
                    self.patience = patience or float("inf")

                def __call__(self, epoch, fitness):
                    if fitness >= self.best_fitness:
                        self.best_epoch = epoch
                        self.best_fitness = fitness
                    stop = (epoch - self.best_epoch) >= self.patience
                    if stop:
                        LOGGER.info(f"Stopping training early as no improvement observed in last {self.patience} epochs.")
                    return stop


            class Callbacks:
                def __init__(self):
                    self._callbacks = {"on_train_start": [], "on_train_epoch_end": [], "on_fit_epoch_end": [], "on_train_end": []}

                def register_action(self, hook, name="", callback=None):
                    self._callbacks[hook].append({"name": name, "callback": callback})

                def run(self, hook, *args, **kwargs):
                    for logger in self._callbacks[hook]:
                        logger["callback"](*args, **kwargs)


            def smart_optimizer(model, name="Adam", lr=0.001, momentum=0.9, decay=1e-5):
                g = [], [], []
                bn = tuple(v for k, v in nn.__dict__.items() if "Norm" in k)
                for v in model.modules():
                    for p_name, p in v.named_parameters(recurse=False):
                        if p_name == "bias":
                            g[2].append(p)
                        elif p_name == "weight" and isinstance(v, bn):
                            g[1].append(p)
                        else:
                            g[0].append(p)
                if name == "Adam":
                    optimizer = torch.optim.Adam(g[2], lr=lr, betas=(momentum, 0.999))
                else:
                    optimizer = torch.optim.SGD(g[2], lr=lr, momentum=momentum, nesterov=True)
                optimizer.add_param_group({"params": g[0], "weight_decay": decay})
                optimizer.add_param_group({"params": g[1], "weight_decay": 0.0})
                return optimizer


            def fitness(x):
                w = [0.0, 0.0, 0.1, 0.9]
                return (x[:, :4] * w).sum(1)


            def train(hyp, opt, device, callbacks):
                save_dir, epochs, batch_size = Path(opt.output_dir), opt.epochs, opt.batch_size
                w = save_dir / "weights"
                w.mkdir(parents=True, exist_ok=True)
                last, best = w / "last.pt", w / "best.pt"
                cuda = device.type != "cpu"
                with torch_distributed_zero_first(LOCAL_RANK):
                    data_dict = {"train": opt.data, "val": opt.data, "nc": 80}
                model = ConvNet0(num_classes=data_dict["nc"]).to(device)
                optimizer = smart_optimizer(model, "SGD", opt.lr, opt.momentum, opt.weight_decay)
                if cuda and RANK == -1 and torch.cuda.device_count() > 1:
                    LOGGER.warning("WARNING: DP not recommended, use torch.distributed.run for best DDP Multi-GPU results.")
                    model = torch.nn.DataParallel(model)
                if opt.sync_bn and cuda and RANK != -1:
                    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model).to(device)
                dataset = SampleDataset0(data_dict["train"], "train")
                sampler = None if RANK == -1 else torch.utils.data.distributed.DistributedSampler(dataset, shuffle=True)
                train_loader = DataLoader(dataset, batch_size=batch_size // WORLD_SIZE, shuffle=sampler is None,
                                          num_workers=opt.workers, sampler=sampler, pin_memory=True)
                if cuda and RANK != -1:
                    model = DDP(model, device_ids=[LOCAL_RANK], output_device=LOCAL_RANK)
                stopper, stop = EarlyStopping(patience=opt.patience), False
                best_fitness = 0.0
                callbacks.run("on_train_start")
                for epoch in range(epochs):
                    model.train()
                    if RANK != -1:
                        train_loader.sampler.set_epoch(epoch)
                    mloss = torch.zeros(3, device=device)
                    for i, (imgs, targets) in enumerate(train_loader):
                        imgs = imgs.to(device, non_blocking=True).float() / 255
                        pred = model(imgs)
                        loss = F.cross_entropy(pred, targets.to(device))
                        if RANK != -1:
                            loss *= WORLD_SIZE
                        loss.backward()
                        optimizer.step()
                        optimizer.zero_grad()
                        if RANK in {-1, 0}:
                            mloss = (mloss * i + loss.detach()) / (i + 1)
                    callbacks.run("on_train_epoch_end", epoch=epoch)
                    if RANK in {-1, 0}:
                        fi = float(mloss.sum())
                        if fi > best_fitness:
                            best_fitness = fi
                        ckpt = {"epoch": epoch, "best_fitness": best_fitness, "model": deepcopy(de_parallel(model)).half(),
                                "optimizer": optimizer.state_dict(), "opt": vars(opt)}
                        torch.save(ckpt, last)
                        if best_fitness == fi:
                            torch.save(ckpt, best)
                        del ckpt
                        stop = stopper(epoch=epoch, fitness=fi)
                    if RANK != -1:
                        broadcast_list = [stop if RANK == 0 else None]
                        dist.broadcast_object_list(broadcast_list, 0)
                        if RANK != 0:
                            stop = broadcast_list[0]
                    if stop:
                        break
                callbacks.run("on_train_end", last, best, epoch)
                torch.cuda.empty_cache()
                return best_fitness


            def main(opt, callbacks=Callbacks()):
                device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
                if LOCAL_RANK != -1:
                    assert torch.cuda.device_count() > LOCAL_RANK, "insufficient CUDA devices for DDP command"
                    torch.cuda.set_device(LOCAL_RANK)
                    device = torch.device("cuda", LOCAL_RANK)
                    dist.init_process_group(backend="nccl" if dist.is_nccl_available() else "gloo")
                train({}, opt, device, callbacks)
                if WORLD_SIZE > 1 and RANK == 0:
                    LOGGER.info("Destroying process group... ")
                    dist.destroy_process_group()


            if __name__ == "__main__":
                opt = parser.parse_args()
                main(opt)
            '''
        )
        args = self.args_block(['parser.add_argument("--sync-bn", action="store_true")', 'parser.add_argument("--patience", type=int, default=100)'])
        return "\n\n".join([self.license() + extra, args, self.body(self.n(2, 5), self.n(2, 5), 1), main])

    def style_flat(self, k: int) -> str:
        """The CIFAR script: everything at module level, DataParallel when several GPUs."""
        extra = self.imports("import torch.backends.cudnn as cudnn\n")
        main = _d(
            f'''
            args = parser.parse_args()
            device = "cuda" if torch.cuda.is_available() else "cpu"
            best_acc = 0
            start_epoch = 0

            print("==> Preparing data..")
            trainset = SampleDataset0(args.data, "train")
            trainloader = DataLoader(trainset, batch_size={self.pick(128, 256)}, shuffle=True, num_workers=2)
            testset = SampleDataset0(args.data, "test")
            testloader = DataLoader(testset, batch_size=100, shuffle=False, num_workers=2)

            print("==> Building model..")
            net = ConvNet0()
            net = net.to(device)
            if device == "cuda":
                net = torch.nn.DataParallel(net)
                cudnn.benchmark = True

            if args.resume:
                print("==> Resuming from checkpoint..")
                assert os.path.isdir("checkpoint"), "Error: no checkpoint directory found!"
                checkpoint = torch.load("./checkpoint/ckpt.pth")
                net.load_state_dict(checkpoint["net"])
                best_acc = checkpoint["acc"]
                start_epoch = checkpoint["epoch"]

            criterion = nn.CrossEntropyLoss()
            optimizer = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
            scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=200)


            def train(epoch):
                print("\\nEpoch: %d" % epoch)
                net.train()
                train_loss = 0
                correct = 0
                total = 0
                for batch_idx, (inputs, targets) in enumerate(trainloader):
                    inputs, targets = inputs.to(device), targets.to(device)
                    optimizer.zero_grad()
                    outputs = net(inputs)
                    loss = criterion(outputs, targets)
                    loss.backward()
                    optimizer.step()
                    train_loss += loss.item()
                    _, predicted = outputs.max(1)
                    total += targets.size(0)
                    correct += predicted.eq(targets).sum().item()


            def test(epoch):
                global best_acc
                net.eval()
                correct = 0
                total = 0
                with torch.no_grad():
                    for batch_idx, (inputs, targets) in enumerate(testloader):
                        inputs, targets = inputs.to(device), targets.to(device)
                        outputs = net(inputs)
                        _, predicted = outputs.max(1)
                        total += targets.size(0)
                        correct += predicted.eq(targets).sum().item()
                acc = 100.0 * correct / total
                if acc > best_acc:
                    print("Saving..")
                    state = {{"net": net.state_dict(), "acc": acc, "epoch": epoch}}
                    if not os.path.isdir("checkpoint"):
                        os.mkdir("checkpoint")
                    torch.save(state, "./checkpoint/ckpt.pth")
                    best_acc = acc


            for epoch in range(start_epoch, start_epoch + {self.n(100, 300)}):
                train(epoch)
                test(epoch)
                scheduler.step()
            '''
        )
        return "\n\n".join([self.license() + extra, self.args_block([]), self.body(self.n(2, 5), self.n(3, 6), 1), main])


STYLES = ("style_examples", "style_hf", "style_timm", "style_yolo", "style_flat")


def corpus(lines: int = 45000, seed: int = 0) -> Dict[str, str]:
    """``{relative path: source}``: training scripts of varied styles, ``lines`` lines at least."""
    rng = random.Random(seed)
    out: Dict[str, str] = {}
    total = 0
    k = 0
    while total < lines:
        style = STYLES[k % len(STYLES)]
        src = getattr(_Gen(rng), style)(k)
        name = f"{style[6:]}/{style[6:]}_{k:04d}.py"
        out[name] = src
        total += src.count("\n")
        k += 1
    return out


def write_corpus(directory: str, lines: int = 45000, seed: int = 0) -> int:
    """Write :func:`corpus` under ``directory``; the number of lines written."""
    n = 0
    for rel, src in corpus(lines, seed).items():
        path = os.path.join(directory, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            fh.write(src)
        n += src.count("\n")
    return n


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--corpus":
        lines = int(sys.argv[sys.argv.index("--lines") + 1]) if "--lines" in sys.argv else 45000
        print(f"{write_corpus(sys.argv[2], lines)} lines written under {sys.argv[2]}")
    else:
        sys.stdout.write(generate(int(sys.argv[1]) if len(sys.argv) > 1 else 1000))
