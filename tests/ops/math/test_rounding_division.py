"""floor_divide / mod (and x // y, x % y) against PyTorch, integers and floats, negative operands,
broadcasting; gradients against torch.remainder's; ONNX lowerings of the integer forms in onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")

import retrograd as rg
from retrograd.testing import build_program as build, started_executor as executor

A_INT = np.array([[-7, -6, -1, 0, 5, 9]], dtype=np.int64)
B_INT = np.array([[3], [-4]], dtype=np.int64)
A_F = np.array([-7.5, -2.25, -0.5, 0.75, 3.0, 8.5])
B_F = np.array([2.0, -1.5, 0.75, -3.0, 1.25, 4.0])


def _program(dtype, a_shape, b_shape):
    def model():
        a = rg.data("a", list(a_shape), dtype=dtype, stop_gradient=False)
        b = rg.data("b", list(b_shape), dtype=dtype, stop_gradient=False)
        return [rg.floor_divide(a, b), rg.mod(a, b), a // b, a % b, 7 // b, 7 % b]
    return build(model)


@pytest.mark.parametrize("a, b", [(A_INT, B_INT), (A_F, B_F)], ids=["int64", "float64"])
def test_values_match_torch_including_operators(a, b):
    main, startup, outs = _program(a.dtype.name, a.shape, b.shape)
    got = executor(startup).run(main, feed={"a": a, "b": b}, fetch_list=outs)
    ta, tb = torch.tensor(a), torch.tensor(b)
    ref = [torch.floor_divide(ta, tb), torch.remainder(ta, tb)] * 2
    ref += [torch.floor_divide(torch.tensor(7, dtype=tb.dtype), tb), torch.remainder(torch.tensor(7, dtype=tb.dtype), tb)]
    for ours, want in zip(got, ref):
        assert ours.dtype == a.dtype
        np.testing.assert_array_equal(ours, want.numpy())


def test_mod_gradients_match_torch_remainder_and_floor_divide_is_flat():
    def model():
        a = rg.data("a", [6], dtype="float64", stop_gradient=False)
        b = rg.data("b", [6], dtype="float64", stop_gradient=False)
        w = rg.constant(np.arange(1.0, 7.0))
        loss = rg.sum(rg.mod(a, b) * w + rg.floor_divide(a, b) * a)
        return rg.gradients(loss, [a, b])
    main, startup, grads = build(model)
    got = executor(startup).run(main, feed={"a": A_F, "b": B_F}, fetch_list=grads)
    ta, tb = torch.tensor(A_F, requires_grad=True), torch.tensor(B_F, requires_grad=True)
    loss = (torch.remainder(ta, tb) * torch.arange(1.0, 7.0, dtype=torch.float64)).sum()
    loss = loss + (torch.floor_divide(ta, tb).detach() * ta).sum()     # torch has no floor_divide gradient
    for ours, want in zip(got, torch.autograd.grad(loss, [ta, tb])):
        np.testing.assert_allclose(ours, want.numpy(), rtol=1e-12)


@pytest.mark.parametrize("a, b", [(A_INT, B_INT), (A_F, B_F)], ids=["int64", "float64"])
def test_onnx_lowerings_match_the_executor(a, b):
    pytest.importorskip("onnx", reason="ONNX export needs onnx")
    ort = pytest.importorskip("onnxruntime", reason="runs the exported model")
    main, startup, outs = _program(a.dtype.name, a.shape, b.shape)
    exe = executor(startup)
    model = rg.onnx.export(main, None, outs[:2] + outs[4:])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run([v.name for v in outs[:2] + outs[4:]], {"a": a, "b": b})
    want = exe.run(main, feed={"a": a, "b": b}, fetch_list=outs[:2] + outs[4:])
    for ours, ref in zip(got, want):
        np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-12)
        assert ours.dtype == ref.dtype
