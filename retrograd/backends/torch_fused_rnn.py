"""oneDNN's fused LSTM through PyTorch's explicit ATen ops, for the ``LSTMSequence`` op.

``aten::mkldnn_rnn_layer`` runs one LSTM layer and direction (oneDNN's RNN
primitive, what ``torch.nn.LSTM`` runs on CPU) and returns a workspace;
``aten::mkldnn_rnn_layer_backward`` takes it back (shared/notes on vendor
kernels). The pitfalls handled here: the forward must run under grad mode or
it returns no workspace (programs run under ``inference_mode``); x, h0, c0
must be contiguous (else silently wrong); only float32 works; the workspace is
uint8, kept as a float32 view (padded to whole floats) because the IR's
workspace Var is in x's dtype. ``forget_bias`` is folded into the f gate's
bias (a copy of ``b`` only then; ``b_hh`` is one cached zero vector that the
kernels only read). Gate order i, f, g, o is oneDNN's.

Weights: oneDNN wants ``[4H, D]``; retrograd stores ``[D, 4H]``. A transposed
view makes each kernel copy it (``.contiguous()`` inside ATen), forward and
backward alike, so the forward makes the ``[4H, D]`` copies itself and hangs
them on the workspace tensor (``WEIGHTS_ATTR``, with the weight tensors they
came from; free when a weight already is a transposed view of a ``[4H, D]`` buffer, as the
torch backend's fused Adam leaves the weights it updates); the backward uses them when it is
handed the same weight tensors,
and falls back to views otherwise (a workspace that went through NumPy, or a
weight rewritten between the two ops). They are not cached across runs: a
weight may change in place between runs (a fed NumPy array shares its memory)
and inference tensors carry no version counter to notice it.

Inside a compiled region (``Executor(compile=True)``, ``torch.compiler.is_compiling()``) the two
calls go through two opaque custom ops (``retrograd::onednn_lstm_layer`` / ``_backward``,
``compiled_ops``): the compiler cannot trace the grad-mode switch the raw calls need (a graph break
would cut the region into pieces), so each is one extern call in the one compiled graph, and the
``[4H, D]`` weight copies are ordinary traced code (none where the weights already are transposed
views of such buffers) shared by the two. The workspace's size is oneDNN's business: a
data-dependent size to the compiler.

``available(torch)`` checks once that this torch has the ops; without them
(an older or a stripped build) the backend logs one line and ``LSTMSequence``
runs its general kernels.
"""
from __future__ import annotations

import logging

log = logging.getLogger("retrograd")

OPS = ("mkldnn_rnn_layer", "mkldnn_rnn_layer_backward")
LSTM_MODE = 2          # ideep's rnn_kind for LSTM (the cuDNN numbering)


def available(torch) -> bool:
    """Whether this torch has oneDNN and the explicit LSTM layer ops (logs once when not)."""
    missing = [name for name in OPS if not hasattr(torch.ops.aten, name)]
    if not missing and torch.backends.mkldnn.is_available():
        return True
    why = f"no aten::{', aten::'.join(missing)}" if missing else "oneDNN is not available"
    log.info("retrograd: torch %s has %s; LSTM layers use the general kernels", torch.__version__, why)
    return False


class OneDNNLSTM:
    """The fused forward and backward of one LSTM layer and direction on a CPU float32 tensor."""

    def __init__(self, torch):
        self.torch = torch
        self._zeros: dict[int, object] = {}          # 4H -> a zero bias the kernels only read

    def applies(self, x) -> bool:
        """float32 on the CPU, with at least one step and one example (oneDNN fails on empty ones)."""
        return x.dtype == self.torch.float32 and x.device.type == "cpu" and x.shape[0] > 0 and x.shape[1] > 0

    def _grad_mode(self):
        torch = self.torch
        return _Both(torch.inference_mode(False), torch.enable_grad())

    def _zero_bias(self, size: int):
        zeros = self._zeros.get(size)
        if zeros is None:
            zeros = self._zeros[size] = self.torch.zeros(size, dtype=self.torch.float32)
        return zeros

    def _biases(self, hidden: int, b, forget_bias: float):
        """(b_ih, b_hh): oneDNN adds their sum; ``b`` itself unless ``forget_bias`` shifts the f gate."""
        zeros = self._zero_bias(4 * hidden)
        if not forget_bias:
            return (b if b is not None else zeros), zeros
        b_ih = b.clone() if b is not None else zeros.clone()
        b_ih[hidden:2 * hidden] += forget_bias
        return b_ih, zeros

    def forward(self, x, w_ih, w_hh, b, h0, c0, forget_bias: float, reverse: bool):
        torch, hidden = self.torch, w_hh.shape[0]
        if torch.compiler.is_compiling():
            return self._compiled_forward(x, w_ih, w_hh, b, h0, c0, forget_bias, reverse)
        b_ih, b_hh = self._biases(hidden, b, forget_bias)
        w_ih_t, w_hh_t = w_ih.t().contiguous(), w_hh.t().contiguous()
        with self._grad_mode():
            y, hy, cy, ws = torch.ops.aten.mkldnn_rnn_layer(
                x.contiguous(), w_ih_t, w_hh_t, b_ih, b_hh, h0.contiguous(), c0.contiguous(), reverse, [],
                LSTM_MODE, hidden, 1, True, False, False, True)
        pad = (-ws.numel()) % 4
        if pad:
            ws = torch.cat([ws, torch.zeros(pad, dtype=ws.dtype)])
        workspace = ws.view(torch.float32)
        setattr(workspace, WEIGHTS_ATTR, (w_ih, w_hh, w_ih_t, w_hh_t))
        return y, hy, cy, workspace

    def backward(self, x, w_ih, w_hh, b, h0, c0, h_all, h_last, c_last, workspace, dh_all, dh_last, dc_last,
                 forget_bias: float, reverse: bool):
        torch, hidden = self.torch, w_hh.shape[0]
        if torch.compiler.is_compiling():
            return self._compiled_backward(x, w_ih, w_hh, b, h0, c0, h_all, h_last, c_last, workspace, dh_all,
                                           dh_last, dc_last, forget_bias, reverse)
        b_ih, b_hh = self._biases(hidden, b, forget_bias)
        w_ih_t, w_hh_t = forward_weights(workspace, w_ih, w_hh)
        with self._grad_mode():
            dx, dw_ih, dw_hh, db, _, dh0, dc0 = torch.ops.aten.mkldnn_rnn_layer_backward(
                x.contiguous(), w_ih_t, w_hh_t, b_ih, b_hh, h0.contiguous(), c0.contiguous(), h_all,
                h_last, c_last, dh_all, dh_last, dc_last, reverse, LSTM_MODE, hidden, 1, True, True, False, [],
                False, workspace.view(torch.uint8))
        return dx, dw_ih.t(), dw_hh.t(), (db if b is not None else None), dh0, dc0

    # -- inside a compiled region: the same calls as opaque custom ops ---------------------------------
    def _traced_biases(self, hidden: int, b, x, forget_bias: float):
        """(b_ih, b_hh) as traced code (no cached tensor: the compiler would guard on it)."""
        zeros = self.torch.zeros(4 * hidden, dtype=x.dtype)
        b_ih = zeros if b is None else b
        if forget_bias:
            b_ih = self.torch.cat([b_ih[:hidden], b_ih[hidden:2 * hidden] + forget_bias, b_ih[2 * hidden:]])
        return b_ih, zeros

    def _compiled_forward(self, x, w_ih, w_hh, b, h0, c0, forget_bias: float, reverse: bool):
        hidden = w_hh.shape[0]
        b_ih, b_hh = self._traced_biases(hidden, b, x, forget_bias)
        layer, _ = compiled_ops(self.torch)
        return layer(x.contiguous(), w_ih.t().contiguous(), w_hh.t().contiguous(), b_ih, b_hh,
                     h0.contiguous(), c0.contiguous(), reverse)

    def _compiled_backward(self, x, w_ih, w_hh, b, h0, c0, h_all, h_last, c_last, workspace, dh_all, dh_last,
                           dc_last, forget_bias: float, reverse: bool):
        hidden = w_hh.shape[0]
        b_ih, b_hh = self._traced_biases(hidden, b, x, forget_bias)
        _, layer_backward = compiled_ops(self.torch)
        dx, dw_ih, dw_hh, db, dh0, dc0 = layer_backward(
            x.contiguous(), w_ih.t().contiguous(), w_hh.t().contiguous(), b_ih, b_hh, h0.contiguous(),
            c0.contiguous(), h_all.contiguous(), h_last.contiguous(), c_last.contiguous(), workspace,
            dh_all.contiguous(), dh_last.contiguous(), dc_last.contiguous(), reverse)
        return dx, dw_ih.t(), dw_hh.t(), (db if b is not None else None), dh0, dc0


_COMPILED_OPS: list = []


def compiled_ops(torch):
    """The two custom ops (``retrograd::onednn_lstm_layer``, ``retrograd::onednn_lstm_layer_backward``)
    a compiled region calls, defined on first use: each runs the ATen call under grad mode and
    tells the compiler its outputs' shapes (the workspace's size is data-dependent to it).

    Example::

        layer, layer_backward = compiled_ops(torch)
        y, hy, cy, ws = layer(x, w_ih_t, w_hh_t, b_ih, b_hh, h0, c0, False)     # weights [4H, D]
    """
    if _COMPILED_OPS:
        return _COMPILED_OPS[0]

    def grad_mode():
        return _Both(torch.inference_mode(False), torch.enable_grad())

    # schemas spelled out: this module's annotations are strings (``from __future__ import annotations``)
    @torch.library.custom_op("retrograd::onednn_lstm_layer", mutates_args=(), schema=(
        "(Tensor x, Tensor w_ih_t, Tensor w_hh_t, Tensor b_ih, Tensor b_hh, Tensor h0, Tensor c0, bool reverse)"
        " -> (Tensor, Tensor, Tensor, Tensor)"))
    def layer(x, w_ih_t, w_hh_t, b_ih, b_hh, h0, c0, reverse):
        with grad_mode():
            y, hy, cy, ws = torch.ops.aten.mkldnn_rnn_layer(
                x, w_ih_t, w_hh_t, b_ih, b_hh, h0, c0, reverse, [], LSTM_MODE, w_hh_t.shape[1], 1, True, False,
                False, True)
        pad = (-ws.numel()) % 4              # as the eager path: a float32 view, padded to whole floats
        ws = torch.cat([ws.detach(), torch.zeros(pad, dtype=ws.dtype)]) if pad else ws.detach()
        return y.detach().contiguous(), hy.detach().contiguous(), cy.detach().contiguous(), ws.view(torch.float32)

    @layer.register_fake
    def _(x, w_ih_t, w_hh_t, b_ih, b_hh, h0, c0, reverse):
        size = torch.library.get_ctx().new_dynamic_size()
        return (x.new_empty((x.shape[0], x.shape[1], h0.shape[1])), h0.new_empty(h0.shape),
                c0.new_empty(c0.shape), x.new_empty((size,), dtype=torch.float32))

    @torch.library.custom_op("retrograd::onednn_lstm_layer_backward", mutates_args=(), schema=(
        "(Tensor x, Tensor w_ih_t, Tensor w_hh_t, Tensor b_ih, Tensor b_hh, Tensor h0, Tensor c0, Tensor h_all,"
        " Tensor h_last, Tensor c_last, Tensor workspace, Tensor dh_all, Tensor dh_last, Tensor dc_last,"
        " bool reverse) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)"))
    def layer_backward(x, w_ih_t, w_hh_t, b_ih, b_hh, h0, c0, h_all, h_last, c_last, workspace, dh_all, dh_last,
                       dc_last, reverse):
        with grad_mode():
            out = torch.ops.aten.mkldnn_rnn_layer_backward(
                x, w_ih_t, w_hh_t, b_ih, b_hh, h0, c0, h_all, h_last, c_last, dh_all, dh_last, dc_last, reverse,
                LSTM_MODE, w_hh_t.shape[1], 1, True, True, False, [], False, workspace.view(torch.uint8))
        dx, dw_ih, dw_hh, db, _, dh0, dc0 = out
        return tuple(t.detach().contiguous() for t in (dx, dw_ih, dw_hh, db, dh0, dc0))

    @layer_backward.register_fake
    def _(x, w_ih_t, w_hh_t, b_ih, b_hh, h0, c0, h_all, h_last, c_last, workspace, dh_all, dh_last, dc_last,
          reverse):
        return (x.new_empty(x.shape), w_ih_t.new_empty(w_ih_t.shape), w_hh_t.new_empty(w_hh_t.shape),
                b_ih.new_empty(b_ih.shape), h0.new_empty(h0.shape), c0.new_empty(c0.shape))

    _COMPILED_OPS.append((layer, layer_backward))
    return _COMPILED_OPS[0]


WEIGHTS_ATTR = "retrograd_onednn_weights"


def forward_weights(workspace, w_ih, w_hh):
    """The ``[4H, D]`` weights the forward ran with, when it was handed these very weight tensors;
    else transposed views (the kernel then copies them).

    Example::

        y, hy, cy, ws = lstm.forward(x, w_ih, w_hh, b, h0, c0, 0.0, False)
        w_ih_t, w_hh_t = forward_weights(ws, w_ih, w_hh)     # the forward's contiguous copies
    """
    kept = getattr(workspace, WEIGHTS_ATTR, None)
    if kept is not None and kept[0] is w_ih and kept[1] is w_hh:
        return kept[2], kept[3]
    return w_ih.t(), w_hh.t()


class _Both:
    """Two context managers entered in order (``contextlib.ExitStack`` costs more per call)."""

    def __init__(self, first, second):
        self.first, self.second = first, second

    def __enter__(self):
        self.first.__enter__()
        self.second.__enter__()

    def __exit__(self, *exc):
        self.second.__exit__(*exc)
        self.first.__exit__(*exc)
