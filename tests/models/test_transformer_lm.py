"""The transformer char model and its key/value-cached step (retrograd/transformer_lm.py):
generation in one program equals greedy decoding that recomputes the whole model on the text so
far, on every backend and in exported ONNX."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd.models.charlm import ModelConfig
from retrograd.models.generation import build_generator, run_generator
from retrograd.models.transformer_lm import time_major_logits, transformer_logits

pytestmark = pytest.mark.engine

PROMPT = np.array([69, 70, 71, 0], dtype=np.int64)
MAX_POSITIONS = 24


def full_model(cfg, max_positions=MAX_POSITIONS):
    """The model over whole texts (the training program's forward), its parameters initialised
    (embeddings scaled up so that greedy decoding keeps changing its answer)."""
    main, startup = rg.Program(random_seed=1), rg.Program(random_seed=1)
    with rg.program_guard(main, startup):
        ids = rg.data("ids", [-1, -1], dtype="int64")
        positions = rg.data("positions", [-1], dtype="int64")
        logits = transformer_logits(ids, positions, cfg, max_positions)
    exe = rg.Executor()
    exe.run(startup)
    params = {v.name: np.asarray(exe.scope.find(v.name)) for v in main.global_block().vars.values()
              if v.is_parameter}
    params["embed.w"] = params["embed.w"] * 3.0
    params["pos.w"] = params["pos.w"] * 3.0
    for name, value in params.items():
        exe.scope.set(name, value)
    return main, logits, exe, params


def recomputed_greedy(cfg, prompt, length):
    """Greedy decoding that runs the whole model on the text so far for every new id."""
    main, logits, exe, _ = full_model(cfg)
    ids = list(prompt)
    for _ in range(length):
        out, = exe.run(main, feed={"ids": np.array([ids]), "positions": np.arange(len(ids))}, fetch_list=[logits])
        ids.append(int(np.argmax(out[0, -1])))
    return ids


def executor(params, backend="numpy", device=None):
    exe = rg.Executor(backend=backend, device=device)
    for name, value in params.items():
        exe.scope.set(name, value)
    return exe


CONFIGS = [ModelConfig(model="transformer", hidden=16, layers=2, heads=4),
           ModelConfig(model="transformer", hidden=8, layers=1, heads=1)]


@pytest.mark.parametrize("cfg", CONFIGS, ids=["2x4heads", "1x1head"])
def test_cached_generation_equals_recomputed_greedy_decoding(cfg):
    want = recomputed_greedy(cfg, PROMPT, 16)
    assert len(set(want[4:])) > 2
    _, _, _, params = full_model(cfg)
    gen = build_generator(cfg, max_positions=MAX_POSITIONS)
    assert run_generator(executor(params), gen, PROMPT, 16, 0.0, seed=0).tolist() == want
    assert run_generator(executor(params), gen, PROMPT, 16, 0.7, seed=3, top_k=1).tolist() == want
    assert run_generator(executor(params), gen, PROMPT[:1], 6, 0.0, seed=0).tolist() == \
        recomputed_greedy(cfg, PROMPT[:1], 6)


@pytest.mark.parametrize("window", [MAX_POSITIONS, 8])
def test_cached_generation_draws_the_same_ids_on_every_backend(backend, window):
    cfg = CONFIGS[0]
    _, _, _, params = full_model(cfg, window)
    gen = build_generator(cfg, max_positions=window)
    for seed, top_k in ((5, 0), (6, 3)):
        want = run_generator(executor(params), gen, PROMPT, 18, 1.0, seed, top_k)
        got = run_generator(executor(params, backend.name, backend.device), gen, PROMPT, 18, 1.0, seed, top_k)
        np.testing.assert_array_equal(got, want, err_msg=f"seed {seed}, top_k {top_k} on {backend}")


def test_exported_transformer_generator_runs_in_onnxruntime_alone(tmp_path):
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    cfg = CONFIGS[0]
    _, _, _, params = full_model(cfg)
    gen = build_generator(cfg, top_k=4, max_positions=MAX_POSITIONS)
    exe = executor(params)
    rg.onnx.export(gen.program, str(tmp_path / "g.onnx"), [gen.ids], scope=exe.scope)
    sess = ort.InferenceSession(str(tmp_path / "g.onnx"), providers=["CPUExecutionProvider"])
    assert sorted(i.name for i in sess.get_inputs()) == ["length", "prompt", "seed", "temperature"]
    for seed in (0, 1):
        got, = sess.run(None, {"prompt": PROMPT, "length": np.array(15), "seed": np.array(seed),
                               "temperature": np.array(0.9, dtype=np.float32)})
        np.testing.assert_array_equal(got, run_generator(exe, gen, PROMPT, 15, 0.9, seed))


def test_the_cache_is_carried_by_the_loop_and_written_with_update_slice():
    cfg = CONFIGS[0]
    gen = build_generator(cfg, max_positions=MAX_POSITIONS)
    loop, = [op for op in gen.program.global_block().ops if op.type == "While"]
    body = loop.attrs["body"]
    caches = [body.var(name) for name in loop.attrs["carry_binds"][2:4]]
    assert [tuple(v.shape) for v in caches] == [(2, 1, 4, -1, 4)] * 2         # [layers, N, heads, len, hd]
    assert sum(op.type == "UpdateSlice" for op in body.ops) == 2 * cfg.layers + 1
    assert [op.type for op in body.ops].count("If") == 1                      # the window's refill


def recomputed_sliding_greedy(cfg, prompt, length, window):
    """Greedy decoding recomputing the model on the window of the text the cache stands for:
    ids ``offset .. t`` at positions ``0 ..``, the window moving to the last ``window // 2`` ids
    whenever it is full."""
    main, logits, exe, _ = full_model(cfg, window)
    ids, offset = list(prompt), 0
    for t in range(len(prompt) + length - 1):
        if t - offset >= window:
            offset = t - window // 2
        if t + 1 >= len(prompt):
            context = ids[offset:t + 1]
            out, = exe.run(main, feed={"ids": np.array([context]), "positions": np.arange(len(context))},
                           fetch_list=[logits])
            ids.append(int(np.argmax(out[0, -1])))
    return ids


@pytest.mark.parametrize("window", [8, 5])
def test_a_text_longer_than_the_positions_slides_its_window(window):
    cfg = CONFIGS[0]
    want = recomputed_sliding_greedy(cfg, PROMPT, 20, window)
    _, _, _, params = full_model(cfg, window)
    gen = build_generator(cfg, max_positions=window)
    assert run_generator(executor(params), gen, PROMPT, 20, 0.0, seed=0).tolist() == want
    long_prompt = np.arange(30, 30 + 2 * window + 1)                 # the prompt alone overflows the window
    assert run_generator(executor(params), gen, long_prompt, 6, 0.0, seed=0).tolist() == \
        recomputed_sliding_greedy(cfg, long_prompt, 6, window)


def test_a_transformer_generator_needs_its_positions():
    with pytest.raises(rg.ProgramError, match="needs max_positions"):
        build_generator(CONFIGS[1])


def test_time_major_logits_are_the_batch_major_models_rows_in_time_order():
    cfg = CONFIGS[1]
    main, logits, exe, _ = full_model(cfg)
    with rg.program_guard(main, rg.Program()):
        chars = rg.data("chars", [-1, -1], dtype="int64")
        rows = time_major_logits(chars, cfg, MAX_POSITIONS)
    text = np.random.default_rng(0).integers(0, 96, (5, 3))          # [T, N]
    want, = exe.run(main, feed={"ids": text.T, "positions": np.arange(5)}, fetch_list=[logits])
    got, = exe.run(main, feed={"chars": text}, fetch_list=[rows])
    np.testing.assert_allclose(got, want.transpose(1, 0, 2).reshape(15, 96), rtol=1e-5, atol=1e-6)
