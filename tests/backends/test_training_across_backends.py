"""One program trains the same on every backend: losses, parameters, dropout masks, files.

The NumPy executor is the reference: the other backend must give the same
losses and parameters after several steps (float32: 1e-5 relative, float64:
1e-10), bit-identical dropout masks and initial parameters (keyed draws), and
parameter files that load on either backend and continue training the same.
"""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd.backends import to_numpy

TOL = {"float32": dict(rtol=1e-5, atol=1e-6), "float64": dict(rtol=1e-10, atol=1e-12)}


def _mlp(dtype: str, checkpoints: bool = False):
    main, startup = rg.Program(random_seed=4), rg.Program(random_seed=4)
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 6], dtype)
        labels = rg.data("labels", [-1], "int64")
        h = rg.layers.fc(x, 16, act="tanh", name="fc1")
        d = rg.dropout(h, 0.4)
        w = rg.create_parameter("head.w", [16, 3], dtype, init=("normal", 0.0, 0.3))
        logits = rg.matmul(d, w)
        loss = rg.mean(rg.softmax_cross_entropy(logits, labels))
        rg.optim.Adam(0.05).minimize(loss, checkpoints=[h] if checkpoints else None)
    mask = next(op for op in main.global_block().ops if op.type == "Dropout").outputs[1]
    return main, startup, loss, mask


def _batches(dtype: str, steps: int):
    rng = np.random.default_rng(11)
    return [{"x": rng.standard_normal((8, 6)).astype(dtype), "labels": rng.integers(0, 3, 8)}
            for _ in range(steps)]


def _train(exe, main, loss, mask, batches):
    losses, masks = [], []
    for feed in batches:
        loss_v, mask_v = exe.run(main, feed=feed, fetch_list=[loss, mask])
        losses.append(float(loss_v))
        masks.append(mask_v)
    return np.array(losses), masks


def _params(exe, program) -> dict:
    return {v.name: to_numpy(exe.scope.get(v.name)) for v in program.all_parameters()}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_training_gives_the_same_losses_parameters_and_masks(backend, dtype):
    main, startup, loss, mask = _mlp(dtype)
    runs = []
    for exe in (rg.Executor(), backend.executor()):
        exe.run(startup)
        initial = _params(exe, main)
        losses, masks = _train(exe, main, loss, mask, _batches(dtype, 6))
        runs.append((initial, losses, masks, _params(exe, main)))
    (init_a, loss_a, mask_a, end_a), (init_b, loss_b, mask_b, end_b) = runs
    for name in init_a:                         # keyed initialisers: bit for bit
        np.testing.assert_array_equal(init_b[name], init_a[name], err_msg=name)
    for a, b in zip(mask_a, mask_b):            # keyed dropout masks: bit for bit
        np.testing.assert_array_equal(b, a)
    assert len({m.tobytes() for m in mask_a}) == len(mask_a)    # a new mask every run
    np.testing.assert_allclose(loss_b, loss_a, **TOL[dtype])
    assert loss_a[-1] < loss_a[0]
    for name in end_a:
        assert end_b[name].dtype == np.dtype(dtype)
        np.testing.assert_allclose(end_b[name], end_a[name], **TOL[dtype], err_msg=name)


def test_recomputed_dropout_replays_the_mask_on_every_backend(backend):
    """Checkpointing recomputes the dropout in the backward: gradients stay those of store-all."""
    plain, ckpt = _mlp("float64"), _mlp("float64", checkpoints=True)
    batches = _batches("float64", 3)
    results = []
    for main, startup, loss, mask in (plain, ckpt):
        exe = backend.executor()
        exe.run(startup)
        results.append((_train(exe, main, loss, mask, batches)[0], _params(exe, main)))
    np.testing.assert_array_equal(results[1][0], results[0][0])
    for name in results[0][1]:
        np.testing.assert_allclose(results[1][1][name], results[0][1][name], rtol=1e-13, atol=1e-15,
                                   err_msg=name)


def _lstm_lm(dtype: str):
    main, startup = rg.Program(random_seed=8), rg.Program(random_seed=8)
    with rg.program_guard(main, startup):
        ids = rg.data("ids", [-1, -1], "int64")
        targets = rg.data("targets", [-1, -1], "int64")
        emb = rg.layers.embedding(ids, 11, 8, name="emb")
        if dtype == "float64":
            emb = rg.cast(emb, "float64")
        h_all, _, _, _ = rg.layers.lstm(emb, 12, name="lstm")
        logits = rg.layers.fc(h_all, 11, name="out")
        loss = rg.mean(rg.softmax_cross_entropy(rg.reshape(logits, [-1, 11]), rg.reshape(targets, [-1])))
        rg.optim.SGD(0.5).minimize(loss)
    return main, startup, loss


def _text(steps: int):
    rng = np.random.default_rng(3)
    seqs = rng.integers(0, 11, (steps, 7, 4))
    return [{"ids": s[:-1], "targets": s[1:]} for s in seqs]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_lstm_language_model_trains_the_same(backend, dtype):
    main, startup, loss = _lstm_lm(dtype)
    runs = []
    for exe in (rg.Executor(), backend.executor()):
        exe.run(startup)
        losses = [float(exe.run(main, feed=feed, fetch_list=[loss])[0]) for feed in _text(4)]
        runs.append((np.array(losses), _params(exe, main)))
    np.testing.assert_allclose(runs[1][0], runs[0][0], **TOL[dtype])
    assert runs[0][0][-1] < runs[0][0][0]
    for name, value in runs[0][1].items():
        np.testing.assert_allclose(runs[1][1][name], value, **TOL[dtype], err_msg=name)


def test_a_file_saved_on_one_backend_loads_on_the_other(backend, tmp_path):
    main, startup, loss, mask = _mlp("float32")
    batches = _batches("float32", 4)
    trained = backend.executor()
    trained.run(startup)
    _train(trained, main, loss, mask, batches[:2])
    path = rg.save_params(trained.scope, tmp_path / "m.npz", main)
    on_numpy = rg.Executor()
    on_numpy.run(startup)
    rg.load_params(on_numpy.scope, path, main)
    for name, value in _params(trained, main).items():
        np.testing.assert_array_equal(to_numpy(on_numpy.scope.get(name)), value, err_msg=name)
    path_back = rg.save_params(on_numpy.scope, tmp_path / "back.npz", main)
    again = backend.executor()
    again.run(startup)
    rg.load_params(again.scope, path_back, main)
    assert again.backend.owns(again.scope.get("fc1.w"))
    # the run ids differ (a fresh executor): compare the two backends from the same state instead
    resumed = [_train(exe, main, loss, mask, batches[2:])[0] for exe in (on_numpy, again)]
    np.testing.assert_allclose(resumed[1], resumed[0], **TOL["float32"])


def _budgeted_loops():
    """A while loop and an LSTM, each under a memory budget, with dropout inside the loop."""
    main, startup = rg.Program(random_seed=6), rg.Program(random_seed=6)
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 6], "float64", stop_gradient=False)
        seq = rg.data("seq", [-1, -1, 6], "float64")
        n = rg.data("n", [], "int64")
        w = rg.create_parameter("w", [6, 6], "float64")
        _, h = rg.while_loop(lambda i, h: i < n,
                             lambda i, h: (i + 1, rg.dropout(rg.tanh(h @ w), 0.2) + x * 0.1),
                             [rg.constant(0), x], recompute=3000)
        h_all, _, _, _ = rg.layers.lstm(seq, 6, name="lstm", recompute=4000)
        loss = rg.mean(h * h) + rg.mean(h_all * h_all)
        grads = [g for _, g in rg.append_backward(loss)]
    return main, startup, [loss] + grads


def test_loops_under_a_memory_budget_match_across_backends(backend):
    main, startup, fetch = _budgeted_loops()
    ops = {op.type for block in main.blocks for op in block.ops}
    assert {"WhileBudgetGrad", "RecurrentNetworkBudgetGrad"} <= ops
    rng = np.random.default_rng(2)
    feed = {"x": rng.standard_normal((4, 6)), "seq": rng.standard_normal((12, 4, 6)), "n": np.array(9)}
    results = []
    for exe in (rg.Executor(), backend.executor()):
        exe.run(startup)
        results.append((exe.run(main, feed=feed, fetch_list=fetch), exe.last_stats.peak_bytes))
    (want, peak_want), (got, peak_got) = results
    for var, a, b in zip(fetch, want, got):
        np.testing.assert_allclose(b, a, **TOL["float64"], err_msg=var.name)
    assert peak_got == peak_want


def test_fused_adam_shape_and_broadcast_run_on_every_backend(backend):
    """Ops that the op tables do not reach: the fused optimizer update (passes), Shape, Broadcast."""
    from retrograd.ops.core.registry import append_op
    from retrograd.passes.fuse_updates import fuse_optimizer_updates
    main, startup = rg.Program(random_seed=3), rg.Program(random_seed=3)
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 4])
        h = rg.layers.fc(rg.layers.fc(x, 5, act="tanh", name="a"), 3, name="b")
        loss = rg.mean(h * h)
        rg.optim.Adam(0.1).minimize(loss)
        shape = append_op("Shape", [x], {})[0]
        rg.distributed.broadcast([main.global_block().var("a.w")])
    assert fuse_optimizer_updates(main) > 0
    assert {"FusedAdamUpdate", "Shape", "Broadcast"} <= {op.type for op in main.global_block().ops}
    xb = np.random.default_rng(0).standard_normal((6, 4)).astype("float32")
    runs = []
    for exe in (rg.Executor(), backend.executor()):
        exe.run(startup)
        runs.append([exe.run(main, feed={"x": xb}, fetch_list=[loss, shape]) for _ in range(3)])
    for (loss_a, shape_a), (loss_b, shape_b) in zip(*runs):
        np.testing.assert_array_equal(shape_b, [6, 4])
        np.testing.assert_allclose(loss_b, loss_a, **TOL["float32"])
