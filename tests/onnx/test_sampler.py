"""``retrograd export``: a saved char-LM's sampling step as ONNX, sampled with onnxruntime alone."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import retrograd as rg
from retrograd.charlm import VOCAB, ModelConfig, build_sampler, build_training
from retrograd.cli import main as cli_main


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
