"""The executor: compiled plans reused across batch sizes, freeing after last use, clear errors."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd.errors import ExecutionError, FeedError, ProgramError, RetrogradError
from retrograd.ir.program import Op, Program


def _mlp():
    main, startup = Program(random_seed=5), Program(random_seed=5)
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 4])
        w = rg.create_parameter("fc.w", [4, 3])
        b = rg.create_parameter("fc.b", [3], init=0.25)
        h = rg.tanh(rg.matmul(x, w) + b)
        loss = rg.mean(h * h)
    return main, startup, h, loss


def test_one_compiled_program_runs_batch_after_batch_of_different_sizes():
    main, startup, h, loss = _mlp()
    exe = rg.Executor()
    exe.run(startup)
    w, b = exe.scope.get("fc.w"), exe.scope.get("fc.b")
    rng = np.random.default_rng(0)
    for n in (2, 7, 1, 7, 3):
        xb = rng.standard_normal((n, 4)).astype("float32")
        h_v, loss_v = exe.run(main, feed={"x": xb}, fetch_list=[h, loss])
        expected = np.tanh(xb @ w + b)
        assert h_v.shape == (n, 3) and h_v.dtype == np.float32
        np.testing.assert_allclose(h_v, expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(loss_v, np.mean(expected * expected), rtol=1e-5)


def test_startup_is_seeded_and_reproducible():
    values = []
    for _ in range(2):
        _, startup, _, _ = _mlp()
        exe = rg.Executor()
        exe.run(startup)
        values.append(exe.scope.get("fc.w"))
    np.testing.assert_array_equal(values[0], values[1])
    np.testing.assert_array_equal(exe.scope.get("fc.b"), np.full(3, 0.25, "float32"))


def test_peak_bytes_of_a_long_elementwise_chain_stays_a_few_arrays():
    main = Program()
    with rg.program_guard(main, Program()):
        x = rg.data("x", [-1, 1024])
        y = x
        for i in range(20):
            y = rg.tanh(y) if i % 2 else rg.neg(y)
    xb = np.ones((512, 1024), "float32")            # 2 MiB per array
    exe = rg.Executor()
    out, = exe.run(main, feed={"x": xb}, fetch_list=[y])
    np.testing.assert_allclose(out, _chain_reference(xb), rtol=1e-6)
    peak = exe.last_stats.peak_bytes
    # The feed, the value being read and the value being written; never all 21.
    assert 2 * xb.nbytes <= peak < 4 * xb.nbytes
    assert exe.last_stats.ops_run == 20


def _chain_reference(x: np.ndarray) -> np.ndarray:
    for i in range(20):
        x = np.tanh(x) if i % 2 else -x
    return x


def test_last_stats_fields():
    main, startup, _, loss = _mlp()
    exe = rg.Executor()
    assert exe.last_stats.ops_run == 0
    exe.run(startup)
    exe.run(main, feed={"x": np.ones((3, 4), "float32")}, fetch_list=[loss])
    stats = exe.last_stats
    assert isinstance(stats, rg.RunStats)
    assert stats.time_s > 0 and isinstance(stats.time_s, float)
    assert stats.ops_run == len(main.global_block().ops)
    assert stats.peak_bytes >= 3 * 4 * 4 and isinstance(stats.peak_bytes, int)


def test_fetch_by_name_and_by_var_agree():
    main, startup, h, _ = _mlp()
    exe = rg.Executor()
    exe.run(startup)
    xb = np.ones((2, 4), "float32")
    a, = exe.run(main, feed={"x": xb}, fetch_list=[h])
    b, = exe.run(main, feed={"x": xb}, fetch_list=[h.name])
    np.testing.assert_array_equal(a, b)


def test_scope_set_changes_the_next_run():
    main, startup, h, _ = _mlp()
    exe = rg.Executor()
    exe.run(startup)
    exe.scope.set("fc.w", np.zeros((4, 3), "float32"))
    exe.scope.set("fc.b", np.zeros(3, "float32"))
    h_v, = exe.run(main, feed={"x": np.ones((2, 4), "float32")}, fetch_list=[h])
    np.testing.assert_array_equal(h_v, np.zeros((2, 3), "float32"))


# --- User mistakes: the right error class, naming the op or variable -------------------------

@pytest.fixture
def ready():
    main, startup, h, loss = _mlp()
    exe = rg.Executor()
    exe.run(startup)
    return exe, main, loss


def test_missing_feed(ready):
    exe, main, loss = ready
    with pytest.raises(FeedError, match=r"'x'.*feed it"):
        exe.run(main, feed={}, fetch_list=[loss])


def test_parameters_missing_until_startup_runs():
    main, _, _, loss = _mlp()
    with pytest.raises(FeedError, match=r"'fc.w'.*startup"):
        rg.Executor().run(main, feed={"x": np.ones((2, 4), "float32")}, fetch_list=[loss])


@pytest.mark.parametrize("value, pattern", [
    (np.ones((2, 4, 1), "float32"), r"feed 'x' has shape \[2, 4, 1\].*float32\[\?, 4\]"),   # rank
    (np.ones(4, "float32"), r"feed 'x' has shape \[4\]"),                                    # rank
    (np.ones((2, 5), "float32"), r"feed 'x' has shape \[2, 5\].*float32\[\?, 4\]"),          # fixed dim
])
def test_feed_of_the_wrong_shape(ready, value, pattern):
    exe, main, loss = ready
    with pytest.raises(FeedError, match=pattern):
        exe.run(main, feed={"x": value}, fetch_list=[loss])


def test_float_fed_to_an_int64_var():
    main = Program()
    with rg.program_guard(main, Program()):
        ids = rg.data("ids", [-1], dtype="int64")
        doubled = ids * 2
    exe = rg.Executor()
    got, = exe.run(main, feed={"ids": np.array([1, 2], "int64")}, fetch_list=[doubled])
    np.testing.assert_array_equal(got, [2, 4])
    with pytest.raises(FeedError, match=r"feed 'ids' has dtype float.*int64"):
        exe.run(main, feed={"ids": np.array([1.5, 2.0])}, fetch_list=[doubled])


def test_feed_of_a_name_the_program_lacks(ready):
    exe, main, loss = ready
    with pytest.raises(FeedError, match=r"feed 'nope'"):
        exe.run(main, feed={"x": np.ones((1, 4), "float32"), "nope": np.ones(1)}, fetch_list=[loss])


def test_unknown_fetch(ready):
    exe, main, _ = ready
    with pytest.raises(FeedError, match=r"fetch 'no_such_var'"):
        exe.run(main, feed={"x": np.ones((1, 4), "float32")}, fetch_list=["no_such_var"])


def test_unknown_op_type_is_a_program_error_naming_the_op():
    main = Program()
    g = main.global_block()
    g.create_var("x", [-1, 2], is_data=True)
    g.create_var("y", [-1, 2])
    g.append_op(Op("Tanh", ["x"], ["y"]))
    g.append_op(Op("NoSuchOp", ["y"], ["y"]))
    with pytest.raises(ProgramError, match=r"op #1 NoSuchOp"):
        rg.Executor().run(main, feed={"x": np.ones((1, 2), "float32")}, fetch_list=["y"])


def test_kernel_failure_names_the_op_and_the_shapes_it_received():
    main = Program()
    with rg.program_guard(main, Program()):
        a = rg.data("a", [-1, -1])
        b = rg.data("b", [-1, -1])
        c = rg.matmul(a, b)          # inner sizes are known only at run time
    exe = rg.Executor()
    with pytest.raises(ExecutionError, match=r"op #0 MatMul in block 0 failed.*a: float32\[2, 3\].*"
                                             r"b: float32\[4, 5\]"):
        exe.run(main, feed={"a": np.ones((2, 3), "float32"), "b": np.ones((4, 5), "float32")},
                fetch_list=[c])


@pytest.mark.skipif(not hasattr(rg, "gather"), reason="rg.gather not built yet")
def test_gather_with_an_id_out_of_range_is_an_execution_error():
    main = Program()
    with rg.program_guard(main, Program()):
        table = rg.data("table", [4, 2])
        ids = rg.data("ids", [-1], dtype="int64")
        rows = rg.gather(table, ids)
    exe = rg.Executor()
    feed = {"table": np.arange(8, dtype="float32").reshape(4, 2), "ids": np.array([0, 3], "int64")}
    got, = exe.run(main, feed=feed, fetch_list=[rows])
    np.testing.assert_array_equal(got, [[0, 1], [6, 7]])
    with pytest.raises(ExecutionError, match=r"Gather"):
        exe.run(main, feed={**feed, "ids": np.array([0, 4], "int64")}, fetch_list=[rows])


def test_errors_are_retrograd_errors_never_bare_key_errors(ready):
    exe, main, loss = ready
    for feed, fetch in (({}, [loss]), ({"x": np.ones((1, 4), "float32")}, ["zz"])):
        with pytest.raises(RetrogradError):
            exe.run(main, feed=feed, fetch_list=fetch)
    with pytest.raises(RetrogradError):
        exe.scope.get("never_set")


def test_scope_value_of_another_float_dtype_is_cast_once_and_float_for_int_is_refused():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3])
        w = rg.create_parameter("w", [3, 2])
        count = rg.create_parameter("count", [], dtype="int64", trainable=False)
        y = rg.matmul(x, w)
        c = count + 1
    exe = rg.Executor()
    exe.run(startup)
    w64 = np.arange(6, dtype=np.float64).reshape(3, 2)
    exe.scope.set("w", w64)
    xb = np.ones((2, 3), np.float32)
    out, = exe.run(main, feed={"x": xb}, fetch_list=[y])
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, xb @ w64.astype(np.float32))
    assert exe.scope.get("w").dtype == np.float32
    exe.scope.set("count", np.asarray(1.5))
    with pytest.raises(rg.FeedError, match="'count'.*float64.*int64"):
        exe.run(main, feed={"x": xb}, fetch_list=[c])


def test_feeding_a_value_an_op_computes_first_is_refused():
    """Regression (issue #10): the feed was silently replaced by the op's result."""
    main, startup, h, loss = _mlp()
    exe = rg.Executor()
    exe.run(startup)
    xb = np.ones((2, 4), np.float32)
    with pytest.raises(FeedError, match=rf"feed '{h.name}' would be ignored: .*op #\d+ Tanh in block 0 computes it"):
        exe.run(main, feed={"x": xb, h.name: np.zeros((2, 3), np.float32)}, fetch_list=[loss])
    exe.run(main, feed={"x": xb}, fetch_list=[loss])          # without it: runs


def test_feeding_a_parameter_that_an_update_writes_is_honoured():
    """A fed persistable read before its update (an optimizer step) starts the update."""
    main, startup = Program(), Program()
    with rg.program_guard(main, startup):
        w = rg.create_parameter("w", [2], init=1.0)
        loss = rg.sum(w * w)
        rg.optim.SGD(0.25).minimize(loss)
    exe = rg.Executor()
    exe.run(startup)
    [value] = exe.run(main, feed={"w": np.array([2.0, -4.0], np.float32)}, fetch_list=[loss])
    assert value == pytest.approx(20.0)
    np.testing.assert_allclose(exe.scope.get("w"), [1.0, -2.0])    # w - 0.25 * 2w, from the fed w


def test_a_scope_value_replaced_after_a_run_is_checked_again():
    """Values the executor wrote back skip the next run's checks (issue 22: per-run overhead);
    a value put into the scope by anyone else is checked as before."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3])
        loss = rg.mean(rg.square(rg.layers.fc(x, 2, name="fc")))
        rg.optim.SGD(0.1).minimize(loss)
    exe = rg.Executor()
    exe.run(startup)
    feed = {"x": np.ones((4, 3), "float32")}
    exe.run(main, feed=feed, fetch_list=[loss])
    exe.run(main, feed=feed, fetch_list=[loss])          # reads what the first run wrote back
    exe.scope.set("fc.w", np.ones((3, 5), "float32"))
    with pytest.raises(rg.FeedError, match="fc.w"):
        exe.run(main, feed=feed, fetch_list=[loss])
    exe.scope.set("fc.w", np.ones((3, 2), "float64"))    # cast once to the declared float32
    exe.run(main, feed=feed, fetch_list=[loss])
    assert exe.scope.get("fc.w").dtype == np.float32
