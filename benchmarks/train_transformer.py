"""The transformer of ``examples/gpt_chars.py``: one training step per framework, for
``benchmarks/train.py --model transformer``.

The model (``gpt_chars.Config()``: width 64, 4 heads, 2 pre-norm blocks, 64
positions, GELU MLP of 4x width, no dropout), AdamW (weight decay 0.01) with
global-norm clipping at 1.0, batch 32 windows of 64 characters, float32 on the
CPU, one thread. retrograd runs ``gpt_chars.build`` (with its cosine schedule
over the steps this benchmark runs, warmup a tenth of them: a handful of scalar
ops) on each backend; PyTorch eager the same layers from
``torch.nn`` (``MultiheadAttention`` with a causal mask, ``LayerNorm``,
``Linear``, ``GELU``); JAX one ``jit`` of the whole step with the same layers
written in ``jax.numpy`` and AdamW/clipping written out. PyTorch and JAX use a
constant learning rate (the schedule costs nothing measurable).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import retrograd as rg
from retrograd.models import charlm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

CLIP, WEIGHT_DECAY = 1.0, 0.01


def gpt_module():
    """``examples/gpt_chars.py``, or None where this checkout lacks it (or its ops)."""
    if not hasattr(rg.layers, "transformer_block"):
        return None
    try:
        import gpt_chars
    except ImportError:
        return None
    return gpt_chars


def _feed(g, corpus, i: int, batch: int, seq_len: int) -> dict:
    return g.batch_major(*charlm.batch_at(corpus, i, seq_len, batch, 0))


def retrograd_stepper(g, corpus, backend: str, batch: int, lr: float, steps: int, device: str | None = None,
                      graphs: bool = False):
    """step(i) -> loss on ``backend`` (and ``device``; ``graphs``: replayed as a CUDA graph);
    ``step.executor`` is the executor."""
    cfg = g.Config()
    model = g.build(cfg, lr, steps=steps)      # its warmup: a tenth of the steps run here
    exe = rg.Executor(backend=backend, device=device, graphs=graphs)
    exe.run(model.startup)

    def step(i: int) -> float:
        loss, = exe.run(model.main, feed=_feed(g, corpus, i, batch, cfg.seq_len), fetch_list=[model.loss])
        return float(loss)
    step.executor = exe
    return step


def torch_stepper(g, corpus, batch: int, lr: float, threads: int, device: str = "cpu", compile: bool = False):
    """step(i) -> loss of the same model in PyTorch on ``device`` (``compile``: the model through
    ``torch.compile``)."""
    import torch
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg, vocab = g.Config(), g.VOCAB
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(cfg.width), nn.LayerNorm(cfg.width)
            self.att = nn.MultiheadAttention(cfg.width, cfg.heads, batch_first=True)
            self.fc1, self.fc2 = nn.Linear(cfg.width, 4 * cfg.width), nn.Linear(4 * cfg.width, cfg.width)

        def forward(self, x, mask):
            h = self.ln1(x)
            x = x + self.att(h, h, h, attn_mask=mask, is_causal=True, need_weights=False)[0]
            return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, cfg.width), nn.Embedding(cfg.seq_len, cfg.width)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg.layers))
            self.ln, self.head = nn.LayerNorm(cfg.width), nn.Linear(cfg.width, vocab)

        def forward(self, ids, positions):
            x = self.tok(ids) + self.pos(positions)
            mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1], device=ids.device)
            for block in self.blocks:
                x = block(x, mask)
            return self.head(self.ln(x))

    model = GPT().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=WEIGHT_DECAY)
    forward = torch.compile(model) if compile else model

    def step(i: int) -> float:
        feed = {k: torch.from_numpy(v).to(device) for k, v in _feed(g, corpus, i, batch, cfg.seq_len).items()}
        logits = forward(feed["ids"], feed["positions"])
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), feed["targets"].reshape(-1))
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        return loss.item()
    return step


def jax_stepper(g, corpus, batch: int, lr: float):
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None
    cfg, vocab, d = g.Config(), g.VOCAB, g.Config().width
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 64))

    def dense(n_in, n_out):
        bound = 1.0 / np.sqrt(n_in)
        return {"w": jax.random.uniform(next(keys), (n_in, n_out), jnp.float32, -bound, bound),
                "b": jnp.zeros(n_out, jnp.float32)}

    def norm():
        return {"w": jnp.ones(d, jnp.float32), "b": jnp.zeros(d, jnp.float32)}

    params = {"tok": jax.random.normal(next(keys), (vocab, d), jnp.float32),
              "pos": jax.random.normal(next(keys), (cfg.seq_len, d), jnp.float32),
              "blocks": [{"ln1": norm(), "ln2": norm(), "q": dense(d, d), "k": dense(d, d), "v": dense(d, d),
                          "o": dense(d, d), "fc1": dense(d, 4 * d), "fc2": dense(4 * d, d)}
                         for _ in range(cfg.layers)],
              "ln": norm(), "head": dense(d, vocab)}

    def layer_norm(p, x):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + 1e-5) * p["w"] + p["b"]

    def linear(p, x):
        return x @ p["w"] + p["b"]

    def attention(p, x):
        n, length, _ = x.shape
        heads = [linear(p[k], x).reshape(n, length, cfg.heads, d // cfg.heads) for k in "qkv"]
        out = jax.nn.dot_product_attention(*heads, is_causal=True)
        return linear(p["o"], out.reshape(n, length, d))

    def loss_fn(p, ids, targets, positions):
        x = p["tok"][ids] + p["pos"][positions]
        for b in p["blocks"]:
            x = x + attention(b, layer_norm(b["ln1"], x))
            x = x + linear(b["fc2"], jax.nn.gelu(linear(b["fc1"], layer_norm(b["ln2"], x)), approximate=False))
        logp = jax.nn.log_softmax(linear(p["head"], layer_norm(p["ln"], x)))
        return -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()

    b1, b2, eps = 0.9, 0.999, 1e-8
    tree = jax.tree_util

    @jax.jit
    def train_step(p, m, v, t, ids, targets, positions):
        loss, grads = jax.value_and_grad(loss_fn)(p, ids, targets, positions)
        norm_ = jnp.sqrt(sum(jnp.sum(x * x) for x in tree.tree_leaves(grads)))
        grads = tree.tree_map(lambda x: x * jnp.minimum(1.0, CLIP / (norm_ + 1e-6)), grads)
        t = t + 1
        m = tree.tree_map(lambda a, x: b1 * a + (1 - b1) * x, m, grads)
        v = tree.tree_map(lambda a, x: b2 * a + (1 - b2) * x * x, v, grads)
        corr1, corr2 = 1 - b1 ** t, 1 - b2 ** t
        p = tree.tree_map(lambda q, a, s: q * (1 - lr * WEIGHT_DECAY)
                          - lr * (a / corr1) / (jnp.sqrt(s / corr2) + eps), p, m, v)
        return p, m, v, t, loss

    state = [params, tree.tree_map(jnp.zeros_like, params), tree.tree_map(jnp.zeros_like, params),
             jnp.float32(0)]

    def step(i: int) -> float:
        feed = _feed(g, corpus, i, batch, cfg.seq_len)
        *updated, loss = train_step(*state, feed["ids"], feed["targets"], feed["positions"])
        state[:] = updated
        return float(loss)
    return step


def steppers(corpus, batch: int, lr: float, threads: int, steps: int) -> dict:
    """label -> step(i) for every framework installed; empty when gpt_chars is not in this checkout."""
    g = gpt_module()
    if g is None:
        return {}
    out = {}
    for backend in ("numpy", "torch", "onnxruntime"):
        try:
            step = retrograd_stepper(g, corpus, backend, batch, lr, steps)
            step(0)
        except rg.BackendError as exc:
            print(f"skipping the transformer on {backend}: {exc}", flush=True)
            continue
        out[f"retrograd ({backend})"] = step
    jax_step = jax_stepper(g, corpus, batch, lr)
    if jax_step is not None:
        out["JAX (`jit` of the whole step)"] = jax_step
    out["PyTorch eager (`torch.nn`)"] = torch_stepper(g, corpus, batch, lr, threads)
    return out
