"""max/min, argmax/argmin and topk against PyTorch (float64) per backend: values, gradients
(the tie rule: the first maximal element gets the whole gradient), bad input when built and
when run (ExecutionError naming the op on every backend, the engine's guard nodes too)."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg

torch = pytest.importorskip("torch", reason="the reference values come from PyTorch")

pytestmark = pytest.mark.engine


def run(backend, build, feed, wrt=True):
    """Build ``build(*data Vars)`` -> outputs; with ``wrt``, also the gradient of a weighted sum
    of the float outputs with respect to the first input."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        xs = [rg.data(name, list(value.shape), value.dtype.name, stop_gradient=False)
              for name, value in feed.items()]
        outs = build(*xs)
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        fetch = list(outs)
        if wrt:
            floats = [o for o in outs if o.dtype == "float64"]
            loss = rg.add_n([rg.sum(o * (i + 1.0)) for i, o in enumerate(floats)])
            fetch += rg.gradients(loss, xs[0])
    return backend.executor().run(main, feed=feed, fetch_list=fetch)


def torch_grad(outs, t):
    floats = [o for o in outs if o.dtype == torch.float64]
    loss = sum((o * (i + 1.0)).sum() for i, o in enumerate(floats))
    return torch.autograd.grad(loss, t)[0].numpy()


def distinct(shape, seed=0):
    r = np.random.default_rng(seed)
    return r.permutation(int(np.prod(shape))).reshape(shape) * 0.5 - 3.0 + r.uniform(0, 0.1, shape)


@pytest.mark.parametrize("axis,keepdims", [(None, False), (1, False), (-1, True), ([0, 2], False),
                                           ([0, 1, 2], True), (0, True)])
def test_max_min_match_torch_amax_amin_without_ties(axis, keepdims, backend):
    x0 = distinct((2, 3, 4))
    got = run(backend, lambda x: [rg.max(x, axis, keepdims), rg.min(x, axis, keepdims)], {"x": x0})
    t = torch.tensor(x0, requires_grad=True)
    dims = tuple(range(3)) if axis is None else axis
    want = [torch.amax(t, dims, keepdims), torch.amin(t, dims, keepdims)]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.detach().numpy(), rtol=0, atol=0)
    np.testing.assert_allclose(got[2], torch_grad(want, t), rtol=1e-12)


def test_max_gives_the_whole_gradient_to_the_first_maximal_element(backend):
    x0 = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    dx, = run(backend, lambda x: rg.max(x, axis=1), {"x": x0})[1:]
    np.testing.assert_array_equal(dx, [[0, 1, 0, 0], [1, 0, 0, 0]])
    # torch.max(x, dim) picks the same element; torch.amax would split the gradient
    t = torch.tensor(x0, requires_grad=True)
    torch.max(t, 1).values.sum().backward()
    np.testing.assert_array_equal(dx, t.grad.numpy())


def test_min_over_several_axes_picks_the_first_in_row_major_order(backend):
    x0 = np.array([[[5.0, 1.0], [1.0, 4.0]], [[1.0, 9.0], [2.0, 1.0]]])   # 1.0 four times
    y, dx = run(backend, lambda x: rg.min(x, axis=[1, 2]), {"x": x0})
    np.testing.assert_array_equal(y, [1.0, 1.0])
    np.testing.assert_array_equal(dx, [[[0, 1], [0, 0]], [[1, 0], [0, 0]]])
    y, dx = run(backend, lambda x: rg.max(x), {"x": np.full((2, 2, 2), 7.0)})      # all tied: element 0
    assert dx.reshape(-1).tolist() == [1.0] + [0.0] * 7


@pytest.mark.parametrize("axis,keepdims", [(-1, False), (0, True), (1, False), (None, False), (None, True)])
def test_argmax_argmin_take_the_first_index_on_ties_as_torch(axis, keepdims, backend):
    x0 = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, -1.0, -1.0], [0.0, 0.0, 0.0, 0.0]])
    got = run(backend, lambda x: [rg.argmax(x, axis, keepdims), rg.argmin(x, axis, keepdims)],
              {"x": x0}, wrt=False)
    t = torch.tensor(x0)
    want = [torch.argmax(t, axis, keepdims), torch.argmin(t, axis, keepdims)]
    for g, w in zip(got, want):
        assert g.dtype == np.int64
        np.testing.assert_array_equal(g, w.numpy())


def test_argmax_of_integers(backend):
    x0 = np.array([[3, 7, 7], [-2, -5, -2]])
    got, = run(backend, lambda x: rg.argmax(x), {"x": x0}, wrt=False)
    np.testing.assert_array_equal(got, [1, 0])


@pytest.mark.parametrize("k,axis", [(2, -1), (4, 1), (0, 0), (3, 0)])
def test_topk_values_indices_and_gradient_match_torch(k, axis, backend):
    x0 = distinct((3, 4, 2), seed=k)
    values, indices, dx = run(backend, lambda x: list(rg.topk(x, k, axis)), {"x": x0})
    t = torch.tensor(x0, requires_grad=True)
    want = torch.topk(t, k, dim=axis, largest=True, sorted=True)
    np.testing.assert_array_equal(values, want.values.detach().numpy())
    np.testing.assert_array_equal(indices, want.indices.numpy())
    assert indices.dtype == np.int64
    np.testing.assert_allclose(dx, torch_grad([want.values], t), rtol=1e-12)


def test_topk_orders_equal_values_by_index(backend):
    x0 = np.array([[1.0, 5.0, 1.0, 5.0, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    values, indices = run(backend, lambda x: list(rg.topk(x, 3)), {"x": x0}, wrt=False)
    np.testing.assert_array_equal(values, [[5.0, 5.0, 3.0], [2.0, 2.0, 2.0]])
    np.testing.assert_array_equal(indices, [[1, 3, 4], [0, 1, 2]])


def test_topk_with_a_var_k_has_an_unknown_size_along_the_axis(backend):
    x0 = distinct((2, 5))
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 5], "float64", stop_gradient=False)
        k = rg.data("k", [], "int64")
        values, indices = rg.topk(x, k)
        dx, = rg.gradients(rg.sum(values * values), x)
    assert values.shape == (-1, -1) and indices.dtype == "int64"
    exe = backend.executor()
    for count in (1, 3, 5):
        v, i, d = exe.run(main, feed={"x": x0, "k": np.array(count)}, fetch_list=[values, indices, dx])
        t = torch.tensor(x0, requires_grad=True)
        want = torch.topk(t, count)
        (want.values ** 2).sum().backward()
        np.testing.assert_array_equal(v, want.values.detach().numpy())
        np.testing.assert_array_equal(i, want.indices.numpy())
        np.testing.assert_allclose(d, t.grad.numpy(), rtol=1e-12)


def test_topk_k_larger_than_the_axis_fails_the_run_naming_the_op(backend):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        values, _ = rg.topk(rg.data("x", [-1, 3], "float64"), rg.data("k", [], "int64"))
    with pytest.raises(rg.ExecutionError, match=r"TopK in block 0.*k = 4 must lie in \[0, 3\]"):
        backend.executor().run(main, feed={"x": np.zeros((2, 3)), "k": np.array(4)}, fetch_list=[values])


@pytest.mark.parametrize("build", [lambda x: rg.max(x, axis=0), lambda x: rg.min(x),
                                   lambda x: rg.argmax(x, axis=0), lambda x: rg.argmin(x, axis=None)],
                         ids=["Max", "Min", "ArgMax", "ArgMin"])
def test_an_empty_reduced_axis_fails_the_run_naming_the_op(build, backend, request):
    op = request.node.callspec.id.split("-")[-1]
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        y = build(rg.data("x", [-1, 3], "float64"))
    with pytest.raises(rg.ExecutionError, match=rf"{op} in block 0.*{op} over an empty axis: axis 0"):
        backend.executor().run(main, feed={"x": np.zeros((0, 3))}, fetch_list=[y])


def test_bad_axes_and_k_are_refused_when_built():
    with rg.program_guard(rg.Program(), rg.Program()):
        x = rg.data("x", [-1, 3])
        with pytest.raises(rg.ShapeError, match="Max.*axis 2 is out of range for rank 2"):
            rg.max(x, axis=2)
        with pytest.raises(rg.ShapeError, match="axis -3 is out of range"):
            rg.argmin(x, axis=-3)
        with pytest.raises(rg.ShapeError, match=r"TopK.*k = 4 is larger than axis 1 of 'x' \(3\)"):
            rg.topk(x, 4)
        with pytest.raises(rg.ProgramError, match="k must be >= 0"):
            rg.topk(x, -1)
        with pytest.raises(rg.ShapeError, match="must be an int64 scalar"):
            rg.topk(x, rg.data("k2", [1], "int64"))


def test_an_int_k_larger_than_an_axis_known_only_at_run_time_fails_naming_the_op(backend):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        values, _ = rg.topk(rg.data("x", [2, -1], "float64"), 3)
    exe = backend.executor()
    got, = exe.run(main, feed={"x": distinct((2, 4))}, fetch_list=[values])
    assert got.shape == (2, 3)
    with pytest.raises(rg.ExecutionError, match=r"TopK in block 0.*k = 3 must lie in \[0, 2\]"):
        exe.run(main, feed={"x": np.zeros((2, 2))}, fetch_list=[values])


def test_extremes_of_a_scalar(backend):
    s0 = np.array(2.5)
    y, i, j, ds = run(backend, lambda s: [rg.max(s), rg.argmax(s), rg.argmin(s, axis=None, keepdims=True)],
                      {"s": s0})
    assert y.shape == () and float(y) == 2.5 and float(ds) == 1.0
    assert i.shape == () and int(i) == 0 and j.shape == () and int(j) == 0


def test_max_gradient_with_sizes_known_only_at_run_time(backend):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, 3], "float64", stop_gradient=False)
        y = rg.max(x, axis=[0, 2])
        dx, = rg.gradients(rg.sum(y * y), x)
    exe = backend.executor()
    for shape in [(2, 4, 3), (1, 2, 3)]:
        x0 = distinct(shape, seed=len(shape))
        got_y, got_dx = exe.run(main, feed={"x": x0}, fetch_list=[y, dx])
        t = torch.tensor(x0, requires_grad=True)
        want = torch.amax(t, (0, 2))
        (want * want).sum().backward()
        np.testing.assert_array_equal(got_y, want.detach().numpy())
        np.testing.assert_allclose(got_dx, t.grad.numpy(), rtol=1e-12)
