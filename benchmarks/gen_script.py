"""Generate a large, realistic DataParallel training script for benchmarks."""

from __future__ import annotations

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


if __name__ == "__main__":
    import sys

    sys.stdout.write(generate(int(sys.argv[1]) if len(sys.argv) > 1 else 1000))
