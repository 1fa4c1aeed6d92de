"""conv1d, conv2d, max_pool2d and avg_pool2d against PyTorch float64 (forward, gradients, second
order), on every backend; shape rules and errors. Finite differences: tests/ops/test_gradients_table.py."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import retrograd as rg

torch = pytest.importorskip("torch")
F = torch.nn.functional

pytestmark = pytest.mark.engine


@pytest.fixture(autouse=True)
def _fresh_programs():
    """Each test builds into programs of its own (parameter names repeat between tests)."""
    with rg.program_guard(rg.Program(), rg.Program()):
        yield

CONV2D = [
    dict(),
    dict(stride=2, padding=1),
    dict(stride=(1, 2), padding=(2, 1), dilation=(2, 1)),
    dict(padding=((1, 0), (0, 2)), groups=2),
    dict(padding="same", groups=4, dilation=2),
    dict(stride=3, padding=2, dilation=2, groups=2),
]
CONV1D = [dict(), dict(stride=2, padding=3, dilation=2), dict(padding=(0, 2), groups=2)]


def _torch_conv(x, w, b, nd, stride=1, padding=0, dilation=1, groups=1):
    """torch's conv{nd}d; per-side padding applied with F.pad first (torch pads symmetrically)."""
    if isinstance(padding, tuple) and (isinstance(padding[0], tuple) or (nd == 1 and len(padding) == 2)):
        pairs = padding if isinstance(padding[0], tuple) else (padding,)
        x = F.pad(x, [p for pair in reversed(pairs) for p in pair])
        padding = 0
    conv = F.conv1d if nd == 1 else F.conv2d
    return conv(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)


def _run(backend, build, inputs, outputs):
    """Build ``outputs(*vars) -> [Var]`` over float64 data Vars named after ``inputs``; run them."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        vars_ = [rg.data(n, a.shape, str(a.dtype), stop_gradient=False) for n, a in inputs.items()]
        fetch = outputs(build(*vars_), vars_)
    return backend.executor().run(main, feed=inputs, fetch_list=fetch)


def _first_and_second(y, vars_, p, q):
    """y, d(sum(y*p))/dvars and the gradient of sum(first * q) (double backward)."""
    grads = rg.gradients(rg.sum(y * rg.constant(p) + y * y * 0.5), vars_)
    second = rg.gradients(rg.add_n([rg.sum(g * rg.constant(qi)) for g, qi in zip(grads, q)]), vars_)
    return [y, *grads, *second]


def _torch_first_and_second(y, leaves, p, q):
    grads = torch.autograd.grad((y * torch.tensor(p) + y * y * 0.5).sum(), leaves, create_graph=True)
    total = sum((g * torch.tensor(qi)).sum() for g, qi in zip(grads, q))
    second = torch.autograd.grad(total, leaves)
    return [y, *grads, *second]


def _compare(backend, build, torch_build, inputs, rtol=1e-9, atol=1e-10):
    r = np.random.default_rng(1)
    leaves = [torch.tensor(a, requires_grad=True) for a in inputs.values()]
    y_t = torch_build(*leaves)
    p = r.standard_normal(tuple(y_t.shape))
    q = [r.standard_normal(a.shape) for a in inputs.values()]
    expected = [t.detach().numpy() for t in _torch_first_and_second(y_t, leaves, p, q)]
    got = _run(backend, build, inputs, lambda y, vars_: _first_and_second(y, vars_, p, q))
    assert len(got) == len(expected)
    for name, a, b in zip(["y", *[f"d{n}" for n in inputs], *[f"dd{n}" for n in inputs]], got, expected):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=name)


@pytest.mark.parametrize("case", CONV2D, ids=str)
def test_conv2d_matches_torch_to_second_order(backend, case):
    r = np.random.default_rng(0)
    groups = case.get("groups", 1)
    inputs = {"x": r.standard_normal((2, 4, 7, 6)), "w": r.standard_normal((8, 4 // groups, 3, 2)),
              "b": r.standard_normal(8)}
    _compare(backend, lambda x, w, b: rg.conv2d(x, w, b, **case),
             lambda x, w, b: _torch_conv(x, w, b, 2, **case), inputs)


@pytest.mark.parametrize("case", CONV1D, ids=str)
def test_conv1d_matches_torch_to_second_order(backend, case):
    r = np.random.default_rng(2)
    groups = case.get("groups", 1)
    inputs = {"x": r.standard_normal((3, 4, 11)), "w": r.standard_normal((6, 4 // groups, 3))}
    _compare(backend, lambda x, w: rg.conv1d(x, w, **case), lambda x, w: _torch_conv(x, w, None, 1, **case),
             inputs)


@pytest.mark.parametrize("case", CONV2D, ids=str)
def test_conv2d_float32_matches_torch(backend, case):
    """float32 takes other routes (onnxruntime's own Conv, ConvTranspose): the same numbers within
    float32 rounding."""
    r = np.random.default_rng(3)
    groups = case.get("groups", 1)
    x = r.standard_normal((3, 4, 9, 8)).astype("float32")
    w = r.standard_normal((8, 4 // groups, 3, 2)).astype("float32")
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        xv, wv = rg.data("x", [-1, 4, -1, 8], stop_gradient=False), rg.data("w", w.shape, stop_gradient=False)
        y = rg.conv2d(xv, wv, **case)
        fetch = [y, *rg.gradients(rg.sum(y * y), [xv, wv])]
    got = backend.executor().run(main, feed={"x": x, "w": w}, fetch_list=fetch)
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    yt = _torch_conv(xt, wt, None, 2, **case)
    (yt * yt).sum().backward()
    for a, b in zip(got, [yt.detach(), xt.grad, wt.grad]):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-4, atol=1e-4)


POOLS = [dict(kernel_size=2), dict(kernel_size=3, stride=1, padding=1), dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 0)),
         dict(kernel_size=3, stride=2, padding=1)]


@pytest.mark.parametrize("case", POOLS, ids=str)
@pytest.mark.parametrize("kind", ["max", "avg"])
def test_pool2d_matches_torch_to_second_order(backend, kind, case):
    r = np.random.default_rng(4)
    x = r.permutation(np.arange(2 * 3 * 7 * 6)).reshape(2, 3, 7, 6) * 0.01 - 1.0   # no ties
    ours, theirs = (rg.max_pool2d, F.max_pool2d) if kind == "max" else (rg.avg_pool2d, F.avg_pool2d)
    _compare(backend, lambda x: ours(x, **case), lambda x: theirs(x, **case), {"x": x})


@pytest.mark.parametrize("case", POOLS, ids=str)
def test_max_pool_of_many_channels_with_ties_matches_torch(backend, case):
    """16 channels (the torch backend pools a channels-last copy from 8 channels on), many ties (as after
    a relu): values, gradients and second order as torch's NCHW max pool."""
    r = np.random.default_rng(5)
    x = np.maximum(r.integers(-2, 3, (2, 16, 7, 6)), 0) * 0.5
    _compare(backend, lambda x: rg.max_pool2d(x, **case), lambda x: F.max_pool2d(x, **case), {"x": x})


def test_torch_max_pool_of_many_channels_hands_back_nchw_tensors_of_torchs_values():
    """The channels-last detour does not leak: contiguous NCHW outputs, the values and flat indices of
    ATen's NCHW kernel (NaN and ties included), float32 and float64."""
    backend = rg.Executor(backend="torch").backend
    aten = torch.ops.aten
    for dtype in (torch.float32, torch.float64):
        x = torch.relu(torch.randn(3, 8, 9, 8, dtype=dtype))
        x[0, 1, 2, 3], x[2, 7, 0, 0] = float("nan"), float("nan")
        for kernel, strides, pads in [([2, 2], [2, 2], [0, 0, 0, 0]), ([3, 3], [2, 1], [1, 1, 1, 1])]:
            y, indices = backend.max_pool(x, kernel, strides, pads)
            want_y, want_indices = aten.max_pool2d_with_indices(x, kernel, strides, pads[:2])
            assert y.is_contiguous() and indices.is_contiguous()
            torch.testing.assert_close(y, want_y, rtol=0, atol=0, equal_nan=True)
            assert torch.equal(indices, want_indices)


def test_max_pool_gradient_goes_to_the_first_of_tied_elements(backend):
    """Ties: the first maximal element in the window's row-major order takes the whole gradient,
    as in torch; overlapping windows add up at a shared maximum."""
    x = np.zeros((1, 1, 3, 4))
    x[0, 0, 2, 3] = -1.0
    got = _run(backend, lambda x: rg.max_pool2d(x, 2, stride=1), {"x": x},
               lambda y, vars_: [y, *rg.gradients(rg.sum(y), vars_)])
    expected = np.zeros((1, 1, 3, 4))
    expected[0, 0, :2, :3] = 1.0            # each of the 2x3 windows picks its top-left element
    np.testing.assert_array_equal(got[0], np.zeros((1, 1, 2, 3)))
    np.testing.assert_array_equal(got[1], expected)
    xt = torch.tensor(x, requires_grad=True)
    F.max_pool2d(xt, 2, stride=1).sum().backward()
    np.testing.assert_array_equal(got[1], xt.grad.numpy())


def test_avg_pool_counts_the_padding_in_the_divisor(backend):
    x = np.ones((1, 1, 2, 2))
    got = _run(backend, lambda x: rg.avg_pool2d(x, 2, padding=1), {"x": x}, lambda y, vars_: [y])[0]
    np.testing.assert_allclose(got, np.full((1, 1, 2, 2), 0.25))


def test_batch_and_spatial_sizes_known_at_run_time(backend):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3, -1, -1], dtype="float64")
        w = rg.data("w", [5, 3, 3, 3], dtype="float64")
        y = rg.conv2d(x, w, stride=2, padding=1)
        pooled = rg.max_pool2d(y, 2)
        assert y.shape == (-1, 5, -1, -1) and pooled.shape == (-1, 5, -1, -1)
    r = np.random.default_rng(5)
    for n, h, wd in [(1, 8, 8), (3, 9, 12)]:
        xv, wv = r.standard_normal((n, 3, h, wd)), r.standard_normal((5, 3, 3, 3))
        got = backend.executor().run(main, feed={"x": xv, "w": wv}, fetch_list=[pooled])[0]
        expected = F.max_pool2d(F.conv2d(torch.tensor(xv), torch.tensor(wv), stride=2, padding=1), 2)
        np.testing.assert_allclose(got, expected.numpy(), rtol=1e-10, atol=1e-12)


# --- shape rules and errors ---------------------------------------------------------------

def test_output_shapes():
    x = rg.data("x", [-1, 4, 32, 30])
    assert rg.conv2d(x, rg.create_parameter("w1", [8, 4, 3, 3]), padding=1).shape == (-1, 8, 32, 30)
    assert rg.conv2d(x, rg.create_parameter("w2", [8, 2, 5, 3]), stride=2, dilation=(1, 2),
                     groups=2).shape == (-1, 8, 14, 13)
    assert rg.max_pool2d(x, 3, stride=2, padding=1).shape == (-1, 4, 16, 15)
    assert rg.avg_pool2d(x, (2, 3)).shape == (-1, 4, 16, 10)
    assert rg.conv1d(rg.data("s", [2, 3, 10]), rg.create_parameter("w3", [6, 3, 4]), padding=(1, 2)).shape == (2, 6, 10)


def test_wrong_channel_count_names_both_shapes_and_the_line():
    x = rg.data("x", [-1, 3, 8, 8])
    w = rg.create_parameter("w", [6, 4, 3, 3])
    with pytest.raises(rg.ShapeError) as info:
        rg.conv2d(x, w)
    message = str(info.value)
    assert "[?, 3, 8, 8]" in message and "[6, 4, 3, 3]" in message and "test_conv.py" in message


def test_groups_not_dividing_the_filters_is_a_shape_error():
    x = rg.data("x", [-1, 4, 8, 8])
    with pytest.raises(rg.ShapeError, match="groups=2 does not divide the 5 filters"):
        rg.conv2d(x, rg.create_parameter("w", [5, 2, 3, 3]), groups=2)


def test_kernel_larger_than_the_padded_input_is_a_shape_error():
    x = rg.data("x", [-1, 2, 4, 4])
    with pytest.raises(rg.ShapeError, match="more than the padded input"):
        rg.conv2d(x, rg.create_parameter("w", [3, 2, 7, 3]), padding=1)
    with pytest.raises(rg.ShapeError, match="more than the padded input"):
        rg.max_pool2d(x, 5, padding=0)


def test_bad_hyper_parameters_are_program_errors_naming_the_line():
    x = rg.data("x", [-1, 2, 8, 8])
    w = rg.create_parameter("w", [3, 2, 3, 3])
    for kwargs in [dict(stride=0), dict(padding=-1), dict(dilation=(1, 2, 3)), dict(groups=0),
                   dict(padding="same", stride=2), dict(padding=(1, 2, 3))]:
        with pytest.raises(rg.ProgramError, match="test_conv.py"):
            rg.conv2d(x, w, **kwargs)
    with pytest.raises(rg.ProgramError, match="at most half the kernel"):
        rg.max_pool2d(x, 2, padding=2)


def test_bias_of_the_wrong_size_is_a_shape_error():
    x = rg.data("x", [-1, 2, 8, 8])
    with pytest.raises(rg.ShapeError, match=r"bias b float32\[4\]"):
        rg.conv2d(x, rg.create_parameter("w", [3, 2, 3, 3]), rg.create_parameter("b", [4]))


@pytest.mark.engine_skip("the kernel's run-time message (onnxruntime reports its own)")
def test_kernel_larger_than_an_input_known_at_run_time_fails_the_run(backend):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 1, -1, -1], dtype="float64")
        y = rg.conv2d(x, rg.data("w", [1, 1, 3, 3], dtype="float64"))
    with pytest.raises(rg.ExecutionError, match="Conv"):
        backend.executor().run(main, feed={"x": np.ones((1, 1, 2, 2)), "w": np.ones((1, 1, 3, 3))},
                               fetch_list=[y])


@pytest.mark.parametrize("padding", [1, ((1, 0), (2, 1))], ids=["symmetric", "per-side"])
def test_general_path_runs_on_a_strict_array_api_namespace(padding):
    """The im2col path (NumPy/CuPy, and torch for per-side pool padding) uses only Array API calls."""
    xps = pytest.importorskip("array_api_strict")
    r = np.random.default_rng(6)
    feed = {"x": r.standard_normal((2, 4, 7, 6)), "w": r.standard_normal((6, 2, 3, 3))}
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x, w = (rg.data(n, a.shape, "float64", stop_gradient=False) for n, a in feed.items())
        y = rg.conv2d(x, w, stride=2, padding=padding, groups=2)
        loss = rg.sum(rg.max_pool2d(y, 2, stride=1) ** 2) + rg.sum(rg.avg_pool2d(y, 2, padding=1) ** 2)
        fetch = [loss, *rg.gradients(loss, [x, w])]
    expected = rg.Executor().run(main, feed=feed, fetch_list=fetch)
    got = rg.Executor(xp=xps).run(main, feed=feed, fetch_list=fetch)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(rg.backends.to_numpy(a), b, rtol=1e-12, atol=1e-12)


@pytest.mark.engine_skip("checks which torch routines the torch backend calls")
def test_torch_backend_uses_atens_explicit_backward_ops(backend, monkeypatch):
    """On torch the gradient ops are ATen's backward ops (never torch.autograd inside a kernel)."""
    if backend.name != "torch":
        pytest.skip("a torch backend check")
    called = []
    for name in ("convolution_backward", "max_pool2d_with_indices_backward", "avg_pool2d_backward"):
        original = getattr(torch.ops.aten, name)
        monkeypatch.setattr(torch.ops.aten, name,
                            lambda *args, _name=name, _original=original: called.append(_name) or _original(*args))
    monkeypatch.setattr(torch.autograd, "grad", lambda *a, **k: pytest.fail("torch.autograd.grad called"))
    r = np.random.default_rng(7)
    x, w = r.standard_normal((2, 3, 8, 8)), r.standard_normal((4, 3, 3, 3))
    build = lambda x, w: rg.max_pool2d(rg.conv2d(x, w, padding=1), 2) + rg.avg_pool2d(rg.conv2d(x, w, padding=1), 2)
    _run(backend, build, {"x": x, "w": w}, lambda y, vars_: rg.gradients(rg.sum(y * y), vars_))
    assert set(called) == {"convolution_backward", "max_pool2d_with_indices_backward", "avg_pool2d_backward"}


@pytest.mark.engine_skip("zero-stride NumPy views are an array backend's concern")
def test_shape_only_inputs_may_be_zero_stride_stand_ins(backend):
    """The gradient ops read their ``*_like`` input for its shape alone (a pass may bind a stand-in)."""
    from retrograd.ops.nn.conv import conv_input_grad, conv_weight_grad
    from retrograd.ops.nn.pool import avg_pool_grad, max_pool_grad
    r = np.random.default_rng(8)
    conv = {"strides": [2, 1], "pads": [1, 0, 0, 2], "dilations": [1, 2], "groups": 2}
    pool = {"kernel": [3, 3], "strides": [2, 1], "pads": [1, 1, 1, 1]}
    x, w, dy = r.standard_normal((2, 4, 5, 5)), r.standard_normal((6, 2, 2, 3)), r.standard_normal((2, 6, 3, 3))
    # indices a max pool returns (CUDA's backward drops any outside its window, as no pool returns them)
    dy_pool = r.standard_normal((2, 4, 3, 5))
    ids = torch.nn.functional.max_pool2d(torch.tensor(r.permutation(200).reshape(2, 4, 5, 5) * 1.0), 3, (2, 1), 1,
                                         return_indices=True)[1].numpy()
    builds = [(lambda a, b, like: conv_input_grad(a, b, like, conv), [dy, w, x]),
              (lambda a, b, like: conv_weight_grad(a, b, like, conv), [x, dy, w]),
              (lambda a, b, like: max_pool_grad(a, b, like, pool), [dy_pool, ids, x]),
              (lambda a, like: avg_pool_grad(a, like, pool), [dy_pool, x])]
    for build, arrays in builds:
        main = rg.Program()
        with rg.program_guard(main, rg.Program()):
            vars_ = [rg.data(f"in{i}", a.shape, str(a.dtype)) for i, a in enumerate(arrays)]
            out = build(*vars_)
        feed = {f"in{i}": a for i, a in enumerate(arrays)}
        expected = rg.Executor().run(main, feed=feed, fetch_list=[out])[0]
        feed[f"in{len(arrays) - 1}"] = np.broadcast_to(np.zeros((), arrays[-1].dtype), arrays[-1].shape)
        got = backend.executor().run(main, feed=feed, fetch_list=[out])[0]
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@st.composite
def _conv_configs(draw):
    """A random convolution: 1 or 2 spatial axes, groups, per-side pads, strides, dilations."""
    nd = draw(st.integers(1, 2))
    groups = draw(st.integers(1, 3))
    c, f = groups * draw(st.integers(1, 2)), groups * draw(st.integers(1, 2))
    kernel = [draw(st.integers(1, 3)) for _ in range(nd)]
    dilation = [draw(st.integers(1, 2)) for _ in range(nd)]
    stride = [draw(st.integers(1, 3)) for _ in range(nd)]
    pads = [(draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in range(nd)]
    sizes = [max(1, d * (k - 1) + 1 - p[0] - p[1]) + draw(st.integers(0, 4))
             for k, d, p in zip(kernel, dilation, pads)]
    return dict(nd=nd, groups=groups, c=c, f=f, kernel=kernel, dilation=dilation, stride=stride,
                pads=pads, sizes=sizes, n=draw(st.integers(1, 2)), seed=draw(st.integers(0, 2**16)))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cfg=_conv_configs())
def test_random_convolutions_match_torch(backend, cfg):
    r = np.random.default_rng(cfg["seed"])
    nd = cfg["nd"]
    x = r.standard_normal((cfg["n"], cfg["c"], *cfg["sizes"]))
    w = r.standard_normal((cfg["f"], cfg["c"] // cfg["groups"], *cfg["kernel"]))
    hyper = dict(stride=cfg["stride"], dilation=cfg["dilation"], groups=cfg["groups"])
    conv = rg.conv1d if nd == 1 else rg.conv2d
    got = _run(backend, lambda x, w: conv(x, w, padding=cfg["pads"], **hyper), {"x": x, "w": w},
               lambda y, vars_: [y, *rg.gradients(rg.sum(y * y), vars_)])
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    padded = F.pad(xt, [p for pair in reversed(cfg["pads"]) for p in pair])
    yt = (F.conv1d if nd == 1 else F.conv2d)(padded, wt, **hyper)
    (yt * yt).sum().backward()
    for a, b in zip(got, [yt.detach(), xt.grad, wt.grad]):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-9, atol=1e-10)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_poolings_match_torch(backend, data):
    kernel = [data.draw(st.integers(1, 3)) for _ in range(2)]
    stride = [data.draw(st.integers(1, 3)) for _ in range(2)]
    padding = [data.draw(st.integers(0, k // 2)) for k in kernel]
    sizes = [k + data.draw(st.integers(0, 4)) for k in kernel]
    kind = data.draw(st.sampled_from(["max", "avg"]))
    r = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = r.permutation(np.arange(2 * 3 * sizes[0] * sizes[1])).reshape(2, 3, *sizes) * 0.01
    ours, theirs = (rg.max_pool2d, F.max_pool2d) if kind == "max" else (rg.avg_pool2d, F.avg_pool2d)
    got = _run(backend, lambda x: ours(x, kernel, stride, padding), {"x": x},
               lambda y, vars_: [y, *rg.gradients(rg.sum(y * y), vars_)])
    xt = torch.tensor(x, requires_grad=True)
    yt = theirs(xt, kernel, stride, padding)
    (yt * yt).sum().backward()
    for a, b in zip(got, [yt.detach(), xt.grad]):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-9, atol=1e-10)
