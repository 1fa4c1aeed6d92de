"""``Program.clone(for_test=True)``: the forward-only evaluation form of a training program."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg

pytestmark = pytest.mark.engine

UPDATE_TYPES = {"AdamUpdate", "FusedAdamUpdate", "SGDUpdate", "MomentumUpdate", "Increment", "AllReduce"}


def _classifier(clip_norm=None, data_parallel=False):
    """fc -> tanh -> dropout(0.5) -> fc, softmax cross-entropy, Adam."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 8])
        y = rg.data("y", [-1], dtype="int64")
        h = rg.dropout(rg.layers.fc(x, 16, act="tanh", name="fc1"), 0.5)
        logits = rg.layers.fc(h, 3, name="fc2")
        loss = rg.mean(rg.softmax_cross_entropy(logits, y))
        opt = rg.optim.Adam(1e-2, clip_norm=clip_norm)
        (rg.distributed.DataParallel(opt) if data_parallel else opt).minimize(loss)
    return main, startup, logits, loss


def _batch():
    rng = np.random.default_rng(0)
    return {"x": rng.standard_normal((5, 8)).astype(np.float32), "y": np.array([0, 1, 2, 0, 1])}


def _eval_reference(scope_get, x):
    """The classifier in NumPy with dropout off."""
    h = np.tanh(x @ scope_get("fc1.w") + scope_get("fc1.b"))
    return h @ scope_get("fc2.w") + scope_get("fc2.b")


def _persistables(exe, program) -> dict:
    return {v.name: _numpy(exe.scope.get(v.name)) for v in program.list_vars() if v.persistable}


def _numpy(value):
    return rg.backends.to_numpy(value).copy()   # torch (CPU/CUDA) and CuPy arrays alike


def test_the_test_program_has_no_gradient_or_update_ops():
    main, _, _, _ = _classifier(clip_norm=1.0, data_parallel=True)
    test = main.clone(for_test=True)
    types = [op.type for op in test.global_block().ops]
    assert types == ["MatMul", "Add", "Tanh", "Dropout", "MatMul", "Add", "SoftmaxCrossEntropy", "Mean"]
    assert not UPDATE_TYPES & set(types)
    assert test.global_block().ops[3].attrs["is_test"] is True
    assert "is_test" not in main.global_block().ops[3].attrs          # the training program is untouched
    assert "fc1.w.grad" not in test.global_block().vars


def test_the_test_program_evaluates_without_changing_anything(backend):
    main, startup, logits, loss = _classifier()
    test = main.clone(for_test=True)
    exe = backend.executor()
    exe.run(startup)
    before = _persistables(exe, main)
    feed = _batch()
    logits_v, loss_v = exe.run(test, feed=feed, fetch_list=[logits, loss])   # the training program's Vars
    again, = exe.run(test, feed=feed, fetch_list=[logits])
    expected = _eval_reference(lambda n: before[n], feed["x"])
    np.testing.assert_allclose(logits_v, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(again, logits_v, rtol=0, atol=0)             # dropout is the identity
    shifted = expected - expected.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(loss_v, -log_probs[np.arange(5), feed["y"]].mean(), rtol=1e-5)
    after = _persistables(exe, main)
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)


def test_running_the_training_program_for_an_output_runs_the_step(backend):
    """What the README says: fetching the loss from the training program updates the parameters."""
    main, startup, _, loss = _classifier()
    exe = backend.executor()
    exe.run(startup)
    w0 = _numpy(exe.scope.get("fc1.w"))
    exe.run(main, feed=_batch(), fetch_list=[loss])
    assert np.abs(_numpy(exe.scope.get("fc1.w")) - w0).max() > 0


def test_a_training_program_keeps_training_after_its_test_clone_ran():
    main, startup, _, loss = _classifier()
    test = main.clone(for_test=True)
    exe = rg.Executor()
    exe.run(startup)
    feed = _batch()
    first, = exe.run(test, feed=feed, fetch_list=[loss])
    for _ in range(30):
        exe.run(main, feed=feed, fetch_list=[loss])
    later, = exe.run(test, feed=feed, fetch_list=[loss])
    assert later < first


def test_a_forward_value_nothing_reads_stays_fetchable():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 4])
        h = rg.layers.fc(x, 3, name="fc")
        doubled = h * 2.0                                    # read by nothing: a metric
        loss = rg.mean(h * h)
        rg.optim.SGD(0.1).minimize(loss)
    test = main.clone(for_test=True)
    exe = rg.Executor()
    exe.run(startup)
    xb = np.ones((2, 4), np.float32)
    h_v, d_v = exe.run(test, feed={"x": xb}, fetch_list=[h, doubled])
    np.testing.assert_allclose(d_v, 2 * h_v)


def test_a_program_without_training_ops_clones_unchanged_but_for_is_test():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 4])
        y = rg.dropout(rg.tanh(x), 0.3)
    test = main.clone(for_test=True)
    assert [op.type for op in test.global_block().ops] == ["Tanh", "Dropout"]
    out, = rg.Executor().run(test, feed={"x": np.ones((2, 4), np.float32)}, fetch_list=[y])
    np.testing.assert_allclose(out, np.tanh(np.ones((2, 4))), rtol=1e-6)


def _dropout_batch_norm_adam():
    """fc -> batch_norm -> relu -> dropout(0.3) -> fc, Adam: what evaluation must switch off."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 8])
        y = rg.data("y", [-1], dtype="int64")
        h = rg.layers.batch_norm(rg.layers.fc(x, 6, name="fc1"), name="bn")
        logits = rg.layers.fc(rg.dropout(rg.relu(h), 0.3), 3, name="fc2")
        loss = rg.mean(rg.softmax_cross_entropy(logits, y))
        rg.optim.Adam(1e-2).minimize(loss)
    return main, startup, logits, loss


def test_batch_norm_and_dropout_evaluate_in_the_test_program(backend):
    main, startup, logits, loss = _dropout_batch_norm_adam()
    test = main.clone(for_test=True)
    assert [op.type for op in test.global_block().ops].count("BatchNormStats") == 0
    exe = backend.executor()
    exe.run(startup)
    rng = np.random.default_rng(1)
    for _ in range(3):           # training moves the parameters and the running statistics
        exe.run(main, feed={"x": rng.standard_normal((16, 8)).astype(np.float32) * 3 + 1,
                            "y": rng.integers(0, 3, 16)}, fetch_list=[loss])
    before = _persistables(exe, main)
    assert np.abs(before["bn.mean"]).max() > 0.01 and np.abs(before["bn.var"] - 1).max() > 0.01
    feed = {"x": rng.standard_normal((5, 8)).astype(np.float32), "y": np.array([0, 1, 2, 0, 1])}
    logits_v, = exe.run(test, feed=feed, fetch_list=[logits])
    p = before
    h = feed["x"] @ p["fc1.w"] + p["fc1.b"]
    h = (h - p["bn.mean"]) / np.sqrt(p["bn.var"] + 1e-5) * p["bn.w"] + p["bn.b"]
    expected = np.maximum(h, 0) @ p["fc2.w"] + p["fc2.b"]
    np.testing.assert_allclose(logits_v, expected, rtol=1e-5, atol=1e-5)
    exe.run(test, feed=feed, fetch_list=[loss])
    after = _persistables(exe, main)
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)


def test_the_docs_evaluation_example_runs_as_written():
    import contextlib
    import io
    import pathlib
    page = (pathlib.Path(__file__).parents[2] / "docs" / "how-to" / "clone-eval.md").read_text()
    example = page.split("```python\n", 1)[1].split("```", 1)[0]
    names: dict = {"__name__": "docs"}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(example, "docs/how-to/clone-eval.md", "exec"), names)
    assert names["logits_v"].shape == (8, 10) and np.isfinite(names["loss_v"])
    np.testing.assert_array_equal(names["exe"].scope.get("fc1.w"), names["before"])


def test_a_clone_made_before_minimize_evaluates_the_same():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 4])
        h = rg.dropout(rg.layers.batch_norm(rg.layers.fc(x, 3, name="fc"), name="bn"), 0.5)
        loss = rg.mean(h * h)
        early = main.clone(for_test=True)
        rg.optim.SGD(0.1).minimize(loss)
    late = main.clone(for_test=True)
    assert [op.type for op in early.global_block().ops] == [op.type for op in late.global_block().ops]
    exe = rg.Executor()
    exe.run(startup)
    exe.run(main, feed={"x": np.arange(8, dtype=np.float32).reshape(2, 4)}, fetch_list=[loss])
    feed = {"x": np.ones((3, 4), np.float32)}
    np.testing.assert_array_equal(exe.run(early, feed=feed, fetch_list=[h])[0],
                                  exe.run(late, feed=feed, fetch_list=[h])[0])
