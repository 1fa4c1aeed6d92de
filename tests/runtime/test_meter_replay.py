"""The memory meter counted once per start of a straight-line plan and replayed (``stats.MeterRecord``).

A replayed run must report what metering op by op reports (``exe.last_stats``) and compute the
same values; a plan the record cannot stand for (control flow, kernels holding values on the
meter, output sizes that depend on values) is metered op by op.
"""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd.ops.core.registry import OPS
from retrograd.runtime import executor as executor_module
from retrograd.runtime.stats import MemoryMeter


def _holds(monkeypatch) -> list:
    """A list that grows by one per ``MemoryMeter.hold`` call (runs replayed as they are by default)."""
    monkeypatch.setattr(executor_module, "CHECK_METER_REPLAY", False)
    calls = []
    real = MemoryMeter.hold

    def hold(self, array):
        calls.append(1)
        return real(self, array)
    monkeypatch.setattr(MemoryMeter, "hold", hold)
    return calls


def _chain_program():
    """x [4, 8] -> Exp -> Reshape [32] (a view on NumPy and torch) -> Mul 3 -> Sum: peaks by hand."""
    main = rg.Program()
    with rg.program_guard(main):
        x = rg.data("x", [4, 8])
        y = rg.reshape(rg.exp(x), [32]) * 3.0
        total = rg.sum(y)
    return main, total


def test_replayed_runs_report_the_hand_counted_peak_and_hold_nothing(backend, monkeypatch):
    main, total = _chain_program()
    exe = backend.executor()
    x = np.linspace(-1, 1, 32).reshape(4, 8).astype("float32")
    holds = _holds(monkeypatch)
    expected = np.float32(np.sum(np.exp(x).reshape(32) * 3.0))
    stats = []
    for _ in range(3):
        out, = exe.run(main, feed={"x": x}, fetch_list=[total])
        np.testing.assert_allclose(out, expected, rtol=1e-6)
        stats.append(exe.last_stats)
        if len(stats) == 1:
            assert holds, "the first run is metered op by op"
            holds.clear()
    assert holds == []                                  # runs 2 and 3: replayed, nothing held
    plan = exe.plan_for(main.global_block(), frozenset([total.name]))
    assert [s.op.type for s in plan.steps] == ["Exp", "Reshape", "Constant", "Mul", "Sum"]
    assert len(plan.meter_records) == 1
    # x (128 B) held; Exp's output beside it: 256, then x dies: 128; Reshape's view adds nothing;
    # the constant 3.0: 132; Mul's output beside Exp's: 260; then 128, and Sum's 4 bytes: 132.
    assert [(s.peak_bytes, s.ops_run) for s in stats] == [(260, 5)] * 3


def test_replay_equals_op_by_op_metering_on_a_training_step(backend):
    """The char-LSTM LM of ``retrograd train`` (small): peaks, ops, losses and parameters the same."""
    if backend.name == "onnxruntime":
        pytest.skip("the onnxruntime engine runs programs its own way")
    from retrograd.cli import train
    from retrograd.models import charlm
    cfg = train.ModelConfig("lstm", 16, 1, 8, None)
    corpus, _ = charlm.load_corpus()
    runs = []
    for replay in (True, False):
        t = train.build_training(cfg, 12, "adam", 3e-3, 5.0, seed=0)
        exe = backend.executor()
        exe.run(t.startup)
        if not replay:
            exe.plan_for(t.main.global_block(), frozenset([t.loss.name])).meter_records = None
        losses, stats = [], []
        for i in range(4):
            xs, ys = train.batch_at(corpus, i, 12, 4, 0)
            loss, = exe.run(t.main, feed={"chars": xs, "next_chars": ys}, fetch_list=[t.loss])
            losses.append(float(loss))
            stats.append((exe.last_stats.peak_bytes, exe.last_stats.ops_run))
        params = {n: np.asarray(backend_numpy(exe, n)) for n in exe.scope.names()}
        runs.append((losses, stats, params, exe, t))
    (losses, stats, params, exe, t), (losses0, stats0, params0, _, _) = runs
    assert losses == losses0 and stats == stats0
    assert params.keys() == params0.keys()
    for name in params:
        np.testing.assert_array_equal(params[name], params0[name])
    plan = exe.plan_for(t.main.global_block(), frozenset([t.loss.name]))
    # torch runs the LSTM as one fused op: straight-line, replayed; NumPy keeps the recurrence (a sub-block)
    assert plan.straight_line == (backend.name == "torch")
    assert bool(plan.meter_records) == plan.straight_line


def backend_numpy(exe, name):
    value = exe.scope.get(name)
    return exe.backend.to_numpy(value) if exe.backend.owns(value) else value


def test_output_sizes_that_depend_on_values_are_metered_from_where_they_differ(backend):
    """Arange's length is a fed value: the same start (a 0-d feed) makes outputs of other sizes."""
    main = rg.Program()
    with rg.program_guard(main):
        n = rg.data("n", [], dtype="int64")
        r = rg.cast(rg.arange(n), "float32")
        total = rg.sum(rg.exp(r * 0.001))
    exe, metered = backend.executor(), backend.executor()
    peaks = {}
    for size in (10, 10, 1000, 10, 1000):
        out, = exe.run(main, feed={"n": np.int64(size)}, fetch_list=[total])
        np.testing.assert_allclose(out, np.sum(np.exp(np.arange(size, dtype="float32") * 0.001)), rtol=1e-5)
        metered.plan_for(main.global_block(), frozenset([total.name])).meter_records = None
        metered.run(main, feed={"n": np.int64(size)}, fetch_list=[total])
        assert exe.last_stats.peak_bytes == metered.last_stats.peak_bytes
        peaks.setdefault(size, set()).add(exe.last_stats.peak_bytes)
    assert len(peaks[10]) == 1 and len(peaks[1000]) == 1
    small, large = peaks[10].pop(), peaks[1000].pop()
    assert large - small >= 2 * 990 * 4        # two float32 [1000] values beside each other


def test_control_flow_plans_are_metered_op_by_op(backend):
    """A while loop's iterations depend on a fed value: ops run and peaks follow each run."""
    if backend.name == "onnxruntime":
        pytest.skip("the onnxruntime engine runs programs its own way")
    main = rg.Program()
    with rg.program_guard(main):
        limit = rg.data("limit", [], dtype="int64")
        x = rg.data("x", [64], dtype="float32")
        i0 = rg.constant(0, "int64")
        _, y = rg.while_loop(lambda i, v: i < limit, lambda i, v: (i + 1, v * 2.0), [i0, x])
    exe = backend.executor()
    x_value = np.ones(64, "float32")
    ops = {}
    for steps in (1, 5, 1, 5):
        out, = exe.run(main, feed={"limit": np.int64(steps), "x": x_value}, fetch_list=[y])
        np.testing.assert_array_equal(out, x_value * 2.0 ** steps)
        ops.setdefault(steps, set()).add(exe.last_stats.ops_run)
    assert len(ops[1]) == 1 and len(ops[5]) == 1 and ops[5] != ops[1]
    plan = exe.plan_for(main.global_block(), frozenset([y.name]))
    assert not plan.straight_line and not plan.meter_records


def _scratch_kernel(k, x):
    """Holds a scratch array on the meter while it runs (as loop kernels do)."""
    scratch = k.xp.zeros((1024,), dtype=x.dtype)
    k.run.meter.hold(scratch)
    k.run.meter.release(scratch)
    return x + 1


@pytest.fixture
def scratch_op():
    """TestMeterScratch registered for one test (registered at import, every other test's table of
    ops, e.g. the ONNX export table's, would see it)."""
    rg.defop("TestMeterScratch", infer=lambda ins, attrs: [(ins[0].shape, ins[0].dtype)])(_scratch_kernel)
    yield
    del OPS["TestMeterScratch"]


def test_a_kernel_holding_values_on_the_meter_keeps_the_plan_metered(backend, monkeypatch, scratch_op):
    if backend.name == "onnxruntime":
        pytest.skip("the onnxruntime engine runs programs its own way")
    main = rg.Program()
    with rg.program_guard(main):
        x = rg.data("x", [8])
        y, = rg.append_op("TestMeterScratch", [x])
    exe = backend.executor()
    holds = _holds(monkeypatch)
    for _ in range(3):
        out, = exe.run(main, feed={"x": np.zeros(8, "float32")}, fetch_list=[y])
        np.testing.assert_array_equal(out, np.ones(8, "float32"))
        assert exe.last_stats.peak_bytes >= 1024 * 4 + 8 * 4
    plan = exe.plan_for(main.global_block(), frozenset([y.name]))
    assert plan.meter_records is None and len(holds) == 3 * 3     # x, the scratch, y per run


def test_the_development_check_catches_a_record_that_differs(monkeypatch):
    monkeypatch.setattr(executor_module, "CHECK_METER_REPLAY", False)
    main, total = _chain_program()
    exe = rg.Executor()
    x = np.ones((4, 8), "float32")
    exe.run(main, feed={"x": x}, fetch_list=[total])
    plan = exe.plan_for(main.global_block(), frozenset([total.name]))
    record, = plan.meter_records.values()
    record.peaks[-1] += 1
    exe.run(main, feed={"x": x}, fetch_list=[total])
    assert exe.last_stats.peak_bytes == record.peaks[-1]          # (the record is what a replay reports)
    monkeypatch.setattr(executor_module, "CHECK_METER_REPLAY", True)
    with pytest.raises(AssertionError, match="replay differs"):
        exe.run(main, feed={"x": x}, fetch_list=[total])


def test_values_written_back_by_a_replayed_run_are_checked_again_once_the_user_replaces_them(backend):
    if backend.name == "onnxruntime":
        pytest.skip("the onnxruntime engine runs programs its own way")
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3])
        loss = rg.mean(rg.layers.fc(x, 2, name="fc"))
        rg.optim.SGD(0.5).minimize(loss)
    exe = backend.executor()
    exe.run(startup)
    feed = {"x": np.ones((4, 3), "float32")}
    for _ in range(3):
        exe.run(main, feed=feed, fetch_list=[loss])
    exe.scope.set("fc.w", np.full((3, 2), 0.25))           # float64: cast to the declared float32
    out, = exe.run(main, feed=feed, fetch_list=[loss])
    bias = backend_numpy(exe, "fc.b")
    # loss = mean(x @ w + b) with x = 1: 3 * 0.25 + mean(b before this step's update)
    np.testing.assert_allclose(out, 0.75 + np.mean(bias + 0.5 * 0.5), rtol=1e-6)
    assert backend_numpy(exe, "fc.w").dtype == np.float32
