"""gather/scatter on any axis with negative ids, and the element-wise forms gather_elements /
scatter_elements (issue 32, item 11), against torch.index_select / index_copy / index_add /
gather / scatter / scatter_add in float64 (values and autograd gradients) on every backend
(numpy, torch, the onnxruntime engine) and in the exported model run by onnxruntime alone."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import retrograd as rg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests/ops: the shared ONNX reference
from onnx_reference import exported  # noqa: E402

torch = pytest.importorskip("torch", reason="the reference values come from PyTorch")

pytestmark = pytest.mark.engine


def run(backend, build, feed, wrt=("x",)):
    """``build(*data Vars)`` -> outputs, then the gradients of ``sum(out * sin(out))`` (float
    outputs) with respect to the inputs named in ``wrt``."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        xs = {name: rg.data(name, list(value.shape), value.dtype.name, stop_gradient=False)
              for name, value in feed.items()}
        outs = build(*xs.values())
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        loss = rg.add_n([rg.sum(o * rg.sin(o)) for o in outs if o.dtype == "float64"])
        grads = rg.gradients(loss, [xs[n] for n in wrt], unconnected="zero") if wrt else []
    return backend.executor().run(main, feed=feed, fetch_list=outs + grads)


def torch_run(fn, feed, wrt=("x",)):
    ts = {n: torch.tensor(v, requires_grad=n in wrt) for n, v in feed.items()}
    outs = fn(*ts.values())
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    loss = sum((o * torch.sin(o)).sum() for o in outs if o.dtype == torch.float64)
    grads = torch.autograd.grad(loss, [ts[n] for n in wrt]) if wrt else []
    return [o.detach().numpy() for o in outs] + [g.numpy() for g in grads]


def check(got, want, rtol=1e-12):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert np.shape(g) == np.shape(w)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-12)


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


X = rand(3, 4, 5)


# --- gather / scatter along any axis, negative ids ----------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2])
def test_gather_along_any_axis_with_negative_ids_matches_torch_index_select(axis, backend):
    n = X.shape[axis]
    ids0 = np.array([[0, -1, 1], [n - 1, -n, 0]])          # repeats, negatives, a 2-d id array
    got = run(backend, lambda x, ids: rg.gather(x, ids, axis=axis), {"x": X, "ids": ids0})

    def peer(x, ids):                                       # index_select takes 1-d, non-negative ids
        flat = torch.tensor((ids0 % n).reshape(-1))
        picked = torch.index_select(x, axis % 3, flat)
        a = axis % 3
        return picked.reshape(X.shape[:a] + ids0.shape + X.shape[a + 1:])
    check(got, torch_run(peer, {"x": X, "ids": ids0}))
    np.testing.assert_allclose(got[0], np.take(X, ids0, axis=axis))
    check(exported(lambda x, ids: rg.gather(x, ids, axis=axis), {"x": X, "ids": ids0})[:1], got[:1])


def test_gather_default_axis_keeps_the_one_gather_op():
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        rg.gather(rg.data("x", [5, 2]), rg.data("i", [3], "int64"))
        rg.gather(rg.data("y", [5, 2]), [1, -1], axis=1)
    types = [op.type for op in main.global_block().ops]
    assert types.count("Gather") == 2 and types[:2] == ["Constant", "Gather"] or types[0] == "Gather"


@pytest.mark.parametrize("bad", [5, -6])
def test_gather_id_outside_minus_n_to_n_names_the_op(bad, backend):
    with pytest.raises(rg.ExecutionError, match=r"Gather.*out of range \[-5, 5\)"):
        run(backend, lambda x, ids: rg.gather(x, ids, axis=2), {"x": X, "ids": np.array([0, bad])}, wrt=())


@pytest.mark.parametrize("overwrite", [True, False])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_along_any_axis_with_negative_ids_matches_torch_index_copy_and_index_add(axis, overwrite, backend):
    a, n = axis % 3, X.shape[axis]
    ids0 = np.array([-1, 0, 1]) if overwrite else np.array([-1, 0, n - 1, 0])     # add: repeats too
    u0 = rand(*(X.shape[:a] + ids0.shape + X.shape[a + 1:]), seed=1)
    got = run(backend, lambda x, ids, u: rg.scatter(x, ids, u, overwrite=overwrite, axis=axis),
              {"x": X, "ids": ids0, "u": u0}, wrt=("x", "u"))

    def peer(x, ids, u):
        index = torch.tensor(ids0 % n)
        return x.index_copy(a, index, u) if overwrite else x.index_add(a, index, u)
    check(got, torch_run(peer, {"x": X, "ids": ids0, "u": u0}, wrt=("x", "u")))
    check(exported(lambda x, ids, u: rg.scatter(x, ids, u, overwrite=overwrite, axis=axis),
                   {"x": X, "ids": ids0, "u": u0}), got[:1])


def test_scatter_repeated_negative_and_positive_id_keeps_the_last_update(backend):
    x0, u0 = rand(4, 2), rand(2, 2, seed=3)                 # -1 and 3 name the same row
    y, dx, du = run(backend, lambda x, ids, u: rg.scatter(x, ids, u), {"x": x0, "ids": np.array([-1, 3]), "u": u0},
                    wrt=("x", "u"))
    want = x0.copy()
    want[3] = u0[1]
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(du[0], 0.0)               # overwritten: no gradient
    np.testing.assert_allclose(du[1], np.sin(want[3]) + want[3] * np.cos(want[3]))


# --- gather_elements / scatter_elements ---------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_gather_elements_matches_torch_gather(axis, backend):
    a = axis % 3
    shape = [2, 3, 4]
    shape[a] = 6                                             # more ids than the axis: repeats
    ids0 = np.random.default_rng(4).integers(-X.shape[a], X.shape[a], shape)
    got = run(backend, lambda x, ids: rg.gather_elements(x, ids, axis), {"x": X, "ids": ids0})
    check(got, torch_run(lambda x, ids: torch.gather(x, a, torch.tensor(ids0 % X.shape[a])), {"x": X, "ids": ids0}))
    check(exported(lambda x, ids: rg.gather_elements(x, ids, axis), {"x": X, "ids": ids0}), got[:1])


@pytest.mark.parametrize("reduction", ["none", "add"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_elements_matches_torch_scatter_and_scatter_add(axis, reduction, backend):
    a = axis % 3
    rng = np.random.default_rng(5)
    shape = [2, 3, 4]
    shape[a] = X.shape[a]
    if reduction == "none":      # distinct ids along the axis (torch leaves repeats unspecified)
        ids0 = np.argsort(rng.uniform(size=shape), axis=a)[tuple(slice(0, 2) if d == a else slice(None)
                                                                  for d in range(3))]
        ids0 = ids0 - X.shape[a] * (ids0 % 2)               # some negative
    else:
        ids0 = rng.integers(-X.shape[a], X.shape[a], shape)
    u0 = rand(*ids0.shape, seed=6)
    build = lambda x, ids, u: rg.scatter_elements(x, ids, u, axis, reduction=reduction)  # noqa: E731
    got = run(backend, build, {"x": X, "ids": ids0, "u": u0}, wrt=("x", "u"))

    def peer(x, ids, u):
        index = torch.tensor(ids0 % X.shape[a])
        return x.scatter(a, index, u) if reduction == "none" else x.scatter_add(a, index, u)
    check(got, torch_run(peer, {"x": X, "ids": ids0, "u": u0}, wrt=("x", "u")))
    check(exported(build, {"x": X, "ids": ids0, "u": u0}), got[:1])


def test_scatter_elements_repeated_ids_keep_the_last_update(backend):
    x0 = np.zeros((2, 3))
    ids0, u0 = np.array([[1, 1, -2]]), np.array([[1.0, 2.0, 3.0]])
    y, = run(backend, lambda x, ids, u: rg.scatter_elements(x, ids, u, 1), {"x": x0, "ids": ids0, "u": u0}, wrt=())
    np.testing.assert_array_equal(y, [[0.0, 3.0, 0.0], [0.0, 0.0, 0.0]])


def test_gather_and_scatter_elements_second_order_against_finite_differences():
    ids0 = np.array([[0, 2, 2], [1, 0, -1]])

    def first_order(x):
        y = rg.gather_elements(rg.tanh(x), rg.constant(ids0), 1)
        u = rg.scatter_elements(x * x, rg.constant(ids0), y * y, 1, reduction="add")
        v = rg.scatter_elements(u, rg.constant(ids0[:, :1]), rg.sin(y[:, :1]), 1)
        return rg.gradients(rg.sum(v * v * v), x)[0]
    rg.testing.check_gradients(first_order, {"x": rand(2, 3, seed=7)})


def test_elements_bad_input_is_a_shape_error_when_built_and_an_execution_error_when_run(backend):
    with rg.program_guard(rg.Program(), rg.Program()):
        x = rg.data("x", [2, 3])
        with pytest.raises(rg.ShapeError, match="rank"):
            rg.gather_elements(x, rg.data("i", [3], "int64"), 0)
        with pytest.raises(rg.ShapeError, match="larger than x"):
            rg.gather_elements(x, rg.data("j", [3, 1], "int64"), 1)
        with pytest.raises(rg.ProgramError, match="reduction"):
            rg.scatter_elements(x, rg.data("k", [2, 1], "int64"), x, 1, reduction="mul")
    with pytest.raises(rg.ExecutionError, match=r"GatherElements.*out of range \[-3, 3\)"):
        run(backend, lambda x, ids: rg.gather_elements(x, ids, 1), {"x": rand(2, 3), "ids": np.array([[3], [0]])},
            wrt=())


# --- size 0 ---------------------------------------------------------------------------------------

EMPTY_CASES = {   # name: (build, feed, the peer's result)
    "gather-no-ids": (lambda x, i: rg.gather(x, i, axis=1), {"x": rand(2, 3), "i": np.zeros((0,), np.int64)},
                      lambda x, i: torch.index_select(x, 1, i)),
    "gather-empty-rows": (lambda x, i: rg.gather(x, i, axis=1), {"x": rand(0, 3), "i": np.array([2, -1])},
                          lambda x, i: torch.index_select(x, 1, i % 3)),
    "scatter-no-ids": (lambda x, i, u: rg.scatter(x, i, u, axis=1),
                       {"x": rand(2, 3), "i": np.zeros((0,), np.int64), "u": rand(2, 0)},
                       lambda x, i, u: x.index_copy(1, i, u)),
    "gather-elements-empty": (lambda x, i: rg.gather_elements(x, i, 1),
                              {"x": rand(2, 3), "i": np.zeros((2, 0), np.int64)},
                              lambda x, i: torch.gather(x, 1, i)),
    "gather-elements-empty-x": (lambda x, i: rg.gather_elements(x, i, 0),
                                {"x": rand(0, 3), "i": np.zeros((0, 2), np.int64)},
                                lambda x, i: torch.gather(x, 0, i)),
    "scatter-elements-add-empty": (lambda x, i, u: rg.scatter_elements(x, i, u, 1, "add"),
                                   {"x": rand(2, 3), "i": np.zeros((2, 0), np.int64), "u": rand(2, 0)},
                                   lambda x, i, u: x.scatter_add(1, i, u)),
    "scatter-elements-empty-x": (lambda x, i, u: rg.scatter_elements(x, i, u, 0),
                                 {"x": rand(0, 4), "i": np.zeros((0, 4), np.int64), "u": rand(0, 4)},
                                 lambda x, i, u: x.scatter(0, i, u)),
}


@pytest.mark.parametrize("case", sorted(EMPTY_CASES))
def test_indexing_options_with_a_size_0_axis_give_torch_empty_result(case, backend):
    build, feed, peer = EMPTY_CASES[case]
    got = run(backend, build, feed, wrt=())
    want = peer(*(torch.tensor(v) for v in feed.values()))
    assert got[0].shape == tuple(want.shape)
    np.testing.assert_array_equal(got[0], want.numpy())
    ours = exported(build, feed)
    assert ours[0].shape == tuple(want.shape)
