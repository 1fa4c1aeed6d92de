"""The onnxruntime engine: rg.Executor(backend="onnxruntime") against the NumPy executor."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="the engine needs onnxruntime (retrograd[onnx])")

import retrograd as rg  # noqa: E402
from retrograd.ops.core.registry import OPS, OpDef  # noqa: E402


def _fc_training(optimizer=None):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 6])
        y = rg.data("y", [-1, 3])
        h = rg.layers.fc(x, 5, act="tanh", name="fc1")
        pred = rg.layers.fc(h, 3, name="fc2")
        loss = rg.mean(rg.square(pred - y))
        (optimizer or rg.optim.Adam(0.05, clip_norm=1.0)).minimize(loss)
    return main, startup, loss


def _pair(startup):
    """A NumPy executor and an engine executor starting from the same parameters."""
    ref = rg.Executor()
    ref.run(startup)
    exe = rg.Executor(backend="onnxruntime")
    for name, value in ref.scope.vars.items():
        exe.scope.set(name, np.array(value))
    return ref, exe


def _batches(n, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((8, 6)).astype("float32"),
             "y": rng.standard_normal((8, 3)).astype("float32")} for _ in range(n)]


@pytest.mark.parametrize("optimizer", [None, rg.optim.SGD(0.1), rg.optim.Momentum(0.05, 0.9)],
                         ids=["adam-clip", "sgd", "momentum"])
def test_training_steps_match_the_numpy_executor(optimizer):
    main, startup, loss = _fc_training(optimizer)
    ref, exe = _pair(startup)
    for feed in _batches(5):
        want, = ref.run(main, feed=feed, fetch_list=[loss])
        got, = exe.run(main, feed=feed, fetch_list=[loss])
        np.testing.assert_allclose(got, want, rtol=1e-5)
    for var in main.list_vars():
        if var.persistable:
            got = exe.scope.get(var.name)
            assert isinstance(got, np.ndarray)
            np.testing.assert_allclose(got, ref.scope.get(var.name), rtol=2e-5, atol=1e-6, err_msg=var.name)
    stats = exe.last_stats
    assert stats.time_s > 0 and stats.ops_run > 0 and stats.peak_bytes > 0


def test_session_is_built_once_and_rebuilt_when_the_program_changes():
    main, startup, loss = _fc_training()
    _, exe = _pair(startup)
    engine = exe._engine
    feed = _batches(1)[0]
    for _ in range(3):
        exe.run(main, feed=feed, fetch_list=[loss])
    assert engine.sessions_built == 1
    exe.run(main, feed=feed, fetch_list=[loss, "fc1.w"])        # another fetch set: another session
    assert engine.sessions_built == 2
    with rg.program_guard(main, rg.Program()):
        doubled = loss * 2.0                                     # the program changes (version bump)
    got_loss, got_doubled = exe.run(main, feed=feed, fetch_list=[loss, doubled])
    assert engine.sessions_built == 3
    assert float(got_doubled) == pytest.approx(2 * float(got_loss), rel=1e-6)
    assert len(engine._sessions) == 1                            # the old version's sessions are gone


def test_values_fetched_earlier_keep_their_numbers():
    main, startup, loss = _fc_training()
    _, exe = _pair(startup)
    feed = _batches(1)[0]
    first = exe.scope.get("fc1.w")
    kept = first.copy()
    fetched, = exe.run(main, feed=feed, fetch_list=["fc1.w"])
    fetched_copy = fetched.copy()
    for _ in range(3):
        exe.run(main, feed=feed, fetch_list=[loss])
    np.testing.assert_array_equal(first, kept)
    np.testing.assert_array_equal(fetched, fetched_copy)
    assert not np.array_equal(exe.scope.get("fc1.w"), kept)       # while the scope moved on


def _error(run):
    with pytest.raises(rg.RetrogradError) as info:
        run()
    return type(info.value), str(info.value)


@pytest.mark.parametrize("bad", [
    {"x": np.ones((8, 5), "float32"), "y": np.ones((8, 3), "float32")},     # wrong shape
    {"x": np.full((8, 6), "a"), "y": np.ones((8, 3), "float32")},           # wrong dtype
    {"x": np.ones((8, 6), "float32")},                                      # missing feed
], ids=["shape", "dtype", "missing"])
def test_bad_feeds_get_the_numpy_executors_error(bad):
    main, startup, loss = _fc_training()
    ref, exe = _pair(startup)
    want = _error(lambda: ref.run(main, feed=bad, fetch_list=[loss]))
    got = _error(lambda: exe.run(main, feed=bad, fetch_list=[loss]))
    assert got[0] is want[0] is not rg.RetrogradError
    assert issubclass(got[0], rg.FeedError)
    if "missing" not in str(bad.keys()) and "y" in bad:
        assert got[1] == want[1]


@pytest.fixture
def op_without_lowering():
    """A registered op with a kernel and no ONNX lowering, removed afterwards."""
    def rule(ins, attrs):
        return [(ins[0].shape, ins[0].dtype)]
    OPS["TimesTwoNoOnnx"] = OpDef("TimesTwoNoOnnx", lambda k, x: x * 2, rule)
    yield "TimesTwoNoOnnx"
    del OPS["TimesTwoNoOnnx"]


def test_an_op_without_a_lowering_is_a_backend_error_naming_it(op_without_lowering):
    from retrograd.ops.core.registry import append_op
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [3])
        y, = append_op(op_without_lowering, [x])
    assert rg.Executor().run(main, feed={"x": np.ones(3, "float32")}, fetch_list=[y])[0][0] == 2.0
    exe = rg.Executor(backend="onnxruntime")
    with pytest.raises(rg.BackendError, match=op_without_lowering):
        exe.run(main, feed={"x": np.ones(3, "float32")}, fetch_list=[y])


def test_cuda_without_onnxruntime_gpu_is_a_backend_error():
    import onnxruntime
    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("onnxruntime-gpu is installed here")
    with pytest.raises(rg.BackendError, match="onnxruntime-gpu"):
        rg.Executor(backend="onnxruntime", device="cuda")


def test_a_program_with_nothing_to_run_returns_its_feeds_and_parameters():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [2])
        w = rg.create_parameter("w", [2], init=0.5)
    ref, exe = _pair(startup)
    got = exe.run(main, feed={"x": np.ones(2, "float32")}, fetch_list=[x, w])
    np.testing.assert_array_equal(got[0], np.ones(2))
    np.testing.assert_array_equal(got[1], np.full(2, 0.5))


def test_dropout_draws_the_numpy_executors_masks_run_after_run():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 50])
        y = rg.dropout(x, 0.5, seed=7)
    ref, exe = rg.Executor(), rg.Executor(backend="onnxruntime")
    feed = {"x": np.ones((4, 50), "float32")}
    runs = [(ref.run(main, feed=feed, fetch_list=[y])[0], exe.run(main, feed=feed, fetch_list=[y])[0])
            for _ in range(3)]
    for want, got in runs:
        np.testing.assert_array_equal(got, want)
    assert not np.array_equal(runs[0][1], runs[1][1])          # a new mask every run


def test_startup_programs_run_on_the_engine_with_the_numpy_executors_numbers():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        rg.create_parameter("u", [4, 5], init=("uniform", -0.3, 0.3))
        rg.create_parameter("n", [6, 3], init=("normal", 0.5, 2.0))
        rg.create_parameter("x", [5, 5])                       # Xavier-uniform
        rg.create_parameter("b", [5])                          # zeros
    ref, exe = rg.Executor(), rg.Executor(backend="onnxruntime")
    ref.run(startup)
    exe.run(startup)
    for name in ("u", "n", "x", "b"):
        np.testing.assert_array_equal(exe.scope.get(name), ref.scope.get(name), err_msg=name)


def test_normal_draws_inside_a_loop_match_the_numpy_executor():
    from retrograd.ops.core.registry import append_op
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        n = rg.data("n", [], dtype="int64")

        def body(i, acc):
            noise, = append_op("GaussianRandom", [], {"shape": [2], "dtype": "float32", "mean": 0.0,
                                                      "std": 1.0, "seed": 3})
            return i + 1, acc + noise
        _, total = rg.while_loop(lambda i, acc: i < n, body, [rg.constant(0), rg.fill([2], 0.0)])
    feed = {"n": np.array(3)}
    want, = rg.Executor().run(main, feed=feed, fetch_list=[total])
    got, = rg.Executor(backend="onnxruntime").run(main, feed=feed, fetch_list=[total])
    np.testing.assert_allclose(got, want, rtol=1e-6)


# --- run-time checks: the kernels' errors, never a silently different result ---------------------

def _both_raise(main, feed, fetch, error=rg.ExecutionError):
    """The NumPy executor's and the engine's errors for one run: (numpy message, engine message)."""
    messages = []
    for exe in (rg.Executor(), rg.Executor(backend="onnxruntime")):
        with pytest.raises(error) as info:
            exe.run(main, feed=feed, fetch_list=fetch)
        messages.append(str(info.value))
    return messages


def _counting_loop(max_iters, nested=False):
    """x + 1 while sum(x) < 100 (bounded by max_iters), at the top or inside a one-iteration loop."""
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [2], dtype="float64")

        def inner(h):
            return rg.while_loop(lambda h: rg.sum(h) < 100.0, lambda h: h + 1.0, h, max_iters=max_iters)

        if nested:
            _, h = rg.while_loop(lambda i, h: i < 1, lambda i, h: (i + 1, inner(h)), [rg.constant(0), x])
        else:
            h = inner(x)
    return main, h


@pytest.mark.parametrize("nested", [False, True], ids=["top", "in-a-loop-body"])
def test_max_iters_exceeded_is_the_kernels_error_at_any_depth(nested):
    """Regression (engine gap): the exported Loop ran past max_iters and returned its carries."""
    main, h = _counting_loop(5, nested)
    exe = rg.Executor(backend="onnxruntime")
    np.testing.assert_allclose(exe.run(main, feed={"x": np.array([45.0, 45.0])}, fetch_list=[h])[0], [50, 50])
    want, got = _both_raise(main, {"x": np.zeros(2)}, [h])
    assert got == want and "While in block" in got and "ran 5 iterations" in got and "max_iters=5" in got


def test_max_iters_zero_refuses_a_first_iteration():
    main, h = _counting_loop(0)
    want, got = _both_raise(main, {"x": np.zeros(2)}, [h])
    assert got == want and "ran 0 iterations" in got


def test_a_failed_recurrent_check_inside_a_branch_names_the_op():
    """Inside an If branch the shapes cannot be read back: the error names the op and the check."""
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, -1, 2], dtype="float64")
        h0 = rg.data("h0", [-1, 2], dtype="float64")
        use = rg.data("use", [], dtype="bool")
        out = rg.cond(use, lambda: rg.recurrent(lambda xs, hs: [rg.tanh(xs[0] + hs[0])], [x], [h0])[1][0],
                      lambda: h0 * 1.0)
    feed = {"x": np.ones((3, 2, 2)), "use": np.array(True), "h0": np.zeros((1, 2))}  # batch 1 broadcasts
    want, got = _both_raise(main, feed, [out])
    assert "RecurrentNetwork in block 1: initial state 'h0' has batch 1" in want
    assert "RecurrentNetwork in block 1: the input sequences' lengths, the initial states' batch" in got
    feed["h0"] = np.zeros((2, 2))
    got, = rg.Executor(backend="onnxruntime").run(main, feed=feed, fetch_list=[out])
    np.testing.assert_allclose(got, np.tanh(1 + np.tanh(1 + np.tanh(1.0))) * np.ones((2, 2)))


def test_an_exported_model_fails_in_onnxruntime_where_the_kernel_raises(tmp_path):
    """rg.onnx.export keeps the checks: a failed one stops onnxruntime in a node naming the op."""
    import onnxruntime
    main, h = _counting_loop(5)
    rg.onnx.export(main, tmp_path / "loop.onnx", fetch_list=[h])
    session = onnxruntime.InferenceSession(str(tmp_path / "loop.onnx"))
    got, = session.run(None, {"x": np.array([45.0, 46.0])})
    np.testing.assert_allclose(got, [50.0, 51.0])                 # 5 iterations: the most allowed
    with pytest.raises(Exception, match=r"retrograd\.check\.\d+ \(.*While in block 0: .*max_iters=5"):
        session.run(None, {"x": np.zeros(2)})


def test_a_fed_value_an_op_computes_is_refused_as_by_the_numpy_executor():
    """Regression (engine gap): the engine computed the value and ignored the feed."""
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [3], dtype="float64")
        y = x * 2.0
        z = y + 1.0
    want, got = _both_raise(main, {"x": np.ones(3), y.name: np.zeros(3)}, [z], rg.FeedError)
    assert got == want and "would be ignored" in got and "Mul" in got


def test_missing_values_get_the_numpy_executors_words():
    main, startup, loss = _fc_training()
    ref, exe = _pair(startup)
    feed = {"x": np.ones((8, 6), "float32")}
    want = _error(lambda: ref.run(main, feed=feed, fetch_list=[loss]))
    assert _error(lambda: exe.run(main, feed=feed, fetch_list=[loss])) == want
    assert "'y' is read by" in want[1] and "Sub in block 0" in want[1]
    fresh = rg.Executor(backend="onnxruntime")                 # startup not run: no parameters
    want = _error(lambda: rg.Executor().run(main, feed=_batches(1)[0], fetch_list=[loss]))
    assert _error(lambda: fresh.run(main, feed=_batches(1)[0], fetch_list=[loss])) == want
    assert "run the startup program first" in want[1]


def test_a_node_that_fails_in_onnxruntime_names_its_op_and_line():
    """Regression: a batch mismatch between two feeds was onnxruntime's message, naming no op."""
    main, startup, loss = _fc_training()
    _, exe = _pair(startup)
    feed = {"x": np.ones((8, 6), "float32"), "y": np.ones((7, 3), "float32")}
    with pytest.raises(rg.ExecutionError, match=r"test_engine\.py:\d+: op #\d+ Sub in block 0 failed in "
                                                r"onnxruntime: .*broadcast"):
        exe.run(main, feed=feed, fetch_list=[loss])


IDS_OUT_OF_RANGE = {   # (build from a: float64[-1], ids: int64[-1]; feed)
    "gather high": (lambda a, ids: rg.gather(a, ids), {"a": np.ones(3), "ids": np.array([0, 3])}),
    "gather negative": (lambda a, ids: rg.gather(a, ids), {"a": np.ones(3), "ids": np.array([1, -4])}),
    "embedding negative": (lambda a, ids: rg.gather(rg.reshape(a, [3, 1]), ids),
                           {"a": np.ones(3), "ids": np.array([[-4, 0]])}),
    "xent label negative": (lambda a, ids: rg.softmax_cross_entropy(rg.unsqueeze(a, 0), rg.slice(ids, [0], [0], [1])),
                            {"a": np.ones(3), "ids": np.array([-1])}),
    "xent label high": (lambda a, ids: rg.softmax_cross_entropy(rg.unsqueeze(a, 0), rg.slice(ids, [0], [0], [1])),
                        {"a": np.ones(3), "ids": np.array([3])}),
    "one_hot label": (lambda a, ids: rg.one_hot(ids, 2), {"a": np.ones(3), "ids": np.array([0, 2])}),
    "one_hot negative": (lambda a, ids: rg.one_hot(ids, 2), {"a": np.ones(3), "ids": np.array([-1, 0])}),
}


@pytest.mark.parametrize("name", sorted(IDS_OUT_OF_RANGE))
def test_ids_outside_the_rows_are_the_kernels_error_word_for_word(name):
    """Regression (engine): ONNX Gather/GatherElements wrapped negative ids and one-hot by
    comparison gave zero rows, where the NumPy kernels raise."""
    build, feed = IDS_OUT_OF_RANGE[name]
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        out = build(rg.data("a", [-1], "float64"), rg.data("ids", [-1] * feed["ids"].ndim, "int64"))
    want, got = _both_raise(main, feed, [out])
    assert got == want and "is out of range" in got and "block 0 failed: IndexError" in got


def test_an_id_check_inside_a_loop_body_names_the_op():
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        table, ids = rg.data("table", [4, 2], "float64"), rg.data("ids", [-1], "int64")
        _, total = rg.while_loop(lambda i, acc: i < 2, lambda i, acc: (i + 1, acc + rg.sum(rg.gather(table, ids))),
                                 [rg.constant(0), rg.fill([], 0.0, "float64")])
    feed = {"table": np.ones((4, 2)), "ids": np.array([0, -5])}    # [-4, 4) count from either end
    want, got = _both_raise(main, feed, [total])
    assert "Gather in block 2 failed: IndexError: id -5" in want       # block 1: the condition
    assert "Gather in block 2: ids must lie in [-n, n)" in got
    feed["ids"] = np.array([0, 3])
    got, = rg.Executor(backend="onnxruntime").run(main, feed=feed, fetch_list=[total])
    assert float(got) == 8.0


def test_a_scalar_feed_keeps_its_shape():
    """np.ascontiguousarray made 0-d feeds 1-d: rg.sum of a scalar came back shaped [1]."""
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        s = rg.data("s", [], "float64")
        outs = [rg.sum(s), s * 2.0, rg.max(s)]
    got = rg.Executor(backend="onnxruntime").run(main, feed={"s": np.array(2.5)}, fetch_list=outs)
    assert [g.shape for g in got] == [(), (), ()]
    assert [float(g) for g in got] == [2.5, 5.0, 2.5]
