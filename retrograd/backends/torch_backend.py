"""The PyTorch backend: tensors on a CPU or a CUDA device.

Kernels use ``array_api_compat.torch`` (torch itself lacks ``isdtype``,
``astype`` and the standard's spellings); on a CUDA device its creation
functions are bound to that device (``DeviceNamespace``). What the standard
lacks: scatter-add is ``index_add_``, a buffer is the tensor's untyped storage
(views share it), transfers are ``torch.from_numpy(...).to(device)`` and
``.cpu().numpy()``.

Programs run under ``torch.inference_mode()`` (retrograd computes gradients
itself), so the tensors a run creates, fetched with ``return_numpy=False`` or
read from the scope, are inference tensors: to use one with torch's autograd or
to change it in place outside a run, ``.clone()`` it first.
"""
from __future__ import annotations

import numpy as np

from ..errors import BackendError
from .base import Backend, Namespace, dtype_name


def is_array(array) -> bool:
    return type(array).__module__.startswith("torch") and hasattr(array, "untyped_storage")


def array_to_numpy(array) -> np.ndarray:
    return array.detach().cpu().numpy()


def _import_torch():
    try:
        import torch
        import array_api_compat.torch as compat
    except ImportError as exc:
        raise BackendError(f'backend "torch" needs PyTorch: pip install "retrograd[torch]" ({exc})') from None
    return torch, compat


class TorchBackend(Backend):
    name = "torch"

    def __init__(self, device: str | None = None):
        torch, compat = _import_torch()
        self.torch = torch
        try:
            dev = torch.device(device or "cpu")
        except (RuntimeError, TypeError) as exc:
            raise BackendError(f'backend "torch" has no device {device!r}: use "cpu", "cuda" or '
                               f'"cuda:N" ({exc})') from None
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise BackendError(f'backend "torch" cannot use device {device!r}: this PyTorch '
                                   f'({torch.__version__}) sees no CUDA GPU (a GPU and a CUDA build '
                                   'of PyTorch are needed; device="cpu" runs anywhere)')
            index = dev.index if dev.index is not None else torch.cuda.current_device()
            if index >= torch.cuda.device_count():
                raise BackendError(f'backend "torch" has no device {device!r}: '
                                   f'{torch.cuda.device_count()} CUDA device(s) visible')
            dev = torch.device("cuda", index)
        elif dev.type != "cpu":
            raise BackendError(f'backend "torch" does not support device {device!r}: use "cpu", '
                               '"cuda" or "cuda:N"')
        self.torch_device = dev
        xp = Namespace(compat, None if dev.type == "cpu" else dev, matmul=torch.matmul)
        super().__init__(xp, str(dev))

    @property
    def has_graphs(self) -> bool:
        return self.torch_device.type == "cuda"

    def owns(self, array) -> bool:
        return isinstance(array, self.torch.Tensor)

    def device_of(self, array) -> str:
        return str(array.device)

    def from_numpy(self, array: np.ndarray):
        array = np.asarray(array)
        if not array.flags.writeable or not array.flags.c_contiguous:
            array = np.array(array, order="C")   # torch wants writable memory it may share
        return self.torch.from_numpy(array).to(self.torch_device)

    def to_numpy(self, array) -> np.ndarray:
        return array.detach().cpu().numpy()

    def dtype_of(self, name) -> object:
        return getattr(self.torch, dtype_name(name))

    def scatter_add_rows(self, shape, dtype: str, ids, rows):
        out = self.torch.zeros(tuple(shape), dtype=self.dtype_of(dtype), device=self.torch_device)
        ids = ids.reshape(-1)
        rows = rows.reshape((ids.shape[0],) + tuple(shape[1:]))
        return out.index_add_(0, ids, rows)

    def erf(self, x):
        return self.torch.special.erf(x)

    def gelu(self, x, approximate: str = "none"):
        return self.torch.nn.functional.gelu(x, approximate=approximate)

    def gelu_grad(self, x, dy, approximate: str = "none"):
        return self.torch.ops.aten.gelu_backward(dy, x, approximate=approximate)

    def silu(self, x):
        return self.torch.nn.functional.silu(x)

    def softplus(self, x, threshold: float):
        return self.torch.nn.functional.softplus(x, beta=1.0, threshold=threshold)

    def elu(self, x, alpha: float):
        return self.torch.nn.functional.elu(x, alpha=alpha)

    def leaky_relu(self, x, negative_slope: float):
        return self.torch.nn.functional.leaky_relu(x, negative_slope=negative_slope)

    def logsumexp(self, x, axes: tuple, keepdims: bool):
        return self.torch.logsumexp(x, dim=axes, keepdim=keepdims)

    def sort_descending(self, x, axis: int):
        return self.torch.sort(x, dim=axis, descending=True, stable=True).indices

    def take_along_axis(self, x, indices, axis: int):
        return self.torch.take_along_dim(x, indices, dim=axis)

    def put_along_axis(self, shape, indices, values, axis: int):
        out = self.torch.zeros(tuple(shape), dtype=values.dtype, device=values.device)
        return out.scatter_(axis, indices, values)

    def buffer_of(self, array) -> tuple[int, int]:
        storage = array.untyped_storage()
        return storage.data_ptr(), storage.nbytes()

    def on_device(self):
        # retrograd differentiates programs itself: torch's autograd bookkeeping (version
        # counters, autograd dispatch) is pure cost here, ~15% of a small LSTM step.
        return self.torch.inference_mode()

    def capture_graph(self, work):
        """A CUDA graph of ``work()``'s launches (``torch.cuda.CUDAGraph``, with ``.replay()``);
        its arrays live in the graph's private memory pool."""
        if self.torch_device.type != "cuda":
            raise BackendError('device graphs need a CUDA device (backend "torch", device "cuda")')
        graph = self.torch.cuda.CUDAGraph()
        with self.torch.cuda.device(self.torch_device), self.torch.cuda.graph(graph):
            work()
        return graph

    def device_memory(self) -> int | None:
        if self.torch_device.type != "cuda":
            return None
        return int(self.torch.cuda.memory_allocated(self.torch_device))
