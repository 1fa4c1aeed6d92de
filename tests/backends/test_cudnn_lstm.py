"""LSTMSequence on the torch backend's CUDA device: cuDNN through aten::_cudnn_rnn / _cudnn_rnn_backward
(retrograd/backends/torch_cudnn_rnn.py).

On a GPU: the forward outputs and every gradient equal the NumPy general path (and torch.nn.LSTM in
float64), forward and reverse, with and without bias, with forget_bias, eagerly and replayed as a CUDA
graph, and the cuDNN branch is the one taken. Everywhere: the plumbing around the three ATen ops
(weights transposed and flattened, forget_bias folded in, time flipped for ``reverse``, the uint8
reserve carried in a float workspace and handed back at its exact size, the reserve copied before
the backward writes into it, the float32 precision set and put back), run through the executor with
stand-ins for the ops that compute in plain torch and check what cuDNN checks; the availability
check and the backend's choice of kernel.
"""
from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest

import retrograd as rg
from retrograd.backends import to_numpy

torch = pytest.importorskip("torch")
from retrograd.backends import torch_cudnn_rnn  # noqa: E402  (imports torch lazily; after the skip)

D, H = 4, 3
NEEDS_GPU = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="needs a CUDA GPU (torch.cuda.is_available() is False here)")


def _values(r, steps, batch, dtype, bias=True, d=D, h=H):
    vals = {"x": r.standard_normal((steps, batch, d)), "w_ih": r.standard_normal((d, 4 * h)) * 0.5,
            "w_hh": r.standard_normal((h, 4 * h)) * 0.5, "b": r.standard_normal(4 * h) * 0.5,
            "h0": r.standard_normal((batch, h)), "c0": r.standard_normal((batch, h))}
    if not bias:
        del vals["b"]
    return {k: v.astype(dtype) for k, v in vals.items()}


def _program(vals, dtype, fused, forget_bias=0.7, reverse=False, twice=False):
    """(main, startup, fetches): h_all, h_last, c_all, c_last and the gradients of every input (twice:
    a second ``rg.gradients`` of the same forward, so two gradient ops read one workspace)."""
    d, h = vals["x"].shape[2], vals["w_hh"].shape[0]
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        v = {k: rg.data(k, [-1, -1, d] if k == "x" else [-1, h] if k in ("h0", "c0") else list(a.shape), dtype,
                        stop_gradient=False) for k, a in vals.items()}
        if fused:
            h_all, h_last, c_all, c_last = rg.lstm_sequence(v["x"], v["w_ih"], v["w_hh"], v.get("b"), v["h0"],
                                                            v["c0"], forget_bias, reverse)
        else:
            x_proj = rg.seq_linear(v["x"], v["w_ih"], v.get("b"))
            (h_all, c_all), (h_last, c_last) = rg.recurrent(
                lambda xs, st: list(rg.lstm_unit(xs[0], st[1], forget_bias, h_gates=rg.matmul(st[0], v["w_hh"]))),
                [x_proj], [v["h0"], v["c0"]], reverse=reverse)
        loss = rg.sum(h_all * h_all) + rg.sum(rg.sin(h_last)) + rg.sum(c_last * 3.0)
        fetches = [h_all, h_last, c_last] + rg.gradients(loss, list(v.values()))
        if twice:
            fetches += rg.gradients(loss * 1.0, list(v.values()))
    return main, startup, fetches


def _run(vals, dtype, fused, exe, **kwargs):
    main, startup, fetches = _program(vals, dtype, fused, **kwargs)
    exe.run(startup)
    return [to_numpy(a) for a in exe.run(main, feed=vals, fetch_list=fetches)]


def _general(vals, dtype, **kwargs):
    return _run(vals, dtype, False, rg.Executor(), **kwargs)


def _assert_equal(ours, want, dtype):
    tol = dict(rtol=5e-5, atol=5e-5) if dtype == "float32" else dict(rtol=1e-10, atol=1e-12)
    assert len(ours) == len(want)
    for i, (a, b) in enumerate(zip(ours, want)):
        np.testing.assert_allclose(a, b, err_msg=f"fetch {i}", **tol)


# --- stand-ins for the three ATen ops: plain torch on the CPU, checking what cuDNN needs -----------

def _lstm(x, w_ih, w_hh, b_ih, b_hh, h, c):
    """PyTorch-layout LSTM (gate order i, f, g, o): (y [T,N,H], h_T, c_T)."""
    hidden, ys = w_hh.shape[1], []
    for x_t in x:
        gates = x_t @ w_ih.T + b_ih + h @ w_hh.T + b_hh
        i, f, g, o = (gates[:, k * hidden:(k + 1) * hidden] for k in range(4))
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        ys.append(h)
    return torch.stack(ys), h, c


class FakeCuDNN:
    """``_cudnn_rnn_flatten_weight``, ``_cudnn_rnn`` and ``_cudnn_rnn_backward`` for CPU tensors.

    The flat buffer has its own layout (b_hh, w_ih, a gap, w_hh, b_ih, a gap), and the flatten rebinds
    the listed tensors as views into it (``rebind``) as torch's does; the weights are read from the
    buffer only (as cuDNN does). The reserve is y's bytes plus ``ODD`` bytes (a size no float
    divides); the backward checks that it gets that reserve intact at its exact size and then
    overwrites it (cuDNN's data pass writes into it)."""

    ODD = 3
    ORDER, GAPS = (3, 0, 1, 2), (0, 0, 5, 0, 2)     # buffer order of [w_ih, w_hh, b_ih, b_hh]; gap before each

    def __init__(self, rebind=True):
        self.rebind = rebind
        self.calls, self.precisions, self.flattens = [], [], 0

    @classmethod
    def _offsets(cls, d, hidden):
        """(buffer size, offset of each of w_ih, w_hh, b_ih, b_hh)."""
        sizes = [4 * hidden * d, 4 * hidden * hidden, 4 * hidden, 4 * hidden]
        offsets, at = [0] * 4, 0
        for gap, i in zip(cls.GAPS, cls.ORDER):
            at += gap
            offsets[i] = at
            at += sizes[i]
        return at + cls.GAPS[-1], offsets

    def _cudnn_rnn_flatten_weight(self, listed, stride, d, mode, hidden, proj, layers, batch_first, bidirectional):
        assert (stride, mode, proj, layers, batch_first, bidirectional) == (4, 2, 0, 1, False, False)
        assert [tuple(w.shape) for w in listed] == [(4 * hidden, d), (4 * hidden, hidden), (4 * hidden,),
                                                    (4 * hidden,)]
        assert all(w.is_contiguous() for w in listed)
        self.flattens += 1
        size, offsets = self._offsets(d, hidden)
        flat = listed[0].new_zeros(size)
        for w, at in zip(listed, offsets):
            view = flat[at:at + w.numel()].view(w.shape)
            view.copy_(w)
            if self.rebind:
                w.set_(view)
        return flat

    def _unflatten(self, flat, d, hidden):
        size, offsets = self._offsets(d, hidden)
        assert flat.numel() == size
        shapes = [(4 * hidden, d), (4 * hidden, hidden), (4 * hidden,), (4 * hidden,)]
        return [flat[at:at + int(np.prod(shape))].view(shape) for at, shape in zip(offsets, shapes)]

    def _check(self, x, listed, stride, flat, hx, cx, mode, hidden, proj, layers, batch_first, dropout, train,
               bidirectional, batch_sizes, dropout_state):
        steps, batch, d = x.shape
        assert x.is_contiguous() and (stride, mode, proj, layers) == (4, 2, 0, 1)
        assert (batch_first, dropout, train, bidirectional, list(batch_sizes), dropout_state) == (
            False, 0.0, True, False, [], None)
        for state in (hx, cx):
            assert tuple(state.shape) == (1, batch, hidden) and state.is_contiguous()
        if self.rebind:                   # torch's flatten leaves the list as views into the buffer
            for w, view in zip(listed, self._unflatten(flat, d, hidden)):
                assert w.data_ptr() == view.data_ptr() and w.shape == view.shape
        self.precisions.append(torch._C._get_fp32_precision_getter("cuda", "rnn"))

    def _cudnn_rnn(self, x, listed, stride, flat, hx, cx, mode, hidden, *rest):
        self.calls.append("forward")
        self._check(x, listed, stride, flat, hx, cx, mode, hidden, *rest)
        y, hy, cy = _lstm(x, *self._unflatten(flat, x.shape[2], hidden), hx[0], cx[0])
        reserve = torch.cat([y.reshape(-1).to(torch.float64).view(torch.uint8),
                             torch.full((self.ODD,), 7, dtype=torch.uint8)])
        return y, hy[None], cy[None], reserve, flat

    def _cudnn_rnn_backward(self, x, listed, stride, flat, hx, cx, y, dy, dhy, dcy, mode, hidden, proj, layers,
                            batch_first, dropout, train, bidirectional, batch_sizes, dropout_state, reserve, mask):
        self.calls.append("backward")
        self._check(x, listed, stride, flat, hx, cx, mode, hidden, proj, layers, batch_first, dropout, train,
                    bidirectional, batch_sizes, dropout_state)
        assert list(mask) == [True, True, True, True]
        assert reserve.dtype == torch.uint8 and reserve.numel() == 8 * y.numel() + self.ODD
        assert torch.equal(reserve[-self.ODD:], torch.full((self.ODD,), 7, dtype=torch.uint8)), "reserve overwritten"
        kept = reserve[:8 * y.numel()].view(torch.float64).reshape(y.shape)
        torch.testing.assert_close(kept, y.to(torch.float64), rtol=0, atol=0)    # y: the forward's, in its order
        with torch.inference_mode(False), torch.enable_grad():
            ins = [a.clone().requires_grad_(True) for a in (x, *self._unflatten(flat, x.shape[2], hidden), hx[0],
                                                             cx[0])]
            y2, hy, cy = _lstm(*ins)
            grads = torch.autograd.grad([y2, hy, cy], ins, [dy, dhy[0], dcy[0]])
        reserve.zero_()
        dx, dw_ih, dw_hh, db_ih, db_hh, dhx, dcx = (g.detach().clone() for g in grads)
        return dx, dhx[None], dcx[None], [dw_ih, dw_hh, db_ih, db_hh]


class TorchWith:
    """torch with ``torch.ops.aten`` replaced by the stand-ins."""

    def __init__(self, aten):
        self.ops = SimpleNamespace(aten=aten)

    def __getattr__(self, name):
        return getattr(torch, name)


def _fake_executor(rebind=True):
    """A CPU torch executor whose LSTMSequence runs CuDNNLSTM over the stand-ins."""
    fake = FakeCuDNN(rebind)
    exe = rg.Executor(backend="torch")
    fused = torch_cudnn_rnn.CuDNNLSTM(TorchWith(fake))
    fused.applies = lambda x: True
    exe.backend.cudnn_lstm = fused
    return exe, fake


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("reverse,bias,forget_bias", [(False, True, 0.0), (True, True, 0.7), (False, False, 0.7),
                                                      (True, False, 0.0)])
def test_cudnn_plumbing_gives_the_general_numbers(dtype, reverse, bias, forget_bias):
    vals = _values(np.random.default_rng(3), 5, 2, dtype, bias)
    exe, fake = _fake_executor()
    ours = _run(vals, dtype, True, exe, forget_bias=forget_bias, reverse=reverse)
    assert fake.calls == ["forward", "backward"]
    _assert_equal(ours, _general(vals, dtype, forget_bias=forget_bias, reverse=reverse), dtype)


@pytest.mark.parametrize("rebind", [True, False])
def test_the_weight_layout_is_learned_once_per_shape(rebind):
    """The first flatten's views give the buffer layout: later calls fill a buffer without it (when the
    flatten does not rebind the list, every call flattens)."""
    vals = _values(np.random.default_rng(2), 4, 2, "float64")
    exe, fake = _fake_executor(rebind)
    want = _general(vals, "float64")
    main, startup, fetches = _program(vals, "float64", True)
    exe.run(startup)
    for _ in range(2):
        _assert_equal([to_numpy(a) for a in exe.run(main, feed=vals, fetch_list=fetches)], want, "float64")
    assert fake.calls == ["forward", "backward"] * 2
    assert fake.flattens == (1 if rebind else 4)
    assert len(exe.backend.cudnn_lstm.layouts) == (1 if rebind else 0)


def test_two_gradient_ops_on_one_workspace_get_the_same_numbers():
    """cuDNN's backward writes into its reserve: each gradient op runs on a copy."""
    vals = _values(np.random.default_rng(4), 4, 3, "float64")
    exe, fake = _fake_executor()
    ours = _run(vals, "float64", True, exe, twice=True)
    assert fake.calls == ["forward", "backward", "backward"]
    _assert_equal(ours, _general(vals, "float64", twice=True), "float64")


def test_float32_runs_at_the_matmul_precision_and_puts_torch_setting_back():
    before = torch._C._get_fp32_precision_getter("cuda", "rnn")
    vals = _values(np.random.default_rng(5), 3, 2, "float32")
    exe, fake = _fake_executor()
    _run(vals, "float32", True, exe)
    _run(_values(np.random.default_rng(5), 3, 2, "float64"), "float64", True, exe)
    assert fake.precisions == ["ieee"] * 2 + [before] * 2      # float64: not touched
    assert torch._C._get_fp32_precision_getter("cuda", "rnn") == before
    assert isinstance(torch.backends.cudnn.allow_tf32, bool)    # torch's flags stay consistent


def test_the_workspace_keeps_the_reserve_in_the_input_dtype():
    fused = torch_cudnn_rnn.CuDNNLSTM(torch)
    reserve = torch.arange(11, dtype=torch.uint8)
    for dtype, length in ((torch.float32, 3), (torch.float64, 2), (torch.float16, 6)):
        workspace = fused.as_workspace(reserve, torch.zeros(1, dtype=dtype))
        assert workspace.dtype == dtype and workspace.numel() == length
        assert torch.equal(fused.reserve_of(workspace, ("k",)), torch.cat([reserve, reserve.new_zeros(
            length * workspace.element_size() - 11)]))         # size unknown: the whole (padded) buffer
        fused.reserve_bytes[("k",)] = 11
        copy = fused.reserve_of(workspace, ("k",))
        assert torch.equal(copy, reserve) and copy.data_ptr() != workspace.data_ptr()
        del fused.reserve_bytes[("k",)]


# --- the availability check and the backend's choice -------------------------------------------

def _torch_without(missing=(), cudnn=True):
    aten = SimpleNamespace(**{n: object() for n in torch_cudnn_rnn.OPS if n not in missing})
    return SimpleNamespace(__version__="0.0-test", ops=SimpleNamespace(aten=aten),
                           backends=SimpleNamespace(cudnn=SimpleNamespace(is_available=lambda: cudnn)))


@pytest.mark.parametrize("missing,cudnn,why", [(("_cudnn_rnn_backward",), True, "aten::_cudnn_rnn_backward"),
                                               ((), False, "cuDNN is not available")])
def test_without_cudnn_or_its_ops_the_general_kernels_run_with_one_line(caplog, missing, cudnn, why):
    with caplog.at_level(logging.INFO, logger="retrograd"):
        assert torch_cudnn_rnn.available(_torch_without(missing, cudnn)) is False
    assert len(caplog.records) == 1 and why in caplog.records[0].getMessage()
    assert torch_cudnn_rnn.available(_torch_without()) is True


def test_this_torch_has_the_ops():
    for name in torch_cudnn_rnn.OPS:
        assert hasattr(torch.ops.aten, name), name


def test_the_cpu_backend_has_no_cudnn_kernel_and_keeps_onednn():
    backend = rg.Executor(backend="torch").backend
    assert backend.cudnn_lstm is None
    x = torch.zeros(2, 3, 4)
    assert backend.vendor_lstm(x) is backend.onednn_lstm
    assert backend.vendor_lstm(x.double()) is None


def test_a_cuda_backend_takes_cudnn_for_cuda_tensors(monkeypatch):
    """A CUDA device (faked where there is none): cuDNN for CUDA tensors of its dtypes, oneDNN for CPU
    float32, the general kernels for the rest; cuDNN disabled in torch: the general kernels."""
    from retrograd.backends import torch_backend
    if not torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch_backend, "_CUDNN_LSTM", {"ok": True})
    backend = torch_backend.TorchBackend("cuda")
    assert isinstance(backend.cudnn_lstm, torch_cudnn_rnn.CuDNNLSTM)

    def tensor(device, dtype, shape=(2, 3, 4)):
        return SimpleNamespace(device=torch.device(device), dtype=dtype, shape=shape)
    for dtype in (torch.float32, torch.float64):
        assert backend.vendor_lstm(tensor("cuda", dtype)) is backend.cudnn_lstm
    assert backend.vendor_lstm(tensor("cuda", torch.float32, (0, 3, 4))) is None
    assert backend.vendor_lstm(tensor("cuda", torch.float32, (2, 0, 4))) is None
    assert backend.vendor_lstm(tensor("cpu", torch.float32)) is backend.onednn_lstm
    monkeypatch.setattr(torch.backends.cudnn, "enabled", False)
    assert backend.vendor_lstm(tensor("cuda", torch.float32)) is None


# --- on a GPU ---------------------------------------------------------------------------------------

def _count_cudnn_calls(monkeypatch) -> list:
    calls = []
    for name in ("forward", "backward"):
        original = getattr(torch_cudnn_rnn.CuDNNLSTM, name)
        monkeypatch.setattr(torch_cudnn_rnn.CuDNNLSTM, name,
                            lambda self, *a, _o=original, _n=name: calls.append(_n) or _o(self, *a))
    return calls


@NEEDS_GPU
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("reverse,bias,forget_bias", [(False, True, 0.0), (True, True, 0.7), (False, False, 0.7),
                                                      (True, False, 0.0)])
def test_cuda_runs_cudnn_and_gives_the_general_numbers(monkeypatch, dtype, reverse, bias, forget_bias):
    calls = _count_cudnn_calls(monkeypatch)
    vals = _values(np.random.default_rng(6), 5, 3, dtype, bias)
    ours = _run(vals, dtype, True, rg.Executor(backend="torch", device="cuda"), forget_bias=forget_bias,
                reverse=reverse)
    assert calls == ["forward", "backward"]
    _assert_equal(ours, _general(vals, dtype, forget_bias=forget_bias, reverse=reverse), dtype)


@NEEDS_GPU
@pytest.mark.parametrize("steps,batch,hidden", [(20, 8, 128), (7, 5, 256)])
def test_cuda_matches_the_general_path_at_benchmark_widths(monkeypatch, steps, batch, hidden):
    """cuDNN's persistent kernels (H <= 128 here) and its standard ones, float32 against float64 NumPy."""
    calls = _count_cudnn_calls(monkeypatch)
    vals = _values(np.random.default_rng(7), steps, batch, "float32", d=hidden, h=hidden)
    for k in ("w_ih", "w_hh", "b"):
        vals[k] = (vals[k] / np.sqrt(hidden)).astype("float32")
    ours = _run(vals, "float32", True, rg.Executor(backend="torch", device="cuda"), reverse=True)
    assert calls == ["forward", "backward"]
    want = _general({k: v.astype("float64") for k, v in vals.items()}, "float64", reverse=True)
    for i, (a, b) in enumerate(zip(ours, want)):
        scale = max(float(np.abs(b).max()), 1.0)
        assert float(np.abs(a - b).max()) <= 2e-4 * scale, f"fetch {i}"


@NEEDS_GPU
def test_cuda_matches_torch_nn_lstm_in_float64():
    vals = _values(np.random.default_rng(8), 6, 4, "float64")
    ours = _run(vals, "float64", True, rg.Executor(backend="torch", device="cuda"), forget_bias=0.0)
    module = torch.nn.LSTM(D, H).double()
    params = {"weight_ih_l0": torch.tensor(vals["w_ih"].T), "weight_hh_l0": torch.tensor(vals["w_hh"].T),
              "bias_ih_l0": torch.tensor(vals["b"]), "bias_hh_l0": torch.zeros(4 * H, dtype=torch.float64)}
    y, (hn, cn) = torch.func.functional_call(module, params, (torch.tensor(vals["x"]), (
        torch.tensor(vals["h0"])[None], torch.tensor(vals["c0"])[None])))
    for got, want in zip(ours[:3], (y, hn[0], cn[0])):
        np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-10, atol=1e-12)


@NEEDS_GPU
def test_two_gradient_ops_on_one_cudnn_workspace_agree(monkeypatch):
    calls = _count_cudnn_calls(monkeypatch)
    vals = _values(np.random.default_rng(9), 5, 3, "float64")
    ours = _run(vals, "float64", True, rg.Executor(backend="torch", device="cuda"), twice=True)
    assert calls == ["forward", "backward", "backward"]
    _assert_equal(ours, _general(vals, "float64", twice=True), "float64")


@NEEDS_GPU
def test_cudnn_lstm_replays_as_a_cuda_graph(monkeypatch):
    before = torch.backends.cudnn.rnn.fp32_precision
    vals = _values(np.random.default_rng(10), 6, 4, "float32")
    main, startup, fetches = _program(vals, "float32", True)
    exe = rg.Executor(backend="torch", device="cuda", graphs=True)
    exe.run(startup)
    want = _general(vals, "float32")
    for run in range(4):            # two warm-up runs, the capture, a replay
        got = [to_numpy(a) for a in exe.run(main, feed=vals, fetch_list=fetches)]
        _assert_equal(got, want, "float32")
    reasons = [e.uncapturable for e in exe.graphs.entries.values() if e.uncapturable]
    assert exe.graphs.last_replayed, f"not replayed: {reasons}"
    assert torch.backends.cudnn.rnn.fp32_precision == before
