"""dp2ddp: move PyTorch training scripts from DataParallel to DistributedDataParallel."""

__version__ = "0.1.0"
