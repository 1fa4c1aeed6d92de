"""``rg.onnx.export``: naming of inputs and outputs, initializers, training steps, opset, errors."""
from __future__ import annotations

import builtins

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import retrograd as rg
from retrograd.onnx.model import DEFAULT_OPSET, build_model


def _classifier(optimizer=None):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 8])
        labels = rg.data("labels", [-1], dtype="int64")
        h = rg.layers.fc(x, 16, act="tanh", name="fc1")
        logits = rg.layers.fc(h, 5, name="fc2")
        loss = rg.mean(rg.softmax_cross_entropy(logits, labels))
        if optimizer is not None:
            optimizer.minimize(loss)
    return main, startup, logits, loss


def test_readme_inference_example(tmp_path):
    main, startup, logits, _ = _classifier()
    exe = rg.Executor()
    exe.run(startup)
    model = rg.onnx.export(main, tmp_path / "model.onnx", fetch_list=[logits], scope=exe.scope)
    assert isinstance(model, onnx.ModelProto)
    onnx.checker.check_model(onnx.load(tmp_path / "model.onnx"), full_check=True)
    sess = ort.InferenceSession(str(tmp_path / "model.onnx"))
    assert [i.name for i in sess.get_inputs()] == ["x"]           # parameters are initializers
    assert {t.name for t in model.graph.initializer} == {"fc1.w", "fc1.b", "fc2.w", "fc2.b"}
    xb = np.random.default_rng(0).standard_normal((3, 8)).astype("float32")
    logits_v, = sess.run([logits.name], {"x": xb})
    want, = exe.run(main, feed={"x": xb}, fetch_list=[logits])
    np.testing.assert_allclose(logits_v, want, rtol=1e-5, atol=1e-5)


def test_adam_training_step_runs_three_steps_in_onnxruntime_like_numpy():
    main, startup, _, loss = _classifier(rg.optim.Adam(0.05, clip_norm=1.0, weight_decay=0.01))
    exe = rg.Executor()
    exe.run(startup)
    persistables = sorted(v.name for v in main.list_vars() if v.persistable)
    state = {n: np.asarray(exe.scope.get(n)) for n in persistables}
    model = rg.onnx.export(main, None, [loss])                    # no scope: state is fed
    assert {i.name for i in model.graph.input} == {"x", "labels", *persistables}
    assert {o.name for o in model.graph.output} == {loss.name, *(n + ".new" for n in persistables)}
    sess = ort.InferenceSession(model.SerializeToString())
    r = np.random.default_rng(3)
    for step in range(3):
        feed = {"x": r.standard_normal((6, 8)).astype("float32"), "labels": r.integers(0, 5, 6)}
        got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {**feed, **state})))
        want, = exe.run(main, feed=feed, fetch_list=[loss])
        np.testing.assert_allclose(got[loss.name], want, rtol=1e-5, atol=1e-6)
        state = {n: got[n + ".new"] for n in persistables}
        for n in persistables:
            np.testing.assert_allclose(state[n], np.asarray(exe.scope.get(n)), rtol=1e-5, atol=1e-6,
                                       err_msg=f"{n} after step {step + 1}")
    assert int(state["fc1.w.step"][0]) == 3


def test_fetching_a_feed_and_an_unwritten_parameter():
    main, startup, logits, _ = _classifier()
    exe = rg.Executor()
    exe.run(startup)
    model = rg.onnx.export(main, None, ["x", "fc1.w", logits], scope=exe.scope)
    sess = ort.InferenceSession(model.SerializeToString())
    xb = np.ones((2, 8), "float32")
    x_v, w_v, _ = sess.run(["x", "fc1.w", logits.name], {"x": xb})
    np.testing.assert_array_equal(x_v, xb)
    np.testing.assert_array_equal(w_v, exe.scope.get("fc1.w"))


def test_default_opset_is_the_newest_onnxruntime_accepts():
    main, startup, logits, _ = _classifier()
    exe = rg.Executor()
    exe.run(startup)
    model = rg.onnx.export(main, None, [logits], scope=exe.scope)
    assert model.opset_import[0].version == DEFAULT_OPSET
    ort.InferenceSession(model.SerializeToString())
    newer = onnx.ModelProto()
    newer.CopyFrom(model)
    newer.opset_import[0].version = DEFAULT_OPSET + 1
    with pytest.raises(Exception, match="opset|Opset"):
        ort.InferenceSession(newer.SerializeToString())
    older = rg.onnx.export(main, None, [logits], scope=exe.scope, opset=21)
    assert older.opset_import[0].version == 21


def test_engine_entry_makes_parameters_inputs_and_names_written_state():
    main, startup, _, loss = _classifier(rg.optim.SGD(0.1))
    built = build_model(main, [loss.name], param_inputs=True)
    assert built.param_inputs == ["fc1.w", "fc1.b", "fc2.w", "fc2.b"]
    assert built.inputs == ["x", "labels"] + built.param_inputs
    assert built.written == {n: n + ".new" for n in built.param_inputs}
    assert built.outputs == {loss.name: loss.name}


def test_missing_scope_value_and_bad_fetch_are_clear_errors():
    main, startup, logits, _ = _classifier()
    with pytest.raises(rg.FeedError, match="fc1.w.*startup"):
        rg.onnx.export(main, None, [logits], scope=rg.Scope())
    with pytest.raises(rg.ProgramError, match="nope"):
        rg.onnx.export(main, None, ["nope"])


def test_export_without_onnx_names_the_extra(monkeypatch):
    real_import = builtins.__import__

    def no_onnx(name, *args, **kwargs):
        if name == "onnx" or name.startswith("onnx."):
            raise ImportError("No module named 'onnx'")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_onnx)
    main, _, logits, _ = _classifier()
    with pytest.raises(rg.BackendError, match=r'pip install "retrograd\[onnx\]"'):
        rg.onnx.export(main, None, [logits])


def test_rg_onnx_imports_without_onnx_installed():
    import subprocess
    import sys
    code = ("import sys; sys.modules['onnx'] = None; sys.modules['onnxruntime'] = None\n"
            "import retrograd as rg\n"
            "try:\n    rg.onnx.export(rg.Program(), None, [])\n"
            "except rg.BackendError as exc:\n    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert 'pip install "retrograd[onnx]"' in out.stdout


def test_initialisers_draw_the_backends_numbers_bit_for_bit():
    """The startup program (uniform and normal draws) exported: the keyed generator in ONNX ops."""
    main, startup = rg.Program(random_seed=3), rg.Program(random_seed=3)
    with rg.program_guard(main, startup):
        names = []
        for dtype in ("float32", "float64"):
            for init in (("normal", 0.5, 2.0), ("uniform", -0.3, 0.7), "xavier"):
                names.append(rg.create_parameter(f"p{len(names)}", [40, 30], dtype=dtype, init=init).name)
    model = rg.onnx.export(startup, None, names)
    got = ort.InferenceSession(model.SerializeToString()).run(names, {})
    want = rg.Executor().run(startup, fetch_list=names)
    for name, g, w in zip(names, got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w), name


def test_normal_draws_inside_a_loop_change_per_iteration_like_the_executor():
    from retrograd.ops.core.registry import append_op
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        n = rg.data("n", [], dtype="int64")

        def body(i, acc):
            r, = append_op("GaussianRandom", [], {"shape": [5], "dtype": "float64", "mean": 0.0, "std": 1.0,
                                                  "seed": 3})
            return i + 1, acc * 2.0 + r
        _, acc = rg.while_loop(lambda i, a: i < n, body, [rg.constant(0), rg.fill([5], 0.0, "float64")])
    sess = ort.InferenceSession(rg.onnx.export(main, None, [acc]).SerializeToString())
    exe = rg.Executor()
    for trips in (0, 1, 4):
        got, = sess.run(None, {"n": np.array(trips)})
        want, = exe.run(main, feed={"n": np.array(trips)}, fetch_list=[acc])
        assert np.array_equal(got, want)


@pytest.mark.parametrize("d_in, d_out", [(3, 8), (8, 3)])
def test_seq_linear_bias_is_the_products_last_term_when_the_input_is_narrower(d_in, d_out):
    """[x, 1] @ [w; b] (no Add pass over the output) only where x is narrower than the output;
    either way onnxruntime gives x @ w + b as NumPy computes it."""
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, -1, d_in], "float32")
        w = rg.data("w", [d_in, d_out], "float32")
        b = rg.data("b", [d_out], "float32")
        y = rg.seq_linear(x, w, b)
    model = build_model(main, [y.name], feed_names=["x", "w", "b"]).model
    types = [n.op_type for n in model.graph.node]
    assert ("Add" not in types) == (d_in < d_out)
    r = np.random.default_rng(3)
    feed = {"x": r.standard_normal((4, 5, d_in)).astype(np.float32),
            "w": r.standard_normal((d_in, d_out)).astype(np.float32),
            "b": r.standard_normal(d_out).astype(np.float32)}
    got, = ort.InferenceSession(model.SerializeToString()).run(None, feed)
    np.testing.assert_allclose(got, feed["x"] @ feed["w"] + feed["b"], rtol=1e-5, atol=1e-6)
