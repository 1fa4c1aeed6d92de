"""Generation as one program (retrograd/generation.py): the while_loop that carries the model's
state and draws with rg.categorical, checked against a Python loop over the one-step sampler
program (charlm.build_sampler) and across backends."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd.models.charlm import ModelConfig, build_sampler, build_training
from retrograd.models.generation import build_generator, generate_text, run_generator

pytestmark = pytest.mark.engine

MODELS = ["lstm", "gru", "milstm"]
PROMPT = np.array([69, 70, 71, 0], dtype=np.int64)        # "def "


def trained_like(model: str, layers: int = 2):
    """A model config and parameters (random, with the embedding and the recurrent weights
    scaled up so that the state, and with it greedy decoding, keeps changing)."""
    cfg = ModelConfig(model=model, hidden=12, layers=layers, embed=6)
    t = build_training(cfg, seq_len=4, optimizer="sgd", lr=0.1, clip_norm=None, seed=3)
    exe = rg.Executor()
    exe.run(t.startup)
    params = {v.name: np.asarray(exe.scope.find(v.name)) for v in t.main.global_block().vars.values()
              if v.is_parameter}
    for name in params:
        if name.endswith((".w_ih", ".w_hh")) or name == "embed.w":
            params[name] = params[name] * 4.0 if name != "embed.w" else params[name] * 20.0
    return cfg, params


def executor(params, backend="numpy", device=None):
    exe = rg.Executor(backend=backend, device=device)
    for name, value in params.items():
        exe.scope.set(name, value)
    return exe


def one_step_probabilities(cfg, params, ids):
    """The next-id distribution after each of ``ids``: the one-step sampler program run in a
    Python loop, its states fed back by hand (charlm.generate's way)."""
    main, net, probs = build_sampler(cfg)
    state_in = [v for pair in zip(net.h0, net.c0) for v in pair if v is not None]
    state_out = [v for pair in zip(net.h_last, net.c_last) for v in pair if v is not None]
    states = [np.zeros((1, cfg.hidden), np.float32) for _ in state_in]
    exe, out = executor(params), []
    for i in ids:
        feed = {net.ids.name: np.array([[i]]), **{v.name: s for v, s in zip(state_in, states)}}
        p, *states = exe.run(main, feed=feed, fetch_list=[probs] + state_out)
        out.append(p[0])
    return out


def python_greedy(cfg, params, prompt, length):
    main, net, probs = build_sampler(cfg)
    state_in = [v for pair in zip(net.h0, net.c0) for v in pair if v is not None]
    state_out = [v for pair in zip(net.h_last, net.c_last) for v in pair if v is not None]
    states = [np.zeros((1, cfg.hidden), np.float32) for _ in state_in]
    exe, ids = executor(params), list(prompt)
    for t in range(len(prompt) + length - 1):
        feed = {net.ids.name: np.array([[ids[t]]]), **{v.name: s for v, s in zip(state_in, states)}}
        p, *states = exe.run(main, feed=feed, fetch_list=[probs] + state_out)
        if t + 1 >= len(prompt):
            ids.append(int(np.argmax(p[0])))
    return ids


@pytest.mark.parametrize("model", MODELS)
def test_greedy_generation_is_the_python_loop_over_the_one_step_sampler(model):
    cfg, params = trained_like(model)
    gen, exe = build_generator(cfg), executor(params)
    want = python_greedy(cfg, params, PROMPT, 20)
    assert len(set(want[4:])) > 1                                  # not one id over and over
    greedy = run_generator(exe, gen, PROMPT, 20, temperature=0.0, seed=0)
    assert greedy.dtype == np.int64 and greedy.tolist() == want
    top_one = run_generator(exe, gen, PROMPT, 20, temperature=0.8, seed=5, top_k=1)
    assert top_one.tolist() == want


@pytest.mark.parametrize("model", MODELS)
def test_the_program_draws_the_same_ids_on_every_backend(backend, model):
    cfg, params = trained_like(model)
    gen = build_generator(cfg)
    numpy_exe, exe = executor(params), executor(params, backend.name, backend.device)
    for seed, top_k in ((7, 0), (8, 4)):
        want = run_generator(numpy_exe, gen, PROMPT, 30, 0.9, seed, top_k)
        got = run_generator(exe, gen, PROMPT, 30, 0.9, seed, top_k)
        np.testing.assert_array_equal(got, want, err_msg=f"seed {seed}, top_k {top_k} on {backend}")


def test_the_seed_decides_the_ids():
    cfg, params = trained_like("lstm")
    gen, exe = build_generator(cfg), executor(params)
    first = run_generator(exe, gen, PROMPT, 40, 1.0, seed=11)
    np.testing.assert_array_equal(run_generator(exe, gen, PROMPT, 40, 1.0, seed=11), first)
    np.testing.assert_array_equal(first[:4], PROMPT)
    others = {tuple(run_generator(exe, gen, PROMPT, 40, 1.0, seed=s)) for s in (12, 13, -1)}
    assert tuple(first) not in others and len(others) == 3


def test_top_k_draws_only_among_the_k_most_likely_ids():
    cfg, params = trained_like("gru")
    gen, exe = build_generator(cfg), executor(params)
    for k in (2, 5):
        ids = run_generator(exe, gen, PROMPT, 40, 1.5, seed=k, top_k=k)
        probs = one_step_probabilities(cfg, params, ids[:-1])
        ranks = [int(np.sum(p > p[i])) for p, i in zip(probs[3:], ids[4:])]
        assert max(ranks) < k and max(ranks) > 0               # among the k, and not just the argmax


def test_the_first_drawn_id_follows_the_models_distribution():
    """Over many seeds, the first id drawn after the prompt is distributed as softmax(logits / T)."""
    cfg, params = trained_like("lstm", layers=1)
    params["out.w"] = params["out.w"] * 40.0                    # a few likely ids, many unlikely ones
    gen, exe = build_generator(cfg), executor(params)
    p = one_step_probabilities(cfg, params, PROMPT)[-1].astype(np.float64) ** (1 / 0.9)
    p /= p.sum()
    n = 400
    firsts = [run_generator(exe, gen, PROMPT, 1, 0.9, seed)[4] for seed in range(n)]
    freq = np.bincount(firsts, minlength=p.size) / n
    common = np.argsort(p)[-2:]
    assert p[common].min() > 0.05
    assert np.all(np.abs(freq[common] - p[common]) < 4 * np.sqrt(p[common] * (1 - p[common]) / n))


def test_prompt_only_and_one_id_prompts():
    cfg, params = trained_like("milstm", layers=1)
    gen, exe = build_generator(cfg), executor(params)
    np.testing.assert_array_equal(run_generator(exe, gen, PROMPT, 0, 0.8, 1), PROMPT)
    assert run_generator(exe, gen, PROMPT[:1], 5, 0.0, 1).tolist() == python_greedy(cfg, params, PROMPT[:1], 5)


def test_generate_text_decodes_prompt_and_draws():
    cfg, params = trained_like("lstm", layers=1)
    exe = executor(params)
    text = generate_text(exe, cfg, "def ", 30, 0.8, seed=2)
    ids = run_generator(exe, build_generator(cfg), cfg.vocab.encode("def "), 30, 0.8, 2)
    assert text == cfg.vocab.decode(ids) and len(text) == 34
    assert len(generate_text(exe, cfg, "", 10, 0.8, seed=2)) == 10       # starts from a newline


def test_the_program_is_one_while_loop_with_a_fixed_top_k_option():
    cfg, _ = trained_like("gru", layers=1)
    gen = build_generator(cfg)
    assert [op.type for op in gen.program.global_block().ops].count("While") == 1
    assert {v.name for v in gen.program.global_block().vars.values() if v.is_data} == \
        {"prompt", "length", "temperature", "seed", "top_k"}
    fixed = build_generator(cfg, top_k=3)
    assert "top_k" not in {v.name for v in fixed.program.global_block().vars.values() if v.is_data}


def test_readme_generation_example_runs_as_printed():
    import re
    from pathlib import Path
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S)
                 if "rg.categorical(logits / 0.8, seed=seed)" in b)
    env: dict = {"__name__": "readme"}
    exec(compile(block, "README.md", "exec"), env)
    out, exe, main, ids = env["out"], env["exe"], env["main"], env["ids"]
    assert out.dtype == np.int64 and out.shape == (12,) and out[:2].tolist() == [3, 1]
    other, = exe.run(main, feed={**env["feed"], "seed": np.array(8)}, fetch_list=[ids])
    assert other[:2].tolist() == [3, 1] and other.tolist() != out.tolist()
    pytest.importorskip("torch", reason="the same ids on the torch backend")
    on_torch = rg.Executor(backend="torch")
    on_torch.scope.set("next.w", np.asarray(exe.scope.find("next.w")))
    np.testing.assert_array_equal(on_torch.run(main, feed=env["feed"], fetch_list=[ids])[0], out)
