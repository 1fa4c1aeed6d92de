"""``retrograd export``: a saved char-LM's sampling step as ONNX, sampled with onnxruntime alone."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import retrograd as rg
from retrograd.models.charlm import VOCAB, ModelConfig, build_sampler, build_training
from retrograd.cli.main import main as cli_main


def _saved_model(tmp_path, model: str):
    cfg = ModelConfig(model=model, hidden=12, layers=2, embed=8)
    t = build_training(cfg, seq_len=4, optimizer="adam", lr=1e-3, clip_norm=None, seed=1)
    exe = rg.Executor()
    exe.run(t.startup)
    path = tmp_path / f"{model}.npz"
    rg.save_params(exe.scope, str(path), t.main)
    return cfg, exe, path


@pytest.mark.parametrize("model", ["lstm", "gru"])
def test_exported_sampler_steps_like_the_numpy_sampler(tmp_path, model, capsys):
    cfg, exe, path = _saved_model(tmp_path, model)
    assert cli_main(["export", str(path), "-o", str(tmp_path / "m.onnx")]) == 0
    assert "probs" in capsys.readouterr().out
    sess = ort.InferenceSession(str(tmp_path / "m.onnx"))
    assert sess.get_modelmeta().custom_metadata_map["vocab"] == VOCAB
    states = [i.name for i in sess.get_inputs() if i.name != "chars"]
    per_layer = ("h0", "c0") if model == "lstm" else ("h0",)
    assert states == [f"{model}{k}.{s}" for k in range(2) for s in per_layer]
    program, net, probs = build_sampler(cfg)
    state_out = [v for pair in zip(net.h_last, net.c_last) for v in pair if v is not None]
    ours = {n: np.zeros((2, 12), np.float32) for n in states}
    theirs = dict(ours)
    for char in (5, 40, 0):
        chars = np.array([[char, char + 1]])
        got = sess.run(["probs"] + [n + ".new" for n in states], {"chars": chars, **ours})
        want = exe.run(program, feed={"chars": chars, **theirs}, fetch_list=[probs] + state_out)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
        ours, theirs = dict(zip(states, got[1:])), dict(zip(states, want[1:]))


def test_export_of_a_foreign_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "other.npz"
    np.savez(path, w=np.zeros(3))
    assert cli_main(["export", str(path)]) == 2
    err = capsys.readouterr().err
    assert "not a model saved by `retrograd train`" in err and len(err.strip().splitlines()) == 1


# --- retrograd export --generate: the whole generation loop as one model ---------------------------

def _sample(path, capsys, *options) -> str:
    assert cli_main(["sample", str(path), *options]) == 0
    return capsys.readouterr().out[:-1]


@pytest.mark.parametrize("model", ["lstm", "gru", "milstm"])
def test_exported_generator_writes_what_retrograd_sample_prints(tmp_path, model, capsys):
    _, _, path = _saved_model(tmp_path, model)
    out = tmp_path / "g.onnx"
    assert cli_main(["export", "--generate", str(path), "-o", str(out)]) == 0
    assert "outputs ids" in capsys.readouterr().out
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert sorted(i.name for i in sess.get_inputs()) == ["length", "prompt", "seed", "temperature"]
    assert [o.name for o in sess.get_outputs()] == ["ids"]
    meta = sess.get_modelmeta().custom_metadata_map
    assert meta["vocab"] == VOCAB and meta["unknown"] == str(VOCAB.index("?"))
    prompt = np.array([VOCAB.index(c) for c in "import "], dtype=np.int64)
    for seed, temperature in ((0, 0.8), (3, 1.0), (-2, 0.0)):
        ids, = sess.run(["ids"], {"prompt": prompt, "length": np.array(40), "seed": np.array(seed),
                                  "temperature": np.array(temperature, dtype=np.float32)})
        assert ids.dtype == np.int64 and ids[:len(prompt)].tolist() == prompt.tolist()
        text = "import " + "".join(VOCAB[i] for i in ids[len(prompt):])
        assert text == _sample(path, capsys, "--prompt", "import ", "--length", "40", "--seed", str(seed),
                               "--temperature", str(temperature))


def test_exported_generator_with_top_k_matches_sample_top_k(tmp_path, capsys):
    _, _, path = _saved_model(tmp_path, "lstm")
    out = tmp_path / "g3.onnx"
    assert cli_main(["export", "--generate", "--top-k", "3", str(path), "-o", str(out)]) == 0
    capsys.readouterr()
    from retrograd.cli.onnx_sampler import generate_with_onnxruntime
    text = generate_with_onnxruntime(out, "def ", 50, temperature=1.0, seed=4)
    assert text == _sample(path, capsys, "--length", "50", "--temperature", "1.0", "--seed", "4", "--top-k", "3")
    assert text != _sample(path, capsys, "--length", "50", "--temperature", "1.0", "--seed", "4")
    assert ort.InferenceSession(str(out)).get_modelmeta().custom_metadata_map["top_k"] == "3"


def test_the_lines_python_m_sampler_prints_generate_the_samples_text(tmp_path, capsys):
    """`python -m retrograd.onnx.sampler` prints the few lines a user needs; run as printed
    (the file name put in), they print what `retrograd sample` prints for the same options."""
    from retrograd.cli.onnx_sampler import main as sampler_main
    _, _, path = _saved_model(tmp_path, "gru")
    assert cli_main(["export", "--generate", str(path), "-o", str(tmp_path / "g.onnx")]) == 0
    capsys.readouterr()
    assert sampler_main([]) == 0
    code = capsys.readouterr().out.split("\n", 1)[1].replace('"g.onnx"', repr(str(tmp_path / "g.onnx")))
    assert "onnxruntime" in code and "retrograd" not in code         # onnxruntime and NumPy alone
    exec(compile(code, "printed", "exec"), {})
    printed = capsys.readouterr().out[:-1]
    assert printed == _sample(path, capsys, "--prompt", "def ", "--length", "200", "--seed", "0",
                              "--temperature", "0.8")
    assert sampler_main([str(tmp_path / "g.onnx"), "--length", "200"]) == 0
    assert capsys.readouterr().out[:-1] == printed


def test_a_saved_transformer_generates_the_same_text_in_onnxruntime(tmp_path, capsys):
    """--model transformer: retrograd sample and the exported generator (the key/value cache,
    sliding past the 8 learned positions) write the same text; no one-step export for it."""
    cfg = ModelConfig(model="transformer", hidden=16, layers=2, heads=2)
    t = build_training(cfg, seq_len=8, optimizer="adam", lr=1e-3, clip_norm=None, seed=1)
    exe = rg.Executor()
    exe.run(t.startup)
    path = tmp_path / "t.npz"
    rg.save_params(exe.scope, str(path), t.main)
    assert cli_main(["export", "--generate", str(path), "-o", str(tmp_path / "t.onnx")]) == 0
    capsys.readouterr()
    from retrograd.cli.onnx_sampler import generate_with_onnxruntime
    for seed in (0, 5):
        text = generate_with_onnxruntime(tmp_path / "t.onnx", "def ", 30, temperature=1.0, seed=seed)
        assert len(text) == 34
        assert text == _sample(path, capsys, "--length", "30", "--temperature", "1.0", "--seed", str(seed))
    assert cli_main(["export", str(path)]) == 2
    err = capsys.readouterr().err
    assert "no one-step sampling program" in err and "--generate" in err and len(err.strip().splitlines()) == 1
