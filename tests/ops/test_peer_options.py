"""The options people port code with (issue 32, items 12 and 14), each against its peer on every
backend (numpy, torch, the onnxruntime engine): values and float64 gradients against PyTorch's
autograd, the ONNX export run in onnxruntime alone."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import retrograd as rg

sys.path.insert(0, str(Path(__file__).resolve().parent))   # tests/ops: the shared ONNX reference
from onnx_reference import exported  # noqa: E402

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


# --- topk(largest=, sorted=) -----------------------------------------------------------------------

@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_topk_largest_and_smallest_match_torch_topk(axis, largest, backend):
    x0 = np.random.default_rng(1).permutation(24).reshape(2, 3, 4) * 0.25 - 2.0      # distinct values
    k = 2
    got = run(backend, lambda x: rg.topk(x, k, axis=axis, largest=largest, sorted=True), {"x": x0})
    t = torch.tensor(x0, requires_grad=True)
    want = torch.topk(t, k, dim=axis, largest=largest, sorted=True)
    np.testing.assert_array_equal(got[0], want.values.detach().numpy())
    np.testing.assert_array_equal(got[1], want.indices.numpy())
    np.testing.assert_allclose(got[2], torch_grad([want.values], t), rtol=1e-12)
    ours = exported(lambda x: rg.topk(x, k, axis=axis, largest=largest), {"x": x0})
    np.testing.assert_array_equal(ours[1], got[1])


def test_topk_smallest_ties_go_to_the_lower_index_and_sorted_false_is_accepted(backend):
    x0 = np.array([[3.0, 1.0, 2.0, 1.0, 1.0]])
    values, ids = run(backend, lambda x: rg.topk(x, 3, largest=False, sorted=False), {"x": x0}, wrt=False)
    assert values.tolist() == [[1.0, 1.0, 1.0]] and ids.tolist() == [[1, 3, 4]]
    t = torch.topk(torch.tensor(x0), 3, largest=False, sorted=False)          # the same set as torch
    assert sorted(t.indices[0].tolist()) == ids[0].tolist()


def test_topk_smallest_with_a_run_time_k(backend):
    x0 = np.array([[5.0, -1.0, 4.0, 0.0], [1.0, 2.0, 3.0, 4.0]])
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [2, 4], "float64")
        k = rg.data("k", [], "int64")
        values, ids = rg.topk(x, k, largest=False)
    got = backend.executor().run(main, feed={"x": x0, "k": np.array(3)}, fetch_list=[values, ids])
    want = torch.topk(torch.tensor(x0), 3, largest=False)
    np.testing.assert_array_equal(got[0], want.values.numpy())
    np.testing.assert_array_equal(got[1], want.indices.numpy())


# --- cumsum / cumprod (exclusive=, reverse=) --------------------------------------------------------

def torch_cumulative(fn, identity):
    """torch's cumsum/cumprod with the options written out: flips for reverse, a shift for exclusive."""
    def run_it(t, axis, reverse, exclusive):
        if reverse:
            t = torch.flip(t, [axis])
        if exclusive:
            first = torch.full_like(t.narrow(axis, 0, 1), identity)
            t = torch.cat([first, t.narrow(axis, 0, t.shape[axis] - 1)], axis)
        y = fn(t, axis)
        return torch.flip(y, [axis]) if reverse else y
    return run_it


@pytest.mark.parametrize("name,identity", [("cumsum", 0.0), ("cumprod", 1.0)])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumulative_exclusive_and_reverse_match_torch(name, identity, axis, reverse, backend):
    x0 = rand(3, 4, 2, seed=2)
    x0[1, 2, 0] = 0.0                                       # cumprod's gradient through a zero
    got = run(backend, lambda x: getattr(rg, name)(x, axis, reverse=reverse, exclusive=True), {"x": x0})
    t = torch.tensor(x0, requires_grad=True)
    want = torch_cumulative(getattr(torch, name), identity)(t, axis % 3, reverse, True)
    np.testing.assert_allclose(got[0], want.detach().numpy(), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(got[1], torch_grad([want], t), rtol=1e-10, atol=1e-12)
    ours = exported(lambda x: getattr(rg, name)(x, axis, reverse=reverse, exclusive=True), {"x": x0})
    np.testing.assert_allclose(ours[0], got[0], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
def test_cumulative_exclusive_of_ints_and_bools_and_an_empty_axis(name, backend):
    ints = np.array([[3, 1, 2], [2, 2, 2]])
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        a = rg.data("a", [2, 3], "int64")
        b = rg.data("b", [2, 3], "bool")
        e = rg.data("e", [2, 0], "float64")
        fn = getattr(rg, name)
        outs = [fn(a, 1, exclusive=True), fn(b, 1, reverse=True, exclusive=True), fn(e, 1, exclusive=True)]
    got = backend.executor().run(main, feed={"a": ints, "b": ints > 1, "e": np.zeros((2, 0))}, fetch_list=outs)
    np_fn = getattr(np, name)
    identity = 0 if name == "cumsum" else 1
    want_a = np.concatenate([np.full((2, 1), identity), np_fn(ints, 1)[:, :-1]], 1)
    flipped = (ints > 1)[:, ::-1].astype(np.int64)
    want_b = np.concatenate([np.full((2, 1), identity), np_fn(flipped, 1)[:, :-1]], 1)[:, ::-1]
    assert got[0].tolist() == want_a.tolist() and got[0].dtype == np.int64
    assert got[1].tolist() == want_b.tolist()
    assert got[2].shape == (2, 0)


# --- layer_norm / rms_norm over several trailing axes (normalized_ndim) ---------------------------

@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("params", ["none", "weight", "both"])
def test_layer_norm_over_trailing_axes_matches_torch(nd, params, backend):
    x0 = rand(2, 3, 4, 5, seed=3)
    shape = x0.shape[4 - nd:]
    w0, b0 = 1.0 + 0.1 * rand(*shape, seed=4), 0.1 * rand(*shape, seed=5)
    feed = {"x": x0, "w": w0, "b": b0}

    def build(x, w, b):
        if params == "none":
            return rg.layer_norm(x, normalized_ndim=nd)
        return rg.layer_norm(x, w, b if params == "both" else None)     # nd from weight's rank
    got = run(backend, build, feed)
    t = torch.tensor(x0, requires_grad=True)
    want = torch.nn.functional.layer_norm(t, shape, None if params == "none" else torch.tensor(w0),
                                          torch.tensor(b0) if params == "both" else None, 1e-5)
    np.testing.assert_allclose(got[0], want.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got[1], torch_grad([want], t), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(exported(build, feed)[0], got[0], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("nd", [1, 2])
def test_rms_norm_over_trailing_axes_matches_torch(nd, backend):
    x0 = rand(3, 4, 6, seed=6)
    shape = x0.shape[3 - nd:]
    w0 = 1.0 + 0.1 * rand(*shape, seed=7)
    for with_weight in (True, False):
        build = (lambda x, w: rg.rms_norm(x, w)) if with_weight else (lambda x, w: rg.rms_norm(x, normalized_ndim=nd))
        got = run(backend, build, {"x": x0, "w": w0})
        t = torch.tensor(x0, requires_grad=True)
        want = torch.nn.functional.rms_norm(t, shape, torch.tensor(w0) if with_weight else None, 1e-6)
        np.testing.assert_allclose(got[0], want.detach().numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(got[1], torch_grad([want], t), rtol=1e-8, atol=1e-10)


def test_layer_norm_over_two_axes_with_a_run_time_batch_and_second_order(backend):
    x0 = rand(5, 3, 4, seed=8)
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, 3, 4], "float64", stop_gradient=False)
        w = rg.data("w", [3, 4], "float64", stop_gradient=False)
        y = rg.layer_norm(x, w)
        dx, = rg.gradients(rg.sum(y * y * y), [x])
        ddw, = rg.gradients(rg.sum(dx * dx), [w])
    w0 = 1.0 + 0.1 * rand(3, 4, seed=9)
    got = backend.executor().run(main, feed={"x": x0, "w": w0}, fetch_list=[y, ddw])
    t, tw = torch.tensor(x0, requires_grad=True), torch.tensor(w0, requires_grad=True)
    ty = torch.nn.functional.layer_norm(t, (3, 4), tw)
    tdx, = torch.autograd.grad((ty ** 3).sum(), t, create_graph=True)
    tddw, = torch.autograd.grad((tdx ** 2).sum(), tw)
    np.testing.assert_allclose(got[0], ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got[1], tddw.numpy(), rtol=1e-8, atol=1e-10)


def test_norm_params_that_do_not_match_the_trailing_axes_are_a_shape_error():
    with rg.program_guard(rg.Program(), rg.Program()):
        x = rg.data("x", [2, 3, 4])
        with pytest.raises(rg.ShapeError, match="normalised"):
            rg.layer_norm(x, rg.data("w", [4, 3]))
        with pytest.raises(rg.ShapeError, match="normalized_ndim"):
            rg.rms_norm(x, normalized_ndim=4)


# --- pooling: ceil_mode, count_include_pad, dilation ------------------------------------------------

POOL_CASES = [  # kernel, stride, padding, H, W
    (3, 2, 0, 8, 7), (3, 2, 1, 7, 8), (2, 2, 0, 5, 5), ((3, 2), (2, 3), (1, 0), 9, 8), (3, 3, 1, 6, 7),
]


@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("case", POOL_CASES, ids=[str(c) for c in POOL_CASES])
def test_avg_pool2d_options_match_torch(case, count_include_pad, ceil_mode, backend):
    kernel, stride, padding, h, w = case
    x0 = rand(2, 3, h, w, seed=11)
    build = lambda x: rg.avg_pool2d(x, kernel, stride, padding, count_include_pad=count_include_pad,  # noqa: E731
                                    ceil_mode=ceil_mode)
    got = run(backend, build, {"x": x0})
    t = torch.tensor(x0, requires_grad=True)
    want = torch.nn.functional.avg_pool2d(t, kernel, stride, padding, ceil_mode=ceil_mode,
                                          count_include_pad=count_include_pad)
    np.testing.assert_allclose(got[0], want.detach().numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got[1], torch_grad([want], t), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(exported(build, {"x": x0})[0], got[0], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("dilation", [1, 2, (2, 1)])
@pytest.mark.parametrize("case", POOL_CASES, ids=[str(c) for c in POOL_CASES])
def test_max_pool2d_options_match_torch(case, dilation, ceil_mode, backend):
    kernel, stride, padding, h, w = case
    x0 = np.random.default_rng(12).permutation(2 * 3 * h * w).reshape(2, 3, h, w) / 10.0   # no ties
    build = lambda x: rg.max_pool2d(x, kernel, stride, padding, dilation=dilation, ceil_mode=ceil_mode)  # noqa: E731
    got = run(backend, build, {"x": x0})
    t = torch.tensor(x0, requires_grad=True)
    want = torch.nn.functional.max_pool2d(t, kernel, stride, padding, dilation=dilation, ceil_mode=ceil_mode)
    np.testing.assert_array_equal(got[0], want.detach().numpy())
    np.testing.assert_allclose(got[1], torch_grad([want], t), rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(exported(build, {"x": x0})[0], got[0])


def test_pool_options_second_order_and_float32_against_torch(backend):
    x0 = rand(1, 2, 7, 6, seed=13)
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, 2, 7, 6], "float64", stop_gradient=False)
        x32 = rg.data("x32", [-1, 2, 7, 6], "float32")
        y = rg.avg_pool2d(x * x, 3, 2, 1, count_include_pad=False, ceil_mode=True)
        z = rg.max_pool2d(x * x, 3, 2, 1, dilation=2, ceil_mode=True)
        dx, = rg.gradients(rg.sum(y * y) + rg.sum(z * y[:, :, :3, :3]), [x])
        ddx, = rg.gradients(rg.sum(dx * dx), [x])
        y32 = rg.avg_pool2d(x32, 3, 2, 1, count_include_pad=False, ceil_mode=True)
    got = backend.executor().run(main, feed={"x": x0, "x32": x0.astype("float32")}, fetch_list=[ddx, y32])
    t = torch.tensor(x0, requires_grad=True)
    ty = torch.nn.functional.avg_pool2d(t * t, 3, 2, 1, ceil_mode=True, count_include_pad=False)
    tz = torch.nn.functional.max_pool2d(t * t, 3, 2, 1, dilation=2, ceil_mode=True)
    tdx, = torch.autograd.grad((ty * ty).sum() + (tz * ty[:, :, :3, :3]).sum(), t, create_graph=True)
    tddx, = torch.autograd.grad((tdx * tdx).sum(), t)
    np.testing.assert_allclose(got[0], tddx.numpy(), rtol=1e-9, atol=1e-11)
    want32 = torch.nn.functional.avg_pool2d(torch.tensor(x0, dtype=torch.float32), 3, 2, 1, ceil_mode=True,
                                            count_include_pad=False)
    np.testing.assert_allclose(got[1], want32.numpy(), rtol=1e-5, atol=1e-6)


def test_ceil_mode_needs_known_spatial_sizes():
    with rg.program_guard(rg.Program(), rg.Program()):
        x = rg.data("x", [1, 2, -1, 6])
        with pytest.raises(rg.ProgramError, match="ceil_mode=True needs the spatial sizes"):
            rg.max_pool2d(x, 2, ceil_mode=True)
        with pytest.raises(rg.ProgramError, match="at most half"):
            rg.max_pool2d(rg.data("y", [1, 2, 6, 6]), 3, padding=2, dilation=1)
        rg.max_pool2d(rg.data("z", [1, 2, 9, 9]), 3, padding=2, dilation=2)    # half the dilated span


# --- size 0 ---------------------------------------------------------------------------------------

EMPTY_CASES = {   # name: (build, x, the peer)
    "topk-smallest-k0": (lambda x: rg.topk(x, 0, largest=False)[0], rand(2, 3),
                         lambda t: torch.topk(t, 0, largest=False).values),
    "topk-smallest-no-rows": (lambda x: rg.topk(x, 2, largest=False)[0], rand(0, 3),
                              lambda t: torch.topk(t, 2, largest=False).values),
    "cumsum-exclusive-no-rows": (lambda x: rg.cumsum(x, 1, exclusive=True), rand(0, 3),
                                 lambda t: torch.cumsum(t, 1)),
    "layer-norm-2-axes-no-batch": (lambda x: rg.layer_norm(x, normalized_ndim=2), rand(0, 3, 4),
                                   lambda t: torch.nn.functional.layer_norm(t, (3, 4))),
    "rms-norm-2-axes-no-batch": (lambda x: rg.rms_norm(x, normalized_ndim=2), rand(0, 3, 4),
                                 lambda t: torch.nn.functional.rms_norm(t, (3, 4), eps=1e-6)),
    "avg-pool-ceil-no-batch": (lambda x: rg.avg_pool2d(x, 3, 2, 1, count_include_pad=False, ceil_mode=True),
                               rand(0, 2, 6, 6), lambda t: torch.nn.functional.avg_pool2d(
                                   t, 3, 2, 1, ceil_mode=True, count_include_pad=False)),
    "avg-pool-no-channels": (lambda x: rg.avg_pool2d(x, 2, count_include_pad=False, ceil_mode=True),
                             rand(2, 0, 5, 5), lambda t: torch.zeros(2, 0, 3, 3, dtype=t.dtype)),  # torch refuses C=0
    "dropout-p1-empty": (lambda x: rg.dropout(x, 1.0), rand(0, 3), lambda t: t * 0.0),
    "tensor-array-unstack-empty": (lambda x: rg.TensorArray("float64").unstack(x).concat(), rand(0, 2, 3),
                                   lambda t: t.reshape(0, 3)),
    "tensor-array-scatter-no-ids": (lambda x: rg.TensorArray("float64").scatter(rg.constant(np.zeros(0, np.int64)),
                                                                                x).stack(),
                                    rand(0, 3), lambda t: t),
}


@pytest.mark.parametrize("case", sorted(EMPTY_CASES))
def test_options_with_a_size_0_axis_give_torch_empty_result(case, backend):
    build, x0, peer = EMPTY_CASES[case]
    got = run(backend, build, {"x": x0}, wrt=False)
    want = peer(torch.tensor(x0))
    assert got[0].shape == tuple(want.shape)
    np.testing.assert_array_equal(got[0], want.numpy())


@pytest.mark.parametrize("batch", [0, 3])
def test_norm_over_trailing_axes_holding_a_0_with_a_run_time_batch(batch, backend):
    """Regression (fuzzer, issue 32 item 15): ``layer_norm``/``rms_norm`` over 2 trailing axes
    ``[0, 4]`` of an ``x`` declared ``[-1, 0, 4]`` folded the rows as ``[-1, 0]``, which no
    backend can infer (numpy, torch, the engine and export all failed); torch gives the empty
    result, and empty gradients (here also of a second derivative)."""
    x0, w0 = rand(batch, 0, 4, seed=1), rand(0, 4, seed=2)
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, 0, 4], "float64", stop_gradient=False)
        w = rg.data("w", [0, 4], "float64", stop_gradient=False)
        outs = [rg.layer_norm(x, w, w), rg.layer_norm(x, normalized_ndim=2), rg.rms_norm(x, w)]
        grads = rg.gradients(rg.add_n([rg.sum(o * rg.sin(o)) for o in outs]), [x, w], unconnected="zero")
        second = rg.gradients(rg.sum(grads[0] * grads[0]), [x], unconnected="zero")
    feed = {"x": x0, "w": w0}
    tx, tw = torch.tensor(x0, requires_grad=True), torch.tensor(w0, requires_grad=True)
    touts = [torch.nn.functional.layer_norm(tx, (0, 4), tw, tw), torch.nn.functional.layer_norm(tx, (0, 4)),
             torch.nn.functional.rms_norm(tx, (0, 4), tw)]
    tgx, tgw = torch.autograd.grad(sum((o * torch.sin(o)).sum() for o in touts), [tx, tw], allow_unused=True,
                                   materialize_grads=True)
    want = [o.detach().numpy() for o in touts] + [tgx.numpy(), tgw.numpy(), np.zeros_like(x0)]
    fetch = outs + grads + second
    got = backend.executor().run(main, feed=feed, fetch_list=fetch)
    for ours, theirs in zip(got, want):
        assert ours.shape == theirs.shape
        np.testing.assert_allclose(ours, theirs)
    ort = pytest.importorskip("onnxruntime", reason="runs the exported model")
    sess = ort.InferenceSession(rg.onnx.export(main, None, fetch).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    for ours, theirs in zip(sess.run([v.name for v in fetch], feed), want):
        assert ours.shape == theirs.shape
