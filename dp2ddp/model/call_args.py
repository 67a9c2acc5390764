"""Arguments of calls to library functions, read by the callee's signature.

``torch.save(model.state_dict(), path)`` and ``torch.save(obj=model.state_dict(),
f=path)`` pass the same ``f``: :func:`argument` reads a parameter by its place or by its
keyword, as Python binds it, so every reader of a call asks for a parameter by name
instead of indexing ``call.args``. The signatures are the library's positional-or-keyword
parameters in order (keyword-only ones are found by :func:`dp2ddp.model.syntax.kwarg`).
The script's own functions have their ``def``: ``SemanticModel.argument_for``.
"""

from __future__ import annotations

import ast
from typing import Optional, Sequence

from dp2ddp.model.syntax import kwarg

# torch.save(obj, f, pickle_module, pickle_protocol, ...)
SAVE_PARAMS = ("obj", "f", "pickle_module", "pickle_protocol")
# torch.load(f, map_location, pickle_module, *, weights_only, ...)
LOAD_PARAMS = ("f", "map_location", "pickle_module")
# nn.Module.load_state_dict(state_dict, strict, assign)
LOAD_STATE_DICT_PARAMS = ("state_dict", "strict", "assign")
# torch.multiprocessing.spawn(fn, args, nprocs, join, daemon, start_method)
SPAWN_PARAMS = ("fn", "args", "nprocs", "join", "daemon", "start_method")
# nn.DataParallel(module, device_ids, output_device, dim)
DATA_PARALLEL_PARAMS = ("module", "device_ids", "output_device", "dim")
# nn.parallel.data_parallel(module, inputs, device_ids, output_device, dim, module_kwargs)
DATA_PARALLEL_FUNCTIONAL_PARAMS = ("module", "inputs", "device_ids", "output_device", "dim", "module_kwargs")
# DistributedDataParallel(module, device_ids, output_device, dim, ...)
DDP_PARAMS = ("module", "device_ids", "output_device", "dim")
# DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, ...)
DATALOADER_PARAMS = ("dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "num_workers", "collate_fn",
                     "pin_memory", "drop_last", "timeout", "worker_init_fn", "multiprocessing_context", "generator")
# SummaryWriter(log_dir, comment, purge_step, max_queue, flush_secs, filename_suffix)
SUMMARY_WRITER_PARAMS = ("log_dir", "comment", "purge_step", "max_queue", "flush_secs", "filename_suffix")
# DataFrame.to_csv(path_or_buf, sep, ...)
TO_CSV_PARAMS = ("path_or_buf", "sep")
# shutil.copyfile/copy/copy2/copytree/move(src, dst, ...)
COPY_PARAMS = ("src", "dst")
# open(file, mode, ...), io.open
OPEN_PARAMS = ("file", "mode", "buffering", "encoding", "errors", "newline", "closefd", "opener")
# numpy.load(file, mmap_mode, allow_pickle, ...)
NUMPY_LOAD_PARAMS = ("file", "mmap_mode", "allow_pickle")
# pandas.read_csv(filepath_or_buffer, sep, ...)
READ_CSV_PARAMS = ("filepath_or_buffer", "sep")
# json.load(fp, ...), pickle.load(file, ...), yaml.load(stream, Loader)
STREAM_PARAMS = {"json.load": ("fp",), "pickle.load": ("file",), "yaml.load": ("stream", "Loader"), "yaml.safe_load": ("stream",)}
# PreTrainedModel.from_pretrained(pretrained_model_name_or_path, ...)
FROM_PRETRAINED_PARAMS = ("pretrained_model_name_or_path",)
# torch.set_grad_enabled(mode)
SET_GRAD_ENABLED_PARAMS = ("mode",)
# Tensor.requires_grad_(requires_grad=True), Module.requires_grad_(requires_grad=True)
REQUIRES_GRAD_PARAMS = ("requires_grad",)
# torch.autograd.grad(outputs, inputs, grad_outputs, retain_graph, create_graph, ...)
AUTOGRAD_GRAD_PARAMS = ("outputs", "inputs", "grad_outputs", "retain_graph", "create_graph")
# torch.autograd.backward(tensors, grad_tensors, retain_graph, create_graph, grad_variables, inputs)
AUTOGRAD_BACKWARD_PARAMS = ("tensors", "grad_tensors", "retain_graph", "create_graph")
# Tensor.backward(gradient, retain_graph, create_graph, inputs)
TENSOR_BACKWARD_PARAMS = ("gradient", "retain_graph", "create_graph", "inputs")


def argument(call: ast.Call, params: Sequence[str], name: str) -> Optional[ast.AST]:
    """The expression ``call`` passes for parameter ``name`` of a callee whose positional
    parameters are ``params``: the positional argument at its place (where no ``*xs``
    stands at or before it), else the keyword ``name=``; ``None`` where the call passes
    neither (the parameter's default, or hidden in ``*xs``/``**kw``)."""
    i = params.index(name)
    if i < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args[: i + 1]):
        return call.args[i]
    k = kwarg(call, name)
    return k.value if k is not None else None
