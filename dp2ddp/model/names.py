"""Qualified names the model and its readers look for (every public spelling of each)."""

from __future__ import annotations

import re

from typing import FrozenSet, Iterable


def _names(*names: str) -> FrozenSet[str]:
    return frozenset(names)


def _under(modules: Iterable[str], *attrs: str) -> FrozenSet[str]:
    return frozenset(f"{m}.{a}" for m in modules for a in attrs)


DP = _names(
    "torch.nn.DataParallel",
    "torch.nn.parallel.DataParallel",
    "torch.nn.parallel.data_parallel.DataParallel",
)
DP_FUNCTIONAL = _names(
    "torch.nn.parallel.data_parallel",
    "torch.nn.parallel.data_parallel.data_parallel",
)
DDP = _names(
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
)
APEX_DDP = _names("apex.parallel.DistributedDataParallel", "apex.parallel.distributed.DistributedDataParallel")
DATALOADER = _names("torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader")
DISTRIBUTED_SAMPLER = _names(
    "torch.utils.data.DistributedSampler", "torch.utils.data.distributed.DistributedSampler"
)
RANDOM_SAMPLER = _names("torch.utils.data.RandomSampler", "torch.utils.data.sampler.RandomSampler")
SEQUENTIAL_SAMPLER = _names("torch.utils.data.SequentialSampler", "torch.utils.data.sampler.SequentialSampler")
ITERABLE_DATASET = _names("torch.utils.data.IterableDataset", "torch.utils.data.dataset.IterableDataset")
TENSOR_DATASET = _names("torch.utils.data.TensorDataset", "torch.utils.data.dataset.TensorDataset")
MODULE_BASES = _names("torch.nn.Module", "torch.nn.modules.module.Module")

_DIST = ("torch.distributed", "torch.distributed.distributed_c10d")
INIT = _under(_DIST, "init_process_group")
DESTROY = _under(_DIST, "destroy_process_group")
GET_RANK = _under(_DIST, "get_rank")
GET_WORLD_SIZE = _under(_DIST, "get_world_size")
IS_INITIALIZED = _under(_DIST, "is_initialized")
BARRIER = _under(_DIST, "barrier", "monitored_barrier")
COLLECTIVES = _under(
    _DIST,
    "all_reduce",
    "reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "broadcast_object_list",
    "barrier",
    "monitored_barrier",
    "new_group",
)
SPAWN = _names(
    "torch.multiprocessing.spawn",
    "torch.multiprocessing.spawn.spawn",
    "torch.multiprocessing.start_processes",
)
LAUNCH_MODULES = _names("torch.distributed.launch", "torch.distributed.run")
SYNC_BATCHNORM = _names("torch.nn.SyncBatchNorm", "torch.nn.modules.batchnorm.SyncBatchNorm")

SAVE = _names("torch.save", "torch.serialization.save")
LOAD = _names("torch.load", "torch.serialization.load")
PRINT = _names("builtins.print")
OPEN = _names("builtins.open", "io.open")

SUMMARY_WRITERS = _names(
    "torch.utils.tensorboard.SummaryWriter",
    "torch.utils.tensorboard.writer.SummaryWriter",
    "tensorboardX.SummaryWriter",
    "tensorboardX.writer.SummaryWriter",
    # tensorboard_logger's Logger(logdir): an event file, written through logger.log_value(...)
    "tensorboard_logger.Logger",
    "tensorboard_logger.tensorboard_logger.Logger",
)
TQDM = _names(
    "tqdm.tqdm",
    "tqdm.trange",
    "tqdm.auto.tqdm",
    "tqdm.auto.trange",
    "tqdm.notebook.tqdm",
    "tqdm.notebook.trange",
    "tqdm.std.tqdm",
    "tqdm.std.trange",
    "tqdm.autonotebook.tqdm",
)
WANDB_INIT = _names("wandb.init")
LOGGING_FILE = _names("logging.FileHandler", "logging.handlers.RotatingFileHandler", "logging.handlers.TimedRotatingFileHandler")
LOGGING_BASIC = _names("logging.basicConfig")
MKDIR = _names("os.mkdir", "os.makedirs")
COPY = _names("shutil.copyfile", "shutil.copy", "shutil.copy2", "shutil.copytree", "shutil.move", "os.rename", "os.replace")
# writes whose target is their first argument, as a file name
FILE_WRITES = _names(
    "numpy.save",
    "numpy.savez",
    "numpy.savez_compressed",
    "numpy.savetxt",
    "matplotlib.pyplot.savefig",
    "matplotlib.pyplot.imsave",
    "matplotlib.image.imsave",
    "skimage.io.imsave",
    "scipy.misc.imsave",
    "torchvision.utils.save_image",
    "cv2.imwrite",
    "imageio.imwrite",
    "imageio.imsave",
    "scipy.io.savemat",
)
# writes into an open file object (their second argument)
DUMPS = _names("json.dump", "pickle.dump", "yaml.dump", "yaml.safe_dump", "numpy.save", "torch.save")

CUDA_SET_DEVICE = _names("torch.cuda.set_device")
CUDA_AVAILABLE = _names("torch.cuda.is_available")
DEVICE_COUNT = _names("torch.cuda.device_count")


# (added for the lint rules)
CUDA_DEVICE_SELECT = _names("torch.cuda.set_device", "torch.cuda.device")
BATCHNORM = _under(("torch.nn", "torch.nn.modules", "torch.nn.modules.batchnorm"), "BatchNorm1d", "BatchNorm2d", "BatchNorm3d")
SYNC_BATCHNORM_ANY = _names(
    "torch.nn.SyncBatchNorm", "torch.nn.modules.SyncBatchNorm", "torch.nn.modules.batchnorm.SyncBatchNorm"
)
CONVERT_SYNC_BATCHNORM = frozenset(f"{s}.convert_sync_batchnorm" for s in SYNC_BATCHNORM_ANY)


# the byte-level gate for DataParallel: every spelling of DataParallel (class or functional)
# contains one of these identifiers; ``DistributedDataParallel`` alone does not count, so a
# migrated file is not analysed again. One home: migrate, project and template read it.
DP_BYTES = re.compile(rb"(?<!Distributed)DataParallel|data_parallel")


def may_use_dp(data: bytes) -> bool:
    return DP_BYTES.search(data) is not None
# (added for training steps: dp2ddp/model/steps.py, dp2ddp/model/batches.py)
AUTOGRAD_BACKWARD = _names("torch.autograd.backward")
GRAD_CLIPS = _under(
    ("torch.nn.utils", "torch.nn.utils.clip_grad"), "clip_grad_norm_", "clip_grad_norm", "clip_grad_value_"
)
# optimizers outside torch.optim.<Class> (which steps.py recognises by its shape)
OPTIMIZERS = _names(
    "transformers.AdamW", "transformers.optimization.AdamW", "transformers.Adafactor",
    "transformers.optimization.Adafactor", "pytorch_transformers.AdamW", "pytorch_pretrained_bert.BertAdam",
    "pytorch_pretrained_bert.optimization.BertAdam", "apex.optimizers.FusedAdam", "apex.optimizers.FusedLAMB",
)
SCHEDULER_MODULES = ("torch.optim.lr_scheduler",)
SCHEDULER_FACTORIES = _under(
    ("transformers", "transformers.optimization"),
    "get_linear_schedule_with_warmup", "get_cosine_schedule_with_warmup", "get_constant_schedule_with_warmup",
    "get_polynomial_decay_schedule_with_warmup", "get_cosine_with_hard_restarts_schedule_with_warmup",
    "get_constant_schedule", "get_scheduler",
) | _names("pytorch_transformers.WarmupLinearSchedule", "pytorch_transformers.optimization.WarmupLinearSchedule")
GRAD_SCALERS = _names("torch.cuda.amp.GradScaler", "torch.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler")
NULLCONTEXT = _names("contextlib.nullcontext")
