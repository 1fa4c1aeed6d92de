"""fuse_conv_bias: Conv + bias Add (what layers.conv2d/conv1d build) as one ConvBias (issue 34's CNN)."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd.ir.verify import verify_program
from retrograd.passes import fuse_conv_bias

pytestmark = pytest.mark.engine


def _model(dtype="float32"):
    main, startup = rg.Program(random_seed=1), rg.Program(random_seed=1)
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 2, 9, 8], dtype)
        seq = rg.data("seq", [-1, 3, 10], dtype)
        h = rg.layers.conv2d(x, 4, 3, stride=2, padding=1, act="relu", name="c1")   # Conv + Add + Relu
        h = rg.max_pool2d(rg.layers.conv2d(h, 8, 3, padding=((1, 0), (0, 2)), name="c2"), 2)
        s = rg.layers.conv1d(seq, 5, 3, padding=1, name="t1")
        loss = rg.mean(rg.square(h)) + rg.mean(s * s)
        rg.optim.Momentum(0.05, momentum=0.9).minimize(loss)
    return main, startup, loss, h


def _feed(rng, dtype="float32"):
    return {"x": rng.standard_normal((3, 2, 9, 8)).astype(dtype),
            "seq": rng.standard_normal((2, 3, 10)).astype(dtype)}


def _train(backend, main, startup, fetch, steps=3, dtype="float32", device=None):
    exe = rg.Executor(backend=backend, device=device)
    exe.run(startup)
    rng = np.random.default_rng(0)
    return [[np.asarray(v) for v in exe.run(main, feed=_feed(rng, dtype), fetch_list=fetch)]
            for _ in range(steps)], exe


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_every_conv_layer_takes_its_bias_and_trains_as_before(backend, dtype):
    """The fused program (run on every backend) trains as the unfused one on NumPy: losses and
    parameters after 3 momentum steps."""
    main, startup, loss, _ = _model(dtype)
    fused = main.clone()
    assert fuse_conv_bias(fused) == 3
    ops = fused.global_block().ops
    assert [op.type for op in ops].count("ConvBias") == 3 and "Conv" not in [op.type for op in ops]
    assert not any(op.type == "Add" and op.outputs[0] in ("c1", "c2", "t1") for op in ops)
    verify_program(fused)
    names = [loss.name, "c1.w", "c1.b", "c2.w", "c2.b", "t1.w", "t1.b"]
    want, _ = _train("numpy", main, startup, names, dtype=dtype)
    got, _ = _train(backend.name, fused, startup, names, dtype=dtype, device=backend.device)
    tol = dict(rtol=1e-9, atol=1e-10) if dtype == "float64" else dict(rtol=1e-4, atol=1e-5)
    for a, b in zip(got, want):
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, **tol)


def test_conv_bias_matches_torch_with_gradients(backend):
    """ConvBias's value and the gradients of x, w and b against torch's conv2d with a bias (float64)."""
    torch = pytest.importorskip("torch")
    from retrograd.ops.core.registry import append_op
    r = np.random.default_rng(3)
    x, w, b = r.standard_normal((2, 4, 7, 6)), r.standard_normal((6, 2, 3, 3)), r.standard_normal(6)
    attrs = {"strides": [2, 1], "pads": [1, 0, 1, 0], "dilations": [1, 2], "groups": 2}
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        vs = [rg.data(n, a.shape, "float64", stop_gradient=False) for n, a in (("x", x), ("w", w), ("b", b))]
        y = append_op("ConvBias", vs, dict(attrs))[0]
        fetch = [y, *rg.gradients(rg.sum(y * y), vs)]
    got = backend.executor().run(main, feed={"x": x, "w": w, "b": b}, fetch_list=fetch)
    ts = [torch.tensor(a, requires_grad=True) for a in (x, w, b)]
    yt = torch.nn.functional.conv2d(*ts, stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2)
    (yt * yt).sum().backward()
    for a, e in zip(got, [yt.detach(), *(t.grad for t in ts)]):
        np.testing.assert_allclose(a, e.numpy(), rtol=1e-9, atol=1e-10)


def test_a_fetched_or_shared_convolution_is_left_alone():
    main, _, _, _ = _model()
    product = next(op.outputs[0] for op in main.global_block().ops if op.type == "Conv")
    assert fuse_conv_bias(main.clone(), keep=frozenset([product])) == 2
    with rg.program_guard(main, rg.Program()):
        rg.sum(main.global_block().var(product))                              # a second reader
    assert fuse_conv_bias(main.clone()) == 2


def test_an_add_that_is_not_a_per_filter_bias_is_left_alone():
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x, w = rg.data("x", [-1, 2, 5, 5]), rg.data("w", [3, 2, 3, 3])
        plane = rg.data("plane", [9])
        y = rg.conv2d(x, w) + rg.reshape(plane, [3, 3])                          # broadcast over the plane
        rg.conv2d(x, w) + rg.reshape(rg.data("b", [3]), [3, 1, 1])               # the bias: fused
    assert y.shape[1:] == (3, 3, 3)
    assert fuse_conv_bias(main) == 1


def test_torch_backend_runs_conv_bias_and_still_fetches_the_convolution():
    pytest.importorskip("torch")
    main, startup, loss, h = _model()
    want, _ = _train("numpy", main, startup, [loss, h])
    got, exe = _train("torch", main, startup, [loss, h])
    for a, b in zip(got, want):
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)
    ran = [step for plan in exe._plans.values() for step in plan.steps]
    assert sum(s.op.type == "ConvBias" for s in ran) == 3
    product = next(op.outputs[0] for op in main.global_block().ops if op.type == "Conv")
    value, = exe.run(main, feed=_feed(np.random.default_rng(1)), fetch_list=[product])
    assert value.shape == (3, 4, 5, 4)


@pytest.mark.parametrize("shape", [(2, 0, 5, 5), (0, 3, 5, 5), (1, 1, 1, 1)])
def test_conv_layer_with_an_empty_or_size_one_axis_gives_numpys_shapes_and_the_bias(backend, shape):
    """Regression (review): the torch backend's ConvBias (what the fuse pass makes of every
    conv layer there) called torch's conv without conv's size-0 guard, and with 0 input channels
    torch returns [N, 0, H, W]: the wrong shape, and a failing gradient. A layer over 0 input
    channels is its bias everywhere (torch.nn.Conv2d(0, 4, 3) gives the same), and layers.conv2d
    no longer divides by zero initialising it."""
    main, startup = rg.Program(random_seed=3), rg.Program(random_seed=3)
    with rg.program_guard(main, startup):
        x = rg.data("x", list(shape), stop_gradient=False)
        y = rg.layers.conv2d(x, 4, 3, padding=1, name="c")
        (dx,) = rg.gradients(rg.sum(y * y), [x])
    exe = backend.executor()
    exe.run(startup)
    xb = np.random.default_rng(0).standard_normal(shape).astype("float32")
    y_v, dx_v = exe.run(main, feed={"x": xb}, fetch_list=[y, dx])
    w, b = (rg.backends.to_numpy(exe.scope.get(name)) for name in ("c.w", "c.b"))
    padded = np.pad(xb, [(0, 0), (0, 0), (1, 1), (1, 1)])
    want = np.zeros((shape[0], 4, shape[2], shape[3]), "float32") + b[None, :, None, None]
    for i in range(shape[2]):                       # the convolution written out
        for j in range(shape[3]):
            want[:, :, i, j] += np.einsum("ncij,fcij->nf", padded[:, :, i:i + 3, j:j + 3], w)
    np.testing.assert_allclose(y_v, want, rtol=1e-5, atol=1e-5)
    assert dx_v.shape == shape
