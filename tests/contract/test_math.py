"""Contract: every math builder of DESIGN.md against NumPy written here.

Operators and reflected forms with Python scalars, the scalar dtype rules
("Python ints stay int64, floats follow the other operand's dtype"), ``==``
not overloaded, and each builder by its documented signature.
"""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg

RNG = np.random.default_rng(1234)


def run(main, feed, fetch):
    return rg.Executor().run(main, feed=feed, fetch_list=fetch)


def build(fn, *specs):
    """specs: (name, shape, dtype); fn(*vars) -> Var or list. Returns (main, vars, outs)."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        vs = [rg.data(n, s, dtype=d) for n, s, d in specs]
        out = fn(*vs)
    return main, vs, out


XV = np.array([[-1.5, 0.5, 2.0], [3.0, -0.25, 1.0]], "float32")
IV = np.array([[1, 2, 3], [4, 5, 6]], "int64")


BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
    "pow": np.power, "maximum": np.maximum, "minimum": np.minimum,
    "less": np.less, "greater": np.greater, "equal": np.equal,
}


@pytest.mark.parametrize("fname", sorted(BINARY))
def test_binary_builders_with_scalars_on_both_sides(fname):
    f = getattr(rg, fname)
    ref = BINARY[fname]
    cases = [("x", 2), ("x", 2.5), (2, "x"), (0.5, "x"), ("x", "x2"), ("i", 2), (3, "i")]
    xv = np.abs(XV) + 0.5 if fname == "pow" else XV
    x2v = np.flip(xv).copy()
    feeds = {"x": xv, "x2": x2v, "i": IV}

    def fn(x, x2, i):
        env = {"x": x, "x2": x2, "i": i}
        return [f(*(env.get(a, a) if isinstance(a, str) else a for a in c)) for c in cases]

    main, _, outs = build(fn, ("x", [2, 3], "float32"), ("x2", [2, 3], "float32"), ("i", [2, 3], "int64"))
    vals = run(main, feeds, outs)
    for c, o, v in zip(cases, outs, vals):
        args = [feeds[a] if isinstance(a, str) else a for a in c]
        expect = ref(*args)
        if fname in ("less", "greater", "equal"):
            assert o.dtype == "bool", c
        elif "x" in c or 2.5 in c or 0.5 in c:
            pass
        v = np.asarray(v)
        # the declared dtype is the dtype the run returns
        assert v.dtype == np.dtype(o.dtype), (c, o.dtype, v.dtype)
        np.testing.assert_allclose(v.astype(np.float64), np.asarray(expect, np.float64), rtol=1e-6,
                                   err_msg=f"{fname}{c}")


def test_scalar_dtype_rules():
    def fn(x, d, i):
        return dict(
            f32_int=x + 1, int_f32=1 + x, f32_float=x * 2.5, float_f32=2.5 - x,
            f64_int=d + 1, f64_float=1.5 / d,
            i_int=i + 1, int_i=1 + i, i_mul=i * 3, i_sub=7 - i,
        )

    main, _, outs = build(fn, ("x", [2, 3], "float32"), ("d", [2, 3], "float64"), ("i", [2, 3], "int64"))
    want = dict(f32_int="float32", int_f32="float32", f32_float="float32", float_f32="float32",
                f64_int="float64", f64_float="float64",
                i_int="int64", int_i="int64", i_mul="int64", i_sub="int64")
    for k, dt in want.items():
        assert outs[k].dtype == dt, k
    keys = list(outs)
    vals = run(main, {"x": XV, "d": XV.astype("float64"), "i": IV}, [outs[k] for k in keys])
    for k, v in zip(keys, vals):
        assert np.asarray(v).dtype == np.dtype(want[k]), k
    got = dict(zip(keys, vals))
    np.testing.assert_array_equal(got["i_sub"], 7 - IV)
    np.testing.assert_allclose(got["float_f32"], 2.5 - XV)
    np.testing.assert_allclose(got["f64_float"], 1.5 / XV.astype("float64"))


def test_operators_and_reflected_forms():
    def fn(x, y):
        return [x + y, x - y, x * y, x / y, x @ rg.transpose(y, [1, 0]), -x,
                x < y, x <= y, x > y, x >= y,
                3.0 + x, 3.0 - x, 3.0 * x, 3.0 / y, x + 3, x - 3, x * 3, x / 3,
                1 < x, 1 <= x, 1 > x, 1 >= x, x < 0.5, x ** 2, 2.0 ** x]

    yv = np.array([[1.0, 2.0, -1.0], [0.5, 4.0, 1.0]], "float32")
    main, _, outs = build(fn, ("x", [2, 3], "float32"), ("y", [2, 3], "float32"))
    vals = run(main, {"x": XV, "y": yv}, outs)
    x, y = XV.astype(np.float64), yv.astype(np.float64)
    refs = [x + y, x - y, x * y, x / y, x @ y.T, -x, x < y, x <= y, x > y, x >= y,
            3 + x, 3 - x, 3 * x, 3 / y, x + 3, x - 3, x * 3, x / 3,
            1 < x, 1 <= x, 1 > x, 1 >= x, x < 0.5, x ** 2, 2.0 ** x]
    for i, (o, v, r) in enumerate(zip(outs, vals, refs)):
        if r.dtype == bool:
            assert o.dtype == "bool", i
            np.testing.assert_array_equal(v, r, err_msg=str(i))
        else:
            assert o.dtype == "float32", i
            np.testing.assert_allclose(v, r, rtol=1e-5, err_msg=str(i))


def test_eq_not_overloaded_and_var_hashable():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [2])
        y = rg.data("y", [2])
        n_ops = len(main.global_block().ops)
        assert (x == x) is True
        assert (x == y) is False
        assert (x != y) is True
        assert len(main.global_block().ops) == n_ops  # no op appended by ==
        d = {x: 1, y: 2}
        assert d[x] == 1 and d[y] == 2
        assert x in {x, y} and len({x, y, x}) == 2
        e = rg.equal(x, y)
    assert e.dtype == "bool"
    v, = run(main, {"x": np.array([1, 2], "float32"), "y": np.array([1, 3], "float32")}, [e])
    np.testing.assert_array_equal(v, [True, False])


UNARY = {
    "neg": np.negative, "exp": np.exp, "log": np.log, "tanh": np.tanh,
    "sigmoid": lambda a: 1 / (1 + np.exp(-a)), "relu": lambda a: np.maximum(a, 0),
    "square": np.square, "sqrt": np.sqrt, "abs": np.abs,
}


@pytest.mark.parametrize("fname", sorted(UNARY))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_unary(fname, dtype):
    a = RNG.standard_normal((3, 4)).astype(dtype)
    if fname in ("log", "sqrt"):
        a = np.abs(a) + 0.1
    main, _, out = build(lambda x: getattr(rg, fname)(x), ("x", [-1, 4], dtype))
    assert out.dtype == dtype
    v, = run(main, {"x": a}, [out])
    assert np.asarray(v).dtype == np.dtype(dtype)
    np.testing.assert_allclose(v, UNARY[fname](a.astype(np.float64)), rtol=1e-5, atol=1e-7)


def test_reductions_and_shapes():
    a = RNG.standard_normal((2, 3, 4))

    def fn(x):
        return [rg.sum(x), rg.sum(x, axis=1), rg.sum(x, axis=-1, keepdims=True), rg.sum(x, axis=[0, 2]),
                rg.mean(x), rg.mean(x, axis=0), rg.mean(x, axis=2, keepdims=True),
                rg.reshape(x, [6, 4]), rg.reshape(x, [-1, 12]), rg.transpose(x, [2, 0, 1]),
                rg.clip(x, -0.5, 0.5), rg.maximum(x, 0.0), rg.minimum(0.1, x)]

    main, _, outs = build(fn, ("x", [2, 3, 4], "float64"))
    vals = run(main, {"x": a}, outs)
    refs = [a.sum(), a.sum(1), a.sum(-1, keepdims=True), a.sum((0, 2)), a.mean(), a.mean(0),
            a.mean(2, keepdims=True), a.reshape(6, 4), a.reshape(-1, 12), a.transpose(2, 0, 1),
            np.clip(a, -0.5, 0.5), np.maximum(a, 0), np.minimum(0.1, a)]
    for i, (o, v, r) in enumerate(zip(outs, vals, refs)):
        assert np.shape(v) == r.shape, i
        np.testing.assert_allclose(v, r, rtol=1e-12, err_msg=str(i))
    assert tuple(outs[7].shape) == (6, 4)
    assert outs[0].shape in ((), [])


def test_concat_split_slice():
    a = RNG.standard_normal((4, 6))
    b = RNG.standard_normal((4, 2))

    def fn(x, y):
        parts = rg.split(x, 3, 1)
        parts2 = rg.split(x, [1, 3], axis=0)
        return dict(cat=rg.concat([x, y], 1), cat0=rg.concat([x, x], axis=0), parts=parts, parts2=parts2,
                    sl=rg.slice(x, [0, 1], [1, 2], [3, 5]), sl1=rg.slice(x, axes=[1], starts=[-2], ends=[6]))

    main, _, o = build(fn, ("x", [4, 6], "float64"), ("y", [4, 2], "float64"))
    assert isinstance(o["parts"], list) and len(o["parts"]) == 3
    assert isinstance(o["parts2"], list) and len(o["parts2"]) == 2
    assert tuple(o["parts"][0].shape) == (4, 2)
    assert tuple(o["parts2"][1].shape) == (3, 6)
    fetch = [o["cat"], o["cat0"], *o["parts"], *o["parts2"], o["sl"], o["sl1"]]
    vals = run(main, {"x": a, "y": b}, fetch)
    refs = [np.concatenate([a, b], 1), np.concatenate([a, a], 0), *np.split(a, 3, 1),
            a[:1], a[1:], a[1:3, 2:5], a[:, -2:]]
    for v, r in zip(vals, refs):
        np.testing.assert_array_equal(v, r)


def test_gather_embedding_rows_and_cast():
    table = RNG.standard_normal((10, 4)).astype("float32")
    ids = np.array([3, 0, 3, 9], "int64")

    def fn(w, i):
        return [rg.gather(w, i), rg.cast(i, "float32"), rg.cast(w, "int64"), rg.cast(w, "float64")]

    main, _, outs = build(fn, ("w", [10, 4], "float32"), ("ids", [-1], "int64"))
    assert tuple(outs[0].shape) == (-1, 4)
    assert [o.dtype for o in outs[1:]] == ["float32", "int64", "float64"]
    vals = run(main, {"w": table, "ids": ids}, outs)
    np.testing.assert_array_equal(vals[0], table[ids])
    np.testing.assert_array_equal(vals[1], ids.astype("float32"))
    np.testing.assert_array_equal(vals[2], table.astype("int64"))
    assert np.asarray(vals[3]).dtype == np.float64

    # 2-D ids [T, N] -> [T, N, dim]
    main, _, out = build(lambda w, i: rg.gather(w, i), ("w", [10, 4], "float32"), ("ids", [-1, -1], "int64"))
    ids2 = np.array([[1, 2], [3, 4], [5, 5]], "int64")
    v, = run(main, {"w": table, "ids": ids2}, [out])
    np.testing.assert_array_equal(v, table[ids2])


def test_where_comparisons_logical_not():
    def fn(x, y):
        c = rg.less(x, y)
        return [rg.where(c, x, y), rg.where(c, x, 0.0), rg.where(c, 1.0, y), rg.where(c, 1.0, -1.0),
                rg.logical_not(c), rg.greater(x, 0.0), rg.less(0.0, x), c]

    yv = np.flip(XV).copy()
    main, _, outs = build(fn, ("x", [2, 3], "float32"), ("y", [2, 3], "float32"))
    vals = run(main, {"x": XV, "y": yv}, outs)
    c = XV < yv
    refs = [np.where(c, XV, yv), np.where(c, XV, 0), np.where(c, 1, yv), np.where(c, 1.0, -1.0),
            ~c, XV > 0, 0 < XV, c]
    for i, (v, r) in enumerate(zip(vals, refs)):
        np.testing.assert_array_equal(v, r, err_msg=str(i))
    assert outs[4].dtype == "bool"


def _np_log_softmax(z, axis=-1):
    m = z.max(axis=axis, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=axis, keepdims=True))


def test_softmax_log_softmax_cross_entropy():
    z = RNG.standard_normal((5, 7))
    labels = np.array([0, 6, 3, 3, 1], "int64")

    def fn(x, y):
        return [rg.softmax(x), rg.softmax(x, axis=0), rg.log_softmax(x), rg.log_softmax(x, axis=0),
                rg.softmax_cross_entropy(x, y)]

    main, _, outs = build(fn, ("z", [-1, 7], "float64"), ("labels", [-1], "int64"))
    assert tuple(outs[4].shape) == (-1,)
    vals = run(main, {"z": z, "labels": labels}, outs)
    np.testing.assert_allclose(vals[0], np.exp(_np_log_softmax(z)), rtol=1e-12)
    np.testing.assert_allclose(vals[1], np.exp(_np_log_softmax(z, 0)), rtol=1e-12)
    np.testing.assert_allclose(vals[2], _np_log_softmax(z), rtol=1e-12)
    np.testing.assert_allclose(vals[3], _np_log_softmax(z, 0), rtol=1e-12)
    ce = -_np_log_softmax(z)[np.arange(5), labels]
    assert np.shape(vals[4]) == (5,)
    np.testing.assert_allclose(vals[4], ce, rtol=1e-12)


def test_softmax_cross_entropy_gradient_vs_torch():
    torch = pytest.importorskip("torch")
    z = RNG.standard_normal((4, 6))
    labels = np.array([5, 0, 2, 2], "int64")
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        w = rg.create_parameter("w", [4, 6], dtype="float64", init=z)
        y = rg.data("y", [-1], dtype="int64")
        loss = rg.mean(rg.softmax_cross_entropy(w, y))
        (p, g), = rg.append_backward(loss)
    exe = rg.Executor()
    exe.run(startup)
    lv, gv = exe.run(main, feed={"y": labels}, fetch_list=[loss, g])
    zt = torch.tensor(z, requires_grad=True)
    lt = torch.nn.functional.cross_entropy(zt, torch.tensor(labels))
    lt.backward()
    np.testing.assert_allclose(lv, lt.item(), rtol=1e-12)
    np.testing.assert_allclose(gv, zt.grad.numpy(), rtol=1e-10)


def test_dropout_inverted_scaling_and_mask_in_gradient():
    p = 0.3
    a = RNG.uniform(1.0, 2.0, size=(200, 50))
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        w = rg.create_parameter("w", [200, 50], dtype="float64", init=a)
        d = rg.dropout(w, p, seed=7)
        d2 = rg.dropout(w, p)
        d0 = rg.dropout(w, 0.0)
        loss = rg.sum(d * 3.0)
        (_, g), = rg.append_backward(loss, parameter_list=[w])
    exe = rg.Executor()
    exe.run(startup)
    dv, gv, d2v, d0v = exe.run(main, fetch_list=[d, g, d2, d0])
    kept = dv != 0
    np.testing.assert_allclose(dv[kept], a[kept] / (1 - p), rtol=1e-12)
    frac = kept.mean()
    assert abs(frac - (1 - p)) < 0.02
    # the gradient uses the forward's mask
    np.testing.assert_allclose(gv, 3.0 * kept / (1 - p), rtol=1e-12)
    k2 = d2v != 0
    np.testing.assert_allclose(d2v[k2], a[k2] / (1 - p), rtol=1e-12)
    np.testing.assert_array_equal(d0v, a)
    assert dv.dtype == np.float64


def test_dropout_seed_reproducible_across_programs():
    def once():
        main, _, out = build(lambda x: rg.dropout(x, 0.5, seed=11), ("x", [100], "float32"))
        v, = run(main, {"x": np.ones(100, "float32")}, [out])
        return v
    a, b = once(), once()
    np.testing.assert_array_equal(a, b)
    assert set(np.unique(a)) <= {0.0, 2.0}


def test_stop_gradient_blocks_gradient():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        w = rg.create_parameter("w", [3], dtype="float64", init=np.array([1.0, 2.0, 3.0]))
        loss = rg.sum(w * rg.stop_gradient(w))
        (_, g), = rg.append_backward(loss)
    exe = rg.Executor()
    exe.run(startup)
    gv, = exe.run(main, fetch_list=[g])
    np.testing.assert_allclose(gv, [1.0, 2.0, 3.0])


def test_matmul_batched_and_broadcast():
    a = RNG.standard_normal((2, 3, 4))
    b = RNG.standard_normal((4, 5))
    main, _, out = build(lambda x, y: rg.matmul(x, y), ("a", [-1, 3, 4], "float64"), ("b", [4, 5], "float64"))
    v, = run(main, {"a": a, "b": b}, [out])
    np.testing.assert_allclose(v, a @ b, rtol=1e-12)


def test_builders_check_gradients():
    rng = np.random.default_rng(5)
    rep = rg.testing.check_gradients(
        lambda x, w: rg.sum(rg.tanh(x @ w) * rg.sigmoid(x @ w) + rg.square(rg.exp(-rg.abs(x @ w)))),
        {"x": rng.standard_normal((3, 4)), "w": rng.standard_normal((4, 2))})
    assert set(rep) == {"x", "w"}
    assert all(e <= 1.0 for e in rep.values())
    rep = rg.testing.check_gradients(
        lambda x: rg.mean(rg.log_softmax(rg.concat(rg.split(x, 2, 1)[::-1], 1) * 2.0)),
        {"x": rng.standard_normal((3, 4))})
    assert rep["x"] <= 1.0
