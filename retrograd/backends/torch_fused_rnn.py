"""oneDNN's fused LSTM through PyTorch's explicit ATen ops, for the ``LSTMSequence`` op.

``aten::mkldnn_rnn_layer`` runs one LSTM layer and direction (oneDNN's RNN
primitive, what ``torch.nn.LSTM`` runs on CPU) and returns a workspace;
``aten::mkldnn_rnn_layer_backward`` takes it back (shared/notes on vendor
kernels). The pitfalls handled here: the forward must run under grad mode or
it returns no workspace (programs run under ``inference_mode``); x, h0, c0
must be contiguous (else silently wrong); only float32 works; the workspace is
uint8, kept as a float32 view (padded to whole floats) because the IR's
workspace Var is in x's dtype. ``forget_bias`` is folded into the f gate's
bias, and retrograd's ``[D, 4H]`` weights go in as ``[4H, D]`` views (gate
order i, f, g, o is oneDNN's).

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

    def applies(self, x) -> bool:
        """float32 on the CPU, with at least one step and one example (oneDNN fails on empty ones)."""
        return x.dtype == self.torch.float32 and x.device.type == "cpu" and x.shape[0] > 0 and x.shape[1] > 0

    def _grad_mode(self):
        torch = self.torch
        return _Both(torch.inference_mode(False), torch.enable_grad())

    def _biases(self, w_hh, b, forget_bias: float):
        torch, hidden = self.torch, w_hh.shape[0]
        zeros = torch.zeros(4 * hidden, dtype=w_hh.dtype)
        b_ih = b.clone() if b is not None else zeros.clone()
        if forget_bias:
            b_ih[hidden:2 * hidden] += forget_bias
        return b_ih, zeros

    def forward(self, x, w_ih, w_hh, b, h0, c0, forget_bias: float, reverse: bool):
        torch, hidden = self.torch, w_hh.shape[0]
        b_ih, b_hh = self._biases(w_hh, b, forget_bias)
        with self._grad_mode():
            y, hy, cy, ws = torch.ops.aten.mkldnn_rnn_layer(
                x.contiguous(), w_ih.t(), w_hh.t(), b_ih, b_hh, h0.contiguous(), c0.contiguous(), reverse, [],
                LSTM_MODE, hidden, 1, True, False, False, True)
        pad = (-ws.numel()) % 4
        if pad:
            ws = torch.cat([ws, torch.zeros(pad, dtype=ws.dtype)])
        return y, hy, cy, ws.view(torch.float32)

    def backward(self, x, w_ih, w_hh, b, h0, c0, h_all, h_last, c_last, workspace, dh_all, dh_last, dc_last,
                 forget_bias: float, reverse: bool):
        torch, hidden = self.torch, w_hh.shape[0]
        b_ih, b_hh = self._biases(w_hh, b, forget_bias)
        with self._grad_mode():
            dx, dw_ih, dw_hh, db, _, dh0, dc0 = torch.ops.aten.mkldnn_rnn_layer_backward(
                x.contiguous(), w_ih.t(), w_hh.t(), b_ih, b_hh, h0.contiguous(), c0.contiguous(), h_all,
                h_last, c_last, dh_all, dh_last, dc_last, reverse, LSTM_MODE, hidden, 1, True, True, False, [],
                False, workspace.view(torch.uint8))
        return dx, dw_ih.t(), dw_hh.t(), (db if b is not None else None), dh0, dc0


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
