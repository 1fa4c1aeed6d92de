"""Contract: user mistakes raise rg.RetrogradError subclasses, never bare KeyError/AssertionError/IndexError."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg

BARE = (KeyError, AssertionError, IndexError, ValueError, TypeError, AttributeError)


def _check(err, cls, *names):
    assert isinstance(err, cls), type(err)
    assert isinstance(err, rg.RetrogradError)
    assert type(err) not in BARE
    assert not isinstance(err, (KeyError, AssertionError, IndexError))
    for n in names:
        assert n in str(err), (n, str(err))


def test_error_hierarchy():
    for cls in (rg.ProgramError, rg.FeedError, rg.ExecutionError):
        assert issubclass(cls, rg.RetrogradError)
    assert issubclass(rg.RetrogradError, Exception)


def _prog():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3])
        ids = rg.data("ids", [-1], dtype="int64")
        w = rg.create_parameter("emb_w", [5, 3])
        y = rg.mean(x * 2.0)
        g = rg.gather(w, ids)
    exe = rg.Executor()
    exe.run(startup)
    return main, exe, y, g


@pytest.mark.parametrize("case", ["missing", "rank", "fixed_dim", "dtype", "unknown_fetch", "unknown_feed"])
def test_feed_errors(case):
    main, exe, y, g = _prog()
    feed = {"x": np.ones((2, 3), "float32")}
    fetch = [y]
    if case == "missing":
        feed = {}
    elif case == "rank":
        feed = {"x": np.ones((2, 3, 1), "float32")}
    elif case == "fixed_dim":
        feed = {"x": np.ones((2, 4), "float32")}
    elif case == "dtype":
        feed, fetch = {"ids": np.array([0.5, 1.5])}, [g]
    elif case == "unknown_fetch":
        fetch = ["no_such_var"]
    elif case == "unknown_feed":
        feed = dict(feed, no_such_feed=np.ones(2))
    with pytest.raises(rg.RetrogradError) as e:
        exe.run(main, feed=feed, fetch_list=fetch)
    name = {"unknown_fetch": "no_such_var", "unknown_feed": "no_such_feed", "dtype": "ids"}.get(case, "x")
    _check(e.value, rg.RetrogradError, name)
    if case in ("missing", "rank", "fixed_dim", "dtype"):
        assert isinstance(e.value, rg.FeedError)


def test_gather_out_of_range_is_execution_error_naming_op():
    main, exe, y, g = _prog()
    with pytest.raises(rg.ExecutionError) as e:
        exe.run(main, feed={"ids": np.array([1, 9], "int64")}, fetch_list=[g])
    _check(e.value, rg.ExecutionError, "Gather")
    msg = str(e.value)
    assert "block 0" in msg and "[5, 3]" in msg


@pytest.mark.parametrize("case", ["broadcast", "matmul", "reshape", "concat", "split", "sce_labels"])
def test_build_time_shape_errors(case):
    with rg.program_guard(rg.Program(), rg.Program()):
        a = rg.data("a", [2, 3])
        b = rg.data("b", [4, 5])
        f = {
            "broadcast": lambda: a + b,
            "matmul": lambda: a @ b,
            "reshape": lambda: rg.reshape(a, [7]),
            "concat": lambda: rg.concat([a, b], 0),
            "split": lambda: rg.split(a, 4, 1),
            "sce_labels": lambda: rg.softmax_cross_entropy(a, rg.data("lab", [2])),
        }[case]
        with pytest.raises(rg.ProgramError) as e:
            f()
    _check(e.value, rg.ProgramError, "a")


def test_malformed_json_and_unknown_op():
    for text in ("{not json", "[]", '{"blocks": 3}', ""):
        with pytest.raises(rg.ProgramError) as e:
            rg.Program.from_json(text)
        _check(e.value, rg.ProgramError)
    main, *_ = _prog()
    text = main.to_json().replace('"Gather"', '"NoSuchOpType"')
    with pytest.raises(rg.ProgramError) as e:
        rg.Program.from_json(text)
    _check(e.value, rg.ProgramError, "NoSuchOpType")


def test_control_flow_build_errors():
    with rg.program_guard(rg.Program(), rg.Program()):
        a = rg.data("a", [2, 3])
        b = rg.data("b", [4, 5])
        p = rg.data("p", [], dtype="bool")
        i0 = rg.constant(0)
        cases = [
            lambda: rg.cond(a, lambda: a, lambda: a),                              # non-bool pred
            lambda: rg.cond(p, lambda: (a, a), lambda: a),                         # counts differ
            lambda: rg.cond(p, lambda: a, lambda: rg.cast(a, "float64")),          # dtypes differ
            lambda: rg.cond(p, lambda: a, lambda: b),                              # shapes differ
            lambda: rg.while_loop(lambda i: i < 3, lambda i: (i + 1, i), [i0]),    # wrong count
            lambda: rg.while_loop(lambda i: i < 3, lambda i: rg.cast(i, "float32"), [i0]),
            lambda: rg.while_loop(lambda i: i, lambda i: i + 1, [i0]),             # non-bool cond
        ]
        for f in cases:
            with pytest.raises(rg.ProgramError) as e:
                f()
            _check(e.value, rg.ProgramError)


def test_while_max_iters_exceeded_is_execution_error():
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        n = rg.data("n", [], dtype="int64")
        i, = rg.while_loop(lambda i: i < n, lambda i: [i + 1], [rg.constant(0)], max_iters=5)
    exe = rg.Executor()
    v, = exe.run(main, feed={"n": np.array(5)}, fetch_list=[i])
    assert int(v) == 5
    with pytest.raises(rg.ExecutionError) as e:
        exe.run(main, feed={"n": np.array(9)}, fetch_list=[i])
    _check(e.value, rg.ExecutionError)
    assert "5" in str(e.value)


def test_uninitialised_parameter_is_retrograd_error():
    main, exe, y, g = _prog()
    with pytest.raises(rg.RetrogradError) as e:
        rg.Executor().run(main, feed={"ids": np.array([1], "int64")}, fetch_list=[g])
    _check(e.value, rg.RetrogradError, "emb_w")


def test_load_params_mismatch(tmp_path):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        rg.layers.fc(rg.data("x", [-1, 3]), 4, name="fc")
    other, ostart = rg.Program(), rg.Program()
    with rg.program_guard(other, ostart):
        rg.layers.fc(rg.data("x", [-1, 3]), 5, name="fc")
    exe = rg.Executor()
    exe.run(startup)
    path = str(tmp_path / "p.npz")
    rg.save_params(exe.scope, path, main)
    exe2 = rg.Executor()
    exe2.run(ostart)
    before = np.array(exe2.scope.get("fc.w"))
    with pytest.raises(rg.RetrogradError) as e:
        rg.load_params(exe2.scope, path)
    _check(e.value, rg.RetrogradError, "fc.w")
    np.testing.assert_array_equal(exe2.scope.get("fc.w"), before)


@pytest.mark.parametrize("case", ["add", "matmul", "reshape", "xent_batch", "xent_label"])
def test_run_time_shape_conflicts_are_execution_errors(case):
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        a = rg.data("a", [-1])
        b = rg.data("b", [-1])
        m = rg.data("m", [-1, -1])
        n = rg.data("n", [-1, -1])
        t = rg.data("t", [-1, 4])
        ids = rg.data("ids", [-1], dtype="int64")
        outs = {"add": a + b, "matmul": m @ n, "reshape": rg.reshape(a, [2, -1]),
                "xent_batch": rg.softmax_cross_entropy(t, ids), "xent_label": rg.softmax_cross_entropy(t, ids)}
    feeds = {"add": {"a": np.ones(3), "b": np.ones(4)}, "matmul": {"m": np.ones((2, 3)), "n": np.ones((4, 2))},
             "reshape": {"a": np.ones(3)}, "xent_batch": {"t": np.ones((2, 4)), "ids": np.array([0])},
             "xent_label": {"t": np.ones((2, 4)), "ids": np.array([0, 4])}}
    with pytest.raises(rg.ExecutionError) as e:
        rg.Executor().run(main, feed=feeds[case], fetch_list=[outs[case]])
    op_type = {"add": "Add", "matmul": "MatMul", "reshape": "Reshape"}.get(case, "SoftmaxCrossEntropy")
    _check(e.value, rg.ExecutionError, op_type, "block 0")


def test_more_user_mistakes_are_retrograd_errors():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3])
        x2 = rg.data("x2", [-1, 3, 4])
        loss = rg.mean(rg.layers.fc(x, 4, name="fc"))
        build_time = [
            lambda: rg.layers.fc(x, 0),
            lambda: rg.recurrent(lambda xs, hs: [], [x2], []),
            lambda: rg.optim.SGD("fast"),
            lambda: rg.append_backward(loss, callbacks=[3]),
            lambda: rg.exp(rg.data("ints", [2], dtype="int64")),
            lambda: rg.layers.lstm(x, 4),
            lambda: rg.cond(rg.sum(x) > 0, lambda: x, lambda: None),
            lambda: rg.while_loop(lambda i: i < 3, lambda i: [i + 1], [0]),
        ]
        for f in build_time:
            with pytest.raises(rg.ProgramError) as e:
                f()
            _check(e.value, rg.ProgramError)
    exe = rg.Executor()
    exe.run(startup)
    for kwargs in ({"program": "main"}, {"program": main, "feed": [1]},
                   {"program": main, "feed": {"x": [[1, 2, 3], [1]]}, "fetch_list": [loss]}):
        with pytest.raises(rg.RetrogradError) as e:
            exe.run(**kwargs)
        _check(e.value, rg.RetrogradError)


def test_reduction_dtypes_match_what_runs():
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        i = rg.data("i", [3], dtype="int64")
        b = rg.data("b", [3], dtype="bool")
        outs = [rg.mean(i), rg.sum(i), rg.sum(b), rg.mean(b), i / 2]
    vals = rg.Executor().run(main, feed={"i": np.array([1, -2, 3]), "b": np.array([True, False, True])},
                             fetch_list=outs)
    for o, v in zip(outs, vals):
        assert np.asarray(v).dtype == np.dtype(o.dtype), o
    np.testing.assert_allclose([float(v) for v in vals[:4]], [2 / 3, 2, 2, 2 / 3])
    np.testing.assert_allclose(vals[4], [0.5, -1.0, 1.5])
