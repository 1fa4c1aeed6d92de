"""Contract: natural alternative spellings a user (or a test author) reaches for."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg


def test_fetch_a_parameter_no_op_reads():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 2])
        w = rg.create_parameter("w", [2, 2], init=np.eye(2))
        unused = rg.create_parameter("unused", [3], init=0.25)
        y = x @ w
    exe = rg.Executor()
    exe.run(startup)
    yv, uv, uv2 = exe.run(main, feed={"x": np.ones((1, 2), "float32")}, fetch_list=[y, unused, "unused"])
    np.testing.assert_array_equal(uv, np.full(3, 0.25, "float32"))
    np.testing.assert_array_equal(uv2, uv)
    np.testing.assert_array_equal(yv, [[1.0, 1.0]])


def test_create_parameter_init_forms():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        a = rg.create_parameter("a", [2, 2], init=lambda shape: np.arange(4.0).reshape(shape))
        b = rg.create_parameter("b", [2], init=[1.0, 2.0])
        c = rg.create_parameter("c", [2], init=np.float32(0.5))
        d = rg.create_parameter("d", [2, 3], init="zeros")
        e = rg.create_parameter("e", [2], dtype="float64", init="ones")
        f = rg.create_parameter("f", [200], init=("normal", 1.0, 0.1))
        g = rg.create_parameter("g", [200], init=("uniform", -0.5, 0.5))
    exe = rg.Executor()
    exe.run(startup)
    get = exe.scope.get
    np.testing.assert_array_equal(get("a"), np.arange(4.0).reshape(2, 2))
    np.testing.assert_array_equal(get("b"), [1.0, 2.0])
    np.testing.assert_array_equal(get("c"), [0.5, 0.5])
    np.testing.assert_array_equal(get("d"), np.zeros((2, 3)))
    np.testing.assert_array_equal(get("e"), np.ones(2))
    assert np.asarray(get("e")).dtype == np.float64
    assert abs(np.mean(get("f")) - 1.0) < 0.05 and 0.05 < np.std(get("f")) < 0.2
    assert np.all(np.abs(get("g")) <= 0.5) and np.std(get("g")) > 0.1


def test_softmax_cross_entropy_labels_n_by_1():
    z = np.random.default_rng(0).standard_normal((3, 4))
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, 4], dtype="float64")
        lab = rg.data("lab", [-1, 1], dtype="int64")
        loss = rg.softmax_cross_entropy(x, lab)
    assert tuple(loss.shape) == (-1,)
    v, = rg.Executor().run(main, feed={"x": z, "lab": np.array([[0], [3], [1]])}, fetch_list=[loss])
    ls = z - np.log(np.exp(z).sum(1, keepdims=True))
    np.testing.assert_allclose(v, -ls[np.arange(3), [0, 3, 1]], rtol=1e-12)


def test_keyword_spellings_and_dtype_objects():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data(name="x", shape=[None, 4], dtype=np.float64)
        parts = rg.split(x, num_or_sizes=[1, 3], axis=1)
        y = rg.concat(xs=parts[::-1], axis=1)
        z = rg.transpose(rg.reshape(y, shape=(2, -1)), perm=[1, 0])
        s = rg.sum(x, axis=(0, 1))
        c = rg.clip(x, lo=-0.5, hi=0.5)
        k = rg.cast(x, np.int64)
        h = rg.layers.fc(x, size=3, act="linear", name="lin")
        i, = rg.while_loop(cond_fn=lambda i: i < 4, body_fn=lambda i: [i + 1], loop_vars=[rg.constant(0)])
    assert x.dtype == "float64" and k.dtype == "int64"
    xv = np.arange(8.0).reshape(2, 4) / 8
    exe = rg.Executor()
    exe.run(startup)
    yv, zv, sv, cv, hv, iv = exe.run(program=main, feed={"x": xv}, fetch_list=[y, z, s, c, h, i])
    ref_y = np.concatenate([xv[:, 1:], xv[:, :1]], 1)
    np.testing.assert_array_equal(yv, ref_y)
    np.testing.assert_array_equal(zv, ref_y.reshape(2, -1).T)
    np.testing.assert_allclose(sv, xv.sum())
    np.testing.assert_array_equal(cv, np.clip(xv, -0.5, 0.5))
    np.testing.assert_allclose(hv, xv @ exe.scope.get("lin.w") + exe.scope.get("lin.b"))
    assert int(iv) == 4


def test_recurrent_single_var_arguments_and_tuple_return():
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        xs = rg.data("xs", [-1, -1, 2], dtype="float64")
        h0 = rg.data("h0", [-1, 2], dtype="float64")
        alls, lasts = rg.recurrent(lambda a, s: (a[0] + s[0] * 0.5,), xs, h0)
    xv = np.random.default_rng(1).standard_normal((4, 3, 2))
    hv = np.ones((3, 2))
    av, lv = rg.Executor().run(main, feed={"xs": xv, "h0": hv}, fetch_list=[alls[0], lasts[0]])
    h, ref = hv, []
    for t in range(4):
        h = xv[t] + h * 0.5
        ref.append(h)
    np.testing.assert_allclose(av, np.stack(ref))
    np.testing.assert_allclose(lv, h)


def test_scope_passed_to_run():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        y = rg.layers.fc(rg.data("x", [-1, 2]), 2, name="fc")
    sc = rg.Scope()
    exe = rg.Executor()
    exe.run(startup, scope=sc)
    assert sc.get("fc.w").shape == (2, 2)
    v, = exe.run(main, feed={"x": np.ones((1, 2), "float32")}, fetch_list=[y], scope=sc)
    np.testing.assert_allclose(v, np.ones((1, 2)) @ sc.get("fc.w") + sc.get("fc.b"), rtol=1e-6)
    with pytest.raises(rg.RetrogradError):
        exe.run(main, feed={"x": np.ones((1, 2), "float32")}, fetch_list=[y])   # exe.scope is empty
