"""``Executor(graphs=True)``: runs replayed as CUDA graphs give the eager executor's numbers.

The reference is the NumPy executor running the same program on the same
feeds; the GPU cases are skipped (with the reason) where no CUDA device is.
"""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd.backends import to_numpy


def _cuda_only(backend):
    if backend.name != "torch" or backend.device in (None, "cpu"):
        pytest.skip("device graphs need torch on a CUDA device")


def _lm(dropout: float = 0.0):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        chars = rg.data("chars", [-1, -1], dtype="int64")
        target = rg.data("target", [-1, -1], dtype="int64")
        emb = rg.layers.embedding(chars, 11, 6, name="emb", dtype="float64")
        if dropout:
            emb = rg.dropout(emb, dropout)
        h_all, _, _, _ = rg.layers.lstm(emb, 8, name="lstm")
        logits = rg.layers.fc(h_all, 11, name="head")
        loss = rg.mean(rg.softmax_cross_entropy(logits, target))
        rg.optim.Adam(0.05, clip_norm=1.0).minimize(loss)
    return main, startup, loss


def _batch(step: int, t_len: int = 7, n: int = 3):
    rng = np.random.default_rng(step)
    return {"chars": rng.integers(0, 11, (t_len, n)), "target": rng.integers(0, 11, (t_len, n))}


def _train(exe, main, startup, loss, batches):
    exe.run(startup)
    return [float(exe.run(main, feed=b, fetch_list=[loss])[0]) for b in batches]


def _params(exe, main):
    return {v.name: to_numpy(exe.scope.get(v.name)) for v in main.list_vars() if v.persistable}


def test_graphs_need_torch_on_a_cuda_device(backend):
    if backend.name == "torch" and backend.device not in (None, "cpu"):
        pytest.skip("torch on CUDA has device graphs")
    with pytest.raises(rg.BackendError, match="needs a CUDA device of backend \"torch\""):
        rg.Executor(graphs=True, **backend.kwargs)


def test_replayed_training_matches_the_numpy_executor(backend):
    _cuda_only(backend)
    main, startup, loss = _lm()
    batches = [_batch(i) for i in range(6)] + [_batch(i, t_len=4) for i in range(6, 10)]
    want_exe = rg.Executor()
    want = _train(want_exe, main, startup, loss, batches)
    exe = rg.Executor(backend=backend.name, device=backend.device, graphs=True)
    got = _train(exe, main, startup, loss, batches)
    assert exe.graphs.last_replayed        # the last runs were replays (after 2 warm-ups per shape)
    np.testing.assert_allclose(got, want, rtol=1e-10)
    for name, value in _params(want_exe, main).items():
        np.testing.assert_allclose(_params(exe, main)[name], value, rtol=1e-9, atol=1e-12, err_msg=name)


def test_replacing_a_parameter_is_seen_by_the_next_replay(backend):
    _cuda_only(backend)
    main, startup, loss = _lm()
    exe, want_exe = rg.Executor(backend=backend.name, device=backend.device, graphs=True), rg.Executor()
    _train(exe, main, startup, loss, [_batch(i) for i in range(4)])
    _train(want_exe, main, startup, loss, [_batch(i) for i in range(4)])
    w = np.full((11, 6), 0.1)
    exe.scope.set("emb.w", w)
    want_exe.scope.set("emb.w", w)
    for i in range(4, 8):
        got, = exe.run(main, feed=_batch(i), fetch_list=[loss])
        want, = want_exe.run(main, feed=_batch(i), fetch_list=[loss])
        np.testing.assert_allclose(got, want, rtol=1e-10)
    assert exe.graphs.last_replayed


def test_fetched_arrays_are_not_overwritten_by_the_next_replay(backend):
    _cuda_only(backend)
    main, startup, loss = _lm()
    exe = rg.Executor(backend=backend.name, device=backend.device, graphs=True)
    exe.run(startup)
    kept = [exe.run(main, feed=_batch(i), fetch_list=[loss], return_numpy=False)[0] for i in range(5)]
    values = [float(to_numpy(v)) for v in kept]
    assert len(set(values)) == 5 and exe.graphs.last_replayed


def test_random_ops_and_host_control_flow_stay_eager_and_correct(backend):
    _cuda_only(backend)
    main, startup, loss = _lm(dropout=0.3)
    batches = [_batch(i) for i in range(5)]
    want = _train(rg.Executor(), main, startup, loss, batches)
    exe = rg.Executor(backend=backend.name, device=backend.device, graphs=True)
    np.testing.assert_allclose(_train(exe, main, startup, loss, batches), want, rtol=1e-10)
    assert not exe.graphs.last_replayed          # dropout draws new masks every run

    loop = rg.Program()
    with rg.program_guard(loop, rg.Program()):
        x = rg.data("x", [3], dtype="float64")
        n = rg.data("n", [], dtype="int64")
        i0 = rg.constant(0, dtype="int64")
        _, y = rg.while_loop(lambda i, v: i < n, lambda i, v: (i + 1, v * 1.5), [i0, x])
    exe = rg.Executor(backend=backend.name, device=backend.device, graphs=True)
    for trips in (1, 2, 3, 4, 5):
        got, = exe.run(loop, feed={"x": np.ones(3), "n": np.array(trips)}, fetch_list=[y])
        np.testing.assert_allclose(got, np.full(3, 1.5 ** trips))
    assert not exe.graphs.last_replayed          # the condition is read on the host


def test_an_id_out_of_range_in_a_replay_is_the_eager_error(backend):
    _cuda_only(backend)
    main, startup, loss = _lm()
    exe = rg.Executor(backend=backend.name, device=backend.device, graphs=True)
    _train(exe, main, startup, loss, [_batch(i) for i in range(4)])
    assert exe.graphs.last_replayed
    bad = _batch(5)
    bad["chars"][2, 1] = 11                     # the embedding has 11 rows
    before = _params(exe, main)
    with pytest.raises(rg.ExecutionError, match=r"Gather .*id 11 is out of range \[-11, 11\)"):
        exe.run(main, feed=bad, fetch_list=[loss])
    for name, value in _params(exe, main).items():       # the failed run changed nothing
        np.testing.assert_array_equal(value, before[name], err_msg=name)
    reference = rg.Executor()
    reference.run(startup)
    with pytest.raises(rg.ExecutionError, match=r"Gather .*id 11 is out of range \[-11, 11\)"):
        reference.run(main, feed=bad, fetch_list=[loss])     # the NumPy executor says the same


def test_causal_attention_with_a_clip_replays_as_a_graph_regression_host_scalar_copy(backend):
    """The general attention kernel made its ``-inf`` fill (and Clip its bounds) with ``asarray`` of a
    Python number: a host-to-device copy, which a CUDA graph capture refuses; now a device fill."""
    _cuda_only(backend)
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [2, 2, 5, 4], dtype="float64", stop_gradient=False)
        out = rg.scaled_dot_product_attention(x, rg.clip(x, -0.5, 0.5), x, causal=True)
        loss = rg.sum(out * out)
        grad, = rg.gradients(loss, [x])
    feed = {"x": np.random.default_rng(3).standard_normal((2, 2, 5, 4))}
    want = rg.Executor().run(main, feed=feed, fetch_list=[loss, grad])
    exe = rg.Executor(graphs=True, **backend.kwargs)
    exe.run(startup)
    for _ in range(4):            # two warm-up runs, the capture, a replay
        got = exe.run(main, feed=feed, fetch_list=[loss, grad])
        for a, b in zip(got, want):
            np.testing.assert_allclose(to_numpy(a), b, rtol=1e-10, atol=1e-12)
    assert exe.graphs.last_replayed


# --- graphs="auto" ----------------------------------------------------------------------------------

def test_auto_graphs_without_a_cuda_device_run_eagerly(backend):
    if backend.name == "torch" and backend.device not in (None, "cpu"):
        pytest.skip("torch on CUDA captures graphs")
    if backend.name == "onnxruntime":
        pytest.skip("the engine runs programs its own way")
    main, startup, loss = _lm()
    batches = [_batch(i) for i in range(4)]
    exe = rg.Executor(graphs="auto", **backend.kwargs)
    assert exe.graphs is None                   # no device graphs here: every run eager, no error
    want = _train(backend.executor(), main, startup, loss, batches)
    np.testing.assert_allclose(_train(exe, main, startup, loss, batches), want, rtol=1e-12)


def test_graphs_takes_true_false_or_auto():
    with pytest.raises(rg.BackendError, match='takes True, False or "auto"'):
        rg.Executor(graphs="always")


class _StandInGraph:
    """What a capture leaves: a graph whose replays are counted (the decision logic is tested on a
    CPU; the replayed numbers are tested on CUDA above)."""

    def __init__(self):
        self.replays = 0

    def replay(self):
        self.replays += 1


def _decisions(auto: bool, shapes: list[int], max_graphs: int = 2) -> list[str]:
    """'eager', 'capture' or 'replay' for runs of a stand-in plan fed ``x`` of each length."""
    from types import SimpleNamespace
    import torch
    from retrograd.runtime.graphs import GraphRunner

    runner = GraphRunner(rg.Executor(backend="torch").backend, auto=auto, max_graphs=max_graphs)
    captured = []

    def capture(entry, executor, run, plan, env, fed):
        entry.graph, entry.inputs, entry.outputs = _StandInGraph(), {n: env[n].clone() for n in env}, {}
        captured.append(True)
        return True

    runner._capture = capture
    plan = SimpleNamespace(block=SimpleNamespace(ops=[]))
    run = SimpleNamespace(meter=SimpleNamespace(peak=0), ops_run=0)
    said = []
    for n in shapes:
        before = len(captured)
        values = runner.run(None, run, plan, {"x": torch.zeros(n)}, frozenset({"x"}), None, [])
        said.append("eager" if values is None else "capture" if len(captured) > before else "replay")
    return said


def test_auto_captures_a_signature_once_it_repeats():
    assert _decisions(True, [3, 3, 3, 3, 4, 3]) == ["eager", "eager", "capture", "replay", "eager", "replay"]


def test_auto_stops_capturing_new_signatures_past_max_graphs():
    shapes = [3, 3, 3, 4, 4, 4, 5, 5, 5, 5, 3]
    assert _decisions(True, shapes) == ["eager", "eager", "capture", "eager", "eager", "capture",
                                        "eager", "eager", "eager", "eager", "replay"]
    assert _decisions(False, shapes)[8] == "capture"          # graphs=True captures every signature
