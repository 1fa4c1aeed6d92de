"""GRUSequence (a whole GRU layer as one op) against the general RecurrentNetwork of GRUUnit steps
and against torch.nn.GRU, on every backend; when layers.gru builds it; the memory budget expanding
it; its ONNX form."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd.backends import to_numpy

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.engine

D, H = 4, 3


def _values(r, steps, batch, dtype, bias=True):
    vals = {"x": r.standard_normal((steps, batch, D)), "w_ih": r.standard_normal((D, 3 * H)) * 0.5,
            "w_hh": r.standard_normal((H, 3 * H)) * 0.5, "b_ih": r.standard_normal(3 * H) * 0.5,
            "b_hh": r.standard_normal(3 * H) * 0.5, "h0": r.standard_normal((batch, H))}
    if not bias:
        del vals["b_ih"], vals["b_hh"]
    return {k: v.astype(dtype) for k, v in vals.items()}


def _run(vals, dtype, fused, executor, reverse=False):
    """(h_all, h_last, gradients of every input) of the fused op or the general form."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        v = {k: rg.data(k, [-1, -1, D] if k == "x" else [-1, H] if k == "h0" else list(a.shape), dtype,
                        stop_gradient=False) for k, a in vals.items()}
        if fused:
            h_all, h_last = rg.gru_sequence(v["x"], v["w_ih"], v["w_hh"], v.get("b_ih"), v.get("b_hh"), v["h0"],
                                            reverse)
        else:
            x_proj = rg.seq_linear(v["x"], v["w_ih"], v.get("b_ih"))

            def step(xs, states):
                h_proj = rg.matmul(states[0], v["w_hh"])
                return [rg.gru_unit(xs[0], h_proj + v["b_hh"] if "b_hh" in v else h_proj, states[0])]
            (h_all,), (h_last,) = rg.recurrent(step, [x_proj], [v["h0"]], reverse=reverse)
        loss = rg.sum(h_all * h_all) + rg.sum(rg.sin(h_last))
        grads = rg.gradients(loss, list(v.values()))
    exe = executor()
    exe.run(startup)
    return exe.run(main, feed=vals, fetch_list=[h_all, h_last] + grads)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("reverse,bias", [(False, True), (True, True), (False, False), (True, False)])
@pytest.mark.parametrize("steps,batch", [(5, 3), (1, 1), (0, 2)])
def test_fused_op_equals_the_general_recurrence(dtype, reverse, bias, steps, batch, backend):
    vals = _values(np.random.default_rng(steps + batch), steps, batch, dtype, bias)
    ours = _run(vals, dtype, True, backend.executor, reverse=reverse)
    general = _run(vals, dtype, False, rg.Executor, reverse=reverse)
    # float32: cuDNN's kernels sum in another order than the host's (4.4e-5 seen on an H200)
    f32 = 1e-4 if backend.device == "cuda" else 2e-5
    tol = dict(rtol=f32, atol=f32) if dtype == "float32" else dict(rtol=1e-10, atol=1e-12)
    for a, b in zip(ours, general):
        np.testing.assert_allclose(to_numpy(a), b, **tol)


@pytest.mark.parametrize("reverse", [False, True])
def test_matches_torch_nn_gru_forward_and_gradients(reverse, backend):
    """float64 torch.nn.GRU (reverse: the reverse half of a bidirectional GRU) with the same weights."""
    vals = _values(np.random.default_rng(3), 6, 2, "float64")
    ours = _run(vals, "float64", True, backend.executor, reverse=reverse)
    mod = torch.nn.GRU(D, H, bidirectional=reverse, dtype=torch.float64)
    suffix = "_l0_reverse" if reverse else "_l0"
    params = {name: torch.tensor(vals[key].T if key.startswith("w") else vals[key], requires_grad=True)
              for name, key in ((f"weight_ih{suffix}", "w_ih"), (f"weight_hh{suffix}", "w_hh"),
                                (f"bias_ih{suffix}", "b_ih"), (f"bias_hh{suffix}", "b_hh"))}
    if reverse:        # the forward half gets zero weights; only the reverse half is compared
        params.update({n.replace("_reverse", ""): torch.zeros(p.shape, dtype=torch.float64)
                       for n, p in params.items()})
    x, h0 = (torch.tensor(vals[k], requires_grad=True) for k in ("x", "h0"))
    h0_all = torch.stack([torch.zeros_like(h0), h0]) if reverse else h0[None]
    y, hn = torch.func.functional_call(mod, params, (x, h0_all))
    y = y[..., H:] if reverse else y
    loss = (y * y).sum() + torch.sin(hn[-1]).sum()
    want = torch.autograd.grad(loss, [x, params[f"weight_ih{suffix}"], params[f"weight_hh{suffix}"],
                                      params[f"bias_ih{suffix}"], params[f"bias_hh{suffix}"], h0])
    np.testing.assert_allclose(to_numpy(ours[0]), y.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(to_numpy(ours[1]), hn[-1].detach().numpy(), rtol=1e-10, atol=1e-12)
    for got, expected in zip(ours[2:], [want[0], want[1].T, want[2].T, want[3], want[4], want[5]]):
        np.testing.assert_allclose(to_numpy(got), expected.numpy(), rtol=1e-9, atol=1e-11)


def _layer_ops(fused=True, **kwargs):
    main, _, _ = rg.testing.build_program(lambda: rg.layers.gru(rg.data("x", [-1, -1, D]), H, name="g",
                                                                fused=fused, **kwargs))
    return {op.type for block in main.blocks for op in block.ops}


def test_fused_layers_build_the_sequence_op_unless_the_general_path_is_needed():
    assert "GRUSequence" in _layer_ops() and "GRUUnit" not in _layer_ops()
    assert "GRUSequence" not in _layer_ops(fused=False)
    assert "GRUSequence" in _layer_ops(bidirectional=True, num_layers=2, bias=False)
    assert "GRUSequence" not in _layer_ops(recompute="steps")
    with rg.program_guard(rg.Program(), rg.Program()):
        lengths = rg.data("lengths", [-1], "int64")
        rg.layers.gru(rg.data("x", [-1, -1, D]), H, seq_lengths=lengths, name="g", fused=True)
        assert "GRUSequence" not in {op.type for op in rg.default_main_program().global_block().ops}


def _layer_gradients(fused, x, budget=None, **kwargs):
    main, startup = rg.Program(random_seed=3), rg.Program(random_seed=3)
    with rg.program_guard(main, startup):
        h_all, h_last = rg.layers.gru(rg.data("x", [-1, -1, D]), H, name="g", fused=fused, **kwargs)
        loss = rg.mean(h_all * h_all) + rg.mean(h_last)
        pairs = rg.append_backward(loss, memory_budget=budget, feed_shapes={"x": x.shape} if budget else None)
    exe = rg.Executor()
    exe.run(startup)
    return main, exe.run(main, feed={"x": x}, fetch_list=[loss] + [g for _, g in pairs])


def test_fused_layer_gives_the_general_layers_numbers():
    x = np.random.default_rng(4).standard_normal((7, 3, D)).astype("float32")
    _, fused = _layer_gradients(True, x, bidirectional=True, num_layers=2)
    _, general = _layer_gradients(False, x, bidirectional=True, num_layers=2)
    for a, b in zip(fused, general):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_memory_budget_expands_the_fused_op_into_the_general_recurrence():
    x = np.random.default_rng(2).standard_normal((40, 4, D)).astype("float32")
    main, got = _layer_gradients(True, x, budget=64 << 20)
    assert "GRUSequence" not in {op.type for op in main.global_block().ops}
    assert "GRUUnit" in {op.type for block in main.blocks for op in block.ops}
    _, want = _layer_gradients(False, x)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_bias_must_be_given_whole():
    with rg.program_guard(rg.Program(), rg.Program()):
        x, h0 = rg.data("x", [-1, -1, D]), rg.data("h0", [-1, H])
        w_ih, w_hh, b = rg.data("w_ih", [D, 3 * H]), rg.data("w_hh", [H, 3 * H]), rg.data("b", [3 * H])
        with pytest.raises(rg.ShapeError, match="both b_ih and b_hh"):
            rg.gru_sequence(x, w_ih, w_hh, b, None, h0)
        with pytest.raises(rg.ShapeError, match="w_hh must be float32"):
            rg.gru_sequence(x, w_ih, rg.data("w_bad", [H, 4 * H]), None, None, h0)


def _node_types(graph) -> set:
    """Op types of a graph and of its subgraphs (If branches, Loop bodies)."""
    types = set()
    for node in graph.node:
        types.add(node.op_type)
        for attr in node.attribute:
            if attr.HasField("g"):
                types |= _node_types(attr.g)
    return types


def test_float32_exports_as_an_onnx_gru(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    vals = _values(np.random.default_rng(7), 5, 2, "float32")
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        v = {k: rg.data(k, list(a.shape)) for k, a in vals.items()}
        h_all, h_last = rg.gru_sequence(v["x"], v["w_ih"], v["w_hh"], v["b_ih"], v["b_hh"], v["h0"])
    model = rg.onnx.export(main, str(tmp_path / "gru.onnx"), fetch_list=[h_all, h_last])
    assert "GRU" in _node_types(model.graph)
    got = ort.InferenceSession(str(tmp_path / "gru.onnx")).run(None, vals)
    exe = rg.Executor()
    exe.run(startup)
    want = exe.run(main, feed=vals, fetch_list=[h_all, h_last])
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# --- cuDNN's GRU on the torch backend (retrograd/backends/torch_cudnn_rnn.py) -----------------------

def _torch_gru(x, w_ih, w_hh, b_ih, b_hh, h):
    """PyTorch-layout GRU (gate order r, z, n; weights [3H, D]): (y [T,N,H], h_T)."""
    hidden, ys = w_hh.shape[1], []
    for x_t in x:
        xr, xz, xn = (x_t @ w_ih.T + b_ih).split(hidden, dim=-1)
        hr, hz, hn = (h @ w_hh.T + b_hh).split(hidden, dim=-1)
        r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
        n = torch.tanh(xn + r * hn)
        h = (1 - z) * n + z * h
        ys.append(h)
    return torch.stack(ys), h


class FakeCuDNNGRU:
    """``_cudnn_rnn_flatten_weight`` / ``_cudnn_rnn`` / ``_cudnn_rnn_backward`` for CPU tensors in GRU
    mode: checks what cuDNN needs (mode 3, four weights per layer, no cell state, contiguous [1,N,H]
    states) and computes with plain torch; the backward zeroes the reserve as cuDNN's writes into it."""

    def __init__(self):
        self.calls = []

    def _cudnn_rnn_flatten_weight(self, listed, stride, d, mode, hidden, *rest):
        assert (stride, mode) == (4, 3) and [tuple(w.shape) for w in listed] == [
            (3 * hidden, d), (3 * hidden, hidden), (3 * hidden,), (3 * hidden,)]
        return torch.cat([w.reshape(-1) for w in listed])      # no rebinding: flattened every call

    def _cudnn_rnn(self, x, listed, stride, flat, hx, cx, mode, hidden, *rest):
        assert mode == 3 and cx is None and hx.shape == (1, x.shape[1], hidden) and x.is_contiguous()
        self.calls.append("forward")
        y, hy = _torch_gru(x, *listed, hx[0])
        return y, hy[None], torch.empty(0), torch.full((5,), 9, dtype=torch.uint8), flat

    def _cudnn_rnn_backward(self, x, listed, stride, flat, hx, cx, y, dy, dhy, dcy, mode, *rest):
        reserve, mask = rest[-2], rest[-1]
        assert mode == 3 and cx is None and dcy is None and list(mask) == [True, True, False, True]
        assert torch.equal(reserve, torch.full((5,), 9, dtype=torch.uint8))
        self.calls.append("backward")
        with torch.inference_mode(False), torch.enable_grad():
            ins = [a.clone().requires_grad_(True) for a in (x, *listed, hx[0])]
            y2, hy = _torch_gru(*ins)
            grads = torch.autograd.grad([y2, hy], ins, [dy, dhy[0]])
        reserve.zero_()
        dx, dw_ih, dw_hh, db_ih, db_hh, dhx = (g.detach() for g in grads)
        return dx, dhx[None], None, [dw_ih, dw_hh, db_ih, db_hh]


@pytest.mark.parametrize("reverse,bias", [(False, True), (True, False)])
def test_cudnn_gru_plumbing_gives_the_general_numbers(reverse, bias):
    """CuDNNGRU through the executor with stand-ins for the ATen ops (weights transposed into the
    buffer, zeros for a layer without biases, time flipped for ``reverse``, the reserve copied)."""
    from types import SimpleNamespace
    from retrograd.backends import torch_cudnn_rnn
    fake = FakeCuDNNGRU()

    class TorchWith:
        ops = SimpleNamespace(aten=fake)

        def __getattr__(self, name):
            return getattr(torch, name)
    exe = rg.Executor(backend="torch")
    exe.backend.cudnn_gru = torch_cudnn_rnn.CuDNNGRU(TorchWith())
    exe.backend.cudnn_gru.applies = lambda x: True
    vals = _values(np.random.default_rng(12), 5, 2, "float64", bias)
    ours = _run(vals, "float64", True, lambda: exe, reverse=reverse)
    assert fake.calls == ["forward", "backward"]
    for a, b in zip(ours, _run(vals, "float64", False, rg.Executor, reverse=reverse)):
        np.testing.assert_allclose(to_numpy(a), b, rtol=1e-10, atol=1e-12)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("reverse,bias", [(False, True), (True, False)])
def test_cuda_runs_cudnn_gru_and_gives_the_general_numbers(monkeypatch, dtype, reverse, bias):
    from retrograd.backends import torch_cudnn_rnn
    calls = []
    for name in ("forward", "backward"):
        original = getattr(torch_cudnn_rnn.CuDNNGRU, name)
        monkeypatch.setattr(torch_cudnn_rnn.CuDNNGRU, name,
                            lambda self, *a, _o=original, _n=name: calls.append(_n) or _o(self, *a))
    vals = _values(np.random.default_rng(13), 6, 3, dtype, bias)
    ours = _run(vals, dtype, True, lambda: rg.Executor(backend="torch", device="cuda"), reverse=reverse)
    assert calls == ["forward", "backward"]
    tol = dict(rtol=5e-5, atol=5e-5) if dtype == "float32" else dict(rtol=1e-10, atol=1e-12)
    for a, b in zip(ours, _run(vals, dtype, False, rg.Executor, reverse=reverse)):
        np.testing.assert_allclose(to_numpy(a), b, **tol)
