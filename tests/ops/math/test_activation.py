"""relu, gelu, silu, leaky_relu, elu, softplus against PyTorch (float64): values, first and second
derivatives, on NumPy, torch-CPU and the onnxruntime engine; ``act=`` of fc."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg

torch = pytest.importorskip("torch", reason="the reference values come from PyTorch")
F = torch.nn.functional

pytestmark = pytest.mark.engine

# Away from the kinks (0 for leaky_relu/elu, 20 for softplus's threshold), far into both tails.
X = np.concatenate([np.linspace(-30.0, 30.0, 49) + 0.3, [-1e-3, 2e-3, 19.9, 20.1]])

ACTIVATIONS = {
    "relu": (rg.relu, F.relu),
    "gelu": (rg.gelu, F.gelu),
    "gelu_tanh": (lambda x: rg.gelu(x, approximate="tanh"), lambda t: F.gelu(t, approximate="tanh")),
    "silu": (rg.silu, F.silu),
    "leaky_relu": (rg.leaky_relu, F.leaky_relu),
    "leaky_relu_0.2": (lambda x: rg.leaky_relu(x, negative_slope=0.2), lambda t: F.leaky_relu(t, 0.2)),
    "elu": (rg.elu, F.elu),
    "elu_1.5": (lambda x: rg.elu(x, alpha=1.5), lambda t: F.elu(t, alpha=1.5)),
    "softplus": (rg.softplus, F.softplus),
}


def run_with_gradients(backend, fn, x0, weights):
    """y = fn(x), dx = d/dx sum(y * w) and d/dx sum(dx^2 y) on ``backend``."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", list(x0.shape), "float64", stop_gradient=False)
        y = fn(x)
        dx, = rg.gradients(rg.sum(y * rg.constant(weights, "float64")), x)
        ddx, = rg.gradients(rg.sum(dx * dx * y), x)
    return backend.executor().run(main, feed={"x": x0}, fetch_list=[y, dx, ddx])


def torch_with_gradients(fn, x0, weights):
    t = torch.tensor(x0, requires_grad=True)
    y = fn(t)
    dx, = torch.autograd.grad((y * torch.tensor(weights)).sum(), t, create_graph=True)
    ddx, = torch.autograd.grad((dx * dx * y).sum(), t)
    return [v.detach().numpy() for v in (y, dx, ddx)]


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_matches_torch_with_first_and_second_derivatives(name, backend):
    ours, theirs = ACTIVATIONS[name]
    weights = np.random.default_rng(0).standard_normal(X.shape)
    got = run_with_gradients(backend, ours, X, weights)
    want = torch_with_gradients(theirs, X, weights)
    for what, g, w in zip(("value", "gradient", "second derivative"), got, want):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12, err_msg=f"{name} {what} on {backend}")


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_float32_matches_torch(name, backend):
    ours, theirs = ACTIVATIONS[name]
    x0 = np.linspace(-8.0, 8.0, 33, dtype="float32")
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        y = ours(rg.data("x", [-1], "float32"))
    got, = backend.executor().run(main, feed={"x": x0}, fetch_list=[y])
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, theirs(torch.tensor(x0)).numpy(), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("act", ["gelu", "silu", "leaky_relu", "elu", "softplus"])
def test_fc_act_applies_the_activation(act, backend):
    main, startup = rg.Program(random_seed=1), rg.Program()
    with rg.program_guard(main, startup):
        h = rg.layers.fc(rg.data("x", [-1, 3], "float64"), 4, act=act, name="f")
    assert main.global_block().ops[-1].type == ACTIVATION_OPS[act]
    exe = backend.executor()
    exe.run(startup)
    x0 = np.random.default_rng(2).standard_normal((5, 3))
    got, w, b = exe.run(main, feed={"x": x0}, fetch_list=[h, "f.w", "f.b"])
    pre = torch.tensor(x0 @ w + b)
    want = getattr(F, act)(pre).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


ACTIVATION_OPS = {"gelu": "Gelu", "silu": "Silu", "leaky_relu": "LeakyRelu", "elu": "Elu", "softplus": "Softplus"}


def test_gelu_refuses_an_unknown_approximation():
    with pytest.raises(rg.ProgramError, match='approximate must be "none" or "tanh"'):
        with rg.program_guard(rg.Program(), rg.Program()):
            rg.gelu(rg.data("x", [2]), approximate="erf")


@pytest.mark.parametrize("fn", [rg.gelu, rg.silu, rg.leaky_relu, rg.elu, rg.softplus])
def test_integer_inputs_are_refused_when_built(fn):
    with pytest.raises(rg.ShapeError, match="float32 or float64"):
        with rg.program_guard(rg.Program(), rg.Program()):
            fn(rg.data("i", [2], "int64"))


def test_relu_gradient_is_one_relu_grad_op_reading_relus_output():
    """Relu's gradient: one ReluGrad op (threshold_backward on torch), reading Relu's output, not its input
    (the input need not be kept for the backward pass)."""
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [4], "float32", stop_gradient=False)
        pre = x * 2.0
        y = rg.relu(pre)
        rg.gradients(rg.sum(y * y), [x])
    ops = main.global_block().ops
    grad_ops = [op for op in ops if op.type == "ReluGrad"]
    assert len(grad_ops) == 1 and grad_ops[0].inputs[0] == y.name
    assert not any(op.type in ("Greater", "Where") for op in ops)


def test_relu_of_integers_matches_numpy(backend):
    if backend.name == "onnxruntime":
        pytest.skip("onnxruntime's Relu has no int64 kernel")
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        y = rg.relu(rg.data("i", [5], "int64"))
    got, = backend.executor().run(main, feed={"i": np.array([-3, 0, 2, -1, 7])}, fetch_list=[y])
    np.testing.assert_array_equal(got, [0, 0, 2, 0, 7])
