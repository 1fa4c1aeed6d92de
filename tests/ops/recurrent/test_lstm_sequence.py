"""LSTMSequence (a whole LSTM layer as one op) against the general RecurrentNetwork of LSTMUnit steps
and against torch.nn.LSTM, on every backend; the oneDNN branch of the torch backend and its fallback;
when layers.lstm builds it; the memory budget expanding it; its ONNX form."""
from __future__ import annotations

import logging

import numpy as np
import pytest

import retrograd as rg
from retrograd.backends import to_numpy

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.engine

D, H = 4, 3


def _values(r, steps, batch, dtype, bias=True):
    vals = {"x": r.standard_normal((steps, batch, D)), "w_ih": r.standard_normal((D, 4 * H)) * 0.5,
            "w_hh": r.standard_normal((H, 4 * H)) * 0.5, "b": r.standard_normal(4 * H) * 0.5,
            "h0": r.standard_normal((batch, H)), "c0": r.standard_normal((batch, H))}
    if not bias:
        del vals["b"]
    return {k: v.astype(dtype) for k, v in vals.items()}


def _run(vals, dtype, fused, executor, forget_bias=0.7, reverse=False, keep="all", with_c_all=False):
    """(h_all, h_last, c_last, gradients of every input) of the fused op or the general form."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        v = {k: rg.data(k, [-1, -1, D] if k == "x" else [-1, H] if k in ("h0", "c0") else list(a.shape), dtype,
                        stop_gradient=False) for k, a in vals.items()}
        if fused:
            h_all, h_last, c_all, c_last = rg.lstm_sequence(v["x"], v["w_ih"], v["w_hh"], v.get("b"), v["h0"],
                                                            v["c0"], forget_bias, reverse, keep)
        else:
            x_proj = rg.seq_linear(v["x"], v["w_ih"], v.get("b"))
            (h_all, c_all), (h_last, c_last) = rg.recurrent(
                lambda xs, st: list(rg.lstm_unit(xs[0], st[1], forget_bias, h_gates=rg.matmul(st[0], v["w_hh"]))),
                [x_proj], [v["h0"], v["c0"]], reverse=reverse)
        loss = rg.sum(h_all * h_all) + rg.sum(rg.sin(h_last)) + rg.sum(c_last * 3.0)
        if with_c_all:
            loss = loss + rg.sum(rg.tanh(c_all))
        grads = rg.gradients(loss, list(v.values()))
    exe = executor()
    exe.run(startup)
    return exe.run(main, feed=vals, fetch_list=[h_all, h_last, c_all, c_last] + grads)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("reverse,bias,keep", [(False, True, "all"), (True, True, "all"), (False, False, "all"),
                                               (False, True, "cells"), (True, False, "cells")])
@pytest.mark.parametrize("steps,batch", [(5, 3), (1, 1), (0, 2)])
def test_fused_op_equals_the_general_recurrence(dtype, reverse, bias, keep, steps, batch, backend):
    vals = _values(np.random.default_rng(steps + batch), steps, batch, dtype, bias)
    ours = _run(vals, dtype, True, backend.executor, reverse=reverse, keep=keep)
    general = _run(vals, dtype, False, rg.Executor, reverse=reverse)
    # float32: cuDNN's kernels sum in another order than the host's (4.4e-5 seen on an H200)
    f32 = 1e-4 if backend.device == "cuda" else 2e-5
    tol = dict(rtol=f32, atol=f32) if dtype == "float32" else dict(rtol=1e-10, atol=1e-12)
    for a, b in zip(ours, general):
        np.testing.assert_allclose(to_numpy(a), b, **tol)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("reverse", [False, True])
def test_a_gradient_through_every_cell_state(dtype, reverse, backend):
    """c_all on the loss: the op runs its general kernels (vendor ones take no such gradient)."""
    vals = _values(np.random.default_rng(11), 4, 2, dtype)
    ours = _run(vals, dtype, True, backend.executor, reverse=reverse, with_c_all=True)
    general = _run(vals, dtype, False, rg.Executor, reverse=reverse, with_c_all=True)
    # float32: cuDNN's kernels sum in another order than the host's (4.4e-5 seen on an H200)
    f32 = 1e-4 if backend.device == "cuda" else 2e-5
    tol = dict(rtol=f32, atol=f32) if dtype == "float32" else dict(rtol=1e-10, atol=1e-12)
    for a, b in zip(ours, general):
        np.testing.assert_allclose(to_numpy(a), b, **tol)


def test_torch_cpu_runs_onednn_and_matches_nn_lstm(monkeypatch):
    """float32 on the torch CPU backend goes through oneDNN's primitive (the forward and the
    backward kernel called once each), giving torch.nn.LSTM's numbers."""
    from retrograd.backends import torch_fused_rnn
    calls = []
    for name in ("forward", "backward"):
        original = getattr(torch_fused_rnn.OneDNNLSTM, name)
        monkeypatch.setattr(torch_fused_rnn.OneDNNLSTM, name,
                            lambda self, *a, _o=original, _n=name: calls.append(_n) or _o(self, *a))
    vals = _values(np.random.default_rng(0), 6, 4, "float32")
    ours = _run(vals, "float32", True, lambda: rg.Executor(backend="torch"), forget_bias=0.0)
    assert calls == ["forward", "backward"]
    mod = torch.nn.LSTM(D, H)
    params = {"weight_ih_l0": torch.tensor(vals["w_ih"].T), "weight_hh_l0": torch.tensor(vals["w_hh"].T),
              "bias_ih_l0": torch.tensor(vals["b"]), "bias_hh_l0": torch.zeros(4 * H)}
    x = torch.tensor(vals["x"])
    y, (hn, cn) = torch.func.functional_call(mod, params, (x, (torch.tensor(vals["h0"])[None],
                                                               torch.tensor(vals["c0"])[None])))
    np.testing.assert_allclose(ours[0], y.detach().numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ours[3], cn[0].detach().numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("bias,forget_bias", [(True, 0.0), (False, 0.0), (False, 0.5)])
def test_onednn_bias_without_a_copy_equals_the_general_recurrence(bias, forget_bias):
    """The bias goes to oneDNN as it is (no copy) unless forget_bias shifts it; without one, a cached
    zero vector: the numbers stay the general recurrence's and the fed bias is left unchanged."""
    vals = _values(np.random.default_rng(21), 5, 3, "float32", bias)
    fed = {k: v.copy() for k, v in vals.items()}
    ours = _run(fed, "float32", True, lambda: rg.Executor(backend="torch"), forget_bias=forget_bias)
    general = _run(vals, "float32", False, rg.Executor, forget_bias=forget_bias)
    for a, b in zip(ours, general):
        np.testing.assert_allclose(to_numpy(a), b, rtol=2e-5, atol=2e-5)
    for k in vals:
        np.testing.assert_array_equal(fed[k], vals[k])


def test_onednn_backward_reuses_the_forwards_weight_copies():
    """The forward's [4H, D] weight copies ride on its workspace: the backward, handed the same weight
    tensors, passes them on (no transposing copy in the kernel); other weights or a workspace
    without them (one that went through NumPy) get transposed views, with the same gradients."""
    from retrograd.backends import torch_fused_rnn
    fused = torch_fused_rnn.OneDNNLSTM(torch)
    r = np.random.default_rng(3)
    x, w_ih, w_hh = (torch.tensor(r.standard_normal(s), dtype=torch.float32)
                     for s in ((6, 2, D), (D, 4 * H), (H, 4 * H)))
    b, h0, c0 = (torch.tensor(r.standard_normal(s), dtype=torch.float32) for s in ((4 * H,), (2, H), (2, H)))
    y, hy, cy, ws = fused.forward(x, w_ih, w_hh, b, h0, c0, 0.0, False)
    kept_ih, kept_hh = torch_fused_rnn.forward_weights(ws, w_ih, w_hh)
    assert kept_ih.is_contiguous() and kept_hh.is_contiguous() and tuple(kept_ih.shape) == (4 * H, D)
    torch.testing.assert_close(kept_ih, w_ih.t(), rtol=0, atol=0)
    views = torch_fused_rnn.forward_weights(ws, w_ih.clone(), w_hh)
    assert not views[0].is_contiguous()
    bare = ws.clone()                              # a clone carries no weight copies
    assert not torch_fused_rnn.forward_weights(bare, w_ih, w_hh)[0].is_contiguous()
    grads = torch.ones_like(y), torch.zeros_like(hy), torch.zeros_like(cy)
    with_copies = fused.backward(x, w_ih, w_hh, b, h0, c0, y, hy, cy, ws, *grads, 0.0, False)
    with_views = fused.backward(x, w_ih, w_hh, b, h0, c0, y, hy, cy, bare, *grads, 0.0, False)
    for a, v in zip(with_copies, with_views):
        torch.testing.assert_close(a, v, rtol=0, atol=0)


def test_without_the_aten_ops_the_torch_backend_falls_back_with_one_line(caplog):
    from retrograd.backends import torch_fused_rnn

    class NoOps:
        __version__ = "0.0-test"

        class ops:
            aten = object()

        class backends:
            class mkldnn:
                is_available = staticmethod(lambda: True)
    with caplog.at_level(logging.INFO, logger="retrograd"):
        assert torch_fused_rnn.available(NoOps) is False
    assert len(caplog.records) == 1 and "mkldnn_rnn_layer" in caplog.records[0].getMessage()
    assert torch_fused_rnn.available(torch) is True


def test_fallback_branch_gives_the_general_numbers():
    vals = _values(np.random.default_rng(5), 4, 2, "float32")

    def general_torch():
        exe = rg.Executor(backend="torch")
        exe.backend.onednn_lstm = None
        return exe
    fused = _run(vals, "float32", True, general_torch)
    general = _run(vals, "float32", False, rg.Executor)
    for a, b in zip(fused, general):
        np.testing.assert_allclose(to_numpy(a), b, rtol=2e-5, atol=2e-5)


def _layer_ops(fused=True, **kwargs):
    """Op types of a layers.lstm program, in every block (LSTMUnit: the general step)."""
    main, _, _ = rg.testing.build_program(lambda: rg.layers.lstm(rg.data("x", [-1, -1, D]), H, name="l",
                                                                 fused=fused, **kwargs))
    return {op.type for block in main.blocks for op in block.ops}


def test_fused_layers_build_the_sequence_op_unless_the_general_path_is_needed():
    assert "LSTMSequence" in _layer_ops() and "LSTMUnit" not in _layer_ops()
    assert "LSTMSequence" not in _layer_ops(fused=False)
    assert "LSTMSequence" in _layer_ops(bidirectional=True, num_layers=2)
    assert "LSTMSequence" in _layer_ops(recompute="steps")          # keeping only the cells
    assert "LSTMSequence" not in _layer_ops(recompute=1 << 20)        # a per-op budget: over time steps
    with rg.program_guard(rg.Program(), rg.Program()):
        lengths = rg.data("lengths", [-1], "int64")
        rg.layers.lstm(rg.data("x", [-1, -1, D]), H, seq_lengths=lengths, name="l", fused=True)
        assert "LSTMSequence" not in {op.type for op in rg.default_main_program().global_block().ops}


def test_a_memory_budget_expands_the_fused_op_into_the_general_recurrence():
    r = np.random.default_rng(2)
    x = r.standard_normal((40, 4, D)).astype("float32")

    def build(budget):
        main, startup = rg.Program(random_seed=3), rg.Program(random_seed=3)
        with rg.program_guard(main, startup):
            xv = rg.data("x", [-1, -1, D])
            h_all, _, _, _ = rg.layers.lstm(xv, H, name="l", fused=True)
            loss = rg.mean(h_all * h_all)
            pairs = rg.append_backward(loss, memory_budget=budget, feed_shapes={"x": x.shape})
        return main, startup, loss, pairs
    main, startup, loss, pairs = build(64 << 20)
    assert "LSTMSequence" not in {op.type for op in main.global_block().ops}
    assert "LSTMUnit" in {op.type for block in main.blocks for op in block.ops}
    exe = rg.Executor()
    exe.run(startup)
    got = exe.run(main, feed={"x": x}, fetch_list=[g for _, g in pairs])
    plain_main, plain_startup = rg.Program(random_seed=3), rg.Program(random_seed=3)
    with rg.program_guard(plain_main, plain_startup):
        h_all, _, _, _ = rg.layers.lstm(rg.data("x", [-1, -1, D]), H, name="l")
        plain = rg.append_backward(rg.mean(h_all * h_all))
    exe2 = rg.Executor()
    exe2.run(plain_startup)
    want = exe2.run(plain_main, feed={"x": x}, fetch_list=[g for _, g in plain])
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_float32_exports_as_an_onnx_lstm(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    vals = _values(np.random.default_rng(7), 5, 2, "float32")
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        v = {k: rg.data(k, list(a.shape)) for k, a in vals.items()}
        h_all, h_last, c_all, c_last = rg.lstm_sequence(v["x"], v["w_ih"], v["w_hh"], v["b"], v["h0"], v["c0"], 1.0)
    model = rg.onnx.export(main, str(tmp_path / "lstm.onnx"), fetch_list=[h_all, c_all, c_last])
    assert "LSTM" in {node.op_type for node in model.graph.node}
    got = ort.InferenceSession(str(tmp_path / "lstm.onnx")).run(None, vals)
    exe = rg.Executor()
    exe.run(startup)
    want = exe.run(main, feed=vals, fetch_list=[h_all, c_all, c_last])
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
