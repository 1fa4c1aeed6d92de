"""What every backend offers the executor and the kernels: the ``Backend`` base class.

A backend is one array library on one device. Kernels compute with
``backend.xp`` (an Array API namespace, through ``array_api_compat``); the
few things the standard lacks are methods here, written once per library in
that library's module (``numpy_backend``, ``torch_backend``, ``cupy_backend``):
host/device transfers, scatter-add with repeated ids, buffer identity for
``peak_bytes``, device memory in use. Keyed random draws are written once, with
the namespace's integer ops (``keyed_random``), so every backend draws the same
numbers for the same key.
"""
from __future__ import annotations

import contextlib
import math

import numpy as np

from ..errors import BackendError
from . import keyed_random, norm_math, special, windows


def dtype_name(dtype) -> str:
    """The retrograd name (``"float32"``, ...) of any library's dtype object or name.

    It is the text after the last dot of ``str(dtype)``: ``np.dtype("int64")``,
    ``torch.int64`` and ``"int64"`` all give ``"int64"`` (a NumPy scalar type
    such as ``np.int64`` does not: pass ``np.dtype(np.int64)``).

    Args:
        dtype: A NumPy, torch or CuPy dtype object, or a name.

    Returns:
        The name.

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        assert rg.backends.dtype_name(np.dtype("float32")) == "float32"
        assert rg.backends.dtype_name("int64") == "int64"
        ```
    """
    return str(dtype).rsplit(".", 1)[-1]




def _shifted(xp, x, axis: int):
    """``x`` minus its maximum along ``axis``: every exp of it is <= 1. An empty ``axis`` has no
    maximum (NumPy and torch raise): nothing to shift, and the softmax of nothing is empty, as
    onnxruntime's."""
    if x.shape[axis] == 0:
        return x
    return x - xp.max(x, axis=axis, keepdims=True)


class Backend:
    """One array library on one device; subclasses fill in the library-specific methods.

    Kernels compute with ``backend.xp`` (an Array API namespace, through
    ``array_api_compat``); the few things the standard lacks are methods here,
    written once per library in that library's module: host/device transfers,
    scatter-add with repeated ids, buffer identity for ``peak_bytes``, device
    memory in use, vendor kernels (fused attention, convolutions, fused RNNs).
    ``rg.backends.get_backend`` builds one; ``exe.backend`` is the executor's.

    Args:
        xp: The array namespace kernels compute with.
        device: The device name (``"cpu"``, ``"cuda:0"``...).

    Example:
        ```python
        import numpy as np
        import retrograd as rg

        exe = rg.Executor()
        be = exe.backend                                   # a Backend
        host = be.to_numpy(be.from_numpy(np.arange(3.0)))
        assert be.name == "numpy" and host.tolist() == [0.0, 1.0, 2.0]
        ```
    """

    name = "?"
    runs_whole_programs = False   # True: an engine registered for the name runs programs (runtime/engines.py)
    has_graphs = False    # whether ``capture_graph`` works (CUDA devices)
    # dtypes whose LSTM layers this backend runs as one vendor kernel (``LSTMSequence``): the
    # executor then fuses step-by-step LSTM recurrences (``passes.fuse_recurrent_cells``)
    fused_lstm_dtypes: tuple[str, ...] = ()
    # the same for GRU layers (``GRUSequence``): dtypes whose step-by-step GRU recurrences the
    # executor fuses because this backend runs them as one vendor kernel
    fused_gru_dtypes: tuple[str, ...] = ()
    # ``retrograd.passes`` functions (by name) the executor applies to a clone of each program it
    # runs here, e.g. ("fuse_optimizer_updates",) where a multi-tensor update pays off
    program_passes: tuple[str, ...] = ()

    def __init__(self, xp, device: str):
        self.xp = xp
        self.device = device

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, device={self.device!r})"

    # -- dtypes ------------------------------------------------------------------
    def dtype_of(self, name) -> object:
        """The namespace's dtype for a dtype name (``"float32"``, ...) or any library's dtype.

        Args:
            name: A dtype name or dtype object.

        Returns:
            The dtype object of ``xp``.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            be = rg.backends.get_backend("numpy")
            assert be.dtype_of("float32") == np.float32
            ```
        """
        found = getattr(self.xp, dtype_name(name), None)
        if found is None:      # CuPy and most Array API namespaces have no bfloat16
            raise BackendError(f'backend "{self.name}" has no dtype {dtype_name(name)}')
        return found

    def kernel_for(self, kernel, op, block):
        """The function that runs ``op`` here: its kernel, or the kernel wrapped.

        A backend that computes a dtype by another (NumPy's bfloat16 and float16 in float32)
        wraps the kernels of ops touching it; read once per op when a block is compiled.

        Args:
            kernel: The op's registered kernel.
            op: The Op.
            block: The Block holding it (for its Vars' dtypes).

        Returns:
            The function the plan calls for ``op``.
        """
        return kernel

    # -- transfers (library-specific) ------------------------------------------------
    def owns(self, array) -> bool:
        """Whether ``array`` is an array of this backend's library (on any device).

        Args:
            array: Any object.

        Returns:
            True or False.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            be = rg.backends.get_backend("numpy")
            assert be.owns(np.zeros(2)) and not be.owns([0.0, 0.0])
            ```
        """
        raise NotImplementedError

    def device_of(self, array) -> str:
        """The device an array of this library lives on, spelled like ``self.device``.

        Args:
            array: An array of this backend.

        Returns:
            The device name.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            be = rg.backends.get_backend("numpy")
            assert be.device_of(np.zeros(2)) == "cpu"
            ```
        """
        return self.device

    def from_numpy(self, array: np.ndarray):
        """Host -> device, once (a feed, a loaded parameter).

        Args:
            array: A NumPy array.

        Returns:
            The backend's array.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            be = rg.backends.get_backend("numpy")
            t = be.from_numpy(np.arange(3.0))
            assert be.owns(t)
            ```
        """
        raise NotImplementedError

    def to_numpy(self, array) -> np.ndarray:
        """Device -> host (a fetch with ``return_numpy=True``, a saved parameter).

        Args:
            array: An array of this backend.

        Returns:
            A NumPy array.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            be = rg.backends.get_backend("numpy")
            assert be.to_numpy(be.from_numpy(np.arange(3.0))).tolist() == [0.0, 1.0, 2.0]
            ```
        """
        raise NotImplementedError

    # -- what the Array API lacks (library-specific) ----------------------------------
    def matmul(self, x, y, transpose_x: bool = False, transpose_y: bool = False):
        """``x @ y`` with either operand's last two axes transposed first (the ``MatMul`` kernel).

        A backend overrides it where its BLAS is faster at a product written another way.

        Args:
            x: An array of this backend.
            y: An array of this backend.
            transpose_x: Transpose ``x``'s last two axes first.
            transpose_y: Transpose ``y``'s last two axes first.

        Returns:
            The product.
        """
        xp = self.xp
        if transpose_x:
            x = xp.matrix_transpose(x) if hasattr(xp, "matrix_transpose") else xp.swapaxes(x, -1, -2)
        if transpose_y:
            y = xp.matrix_transpose(y) if hasattr(xp, "matrix_transpose") else xp.swapaxes(y, -1, -2)
        return xp.matmul(x, y)

    def fused_attention(self, q, k, v, mask, causal: bool, scale: float):
        """``(out, lse)`` of ``ScaledDotProductAttention`` from the library's fused kernel, or None.

        Args:
            q: The queries.
            k: The keys.
            v: The values.
            mask: The mask, or None.
            causal: Mask later keys.
            scale: The scores' scale.

        Returns:
            ``(out, lse)``, or None where the library has none for these operands
            (the op then computes its general formulation).
        """
        return None

    def fused_attention_grad(self, q, k, v, mask, out, lse, dout, causal: bool, scale: float):
        """``(dq, dk, dv)`` of ``ScaledDotProductAttentionGrad`` from the fused kernel, or None.

        Args:
            q: The queries.
            k: The keys.
            v: The values.
            mask: The mask, or None.
            out: The forward's output.
            lse: The forward's log-sum-exp.
            dout: The output's gradient.
            causal: Mask later keys.
            scale: The scores' scale.

        Returns:
            ``(dq, dk, dv)``, or None.
        """
        return None

    def multi_adam(self, params, grads, moment1s, moment2s, steps, rate, lr: float, beta1: float, beta2: float,
                   eps: float, weight_decay: float, decoupled: bool):
        """Adam (AdamW with ``decoupled``) for many parameters in one routine (``FusedAdamUpdate``).

        Args:
            params: The parameters.
            grads: Their gradients.
            moment1s: The first moments.
            moment2s: The second moments.
            steps: int64 ``[1]`` update counts before this update.
            rate: The learning-rate array (a schedule's) or None (then ``lr``).
            lr: The learning rate.
            beta1: The first moment's decay.
            beta2: The second moment's decay.
            eps: Added to the denominator.
            weight_decay: The decay rate.
            decoupled: AdamW's decoupled decay.

        Returns:
            Lists ``(params, moment1s, moment2s, steps)`` after the update, new
            arrays (the inputs unchanged); None where the library has no such
            routine (the op then runs ``AdamUpdate``'s math per parameter).
        """
        return None

    # -- sliding windows: the general im2col + GEMM path (windows.py); torch has its own ----------
    def conv(self, x, w, strides, pads, dilations, groups: int):
        """The ``Conv`` kernel: ``y [N, F, *out]`` of ``x [N, C, *spatial]`` and ``w [F, C/groups, *kernel]``.

        Args:
            x: The input.
            w: The filters.
            strides: One stride per spatial axis.
            pads: In ONNX's order: every axis' before, then every axis' after.
            dilations: One dilation per spatial axis.
            groups: The number of groups.

        Returns:
            ``y``.
        """
        return windows.conv(self.xp, x, w, strides, pads, dilations, groups)

    def conv_bias(self, x, w, b, strides, pads, dilations, groups: int):
        """The ``ConvBias`` kernel: ``conv(x, w)`` plus the bias ``b [F]`` along the filter axis.

        Args:
            x: The input.
            w: The filters.
            b: The bias, one per filter.
            strides: One stride per spatial axis.
            pads: In ONNX's order: every axis' before, then every axis' after.
            dilations: One dilation per spatial axis.
            groups: The number of groups.

        Returns:
            ``y``.
        """
        y = self.conv(x, w, strides, pads, dilations, groups)
        return y + self.xp.reshape(b, (-1,) + (1,) * (y.ndim - 2))

    def conv_input_grad(self, dy, w, x_like, strides, pads, dilations, groups: int):
        """``dx``, the transposed convolution of ``dy``.

        Args:
            dy: The output's gradient.
            w: The filters.
            x_like: An array of ``x``'s shape (read for its shape only).
            strides: One stride per spatial axis.
            pads: In ONNX's order: every axis' before, then every axis' after.
            dilations: One dilation per spatial axis.
            groups: The number of groups.

        Returns:
            ``dx`` shaped like ``x_like``.
        """
        return windows.conv_input_grad(self.xp, dy, w, tuple(x_like.shape), strides, pads, dilations, groups)

    def conv_weight_grad(self, x, dy, w_like, strides, pads, dilations, groups: int):
        """``dw``, the filters' gradient.

        Args:
            x: The input.
            dy: The output's gradient.
            w_like: An array of ``w``'s shape (read for its shape only).
            strides: One stride per spatial axis.
            pads: In ONNX's order: every axis' before, then every axis' after.
            dilations: One dilation per spatial axis.
            groups: The number of groups.

        Returns:
            ``dw`` shaped like ``w_like``.
        """
        return windows.conv_weight_grad(self.xp, x, dy, tuple(w_like.shape), strides, pads, dilations, groups)

    def max_pool(self, x, kernel, strides, pads, dilations=None):
        """Window maxima and their flat indices into each ``(n, c)`` plane.

        Args:
            x: The input ``[N, C, H, W]``.
            kernel: The window per spatial axis.
            strides: The strides.
            pads: The paddings, in ONNX's order.
            dilations: The spacing of a window's taps per spatial axis (None: 1).

        Returns:
            ``(y, indices)``.
        """
        return windows.max_pool(self.xp, x, kernel, strides, pads, dilations)

    def max_pool_grad(self, dy, indices, x_like, kernel, strides, pads, dilations=None):
        """``dy`` added into a zero ``x_like``-shaped array at ``indices`` (repeats accumulate).

        The window geometry is for backends whose routine checks it.

        Args:
            dy: The output's gradient.
            indices: ``max_pool``'s indices.
            x_like: An array of the input's shape.
            kernel: The window per spatial axis.
            strides: The strides.
            pads: The paddings, in ONNX's order.
            dilations: The spacing of a window's taps per spatial axis (None: 1).

        Returns:
            ``dx``.
        """
        shape = tuple(x_like.shape)
        size = 1
        for d in shape:
            size *= d
        ids = windows.plane_ids(self.xp, indices, size // (shape[0] * shape[1]) if size else 1)
        flat = self.scatter_add_rows((size,), dtype_name(dy.dtype), ids, self.xp.reshape(dy, (-1,)))
        return self.xp.reshape(flat, shape)

    def max_pool_gather(self, v, indices):
        """``v`` read at ``indices`` (``max_pool``'s), shaped like ``indices``.

        Args:
            v: An array of the input's shape.
            indices: ``max_pool``'s indices.

        Returns:
            The gathered values.
        """
        return windows.max_pool_gather(self.xp, v, indices)

    def avg_pool(self, x, kernel, strides, pads):
        """Window means, zero padding counted in the divisor (``count_include_pad=True``).

        Args:
            x: The input ``[N, C, H, W]``.
            kernel: The window per spatial axis.
            strides: The strides.
            pads: The paddings, in ONNX's order.

        Returns:
            The pooled array.
        """
        return windows.avg_pool(self.xp, x, kernel, strides, pads)

    def avg_pool_grad(self, dy, x_like, kernel, strides, pads):
        """The input's gradient of ``avg_pool``: each output gradient spread evenly over its window.

        Args:
            dy: The output's gradient.
            x_like: An array of the input's shape.
            kernel: The window per spatial axis.
            strides: The strides.
            pads: The paddings, in ONNX's order.

        Returns:
            ``dx`` shaped like ``x_like``.
        """
        return windows.avg_pool_grad(self.xp, dy, tuple(x_like.shape), kernel, strides, pads)

    def scatter_add_rows(self, shape, dtype: str, ids, rows):
        """Zeros of ``shape`` with ``rows[i]`` added into row ``ids[i]`` (repeated ids accumulate).

        Args:
            shape: The result's shape.
            dtype: The result's dtype name.
            ids: Row ids.
            rows: The rows, shaped ``ids.shape + shape[1:]``.

        Returns:
            The array.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            be = rg.backends.get_backend("numpy")
            out = be.scatter_add_rows((3, 2), "float32", np.array([0, 0, 2]), np.ones((3, 2), "float32"))
            assert out.tolist() == [[2.0, 2.0], [0.0, 0.0], [1.0, 1.0]]
            ```
        """
        raise NotImplementedError

    def einsum(self, equation: str, *operands):
        """``numpy.einsum(equation, *operands)`` with explicit output subscripts (the ``Einsum`` kernel).

        Args:
            equation: The subscripts, with ``->``.
            *operands: The arrays.

        Returns:
            The result.
        """
        raise NotImplementedError(f"backend {self.name!r} has no einsum")

    def buffer_of(self, array) -> tuple[int, int]:
        """``(identity, bytes)`` of the memory an array lives in: views share their base's.

        Args:
            array: An array of this backend.

        Returns:
            The pair.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            be = rg.backends.get_backend("numpy")
            x = np.zeros(100, "float32")
            assert be.buffer_of(x[10:]) == be.buffer_of(x) and be.buffer_of(x)[1] == 400
            ```
        """
        raise NotImplementedError

    def layouts(self, arrays) -> tuple:
        """A hashable description of ``arrays`` as the memory meter and kernels see them.

        Per array: which earlier array's buffer it shares (an index), its buffer's
        bytes, shape, dtype and strides. Two runs of a plan that start from equal
        descriptions hold the same bytes at each step (``runtime/stats.py``'s
        ``MeterRecord``).

        Args:
            arrays: Arrays of this backend.

        Returns:
            A tuple with one entry per array.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            be = rg.backends.get_backend("numpy")
            x = np.zeros((2, 3), "float32")
            assert be.layouts([x, x.T])[1][0] == 0           # x.T shares x's buffer
            assert be.layouts([x]) != be.layouts([x.T.copy()])
            ```
        """
        buffers: dict = {}
        described = []
        for array in arrays:
            key, nbytes = self.buffer_of(array)
            described.append((buffers.setdefault(key, len(buffers)), nbytes, tuple(array.shape),
                              str(array.dtype), getattr(array, "strides", None)))
        return tuple(described)

    def device_memory(self) -> int | None:
        """Bytes the library holds on the device now, or None where it does not say (host).

        Returns:
            A count, or None.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            be = rg.backends.get_backend("numpy")
            assert be.device_memory() is None
            ```
        """
        return None

    def capture_graph(self, work):
        """A device graph of the launches ``work()`` makes, with ``.replay()`` (``runtime/graphs.py``).

        Only CUDA backends have them.

        Args:
            work: A function making the launches.

        Returns:
            The graph.

        Raises:
            BackendError: The backend has no device graphs.
        """
        raise BackendError(f'backend "{self.name}" on {self.device} has no device graphs: they need '
                           'backend "torch" with device "cuda" (CuPy cannot capture cuBLAS calls)')

    def region_compiler(self, **options):
        """The compiler of a plan's straight-line regions, or None where the library has none.

        ``Executor(compile=True)`` hands it each region (a Python function of arrays) and runs
        what it returns (runtime/regions.py); torch's is ``torch.compile``.

        Args:
            **options: Keywords for the library's compiler (torch: ``torch.compile``'s, e.g.
                ``backend="aot_eager"``).

        Returns:
            A function ``compile(fn) -> fn`` with the same results, or None.
        """
        return None
    # -- threads (runtime/threads.py) --------------------------------------------------
    def thread_pools(self) -> tuple:
        """This library's own thread pools, beyond the BLAS and OpenMP libraries threadpoolctl finds.

        Returns:
            Objects with ``get_num_threads()`` and ``set_num_threads(n)``, limited to the
            executor's ``threads`` while a run computes (torch: the torch module).
        """
        return ()

    def fix_threads(self, threads: int) -> None:
        """Thread settings this library takes once per process (made when an executor is created).

        Args:
            threads: The executor's thread count (torch: its inter-op pool).
        """

    def on_device(self):
        """The context the executor runs kernels in.

        CuPy: our device made current; torch: inference mode, as retrograd does its own differentiation.

        Returns:
            A context manager.

        Example:
            ```python
            import numpy as np
            import retrograd as rg

            be = rg.backends.get_backend("numpy")
            with be.on_device():
                y = be.xp.exp(be.from_numpy(np.zeros(2)))
            ```
        """
        return contextlib.nullcontext()

    # -- normalization over the last axis (norm_math; torch overrides with its fused routines) --
    def layer_norm(self, x, weight, bias, eps: float):
        """``(y, mean, rstd)`` of a layer norm over the last axis (``mean``, ``rstd``: ``[..., 1]``).

        Args:
            x: The input.
            weight: ``[D]`` or None.
            bias: ``[D]`` or None.
            eps: Added to the variance.

        Returns:
            ``(y, mean, rstd)``.
        """
        return norm_math.layer_norm(self.xp, x, weight, bias, eps)

    def layer_norm_backward(self, dy, x, mean, rstd, weight, want_weight: bool, want_bias: bool):
        """``(dx, dweight or None, dbias or None)`` from the forward's ``mean`` and ``rstd``.

        Args:
            dy: The output's gradient.
            x: The input.
            mean: The forward's mean.
            rstd: The forward's reciprocal std.
            weight: ``[D]`` or None.
            want_weight: Compute ``dweight``.
            want_bias: Compute ``dbias``.

        Returns:
            The triple.
        """
        return norm_math.layer_norm_backward(self.xp, dy, x, mean, rstd, weight, want_weight, want_bias)

    def rms_norm(self, x, weight, eps: float):
        """``(y, rstd)`` of an RMS norm over the last axis (``rstd``: ``[..., 1]``).

        Args:
            x: The input.
            weight: ``[D]`` or None.
            eps: Added to the mean square.

        Returns:
            ``(y, rstd)``.
        """
        return norm_math.rms_norm(self.xp, x, weight, eps)

    def rms_norm_backward(self, dy, x, rstd, weight, want_weight: bool):
        """``(dx, dweight or None)`` from the forward's ``rstd``.

        Args:
            dy: The output's gradient.
            x: The input.
            rstd: The forward's reciprocal RMS.
            weight: ``[D]`` or None.
            want_weight: Compute ``dweight``.

        Returns:
            The pair.
        """
        return norm_math.rms_norm_backward(self.xp, dy, x, rstd, weight, want_weight)

    def channel_stats(self, x):
        """``(mean, var)`` (biased) per channel of ``x [N, C, ...]``, each ``[C]``.

        Args:
            x: The input.

        Returns:
            The pair.
        """
        return norm_math.channel_stats(self.xp, x)

    def batch_norm(self, x, mean, var, weight, bias, eps: float):
        """``x [N, C, ...]`` normalized per channel with the given ``mean`` and ``var`` ``[C]``.

        Args:
            x: The input.
            mean: ``[C]``.
            var: ``[C]``.
            weight: ``[C]`` or None.
            bias: ``[C]`` or None.
            eps: Added to the variance.

        Returns:
            The normalized array.
        """
        return norm_math.batch_norm(self.xp, x, mean, var, weight, bias, eps)

    def batch_norm_backward(self, dy, x, mean, var, weight, eps: float, training: bool,
                            want_weight: bool, want_bias: bool):
        """``(dx, dweight or None, dbias or None)`` with the statistics the forward used.

        Args:
            dy: The output's gradient.
            x: The input.
            mean: The mean used.
            var: The variance used.
            weight: ``[C]`` or None.
            eps: Added to the variance.
            training: Whether the batch's statistics were used (they then depend on ``x``).
            want_weight: Compute ``dweight``.
            want_bias: Compute ``dbias``.

        Returns:
            The triple.
        """
        return norm_math.batch_norm_backward(self.xp, dy, x, mean, var, weight, eps, training,
                                             want_weight, want_bias)
    # -- elementwise special functions (a backend overrides them with its library's own) ---------
    def erf(self, x):
        """The error function, elementwise (``special.erf``: Array API operations only).

        Args:
            x: An array of this backend.

        Returns:
            ``erf(x)``.
        """
        return special.erf(self.xp, x)

    def relu(self, x):
        """``x`` where positive, 0 elsewhere (NaN: 0).

        Args:
            x: An array of this backend.

        Returns:
            ``relu(x)``.
        """
        return self.xp.where(x > 0, x, self.xp.zeros_like(x))

    def relu_grad(self, y, dy):
        """``dy`` where ``y`` (relu's output) is positive, 0 elsewhere.

        Args:
            y: ``relu(x)``, an array of this backend.
            dy: The output's gradient.

        Returns:
            ``dx``.
        """
        return self.xp.where(y > 0, dy, self.xp.zeros_like(dy))

    def gelu(self, x, approximate: str = "none"):
        """``torch.nn.functional.gelu``: ``x * Phi(x)``, or its tanh approximation.

        Args:
            x: An array of this backend.
            approximate: ``"none"`` or ``"tanh"``.

        Returns:
            ``gelu(x)``.
        """
        if approximate == "tanh":
            inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))
            return 0.5 * x * (1.0 + self.xp.tanh(inner))
        return 0.5 * x * (1.0 + self.erf(x * math.sqrt(0.5)))

    def gelu_grad(self, x, dy, approximate: str = "none"):
        """``dy * d gelu / dx`` (torch's ``gelu_backward``).

        Args:
            x: An array of this backend.
            dy: The output's gradient.
            approximate: ``"none"`` or ``"tanh"``.

        Returns:
            ``dx``.
        """
        xp = self.xp
        if approximate == "tanh":
            c = math.sqrt(2.0 / math.pi)
            square = x * x
            t = xp.tanh(c * (x + 0.044715 * (square * x)))
            slope = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * (c * (1.0 + 3.0 * 0.044715 * square))
        else:
            slope = 0.5 * (1.0 + self.erf(x * math.sqrt(0.5))) + x * xp.exp(-0.5 * (x * x)) / math.sqrt(2.0 * math.pi)
        return dy * slope

    def silu(self, x):
        """``x * sigmoid(x)``, the sigmoid from ``exp(-|x|)`` (no overflow).

        Args:
            x: An array of this backend.

        Returns:
            ``silu(x)``.
        """
        xp = self.xp
        z = xp.exp(-xp.abs(x))
        return x * xp.where(x >= 0, 1.0 / (1.0 + z), z / (1.0 + z))

    def softplus(self, x, threshold: float):
        """torch's softplus (beta 1): ``x`` above ``threshold``, else ``log1p(exp(x))``.

        Args:
            x: An array of this backend.
            threshold: Where the identity takes over.

        Returns:
            ``softplus(x)``.
        """
        xp = self.xp
        return xp.where(x > threshold, x, xp.log1p(xp.exp(xp.minimum(x, xp.full_like(x, threshold)))))

    def elu(self, x, alpha: float):
        """``x`` where positive, ``alpha * (exp(x) - 1)`` elsewhere.

        Args:
            x: An array of this backend.
            alpha: The scale of the negative part.

        Returns:
            ``elu(x)``.
        """
        xp = self.xp
        return xp.where(x > 0, x, alpha * xp.expm1(xp.minimum(x, xp.zeros_like(x))))

    def leaky_relu(self, x, negative_slope: float):
        """``x`` where positive, ``negative_slope * x`` elsewhere.

        Args:
            x: An array of this backend.
            negative_slope: The slope below 0.

        Returns:
            ``leaky_relu(x)``.
        """
        return self.xp.where(x > 0, x, x * negative_slope)

    def logsumexp(self, x, axes: tuple, keepdims: bool):
        """``log(sum(exp(x)))`` over ``axes``, shifted by the maximum.

        Args:
            x: An array of this backend.
            axes: A non-empty tuple of axes.
            keepdims: Keep the reduced axes.

        Returns:
            The reduction; -inf over an empty axis, as ``torch.logsumexp``.
        """
        xp = self.xp
        kept = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        if any(x.shape[a] == 0 for a in axes):
            out = xp.full(kept, -math.inf, dtype=x.dtype)
        else:
            top = xp.max(x, axis=axes, keepdims=True)
            top = xp.where(xp.isfinite(top), top, xp.zeros_like(top))   # all -inf (or an inf): no shift
            out = xp.log(xp.sum(xp.exp(x - top), axis=axes, keepdims=True)) + top
        return out if keepdims else xp.reshape(out, tuple(d for i, d in enumerate(x.shape) if i not in axes))

    def linear(self, x, w, b):
        """``x [M, D] @ w [D, K] + b [K]`` (the ``SeqLinear`` kernel with a bias; torch: ``addmm``).

        Args:
            x: ``[M, D]``.
            w: ``[D, K]``.
            b: ``[K]``.

        Returns:
            ``[M, K]``.
        """
        out = self.xp.matmul(x, w)
        out += b
        return out

    def global_norm(self, xs: list):
        """``sqrt(sum_i sum(x_i ** 2))``, 0-d, in the arrays' (one) dtype.

        The ``GlobalNorm`` kernel; torch: ``_foreach_norm``.

        Args:
            xs: The arrays.

        Returns:
            A 0-d array.
        """
        xp = self.xp
        total = None
        for x in xs:
            part = xp.sum(x * x)
            total = part if total is None else total + part
        return xp.asarray(xp.sqrt(total))        # 0-d array (NumPy's sums give scalars)

    def softmax(self, x, axis: int):
        """``exp(x) / sum(exp(x))`` along ``axis``, the row maximum subtracted first.

        The ``Softmax`` kernel; torch: its fused routine.

        Args:
            x: An array of this backend.
            axis: The axis.

        Returns:
            The softmax.
        """
        e = self.xp.exp(_shifted(self.xp, x, axis))
        e /= self.xp.sum(e, axis=axis, keepdims=True)
        return e

    def log_softmax(self, x, axis: int):
        """``x - log(sum(exp(x)))`` along ``axis``, computed from ``x`` minus its row maximum.

        Args:
            x: An array of this backend.
            axis: The axis.

        Returns:
            The log-softmax.
        """
        xp = self.xp
        shifted = _shifted(xp, x, axis)
        return shifted - xp.log(xp.sum(xp.exp(shifted), axis=axis, keepdims=True))

    def add_along_axis(self, x, indices, values, axis: int):
        """``x`` with ``values`` added at ``indices`` along ``axis``.

        The cross-entropy gradient's ``- dloss`` at each label.

        Args:
            x: The caller's own new array: a backend may change it in place.
            indices: Indices, distinct within each slice.
            values: Shaped as ``indices``.
            axis: The axis.

        Returns:
            The sum.
        """
        return x + self.put_along_axis(tuple(x.shape), indices, values, axis)

    def cumsum(self, x, axis: int):
        """Running sums along ``axis`` (the ``CumSum`` kernel).

        Args:
            x: An array of this backend.
            axis: The axis.

        Returns:
            An array of ``x``'s shape and dtype.
        """
        return self.xp.cumulative_sum(x, axis=axis, dtype=x.dtype)

    def cumprod(self, x, axis: int):
        """Running products along ``axis`` (the ``CumProd`` kernel).

        Args:
            x: An array of this backend.
            axis: The axis.

        Returns:
            An array of ``x``'s shape and dtype.
        """
        return self.xp.cumulative_prod(x, axis=axis, dtype=x.dtype)

    def sort_descending(self, x, axis: int):
        """int64 indices sorting ``x`` along ``axis`` largest first, equal values in index order.

        Args:
            x: An array of this backend.
            axis: The axis.

        Returns:
            The int64 indices.
        """
        return self.xp.astype(self.xp.argsort(x, axis=axis, descending=True, stable=True), self.xp.int64)

    def take_along_axis(self, x, indices, axis: int):
        """``numpy.take_along_axis``: ``out[..., i, ...] = x[..., indices[..., i, ...], ...]``.

        Args:
            x: An array of this backend.
            indices: Integer indices.
            axis: The axis.

        Returns:
            The gathered array.
        """
        return self.xp.take_along_axis(x, indices, axis=axis)

    def put_along_axis(self, shape, indices, values, axis: int):
        """Zeros of ``shape`` with ``values`` written at ``indices`` along ``axis`` (``numpy.put_along_axis``).

        The result has ``values``' dtype. This default goes through the host; the
        libraries' modules do it on the device.

        Args:
            shape: The result's shape.
            indices: Indices, distinct within each slice.
            values: The values.
            axis: The axis.

        Returns:
            The array.
        """
        out = np.zeros(tuple(shape), dtype=dtype_name(values.dtype))
        np.put_along_axis(out, self.to_numpy(indices), self.to_numpy(values), axis)
        return self.from_numpy(out)

    # -- keyed random draws (the same numbers on every backend) -------------------------
    def random_uniform(self, key, shape, low: float, high: float, dtype: str):
        """Uniform values in ``[low, high)`` from ``key``.

        Args:
            key: The keyed generator's key (a list of ints): the same key draws the same numbers on every backend.
            shape: The shape.
            low: The lower bound.
            high: The upper bound.
            dtype: A float dtype name.

        Returns:
            The array.
        """
        return keyed_random.uniform(self.xp, key, tuple(shape), low, high, self.dtype_of(dtype))

    def random_normal(self, key, shape, mean: float, std: float, dtype: str):
        """Normal(mean, std) values from ``key``.

        Args:
            key: The keyed generator's key (a list of ints): the same key draws the same numbers on every backend.
            shape: The shape.
            mean: The mean.
            std: The standard deviation.
            dtype: A float dtype name.

        Returns:
            The array.
        """
        return keyed_random.normal(self.xp, key, tuple(shape), mean, std, self.dtype_of(dtype))

    def random_keep_mask(self, key, shape, keep_prob: float):
        """Bernoulli(keep_prob) as a bool array; the same key gives the same mask everywhere.

        Args:
            key: The keyed generator's key (a list of ints): the same key draws the same numbers on every backend.
            shape: The shape.
            keep_prob: The probability of True.

        Returns:
            A bool array.
        """
        return keyed_random.keep_mask(self.xp, key, tuple(shape), keep_prob)

    def random_integers(self, key, shape, low: int, high: int):
        """int64 values uniform in ``[low, high)``.

        Args:
            key: The keyed generator's key (a list of ints): the same key draws the same numbers on every backend.
            shape: The shape.
            low: The smallest value.
            high: One past the largest.

        Returns:
            An int64 array.
        """
        return keyed_random.integers(self.xp, key, tuple(shape), low, high)

    def random_categorical(self, key, logits):
        """One category per row of float ``logits [N, C]``, drawn with probabilities ``softmax(logits)``.

        Args:
            key: The keyed generator's key (a list of ints): the same key draws the same numbers on every backend.
            logits: ``[N, C]``.

        Returns:
            int64 ``[N]``.
        """
        return keyed_random.categorical(self.xp, key, logits)


class Namespace:
    """An array namespace with a few functions replaced: creation on one device, faster aliases.

    Kernels call ``xp.zeros(shape, dtype=...)`` without a device; on a GPU that
    would create a host array, so with ``device`` the creation functions fill
    ``device=`` in. ``overrides`` replace functions by equivalents for the
    arguments retrograd passes (e.g. torch's own ``matmul``: shape rules make
    both operands one dtype, so array_api_compat's type promotion is not needed).
    Every other name is the wrapped namespace's, copied in once: looking a
    function up stays a plain attribute access.
    """

    CREATION = ("arange", "asarray", "empty", "eye", "full", "linspace", "ones", "zeros")

    def __init__(self, xp, device=None, **overrides):
        self.__dict__.update({k: v for k, v in vars(xp).items() if not k.startswith("__")})
        self.__name__ = getattr(xp, "__name__", type(xp).__name__)
        self.__dict__.update(overrides)
        if device is not None:
            for name in self.CREATION:
                setattr(self, name, _on_device(getattr(self, name), device))


def _on_device(create, device):
    def on_device(*args, **kwargs):
        kwargs.setdefault("device", device)
        return create(*args, **kwargs)
    return on_device
