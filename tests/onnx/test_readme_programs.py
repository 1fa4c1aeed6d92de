"""The README's programs, exported to ONNX with their gradients, give the NumPy executor's values."""
from __future__ import annotations

import numpy as np

import retrograd as rg


def test_quickstart_with_gradients(ort_check):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 8])
        y = rg.data("y", [-1, 1])
        w = rg.create_parameter("fc.w", [8, 1])
        b = rg.create_parameter("fc.b", [1])
        pred = rg.tanh(rg.matmul(x, w) + b)
        loss = rg.mean(rg.square(pred - y))
        params_grads = rg.append_backward(loss)
    exe = rg.Executor()
    exe.run(startup)
    r = np.random.default_rng(0)
    for batch in (32, 1):
        feed = {"x": r.random((batch, 8)).astype("float32"), "y": r.random((batch, 1)).astype("float32")}
        ort_check(main, exe, feed, [loss] + [g for _, g in params_grads])


def test_checkpointed_deep_network(ort_check):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 16])
        h = x
        for i in range(6):
            h = rg.layers.fc(h, 16, act="tanh", name=f"fc{i}")
        loss = rg.mean(h * h)
        params_grads = rg.append_backward(loss, checkpoints="auto")
    exe = rg.Executor()
    exe.run(startup)
    feed = {"x": np.random.default_rng(1).random((8, 16)).astype("float32")}
    ort_check(main, exe, feed, [loss] + [g for _, g in params_grads])


def test_control_flow_example_at_several_trip_counts(ort_check):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [4], dtype="float64")
        n = rg.data("n", [], dtype="int64")
        w = rg.create_parameter("w", [4, 4], dtype="float64")

        def step(i, h):
            h = rg.reshape(rg.tanh(rg.reshape(h, [1, 4]) @ w), [4])
            return i + 1, rg.cond(rg.sum(h) > 0.0, lambda: h * 2.0, lambda: -h)

        i, h = rg.while_loop(lambda i, h: i < n, step, [rg.constant(0), x], max_iters=1000)
        loss = rg.sum(h * h)
        dw, = rg.gradients(loss, [w])
        ddw, = rg.gradients(rg.sum(dw * dw), [w])
    exe = rg.Executor()
    exe.run(startup)
    for steps in (0, 3, 7):
        ort_check(main, exe, {"x": np.ones(4), "n": np.array(steps)}, [loss, dw, ddw, i])


def test_recurrent_example_with_lengths(ort_check):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, 8])
        lengths = rg.data("lengths", [-1], dtype="int64")
        h0 = rg.data("h0", [-1, 16])
        w = rg.create_parameter("rnn.w", [8, 16])
        u = rg.create_parameter("rnn.u", [16, 16])
        (h_all,), (h_last,) = rg.recurrent(lambda xs, hs: [rg.tanh(xs[0] @ w + hs[0] @ u)], [x], [h0],
                                           seq_lengths=lengths)
        loss = rg.mean(h_last * h_last)
        params_grads = rg.append_backward(loss)
    exe = rg.Executor()
    exe.run(startup)
    feed = {"x": np.random.default_rng(2).random((20, 4, 8)).astype("float32"),
            "lengths": np.array([20, 7, 1, 12]), "h0": np.zeros((4, 16), "float32")}
    ort_check(main, exe, feed, [loss, h_all] + [g for _, g in params_grads])


def _onnx_section_code() -> list[str]:
    import pathlib
    import re
    text = (pathlib.Path(__file__).parents[2] / "README.md").read_text()
    section = text[text.index("## ONNX export"):]
    section = section[:section.index("\n## ", 3)]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_readme_onnx_section_runs(tmp_path, monkeypatch, capsys):
    """The README's ONNX examples as written: the export/training one, then sampling text with
    onnxruntime alone from a model `retrograd export` wrote."""
    from retrograd.models.charlm import ModelConfig, build_training
    from retrograd.cli.main import main as cli_main
    monkeypatch.chdir(tmp_path)
    export_example, sampling_example, generator_example = _onnx_section_code()
    exec(compile(export_example, "README.md", "exec"), {})
    losses = [float(line) for line in capsys.readouterr().out.split()]
    assert len(losses) == 3 and losses[2] < losses[0]
    t = build_training(ModelConfig(hidden=8, embed=4), seq_len=4, optimizer="adam", lr=1e-3, clip_norm=None,
                       seed=0)
    exe = rg.Executor()
    exe.run(t.startup)
    rg.save_params(exe.scope, "retrograd-lstm.npz", t.main)
    assert cli_main(["export", "retrograd-lstm.npz", "-o", "lm.onnx"]) == 0
    capsys.readouterr()
    exec(compile(sampling_example, "README.md", "exec"), {})
    text = capsys.readouterr().out
    assert text.startswith("def ") and len(text.rstrip("\n")) >= 304
    # the whole generation loop as one model: the text `retrograd sample` prints
    assert cli_main(["export", "--generate", "retrograd-lstm.npz", "-o", "g.onnx"]) == 0
    capsys.readouterr()
    exec(compile(generator_example, "README.md", "exec"), {})
    generated = capsys.readouterr().out
    assert cli_main(["sample", "retrograd-lstm.npz", "--length", "200", "--seed", "0"]) == 0
    assert generated == capsys.readouterr().out and len(generated) == 205
