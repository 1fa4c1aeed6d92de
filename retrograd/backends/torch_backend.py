"""The PyTorch backend: tensors on a CPU or a CUDA device.

Kernels use ``array_api_compat.torch`` (torch itself lacks ``isdtype``,
``astype`` and the standard's spellings); on a CUDA device its creation
functions are bound to that device (``DeviceNamespace``). What the standard
lacks: scatter-add is ``index_add_``, a buffer is the tensor's untyped storage
(views share it), transfers are ``torch.from_numpy(...).to(device)`` and
``.cpu().numpy()``. Convolution and pooling run torch's own routines forward
(``torch.nn.functional.conv*d``, ``max_pool2d``, ``avg_pool2d``) and ATen's
explicit backward ops for their gradient ops (``convolution_backward``,
``max_pool2d_with_indices_backward``, ``avg_pool2d_backward``): never torch's
autograd.

Programs run under ``torch.inference_mode()`` (retrograd computes gradients
itself), so the tensors a run creates, fetched with ``return_numpy=False`` or
read from the scope, are inference tensors: to use one with torch's autograd or
to change it in place outside a run, ``.clone()`` it first.
"""
from __future__ import annotations

import numpy as np

from ..errors import BackendError
from ..ir.dtypes import numpy_dtype
from . import torch_attention
from . import torch_cudnn_rnn
from . import torch_fused_rnn
from .base import Backend, Namespace, dtype_name
from .windows import crop, pad_spatial, padded_shape


def is_array(array) -> bool:
    return type(array).__module__.startswith("torch") and hasattr(array, "untyped_storage")


def array_to_numpy(array) -> np.ndarray:
    array = array.detach().cpu()
    if dtype_name(array.dtype) == "bfloat16":     # NumPy's bfloat16 is ml_dtypes': the same bits
        import torch
        return array.view(torch.int16).numpy().view(numpy_dtype("bfloat16"))
    return array.numpy()


_ONEDNN_LSTM: dict[str, bool] = {}
_CUDNN_LSTM: dict[str, bool] = {}


def _has_onednn_lstm(torch) -> bool:
    """Whether this torch runs oneDNN's LSTM through explicit ops (checked and logged once)."""
    if "ok" not in _ONEDNN_LSTM:
        _ONEDNN_LSTM["ok"] = torch_fused_rnn.available(torch)
    return _ONEDNN_LSTM["ok"]


def _has_cudnn_lstm(torch) -> bool:
    """Whether this torch runs cuDNN's LSTM through explicit ops (checked and logged once, on the
    first torch backend with a CUDA device)."""
    if "ok" not in _CUDNN_LSTM:
        _CUDNN_LSTM["ok"] = torch_cudnn_rnn.available(torch)
    return _CUDNN_LSTM["ok"]


def _fused_adam_ops(torch):
    """ATen's multi-tensor Adam and AdamW (in place), or None where this torch lacks them."""
    aten = torch.ops.aten
    if not (hasattr(aten, "_fused_adam_") and hasattr(aten, "_fused_adamw_")):
        return None
    return aten._fused_adam_.default, aten._fused_adamw_.default


def _import_torch():
    try:
        import torch
        import array_api_compat.torch as compat
    except ImportError as exc:
        raise BackendError(f'backend "torch" needs PyTorch: pip install "retrograd[torch]" ({exc})') from None
    return torch, compat


class TorchBackend(Backend):
    name = "torch"
    # Adam for all parameters in one op (multi_adam); fc's product and bias add as one addmm; a
    # convolution and its bias add as one oneDNN convolution
    program_passes = ("fuse_optimizer_updates", "fuse_linear_bias", "fuse_conv_bias")

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
        self.flash_attention = torch_attention.flash_ops(torch)   # None: this torch lacks them
        self.onednn_lstm = torch_fused_rnn.OneDNNLSTM(torch) if _has_onednn_lstm(torch) else None
        on_cuda = dev.type == "cuda"
        self.cudnn_lstm = torch_cudnn_rnn.CuDNNLSTM(torch) if on_cuda and _has_cudnn_lstm(torch) else None
        self.cudnn_gru = torch_cudnn_rnn.CuDNNGRU(torch) if on_cuda and _has_cudnn_lstm(torch) else None
        self.fused_adam = _fused_adam_ops(torch) if dev.type == "cpu" else None   # (Adam, AdamW) or None

    # -- threads (runtime/threads.py) ------------------------------------------------------
    def thread_pools(self) -> tuple:
        """torch's intra-op pool (``torch.get_num_threads`` / ``set_num_threads``)."""
        return (self.torch,)

    def fix_threads(self, threads: int) -> None:
        """torch's inter-op pool, which takes its size once per process (``runtime/threads.py``)."""
        fix_torch_interop_threads(self.torch, threads)

    # -- fused kernels (LSTMSequence): None where this backend has none for the arrays given ----
    def vendor_lstm(self, x):
        """The vendor LSTM for ``x``: oneDNN (CPU float32), cuDNN (CUDA), or None (general kernels)."""
        for fused in (self.cudnn_lstm, self.onednn_lstm):
            if fused is not None and fused.applies(x):
                return fused
        return None

    @property
    def fused_lstm_dtypes(self) -> tuple[str, ...]:
        """float32 on the CPU (oneDNN, when this torch has its explicit ops); float32 and float64 on
        CUDA (cuDNN; its general kernels where this torch lacks cuDNN's ops)."""
        if self.torch_device.type == "cuda":
            return ("float32", "float64") if self.cudnn_lstm is not None else ("float32",)
        return ("float32",) if self.onednn_lstm is not None else ()

    @property
    def fused_gru_dtypes(self) -> tuple[str, ...]:
        """float32 and float64 on CUDA when this torch has cuDNN's ops; none on the CPU (no vendor GRU
        there: GRUSequence's general kernel is slower than torch.nn.GRU, the recurrence stays)."""
        return ("float32", "float64") if self.cudnn_gru is not None else ()

    def fused_lstm_forward(self, x, w_ih, w_hh, b, h0, c0, forget_bias: float, reverse: bool):
        fused = self.vendor_lstm(x)
        return None if fused is None else fused.forward(x, w_ih, w_hh, b, h0, c0, forget_bias, reverse)

    def fused_lstm_backward(self, x, *rest):
        fused = self.vendor_lstm(x)
        return None if fused is None else fused.backward(x, *rest)

    # GRUSequence: cuDNN on CUDA (no oneDNN GRU is reachable on CPU)
    def fused_gru_forward(self, x, *rest):
        fused = self.cudnn_gru
        return fused.forward(x, *rest) if fused is not None and fused.applies(x) else None

    def fused_gru_backward(self, x, *rest):
        fused = self.cudnn_gru
        return fused.backward(x, *rest) if fused is not None and fused.applies(x) else None

    def multi_adam(self, params, grads, moment1s, moment2s, steps, rate, lr: float, beta1: float, beta2: float,
                   eps: float, weight_decay: float, decoupled: bool):
        """ATen's multi-tensor Adam/AdamW (``_fused_adam_`` / ``_fused_adamw_``) on the CPU, in place
        on fresh copies of the parameters and moments laid out as their gradients are (the inputs
        stay as they are: a value fetched earlier may share their memory); None elsewhere (CUDA's
        wants float step counts)."""
        if self.fused_adam is None or any(p.dtype != params[0].dtype for p in params):
            return None
        update = self.fused_adam[1 if decoupled else 0]
        hyper = (lr, beta1, beta2, eps, weight_decay)
        if self.torch.compiler.is_compiling():
            # inside a compiled region (Executor(compile=True)): the same call as one opaque custom op
            # (the compiler cannot functionalise the in-place kernel; its own per-parameter code is slower)
            outs = _compiled_multi_adam(self.torch)(params, grads, moment1s, moment2s, steps, rate, *hyper,
                                                    decoupled)
            n = len(params)
            return outs[:n], outs[n:2 * n], outs[2 * n:3 * n], outs[3 * n:]
        return _multi_adam(self.torch, update, params, grads, moment1s, moment2s, steps, rate, *hyper)

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
        if array.dtype.kind == "V" and array.dtype == numpy_dtype("bfloat16"):
            return self.torch.from_numpy(array.view(np.int16)).view(self.torch.bfloat16).to(self.torch_device)
        return self.torch.from_numpy(array).to(self.torch_device)

    def to_numpy(self, array) -> np.ndarray:
        return array_to_numpy(array)

    def dtype_of(self, name) -> object:
        return getattr(self.torch, dtype_name(name))

    def scatter_add_rows(self, shape, dtype: str, ids, rows):
        out = self.torch.zeros(tuple(shape), dtype=self.dtype_of(dtype), device=self.torch_device)
        ids = ids.reshape(-1)
        rows = rows.reshape((ids.shape[0],) + tuple(shape[1:]))
        return out.index_add_(0, ids, rows)

    def fused_attention(self, q, k, v, mask, causal: bool, scale: float):
        return torch_attention.attention(self.torch, self.flash_attention, q, k, v, mask, causal, scale)

    def fused_attention_grad(self, q, k, v, mask, out, lse, dout, causal: bool, scale: float):
        return torch_attention.attention_grad(self.torch, self.flash_attention, q, k, v, mask, out, lse,
                                              dout, causal, scale)

    def einsum(self, equation: str, *operands):
        x = operands[0]
        if x.is_floating_point() or x.is_complex() or x.device.type == "cpu":
            return self.torch.einsum(equation, *operands)
        return _broadcast_einsum(self.torch, equation, operands)     # CUDA has no integer matmul

    def erf(self, x):
        return self.torch.special.erf(x)

    def relu(self, x):
        # threshold keeps x where x > 0 and writes 0 elsewhere, NaN included (as the general
        # kernel); one vectorised pass, where ``where(x > 0, x, 0)`` makes three
        return self.torch.threshold(x, 0, 0)

    def relu_grad(self, y, dy):
        return self.torch.ops.aten.threshold_backward(dy, y, 0)

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

    def linear(self, x, w, b):
        return self.torch.addmm(b, x, w)

    def global_norm(self, xs: list):
        torch = self.torch
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(xs)))

    def softmax(self, x, axis: int):
        return self.torch.softmax(x, axis)

    def log_softmax(self, x, axis: int):
        return self.torch.log_softmax(x, axis)

    def add_along_axis(self, x, indices, values, axis: int):
        return x.scatter_add_(axis, indices, values)

    def take_along_axis(self, x, indices, axis: int):
        if indices.ndim == x.ndim and all(i == n for d, (i, n) in enumerate(zip(indices.shape, x.shape))
                                          if d != axis % x.ndim):
            # (gather, not take_along_dim, whose broadcast fixes the sizes under torch.compile)
            return self.torch.gather(x, axis, indices)
        return self.torch.take_along_dim(x, indices, dim=axis)

    def put_along_axis(self, shape, indices, values, axis: int):
        out = self.torch.zeros(tuple(shape), dtype=values.dtype, device=values.device)
        return out.scatter_(axis, indices, values)

    def buffer_of(self, array) -> tuple[int, int]:
        storage = array.untyped_storage()
        return storage.data_ptr(), storage.nbytes()

    def layouts(self, arrays) -> tuple:
        # (Backend.layouts) buffers told apart as buffer_of tells them: by the storage's address
        buffers: dict = {}
        described: list = []
        count = 0
        for array in arrays:
            storage = array.untyped_storage()
            key = storage.data_ptr()
            if key not in buffers:
                buffers[key] = (count, storage.nbytes())
                count += 1
            index, nbytes = buffers[key]
            described += [(index, nbytes, array.shape, array.dtype, array.stride())]
        return tuple(described)

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

    def region_compiler(self, **options):
        """``torch.compile`` (Inductor) for a plan's straight-line regions; a changed size makes a
        region recompile once with that size symbolic (``dynamic=None``: torch's automatic dynamic
        shapes), not once per size. ``options`` go to ``torch.compile`` (tests: ``backend="aot_eager"``).
        oneDNN's LSTM calls are opaque custom ops inside the one graph (backends/torch_fused_rnn.py)."""
        torch = self.torch
        if self.onednn_lstm is not None:       # its custom ops, defined before a trace calls them
            torch_fused_rnn.compiled_ops(torch)
        if self.fused_adam is not None:
            _compiled_multi_adam(torch)
        if self.torch_device.type == "cpu":
            _compiled_pool_ops(torch)
        if "backend" not in options and self.torch_device.type == "cpu":
            # Inductor's layout optimisation makes convolutions channels-last, and ATen's convolution
            # backward then converts layouts back and forth (the CNN step: 41 ms compiled with it,
            # 34 ms without, 34 ms eager, CPU time in one run)
            options["options"] = {"layout_optimization": False}
        skip_guards = self.torch_device.type == "cpu"
        return lambda function: _DataDependentSizes(
            torch, torch.compile(function, dynamic=None, fullgraph=False, **options), skip_guards)

    def device_memory(self) -> int | None:
        if self.torch_device.type != "cuda":
            return None
        return int(self.torch.cuda.memory_allocated(self.torch_device))

    # -- normalization: torch's fused kernels (the ones torch.nn.LayerNorm / RMSNorm run) ----------
    # ATen's kernels mishandle size 0 (a SIGFPE in native_batch_norm_backward on CPU): an empty
    # operand takes the portable formulation, which gives the empty (or zero) result
    def layer_norm(self, x, weight, bias, eps: float):
        if _empty(x):
            return super().layer_norm(x, weight, bias, eps)
        return self.torch.native_layer_norm(x, [x.shape[-1]], weight, bias, eps)

    def layer_norm_backward(self, dy, x, mean, rstd, weight, want_weight: bool, want_bias: bool):
        if _empty(x):
            return super().layer_norm_backward(dy, x, mean, rstd, weight, want_weight, want_bias)
        # (callers want a weight's gradient only where there is a weight)
        bias = dy.new_empty(x.shape[-1:]) if want_bias else None     # read for its presence only
        return self.torch.ops.aten.native_layer_norm_backward(
            dy, x, [x.shape[-1]], mean, rstd, weight, bias, [True, want_weight, want_bias])

    def rms_norm(self, x, weight, eps: float):
        if _empty(x):
            return super().rms_norm(x, weight, eps)
        return self.torch.ops.aten._fused_rms_norm(x, [x.shape[-1]], weight, eps)
    # (rms_norm_backward: the generic one; torch 2.13 has _fused_rms_norm_backward for CUDA only)

    def channel_stats(self, x):
        var, mean = self.torch.var_mean(x, dim=[0, *range(2, x.ndim)], correction=0)
        return mean, var

    def batch_norm(self, x, mean, var, weight, bias, eps: float):
        # evaluation mode with (mean, var) as the running statistics: one fused pass, nothing written
        if _empty(x):
            return super().batch_norm(x, mean, var, weight, bias, eps)
        return self.torch.native_batch_norm(x, weight, bias, mean, var, False, 0.0, eps)[0]

    def batch_norm_backward(self, dy, x, mean, var, weight, eps: float, training: bool,
                            want_weight: bool, want_bias: bool):
        if _empty(x):
            return super().batch_norm_backward(dy, x, mean, var, weight, eps, training, want_weight, want_bias)
        mask = [True, want_weight, want_bias]
        if training:     # torch reads the batch statistics as (mean, 1 / sqrt(var + eps))
            grads = self.torch.ops.aten.native_batch_norm_backward(
                dy, x, weight, None, None, mean, (var + eps).rsqrt(), True, eps, mask)
        else:
            grads = self.torch.ops.aten.native_batch_norm_backward(dy, x, weight, mean, var, None, None, False,
                                                                   eps, mask)
        # CUDA's kernel returns parameter gradients the mask did not ask for (CPU's returns None)
        return tuple(grad if wanted else None for grad, wanted in zip(grads, mask))
    # -- sliding windows: torch's routines, ATen's explicit backward ops ----------------------------
    def conv(self, x, w, strides, pads, dilations, groups: int):
        if _empty(x, w):      # torch refuses 0 filters, and gives [N, 0, ...] for 0 input channels
            return super().conv(x, w, strides, pads, dilations, groups)
        x, padding = self._symmetric(x, pads)
        conv_nd = getattr(self.torch.nn.functional, f"conv{x.ndim - 2}d", None)
        if conv_nd is None:
            return super().conv(x, w, strides, [0] * 2 * (x.ndim - 2), dilations, groups)
        return conv_nd(x, w, None, list(strides), padding, list(dilations), groups)

    def conv_bias(self, x, w, b, strides, pads, dilations, groups: int):
        if _empty(x, w):      # as conv: torch gives [N, 0, ...] for 0 input channels
            return super().conv_bias(x, w, b, strides, pads, dilations, groups)
        x, padding = self._symmetric(x, pads)
        conv_nd = getattr(self.torch.nn.functional, f"conv{x.ndim - 2}d", None)
        if conv_nd is None:
            return super().conv_bias(x, w, b, strides, [0] * 2 * (x.ndim - 2), dilations, groups)
        return conv_nd(x, w, b, list(strides), padding, list(dilations), groups)   # oneDNN adds b as it writes

    def conv_input_grad(self, dy, w, x_like, strides, pads, dilations, groups: int):
        if _empty(dy, w, x_like):
            return super().conv_input_grad(dy, w, x_like, strides, pads, dilations, groups)
        nd, shape = len(strides), tuple(x_like.shape)
        asymmetric = _asymmetric(pads)
        padding = [0] * nd if asymmetric else list(pads[:nd])
        # convolution_backward reads only the input's shape for the input gradient
        stand_in = self.torch.empty(padded_shape(shape, pads) if asymmetric else shape,
                                    dtype=dy.dtype, device=dy.device)
        dx = self.torch.ops.aten.convolution_backward(
            dy, stand_in, w, None, list(strides), padding, list(dilations), False,
            [0] * nd, groups, [True, False, False])[0]
        return crop(dx, pads, shape[2:], self.xp) if asymmetric else dx

    def conv_weight_grad(self, x, dy, w_like, strides, pads, dilations, groups: int):
        if _empty(x, dy, w_like):
            return super().conv_weight_grad(x, dy, w_like, strides, pads, dilations, groups)
        x, padding = self._symmetric(x, pads)
        return self.torch.ops.aten.convolution_backward(
            dy, x, self._stand_in(w_like), None, list(strides), padding, list(dilations), False,
            [0] * len(strides), groups, [False, True, False])[1]

    def max_pool(self, x, kernel, strides, pads, dilations=None):
        if x.ndim != 4 or _asymmetric(pads) or _empty(x):
            return super().max_pool(x, kernel, strides, pads, dilations)
        if self.torch.compiler.is_compiling() and x.device.type == "cpu":
            # inside a compiled region: ATen's kernels as one opaque call (Inductor's CPU code for
            # pooling and its gradient is scalar: the CNN step ran at 0.8x eager with it)
            pool, _ = _compiled_pool_ops(self.torch)
            y, indices = pool(x, list(kernel), list(strides), list(pads[:2]), list(dilations or (1, 1)))
            return y, indices
        return _max_pool(self.torch, x, kernel, strides, pads[:2], dilations)

    def max_pool_grad(self, dy, indices, x_like, kernel, strides, pads, dilations=None):
        if dy.ndim != 4 or _asymmetric(pads) or _empty(dy, x_like):
            return super().max_pool_grad(dy, indices, x_like, kernel, strides, pads, dilations)
        if self.torch.compiler.is_compiling() and dy.device.type == "cpu":
            _, pool_grad = _compiled_pool_ops(self.torch)
            return pool_grad(dy, indices, x_like, list(kernel), list(strides), list(pads[:2]),
                             list(dilations or (1, 1)))
        return self.torch.ops.aten.max_pool2d_with_indices_backward(
            dy, self._stand_in(x_like), list(kernel), list(strides), list(pads[:2]), list(dilations or (1, 1)),
            False, indices)

    def max_pool_gather(self, v, indices):
        n, c = indices.shape[:2]
        picked = self.torch.gather(v.reshape(n, c, -1), 2, indices.reshape(n, c, -1))
        return picked.reshape(indices.shape)

    def avg_pool(self, x, kernel, strides, pads):
        if x.ndim != 4 or _asymmetric(pads) or _empty(x):
            return super().avg_pool(x, kernel, strides, pads)
        return self.torch.nn.functional.avg_pool2d(x, list(kernel), list(strides), list(pads[:2]),
                                                   ceil_mode=False, count_include_pad=True)

    def avg_pool_grad(self, dy, x_like, kernel, strides, pads):
        if dy.ndim != 4 or _asymmetric(pads) or _empty(dy, x_like):
            return super().avg_pool_grad(dy, x_like, kernel, strides, pads)
        return self.torch.ops.aten.avg_pool2d_backward(dy, self._stand_in(x_like), list(kernel), list(strides),
                                                       list(pads[:2]), False, True, None)

    def _stand_in(self, like):
        """An uninitialised dense tensor shaped like ``like``: ATen's backward ops read only the
        shape of their ``input``/``weight`` there, and ``like`` may be a zero-stride stand-in."""
        return self.torch.empty(tuple(like.shape), dtype=like.dtype, device=like.device)

    def _symmetric(self, x, pads):
        """``(x, padding)`` for torch's symmetric ``padding``: asymmetric pads are applied to ``x``."""
        if not _asymmetric(pads):
            return x, list(pads[:len(pads) // 2])
        return pad_spatial(self.xp, x, pads), [0] * (len(pads) // 2)


def _broadcast_einsum(torch, equation: str, operands):
    """``einsum`` as one broadcast product and a sum (exact for integers, which CUDA's GEMMs refuse).

    Each operand is first brought to its letters in the order output-then-summed by a one-operand
    einsum (diagonals, transposes, its own sums: no matmul), then given size-1 axes for the
    letters it lacks.
    """
    inputs, output = equation.split("->")
    subscripts = inputs.split(",")
    summed = sorted(set("".join(subscripts)) - set(output))
    order = output + "".join(summed)
    product = None
    for subs, x in zip(subscripts, operands):
        own = "".join(letter for letter in order if letter in subs)
        aligned = torch.einsum(f"{subs}->{own}", x)
        aligned = aligned.reshape([aligned.shape[own.index(c)] if c in own else 1 for c in order])
        product = aligned if product is None else product * aligned
    return product.sum(dim=list(range(len(output), len(order)))) if summed else product


def _empty(*arrays) -> bool:
    """Whether any of ``arrays`` has an axis of size 0 (vendor kernels are not called then)."""
    return any(a is not None and a.numel() == 0 for a in arrays)


def _asymmetric(pads) -> bool:
    half = len(pads) // 2
    return list(pads[:half]) != list(pads[half:])



class _DataDependentSizes:
    """A compiled region's function: traced with ops whose output sizes depend on data (oneDNN's
    LSTM workspace: ``retrograd::onednn_lstm_layer``) kept in the graph, not cut out of it
    (``capture_dynamic_output_shape_ops``, set for the call only: the user's own compiles keep theirs).

    ``skip_guards`` (CPU): Dynamo's guards (about 700 for the char-LSTM step: the region's kernels,
    their contexts and attributes, every input's layout; 2-4% of that step) run only on calls whose
    inputs' signature (shape, strides, dtype, device, inference flag, which inputs share storage)
    has not been seen; a seen one runs under ``skip_guard_eval_unsafe``. That is safe here because
    everything else the guards check is fixed for a region: its source, kernels and contexts are
    built once per plan and never change (runtime/regions.py)."""

    def __init__(self, torch, compiled, skip_guards: bool = False):
        self.torch, self.config, self.compiled = torch, torch._dynamo.config, compiled
        self.skip_guards, self.seen = skip_guards, set()

    def __call__(self, *args):
        config = self.config
        before = config.capture_dynamic_output_shape_ops
        config.capture_dynamic_output_shape_ops = True
        try:
            if not self.skip_guards:
                return self.compiled(*args)
            key = _signature(self.torch, args)
            if key in self.seen:
                with self.torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                    return self.compiled(*args)
            results = self.compiled(*args)       # guarded: recompiles for a new signature
            self.seen.add(key)
            return results
        finally:
            config.capture_dynamic_output_shape_ops = before


def _signature(torch, args) -> tuple:
    """What Dynamo's tensor guards check of a region's arguments, as one hashable tuple."""
    storages: dict[int, int] = {}
    key = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            shared = storages.setdefault(a.untyped_storage().data_ptr(), i)
            key.append((tuple(a.shape), a.stride(), a.dtype, a.device, a.is_inference(), a.requires_grad, shared))
        else:
            key.append((type(a), a))
    return tuple(key)


def _multi_adam(torch, update, params, grads, moment1s, moment2s, steps, rate, lr: float, beta1: float,
                beta2: float, eps: float, weight_decay: float):
    """``TorchBackend.multi_adam``'s work (``update``: ``_fused_adam_`` or ``_fused_adamw_``; None: the
    results' layouts only, for the compiler's fake tensors)."""
    # The fused kernel walks each parameter, gradient and moment as one flat buffer (layouts
    # must agree) and copies a non-contiguous gradient for nothing. oneDNN's LSTM weight
    # gradients are transposed views of contiguous [4H, D] buffers: the kernel gets every
    # tensor of such a parameter transposed alike (contiguous, the same elementwise update),
    # and the updated weights come back as views of [4H, D] buffers, which oneDNN reads next
    # step without a copy. It reads the gradients only (maximize=False, no grad_scale).
    orders = [_contiguous_order(g) for g in grads]
    grads = [_permuted(g, order) for g, order in zip(grads, orders)]
    dense = torch.contiguous_format
    params, moment1s, moment2s = ([(x if order is None else x.permute(order)).clone(memory_format=dense)
                                   for x, order in zip(group, orders)]
                                  for group in (params, moment1s, moment2s))
    steps = torch._foreach_add(steps, 1) if update is not None else [s.clone() for s in steps]
    if update is not None:
        if rate is not None:
            lr = float(rate.reshape(()))      # the host holds it: a CPU array
        update(params, grads, moment1s, moment2s, [], steps, lr=lr, beta1=beta1, beta2=beta2,
               weight_decay=weight_decay, eps=eps, amsgrad=False, maximize=False)
    params, moment1s, moment2s = ([_unpermuted(x, order) for x, order in zip(group, orders)]
                                  for group in (params, moment1s, moment2s))
    return params, moment1s, moment2s, steps


def _max_pool(torch, x, kernel, strides, pads, dilations):
    """ATen's max pool of NCHW ``x`` (``pads``: one per spatial axis), and its indices.

    ATen's CPU max pool walks each NCHW plane with scalar code, while its channels-last kernel is
    vectorised over channels (2-6x faster at 32-64 channels, the copies included): with 8 channels
    or more it pools a channels-last copy and hands back NCHW tensors, the same values and indices
    (ties and NaN alike: tests/ops/nn/test_conv.py).
    """
    channels_last = x.device.type == "cpu" and x.shape[1] >= 8
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    y, indices = torch.ops.aten.max_pool2d_with_indices(x, list(kernel), list(strides), list(pads),
                                                        list(dilations or (1, 1)))
    return (y.contiguous(), indices.contiguous()) if channels_last else (y, indices)


_COMPILED_POOL: list = []


def _compiled_pool_ops(torch):
    """``retrograd::max_pool2d`` and ``retrograd::max_pool2d_backward``: the torch backend's max pool
    (ATen's kernels, channels-last where faster) as custom ops a compiled region calls whole, in the
    layout of their input (NCHW, or the channels-last the compiler picks around convolutions). Defined
    once, before a trace needs them (``region_compiler``)."""
    if _COMPILED_POOL:
        return _COMPILED_POOL[0]
    aten = torch.ops.aten

    @torch.library.custom_op("retrograd::max_pool2d", mutates_args=(), schema=(
        "(Tensor x, int[] kernel, int[] strides, int[] pads, int[] dilations) -> (Tensor, Tensor)"))
    def pool(x, kernel, strides, pads, dilations):
        if x.is_contiguous():            # NCHW: through channels-last where faster, NCHW back
            y, indices = _max_pool(torch, x, kernel, strides, pads, dilations)
            return y.contiguous(), indices.contiguous()
        # the layout the compiler chose (channels-last around its convolutions): ATen keeps it
        return aten.max_pool2d_with_indices(x, kernel, strides, pads, dilations)

    @pool.register_fake
    def _(x, kernel, strides, pads, dilations):
        return aten.max_pool2d_with_indices(x, kernel, strides, pads, dilations)

    @torch.library.custom_op("retrograd::max_pool2d_backward", mutates_args=(), schema=(
        "(Tensor dy, Tensor indices, Tensor x_like, int[] kernel, int[] strides, int[] pads, int[] dilations)"
        " -> Tensor"))
    def pool_grad(dy, indices, x_like, kernel, strides, pads, dilations):
        return aten.max_pool2d_with_indices_backward(dy, x_like, kernel, strides, pads, dilations, False, indices)

    @pool_grad.register_fake
    def _(dy, indices, x_like, kernel, strides, pads, dilations):
        return aten.max_pool2d_with_indices_backward(dy, x_like, kernel, strides, pads, dilations, False, indices)

    _COMPILED_POOL.append((pool, pool_grad))
    return _COMPILED_POOL[0]


_COMPILED_ADAM: list = []


def _compiled_multi_adam(torch):
    """``retrograd::multi_adam``: ``_multi_adam`` as one custom op a compiled region calls (defined
    once, before a trace needs it: ``region_compiler``); it returns params, moments and steps as one
    list, laid out as the eager call leaves them."""
    if _COMPILED_ADAM:
        return _COMPILED_ADAM[0]
    ops = _fused_adam_ops(torch)

    @torch.library.custom_op("retrograd::multi_adam", mutates_args=(), schema=(
        "(Tensor[] params, Tensor[] grads, Tensor[] moment1s, Tensor[] moment2s, Tensor[] steps, Tensor? rate,"
        " float lr, float beta1, float beta2, float eps, float weight_decay, bool decoupled) -> Tensor[]"))
    def multi_adam(params, grads, moment1s, moment2s, steps, rate, lr, beta1, beta2, eps, weight_decay,
                   decoupled):
        outs = _multi_adam(torch, ops[1 if decoupled else 0], params, grads, moment1s, moment2s, steps, rate,
                           lr, beta1, beta2, eps, weight_decay)
        return [x for group in outs for x in group]

    @multi_adam.register_fake
    def _(params, grads, moment1s, moment2s, steps, rate, lr, beta1, beta2, eps, weight_decay, decoupled):
        outs = _multi_adam(torch, None, params, grads, moment1s, moment2s, steps, rate, lr, beta1, beta2, eps,
                           weight_decay)
        return [x for group in outs for x in group]

    _COMPILED_ADAM.append(multi_adam)
    return multi_adam


def _contiguous_order(array) -> tuple[int, ...] | None:
    """The order of ``array``'s dimensions in which it is contiguous (a transposed view of a
    contiguous tensor has one), or None when it is contiguous already or has no such order.

    Example::

        _contiguous_order(torch.zeros(512, 128).t())      # (1, 0)
    """
    if array.is_contiguous():
        return None
    order = tuple(sorted(range(array.dim()), key=lambda d: -array.stride(d)))
    return order if array.permute(order).is_contiguous() else None


def _permuted(array, order):
    """``array`` with its dimensions in ``order`` (None: contiguous, as it is or copied).

    Example::

        _permuted(w_grad, _contiguous_order(w_grad)).is_contiguous()      # True
    """
    return array.contiguous() if order is None else array.permute(order)


def _unpermuted(array, order):
    """The inverse of ``_permuted``: ``array``'s dimensions back in their original order.

    Example::

        _unpermuted(_permuted(w, (1, 0)), (1, 0)).shape == w.shape      # True
    """
    if order is None:
        return array
    inverse = [0] * len(order)
    for position, dim in enumerate(order):
        inverse[dim] = position
    return array.permute(inverse)


_interop_fixed: dict[int, int] = {}     # id(torch) -> the inter-op count it was given, once


def fix_torch_interop_threads(torch, threads: int) -> bool:
    """Give torch's inter-op pool ``threads`` threads, if torch still allows it: it takes the count
    once per process, before any inter-op work (later calls raise RuntimeError; then the pool
    keeps its size -- eager ops do not use it, only ``torch.jit.fork`` and the like). Returns
    whether the pool has ``threads`` threads now."""
    if torch.get_num_interop_threads() == threads:
        return True
    if id(torch) in _interop_fixed:
        return False
    _interop_fixed[id(torch)] = threads
    try:
        torch.set_num_interop_threads(threads)
    except RuntimeError:
        return False
    return True
