"""`dp2ddp verify`: run a DataParallel script and its DDP migration side by side."""
