"""The options people port code with (issue 32, items 12 and 14), each against its peer on every
backend (numpy, torch, the onnxruntime engine): values and float64 gradients against PyTorch's
autograd, the ONNX export run in onnxruntime alone."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg

torch = pytest.importorskip("torch", reason="the reference values come from PyTorch")

pytestmark = pytest.mark.engine


def run(backend, build, feed, wrt=True):
    """Build ``build(*data Vars)`` -> outputs; with ``wrt``, also the gradient of a weighted sum of
    the float outputs with respect to the first input (weights: a fixed pattern ``w``)."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        xs = [rg.data(name, list(value.shape), value.dtype.name, stop_gradient=False)
              for name, value in feed.items()]
        outs = build(*xs)
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        fetch = list(outs)
        if wrt:
            floats = [o for o in outs if o.dtype == "float64"]
            loss = rg.add_n([rg.sum(o * rg.sin(o * (i + 1.0))) for i, o in enumerate(floats)])
            fetch += rg.gradients(loss, xs[0], unconnected="zero")
    return backend.executor().run(main, feed=feed, fetch_list=fetch)


def torch_grad(outs, t):
    floats = [o for o in outs if o.dtype == torch.float64]
    loss = sum((o * torch.sin(o * (i + 1.0))).sum() for i, o in enumerate(floats))
    return torch.autograd.grad(loss, t)[0].numpy()


def exported(build, feed):
    """The outputs of ``build`` computed by the exported ONNX model in onnxruntime alone."""
    ort = pytest.importorskip("onnxruntime", reason="runs the exported model")
    pytest.importorskip("onnx", reason="ONNX export needs onnx")
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        xs = [rg.data(name, list(value.shape), value.dtype.name) for name, value in feed.items()]
        outs = build(*xs)
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    sess = ort.InferenceSession(rg.onnx.export(main, None, outs).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    return sess.run([o.name for o in outs], feed)


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


# --- dropout(p=1.0) ------------------------------------------------------------------------------

def test_dropout_p1_gives_zeros_as_torch_instead_of_a_program_error(backend):
    x0 = np.array([[1.0, -2.0, 3.0], [0.5, np.nan, 4.0]])
    y, = run(backend, lambda x: rg.dropout(x, p=1.0), {"x": x0}, wrt=False)
    want = torch.nn.functional.dropout(torch.tensor(x0), p=1.0)
    np.testing.assert_array_equal(y, want.numpy())                # NaN stays NaN: x * 0
    y, dx = run(backend, lambda x: rg.dropout(x, p=1.0) + x, {"x": rand(2, 3)})
    t = torch.tensor(rand(2, 3), requires_grad=True)
    want = torch.nn.functional.dropout(t, p=1.0) + t
    np.testing.assert_array_equal(y, want.detach().numpy())
    np.testing.assert_allclose(dx, torch_grad([want], t), rtol=1e-12)
    with pytest.raises(rg.ProgramError, match=r"\[0, 1\]"):
        with rg.program_guard(rg.Program(), rg.Program()):
            rg.dropout(rg.data("x", [2]), p=1.5)


# --- constants: one dtype rule for NumPy values of every rank (item 14) -------------------------

def test_numpy_float64_scalar_constant_was_float32_while_1d_stayed_float64():
    with rg.program_guard(rg.Program(), rg.Program()):
        assert rg.constant(1.5).dtype == "float32"                 # a Python float: the default
        assert rg.constant(np.float64(1.5)).dtype == "float64"
        assert rg.constant(np.array(1.5)).dtype == "float64"
        assert rg.constant(np.array([1.5])).dtype == "float64"
        assert rg.constant(np.float32(1.5)).dtype == "float32"
        assert rg.constant(np.float64(1.5), "float32").dtype == "float32"
        n = rg.data("n", [3], "int64")                               # next to an int Var: the same rule
        assert (n * np.float64(1.5)).dtype == (n * np.array([1.5, 1.5, 1.5])).dtype == "float64"
        x = rg.data("x", [3])                                        # next to a float Var: the Var's
        assert (x * np.float64(1.5)).dtype == (x * np.ones(3)).dtype == "float32"
