"""cuDNN's fused LSTM and GRU through PyTorch's explicit ATen ops, for ``LSTMSequence`` and
``GRUSequence`` on CUDA tensors.

``aten::_cudnn_rnn`` runs one LSTM layer and direction (what ``torch.nn.LSTM``
runs on a GPU) with ``train=True``, which returns cuDNN's reserve (uint8);
``aten::_cudnn_rnn_backward`` takes it back (shared/notes on vendor kernels,
section 6; pytorch ``aten/src/ATen/native/cudnn/RNN.cpp``). What this module
handles:

* weights: cuDNN reads one flat buffer in its own layout.
  ``_cudnn_rnn_flatten_weight`` builds it from ``[w_ih [4H,D], w_hh [4H,H],
  b_ih, b_hh]`` (retrograd's ``[D,4H]`` weights transposed; gate order i, f,
  g, o is cuDNN's) and rebinds those four tensors as views into it, so they are
  fresh copies made here. It asks cuDNN for every gate's offset (1,600 host
  calls per LSTM layer in torch's v8 path), so it runs once per weight shape:
  the offsets it left in the rebound views are kept, and later calls copy the
  weights straight into a zeroed buffer at those offsets. The forward and the
  backward each build the buffer from the same values, so the workspace
  carries only the reserve. ``forget_bias`` is folded into the f block of
  ``b_ih``; without a bias ``b_ih`` is zeros (plus ``forget_bias``): cuDNN's
  LSTM always adds a bias.
* the reserve is uint8; the IR's workspace Var has x's dtype, so it is kept as
  a view in that dtype (padded to whole elements when its size is not a
  multiple, its exact size remembered per shape). The backward **changes the
  reserve** (the data pass writes into it before the weight pass reads it), so
  it runs on a copy: two gradient ops reading one forward (two
  ``rg.gradients`` of one program) get the same numbers.
* ``reverse``: cuDNN has no per-layer reverse for one direction; time is
  flipped around the call (and around ``dx`` in the backward).
* hx/cx must be contiguous ``[1, N, H]`` (cuDNN checks); x is made contiguous.
* float32 precision: cuDNN's RNN uses TF32 by default on Ampere and later
  (``torch.backends.cudnn.rnn.fp32_precision``), while the rest of a retrograd
  program runs torch's matmuls (IEEE float32 unless
  ``torch.backends.cuda.matmul`` allows TF32). The call runs with the RNN's
  precision set to what matmuls use, and puts torch's setting back after it,
  so the fused op gives the general path's numbers to rounding.

``available(torch)`` checks once that this torch has the ops and cuDNN; without
them the backend logs one line and ``LSTMSequence`` on CUDA runs its general
kernels.
"""
from __future__ import annotations

import logging

log = logging.getLogger("retrograd")

OPS = ("_cudnn_rnn", "_cudnn_rnn_backward", "_cudnn_rnn_flatten_weight")
LSTM_MODE = 2                 # cuDNN's CUDNN_LSTM (torch.backends.cudnn.rnn.get_cudnn_mode("LSTM"))
GRU_MODE = 3                  # CUDNN_GRU
WEIGHT_STRIDE = 4             # w_ih, w_hh, b_ih, b_hh per layer and direction
DTYPES = ("float32", "float64", "float16")    # what cuDNN's RNN takes (LSTMSequence: float32/64)


def available(torch) -> bool:
    """Whether this torch has cuDNN and the explicit cuDNN RNN ops (logs one line when not)."""
    missing = [name for name in OPS if not hasattr(torch.ops.aten, name)]
    if missing:
        why = f"no aten::{', aten::'.join(missing)}"
    elif not torch.backends.cudnn.is_available():
        why = "cuDNN is not available"
    else:
        return True
    log.info("retrograd: torch %s has %s; LSTM/GRU layers on CUDA use the general kernels", torch.__version__, why)
    return False


class _CuDNNLayer:
    """One recurrent layer and direction through cuDNN (``mode``, ``gates`` blocks per weight):
    the weight buffer, the reserve as a workspace, the precision; LSTM and GRU below."""
    mode: int
    gates: int

    def __init__(self, torch):
        self.torch = torch
        self.dtypes = tuple(getattr(torch, name) for name in DTYPES)
        self.reserve_bytes: dict[tuple, int] = {}     # shapes and dtype -> cuDNN's reserve size
        self.layouts: dict[tuple, tuple] = {}         # (D, H, dtype, device) -> (buffer size, offsets)
        self.precision = _RNNPrecision(torch)

    def applies(self, x) -> bool:
        """A CUDA tensor of a dtype cuDNN takes, at least one step and one example, cuDNN enabled."""
        return (x.device.type == "cuda" and x.dtype in self.dtypes and x.shape[0] > 0 and x.shape[1] > 0
                and self.torch.backends.cudnn.enabled)

    def buffer(self, w_ih, w_hh, b_ih, b_hh):
        """(weight list, flat cuDNN weight buffer) for one layer and direction; the list's tensors
        are views into the buffer. ``b_ih``/``b_hh`` are tensors (zeros where the layer has none)."""
        d, hidden = w_ih.shape[0], w_hh.shape[0]
        key = (d, hidden, w_ih.dtype, w_ih.device)
        layout = self.layouts.get(key)
        if layout is None:
            return self._flatten(key, w_ih, w_hh, b_ih, b_hh)
        size, offsets = layout
        flat = w_ih.new_zeros(size)
        listed = [flat[at:at + _numel(shape)].view(shape)
                  for at, shape in zip(offsets, _shapes(d, hidden, self.gates))]
        for view, value in zip(listed, (w_ih.t(), w_hh.t(), b_ih, b_hh)):
            view.copy_(value)
        return listed, flat

    def _flatten(self, key, w_ih, w_hh, b_ih, b_hh):
        """The buffer by ``_cudnn_rnn_flatten_weight``; its layout kept when the views show it."""
        torch, (d, hidden) = self.torch, key[:2]
        listed = [w_ih.t().clone(memory_format=torch.contiguous_format),
                  w_hh.t().clone(memory_format=torch.contiguous_format),
                  b_ih.clone(memory_format=torch.contiguous_format), b_hh.clone(memory_format=torch.contiguous_format)]
        flat = torch.ops.aten._cudnn_rnn_flatten_weight(listed, WEIGHT_STRIDE, d, self.mode, hidden, 0, 1, False,
                                                        False)
        layout = _layout_of(listed, flat, _shapes(d, hidden, self.gates))
        if layout is not None:
            self.layouts[key] = layout
        return listed, flat

    def run_forward(self, x, listed, flat, h0, c0, reverse: bool):
        """(y, hy, cy or None, workspace) of ``_cudnn_rnn`` (time flipped around it for ``reverse``)."""
        torch, hidden = self.torch, listed[1].shape[1]
        x_run = torch.flip(x, (0,)) if reverse else x.contiguous()
        y, hy, cy, reserve, _ = torch.ops.aten._cudnn_rnn(
            x_run, listed, WEIGHT_STRIDE, flat, _state(h0), None if c0 is None else _state(c0), self.mode, hidden,
            0, 1, False, 0.0, True, False, [], None)
        self.reserve_bytes[_key(x, hidden)] = reserve.numel()
        if reverse:
            y = torch.flip(y, (0,))
        return y, hy[0], (cy[0] if c0 is not None else None), self.as_workspace(reserve, x)

    def run_backward(self, x, listed, flat, h0, c0, h_all, workspace, dh_all, dh_last, dc_last, reverse: bool):
        """(dx, dh0, dc0 or None, [dw_ih, dw_hh, db_ih, db_hh]) of ``_cudnn_rnn_backward`` on a copy
        of the reserve."""
        torch, hidden = self.torch, listed[1].shape[1]
        if reverse:
            x_run, y, dy = (torch.flip(a, (0,)) for a in (x, h_all, dh_all))
        else:
            x_run, y, dy = x.contiguous(), h_all.contiguous(), dh_all
        reserve = self.reserve_of(workspace, _key(x, hidden))
        dx, dh0, dc0, dw = torch.ops.aten._cudnn_rnn_backward(
            x_run, listed, WEIGHT_STRIDE, flat, _state(h0), None if c0 is None else _state(c0), y, dy,
            dh_last[None], None if dc_last is None else dc_last[None], self.mode, hidden, 0, 1, False, 0.0, True,
            False, [], None, reserve, [True, True, c0 is not None, True])
        if reverse:
            dx = torch.flip(dx, (0,))
        return dx, dh0[0], (dc0[0] if c0 is not None else None), list(dw)

    def as_workspace(self, reserve, like):
        """The uint8 reserve as a vector of ``like``'s dtype (zero-padded to whole elements)."""
        pad = (-reserve.numel()) % like.element_size()
        if pad:
            reserve = self.torch.cat([reserve, reserve.new_zeros(pad)])
        return reserve.view(like.dtype)

    def reserve_of(self, workspace, key):
        """A copy of the reserve inside ``workspace``, at its exact size (the backward writes into it)."""
        raw = workspace.view(self.torch.uint8)
        size = self.reserve_bytes.get(key, raw.numel())
        return raw[:size].clone()


class CuDNNLSTM(_CuDNNLayer):
    """The fused forward and backward of one LSTM layer and direction on a CUDA tensor (cuDNN)."""
    mode, gates = LSTM_MODE, 4

    def weights(self, w_ih, w_hh, b, forget_bias: float):
        """(weight list, flat buffer): ``forget_bias`` folded into b_ih's f block, b_hh zeros."""
        hidden = w_hh.shape[0]
        b_ih = b.clone() if b is not None else w_hh.new_zeros(4 * hidden)
        if forget_bias:
            b_ih[hidden:2 * hidden] += forget_bias
        return self.buffer(w_ih, w_hh, b_ih, w_hh.new_zeros(4 * hidden))

    def forward(self, x, w_ih, w_hh, b, h0, c0, forget_bias: float, reverse: bool):
        with self.precision.like_matmul(x.dtype):
            listed, flat = self.weights(w_ih, w_hh, b, forget_bias)
            return self.run_forward(x, listed, flat, h0, c0, reverse)

    def backward(self, x, w_ih, w_hh, b, h0, c0, h_all, h_last, c_last, workspace, dh_all, dh_last, dc_last,
                 forget_bias: float, reverse: bool):
        with self.precision.like_matmul(x.dtype):
            listed, flat = self.weights(w_ih, w_hh, b, forget_bias)
            dx, dh0, dc0, dw = self.run_backward(x, listed, flat, h0, c0, h_all, workspace, dh_all, dh_last,
                                                 dc_last, reverse)
        dw_ih, dw_hh, db, _ = dw
        return dx, dw_ih.t(), dw_hh.t(), (db if b is not None else None), dh0, dc0


class CuDNNGRU(_CuDNNLayer):
    """The fused forward and backward of one GRU layer and direction on a CUDA tensor (cuDNN's GRU
    is torch.nn.GRU's: gate order r, z, n with ``b_hn`` inside ``r * (h U_n + b_hn)``)."""
    mode, gates = GRU_MODE, 3

    def weights(self, w_ih, w_hh, b_ih, b_hh):
        if b_ih is None:                    # cuDNN's GRU always adds its biases: zeros stand in
            b_ih = b_hh = w_hh.new_zeros(3 * w_hh.shape[0])
        return self.buffer(w_ih, w_hh, b_ih, b_hh)

    def forward(self, x, w_ih, w_hh, b_ih, b_hh, h0, reverse: bool):
        with self.precision.like_matmul(x.dtype):
            listed, flat = self.weights(w_ih, w_hh, b_ih, b_hh)
            y, hy, _, workspace = self.run_forward(x, listed, flat, h0, None, reverse)
        return y, hy, workspace

    def backward(self, x, w_ih, w_hh, b_ih, b_hh, h0, h_all, h_last, workspace, dh_all, dh_last, reverse: bool):
        with self.precision.like_matmul(x.dtype):
            listed, flat = self.weights(w_ih, w_hh, b_ih, b_hh)
            dx, dh0, _, dw = self.run_backward(x, listed, flat, h0, None, h_all, workspace, dh_all, dh_last, None,
                                               reverse)
        dw_ih, dw_hh, db_ih, db_hh = dw
        if b_ih is None:
            db_ih = db_hh = None
        return dx, dw_ih.t(), dw_hh.t(), db_ih, db_hh, dh0


def _shapes(d: int, hidden: int, gates: int) -> tuple:
    return (gates * hidden, d), (gates * hidden, hidden), (gates * hidden,), (gates * hidden,)


def _numel(shape) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


def _layout_of(listed, flat, shapes):
    """(buffer size, offsets) when each listed tensor is a dense view of ``shapes`` into ``flat``
    (how ``_cudnn_rnn_flatten_weight`` leaves them), without overlaps; None otherwise."""
    storage = flat.untyped_storage().data_ptr()
    offsets, spans = [], []
    for w, shape in zip(listed, shapes):
        if (w.untyped_storage().data_ptr() != storage or tuple(w.shape) != shape or not w.is_contiguous()):
            return None
        at = w.storage_offset() - flat.storage_offset()
        if at < 0 or at + _numel(shape) > flat.numel():
            return None
        offsets.append(at)
        spans.append((at, at + _numel(shape)))
    spans.sort()
    if any(end > start for (_, end), (start, _) in zip(spans, spans[1:])):
        return None
    return flat.numel(), tuple(offsets)


def _state(s):
    """``[N, H]`` as the contiguous ``[1, N, H]`` cuDNN wants."""
    return s[None].contiguous()


def _key(x, hidden: int) -> tuple:
    return (tuple(x.shape), hidden, x.dtype, x.device)


class _RNNPrecision:
    """Runs cuDNN's float32 RNN at the precision torch's matmuls use (IEEE unless TF32 is allowed).

    torch >= 2.9 keeps it per op (``torch.backends.cudnn.rnn.fp32_precision``, default "tf32");
    where these getters are missing, cuDNN's own default stays."""

    def __init__(self, torch):
        self.torch = torch
        c = torch._C
        self.get = getattr(c, "_get_fp32_precision_getter", None)
        self.set = getattr(c, "_set_fp32_precision_setter", None)

    def wanted(self) -> str:
        """"tf32" when torch's CUDA matmuls may use TF32, else "ieee"."""
        try:
            return "tf32" if self.torch._C._get_cublas_allow_tf32() else "ieee"
        except (RuntimeError, AttributeError):     # mixed legacy / new flags: the new one decides
            return "tf32" if self.get("cuda", "matmul") == "tf32" else "ieee"

    def like_matmul(self, dtype):
        if dtype != self.torch.float32 or self.get is None or self.set is None:
            return _NOTHING
        want, before = self.wanted(), self.get("cuda", "rnn")
        return _NOTHING if want == before else _Setting(self.set, before, want)


class _Setting:
    """Sets cuDNN's RNN float32 precision for a ``with`` block and puts the previous one back."""

    def __init__(self, setter, before: str, inside: str):
        self.setter, self.before, self.inside = setter, before, inside

    def __enter__(self):
        self.setter("cuda", "rnn", self.inside)

    def __exit__(self, *exc):
        self.setter("cuda", "rnn", self.before)


class _Nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


_NOTHING = _Nothing()
