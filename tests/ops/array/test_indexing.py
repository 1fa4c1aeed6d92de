"""x[...], x.T, rg.scatter and rg.update_slice against NumPy, PyTorch (float64) and JAX, on every
backend (NumPy, torch-CPU, the onnxruntime engine); the shape rule of x[...] against NumPy's
indexing (hypothesis); build-time and run-time errors."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import retrograd as rg

torch = pytest.importorskip("torch", reason="the reference values come from PyTorch")

pytestmark = pytest.mark.engine

R = np.random.default_rng(19)
X = R.standard_normal((3, 4, 5))
C = R.standard_normal((3, 4, 5))         # weights of the loss, so every element's gradient differs

KEYS = [
    0, -1, (1, 2), (slice(None), slice(None, None, 2)), (slice(None, None, -1),), (Ellipsis, -1),
    (None, 1, Ellipsis, None, slice(4, 0, -2)), (slice(-10, None, -1),), (slice(1, 2), None), (),
    (slice(-2, None), -3, slice(None, None, 3)), (Ellipsis,), (2, Ellipsis, slice(-1, -6, -1)),
    (slice(5, None),), (None,),
]


def _run(backend, build, feed):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        fetch = build()
    exe = backend.executor()
    exe.run(startup)
    return exe.run(main, feed=feed, fetch_list=fetch)


def _numpy_grad(x, key, weights):
    """d sum(x[key] * weights) / dx, written with NumPy's own indexing."""
    grad = np.zeros_like(x)
    grad[key] += weights
    return grad


@pytest.mark.parametrize("declared", [[3, 4, 5], [-1, 4, -1]], ids=["known", "run-time"])
@pytest.mark.parametrize("key", KEYS, ids=[repr(k) for k in KEYS])
def test_getitem_value_and_gradient_match_numpy_indexing(backend, key, declared):
    weights = R.standard_normal(X[key].shape)

    def build():
        x = rg.data("x", declared, "float64", stop_gradient=False)
        y = x[key]
        return [y, rg.gradients(rg.sum(y * weights), [x])[0]]
    y, dx = _run(backend, build, {"x": X})
    np.testing.assert_array_equal(y, X[key])
    np.testing.assert_allclose(dx, _numpy_grad(X, key, weights), rtol=1e-12, atol=1e-14)


TORCH_KEYS = [(1, slice(None), slice(1, None, 2)), (Ellipsis, None, -2), (slice(None, 2), 3)]


@pytest.mark.parametrize("key", TORCH_KEYS, ids=[repr(k) for k in TORCH_KEYS])
def test_getitem_first_and_second_derivatives_match_torch(backend, key):
    def build():
        x = rg.data("x", [3, 4, 5], "float64", stop_gradient=False)
        y = rg.sum(rg.tanh(x[key]) ** 3.0)
        dx, = rg.gradients(y, [x])
        ddx, = rg.gradients(rg.sum(dx * C), [x])
        return [y, dx, ddx]
    got = _run(backend, build, {"x": X})
    xt = torch.tensor(X, requires_grad=True)
    y = (torch.tanh(xt[key]) ** 3).sum()
    dx, = torch.autograd.grad(y, xt, create_graph=True)
    ddx, = torch.autograd.grad((dx * torch.tensor(C)).sum(), xt)
    for ours, want in zip(got, [y, dx, ddx]):
        np.testing.assert_allclose(ours, want.detach().numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("index", [0, 2, -1, -3])
def test_int64_var_indices_read_as_ints_with_gradients(backend, index):
    def build():
        x = rg.data("x", [-1, 4, 5], "float64", stop_gradient=False)
        i = rg.data("i", [], "int64")
        j = rg.data("j", [], "int32")
        y = x[i, 1:, j]
        return [y, rg.gradients(rg.sum(y * C[index, 1:, 2]), [x])[0]]
    y, dx = _run(backend, build, {"x": X, "i": np.array(index), "j": np.array(2, np.int32)})
    np.testing.assert_array_equal(y, X[index, 1:, 2])
    np.testing.assert_allclose(dx, _numpy_grad(X, (index, slice(1, None), 2), C[index, 1:, 2]), rtol=1e-12)


def test_transpose_property_reverses_the_axes(backend):
    def build():
        x = rg.data("x", [-1, 4, 5], "float64", stop_gradient=False)
        v = rg.data("v", [3], "float64")
        return [x.T, v.T, rg.gradients(rg.sum(x.T * C.T), [x])[0]]
    xt, vt, dx = _run(backend, build, {"x": X, "v": X[0, 0, :3]})
    np.testing.assert_array_equal(xt, X.T)
    np.testing.assert_array_equal(vt, X[0, 0, :3])
    np.testing.assert_allclose(dx, C, rtol=1e-12)


# --- errors ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("key, error, match", [
    (3, rg.ShapeError, r"Index in block 0: index 3 is out of range for axis 0 of size 3"),
    ((slice(None), -5), rg.ShapeError, r"index -5 is out of range for axis 1 of size 4"),
    ((0, 0, 0, 0), rg.ShapeError, r"too many indices .* 4 for 3 axes"),
    ((Ellipsis, 0, Ellipsis), rg.ProgramError, r"one '\.\.\.'"),
    ([0, 1], rg.ProgramError, r"cannot index with list .*rg\.gather"),
    (1.0, rg.ProgramError, r"cannot index with float"),
    (True, rg.ProgramError, r"cannot index with bool"),
    (slice(0, 2, 0), rg.ProgramError, r"step cannot be zero"),
    (slice(0.5, 2), rg.ProgramError, r"slice start must be an int"),
])
def test_bad_keys_are_refused_when_built_naming_the_users_line(key, error, match):
    with rg.program_guard(rg.Program(), rg.Program()):
        x = rg.data("x", [3, 4, 5])
        with pytest.raises(error, match=r"test_indexing\.py:\d+: .*" + match):
            x[key]


def test_index_out_of_range_names_the_users_line_when_built():
    with rg.program_guard(rg.Program(), rg.Program()):
        x = rg.data("x", [3, 4])
        with pytest.raises(rg.ShapeError, match=r"test_indexing\.py:\d+: Index in block 0"):
            x[7]


def test_a_float_or_non_scalar_var_index_is_refused():
    with rg.program_guard(rg.Program(), rg.Program()):
        x = rg.data("x", [3, 4])
        with pytest.raises(rg.ProgramError, match="int64 or int32 0-d Var"):
            x[rg.data("f", [], "float32")]
        with pytest.raises(rg.ProgramError, match="rg.gather"):
            x[rg.data("ids", [2], "int64")]


def test_iterating_a_var_is_refused_instead_of_indexing_forever():
    with rg.program_guard(rg.Program(), rg.Program()):
        x = rg.data("x", [-1, 4])
        with pytest.raises(rg.ProgramError, match="cannot be iterated"):
            list(x)


@pytest.mark.parametrize("case", ["var past the end", "var before the start", "int on a run-time dim"])
def test_out_of_range_index_at_run_time_is_an_execution_error_naming_the_op(backend, case):
    def build():
        x = rg.data("x", [-1, 4], "float64")
        i = rg.data("i", [], "int64")
        return [x[i]] if case.startswith("var") else [x[5]]
    index = {"var past the end": 3, "var before the start": -4}.get(case, 0)
    with pytest.raises(rg.ExecutionError, match=r"test_indexing\.py:\d+: op #\d+ Index in block 0 failed: "
                                                r"IndexError: index -?\d is out of range for axis 0 of size 3"):
        _run(backend, build, {"x": X[:, :, 0], "i": np.array(index)})


# --- the shape rule against NumPy (hypothesis) ---------------------------------------------------

def _keys(shape):
    """Keys NumPy's basic indexing accepts on ``shape``: ints in range, slices, None, one '...'."""
    def item(n):
        return st.one_of(st.integers(-n, n - 1) if n else st.nothing(),
                         st.builds(slice, st.none() | st.integers(-7, 7), st.none() | st.integers(-7, 7),
                                   st.none() | st.integers(-3, 3).filter(bool)))
    per_axis = st.tuples(*[item(n) for n in shape])
    return per_axis.flatmap(lambda items: st.tuples(
        st.integers(0, len(items)), st.integers(0, len(items)), st.integers(0, 2), st.booleans()).map(
        lambda p: _assemble(items, *p)))


def _assemble(items, cut, new_at, news, ellipsis):
    items = list(items)
    if ellipsis:                               # '...' stands for the axes from `cut` on
        items = items[:cut] + [Ellipsis]
    for _ in range(news):
        items.insert(min(new_at, len(items)), None)
    return tuple(items)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_getitem_shape_rule_matches_numpy(data):
    shape = data.draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5))
    key = data.draw(_keys(shape))
    unknown = data.draw(st.lists(st.booleans(), min_size=len(shape), max_size=len(shape)))
    declared = [-1 if u else d for d, u in zip(shape, unknown)]
    want = np.empty(shape)[key].shape
    with rg.program_guard(rg.Program(), rg.Program()):
        got = rg.data("x", declared)[key].shape
    assert len(got) == len(want) and all(g in (w, -1) for g, w in zip(got, want)), (key, got, want)
    known = all(d >= 0 for d in declared)
    assert not known or got == want


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_getitem_values_match_numpy_on_the_numpy_executor(data):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4))
    key = data.draw(_keys(shape))
    x = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        y = rg.data("x", [-1] * len(shape), "float64")[key]
    got, = rg.Executor().run(main, feed={"x": x}, fetch_list=[y])
    np.testing.assert_array_equal(got, x[key])


# --- scatter ----------------------------------------------------------------------------------------

IDS = np.array([[1, 3], [1, 0]])          # row 1 written twice: the last update (u[1, 0]) wins
X2 = R.standard_normal((5, 3))
U = R.standard_normal((2, 2, 3))
C2 = R.standard_normal((5, 3))


def _scatter_program(overwrite):
    def build():
        x = rg.data("x", [-1, 3], "float64", stop_gradient=False)
        ids = rg.data("ids", [-1, 2], "int64")
        u = rg.data("u", [-1, 2, 3], "float64", stop_gradient=False)
        y = rg.scatter(x, ids, u, overwrite=overwrite)
        loss = rg.sum(y * y * C2)
        dx, du = rg.gradients(loss, [x, u])
        ddx, ddu = rg.gradients(rg.sum(dx * dx) + rg.sum(du * du * du), [x, u])
        return [y, dx, du, ddx, ddu]
    return build


def _torch_scatter(overwrite):
    x, u = torch.tensor(X2, requires_grad=True), torch.tensor(U, requires_grad=True)
    rows = u.reshape(-1, 3)
    if overwrite:     # the winners only: positions 1 (row 3), 2 (row 1, the last of two), 3 (row 0)
        y = x.index_put((torch.tensor([3, 1, 0]),), rows[[1, 2, 3]])
    else:
        y = x.index_add(0, torch.tensor(IDS.reshape(-1)), rows)
    loss = (y * y * torch.tensor(C2)).sum()
    dx, du = torch.autograd.grad(loss, [x, u], create_graph=True)
    ddx, ddu = torch.autograd.grad((dx * dx).sum() + (du * du * du).sum(), [x, u])
    return [y, dx, du, ddx, ddu]


@pytest.mark.parametrize("overwrite", [True, False])
def test_scatter_values_and_two_orders_of_gradients_match_torch(backend, overwrite):
    got = _run(backend, _scatter_program(overwrite), {"x": X2, "ids": IDS, "u": U})
    for ours, want in zip(got, _torch_scatter(overwrite)):
        np.testing.assert_allclose(ours, want.detach().numpy(), rtol=1e-12, atol=1e-12)


def test_scatter_repeated_ids_the_last_update_wins_like_numpy(backend):
    ids = np.array([2, 0, 2, 2, 0])
    u = np.arange(10.0).reshape(5, 2)

    def build():
        x = rg.data("x", [3, 2], "float64", stop_gradient=False)
        upd = rg.data("u", [5, 2], "float64", stop_gradient=False)
        y = rg.scatter(x, rg.constant(ids), upd)
        return [y] + rg.gradients(rg.sum(y), [x, upd])
    y, dx, du = _run(backend, build, {"x": np.zeros((3, 2)), "u": u})
    want = np.zeros((3, 2))
    want[ids] = u
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(y, [[8, 9], [0, 0], [6, 7]])
    np.testing.assert_array_equal(dx, [[0, 0], [1, 1], [0, 0]])
    np.testing.assert_array_equal(du, [[0, 0], [0, 0], [0, 0], [1, 1], [1, 1]])   # the winners only


@pytest.mark.parametrize("bad", [5, -6])          # -1 is the last row (negative ids: from the end)
def test_scatter_id_out_of_range_is_an_execution_error(backend, bad):
    def build():
        x = rg.data("x", [-1, 3], "float64")
        ids = rg.data("ids", [2], "int64")
        return [rg.scatter(x, ids, rg.data("u", [2, 3], "float64"))]
    with pytest.raises(rg.ExecutionError, match=r"op #\d+ Scatter in block 0 failed: IndexError: id -?\d is out of range"):
        _run(backend, build, {"x": X2, "ids": np.array([0, bad]), "u": U[0]})


def test_scatter_shape_mismatch_is_a_shape_error():
    with rg.program_guard(rg.Program(), rg.Program()):
        x = rg.data("x", [5, 3])
        with pytest.raises(rg.ShapeError, match=r"Scatter .*updates must have shape ids.shape \+ x.shape\[1:\]"):
            rg.scatter(x, rg.data("ids", [2], "int64"), rg.data("u", [2, 4]))
        with pytest.raises(rg.ShapeError, match="must be int64 or int32"):
            rg.scatter(x, rg.data("f", [2]), rg.data("u2", [2, 3]))


# --- update_slice -------------------------------------------------------------------------------------

STARTS = [(1, 2), (0, -3), (7, 9), (-1, 1)]     # the last three clamp, as JAX clamps


@pytest.mark.parametrize("starts", STARTS, ids=[str(s) for s in STARTS])
def test_update_slice_matches_jax_with_gradients(backend, starts):
    jax = pytest.importorskip("jax", reason="jax.lax.dynamic_update_slice is the reference")
    jax.config.update("jax_enable_x64", True)
    x0, u0 = R.standard_normal((4, 6)), R.standard_normal((2, 3))
    c = R.standard_normal((4, 6))

    def build():
        x = rg.data("x", [-1, 6], "float64", stop_gradient=False)
        u = rg.data("u", [2, -1], "float64", stop_gradient=False)
        t = rg.data("t", [], "int64")
        y = rg.update_slice(x, u, [t, starts[1]])
        dx, du = rg.gradients(rg.sum(y * y * y * c), [x, u])
        ddu, = rg.gradients(rg.sum(du * du), [u])
        return [y, dx, du, ddu]
    got = _run(backend, build, {"x": x0, "u": u0, "t": np.array(starts[0])})

    def f(x, u):
        return jax.lax.dynamic_update_slice(x, u, starts)

    def loss(x, u):
        return (f(x, u) ** 3 * c).sum()
    dx, du = jax.grad(loss, argnums=(0, 1))(x0, u0)
    ddu = jax.grad(lambda u: (jax.grad(loss, argnums=1)(x0, u) ** 2).sum())(u0)
    for ours, want in zip(got, [f(x0, u0), dx, du, ddu]):
        np.testing.assert_allclose(ours, np.asarray(want), rtol=1e-12, atol=1e-12)


def test_update_slice_that_cannot_fit_is_a_shape_error():
    with rg.program_guard(rg.Program(), rg.Program()):
        x = rg.data("x", [3, 4])
        with pytest.raises(rg.ShapeError, match=r"UpdateSlice .*does not fit"):
            rg.update_slice(x, rg.data("u", [4, 1]), [0, 0])
        with pytest.raises(rg.ShapeError, match="one start per axis"):
            rg.update_slice(x, rg.data("u2", [1, 1]), [0])


# --- the README's example ------------------------------------------------------------------------

def test_readme_op_reference_example_runs_and_matches_torch():
    import re
    from pathlib import Path
    readme = "\n".join(p.read_text() for p in sorted((Path(__file__).resolve().parents[3] / "docs").rglob("*.md")))   # docs/ pages
    block = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "picked = x[t, ::-2]" in b)
    env: dict = {"__name__": "readme"}
    exec(compile(block, "README.md", "exec"), env)
    x = torch.tensor(env["xs"], dtype=torch.float64, requires_grad=True)
    padded = torch.nn.functional.pad(x.T, (1, 1)) + 1.0
    loss = (x @ x.T / np.sqrt(8.0)).sum() + (x[1].flip(0)[::2] * x[-1][::2]).sum() + padded.mean()
    dx, = torch.autograd.grad(loss, x)
    np.testing.assert_allclose(env["padded_v"], padded.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(env["dx_v"], dx.numpy(), rtol=1e-5, atol=1e-6)


def test_update_slice_block_bigger_than_x_at_run_time_is_an_execution_error(backend):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        y = rg.update_slice(rg.data("x", [-1, 3]), rg.data("u", [-1, 3]), [0, 0])
    with pytest.raises(rg.ExecutionError, match=r"UpdateSlice in block 0 failed: ValueError: a block of size 3 "
                                                r"does not fit axis 0 of size 2"):
        backend.executor().run(main, feed={"x": np.ones((2, 3), "float32"), "u": np.ones((3, 3), "float32")},
                               fetch_list=[y])


def test_kernels_keep_to_the_array_api_standard():
    """Index, Scatter, UpdateSlice and the shape ops (forward and gradients) on array-api-strict
    give the NumPy executor's values: the kernels use nothing but the standard (and Backend methods)."""
    strict = pytest.importorskip("array_api_strict")
    from retrograd import backends
    x0, u0 = R.standard_normal((5, 3)), R.standard_normal((3, 3))
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3], "float64", stop_gradient=False)
        u = rg.data("u", [3, 3], "float64", stop_gradient=False)
        i = rg.data("i", [], "int64")
        outs = [x[i, ::-2], x[1:, None, -1], rg.scatter(x, np.array([1, 3, 1]), u),
                rg.scatter(x, np.array([1, 3, 1]), u, overwrite=False), rg.update_slice(x, u[:2], [i, 0]),
                rg.stack([x, x], 1), rg.broadcast_to(x, [2, -1, 3]), rg.tile(x, [2, 2]),
                rg.pad(x, [(1, 0), (0, 2)], 1.0), rg.einsum("ij,kj->ik", x, x)]
        grads = rg.gradients(rg.add_n([rg.sum(v * v) for v in outs]), [x, u])
        outs.append(rg.arange(1, i, 2))
    feed = {"x": x0, "u": u0, "i": np.array(3)}
    want = rg.Executor().run(main, feed=feed, fetch_list=outs + grads)
    got = rg.Executor(xp=strict).run(main, feed=feed, fetch_list=outs + grads)
    for ours, ref in zip(got, want):
        np.testing.assert_allclose(backends.to_numpy(ours), ref, rtol=1e-12)


@pytest.mark.parametrize("rows", [0, 2])
def test_scatter_overwrite_with_empty_rows_on_every_backend_and_exported(backend, rows):
    """Regression (fuzzer, issue 32 item 15): ``rg.scatter(x [2, 0], ids [4], updates [4, 0])``
    (rows of size 0, ids present) failed in onnxruntime: the lowering reshaped the updates to
    ``[-1, *row_shape]``, and -1 beside a 0 has no answer."""
    ort = pytest.importorskip("onnxruntime", reason="runs the exported model")
    x = np.arange(2.0 * rows).reshape(2, rows)
    updates = -np.arange(4.0 * rows).reshape(4, rows) - 1.0
    ids = np.array([1, -2, 1, 0])
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        xv = rg.data("x", [-1, -1], "float64", stop_gradient=False)
        uv = rg.data("u", [-1, -1], "float64", stop_gradient=False)
        out = rg.scatter(xv, rg.data("ids", [-1], "int64"), uv)
        dx, du = rg.gradients(rg.sum(out * out), [xv, uv])
    feed = {"x": x, "u": updates, "ids": ids}
    want = x.copy()
    for j, i in enumerate(ids):          # NumPy's x[ids] = updates: the last write wins
        want[i] = updates[j]
    tx, tu = (torch.tensor(a, requires_grad=True) for a in (x, updates))
    ref = tx.clone()
    for j, i in enumerate(ids):
        ref[int(i)] = tu[j]
    gx, gu = torch.autograd.grad((ref * ref).sum(), [tx, tu])
    got = backend.executor().run(main, feed=feed, fetch_list=[out, dx, du])
    for ours, theirs in zip(got, [want, gx.numpy(), gu.numpy()]):
        np.testing.assert_allclose(ours, theirs, rtol=1e-15)
        assert ours.shape == theirs.shape
    sess = ort.InferenceSession(rg.onnx.export(main, None, [out, dx, du]).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    for ours, theirs in zip(sess.run([v.name for v in (out, dx, du)], feed), [want, gx.numpy(), gu.numpy()]):
        np.testing.assert_allclose(ours, theirs, rtol=1e-15)
