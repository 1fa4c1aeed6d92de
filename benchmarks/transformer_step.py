"""The GPT-style character model's training step: retrograd per backend vs the same model in torch eager.

Sizes of ``examples/gpt_chars.py`` (D=64, 4 heads, 2 blocks, L=64, batch 32):
one AdamW step with gradient clipping on the same batch, one thread each,
median of 7 alternating runs. The torch model is built from ``torch.nn``
modules (Embedding, LayerNorm, MultiheadAttention, Linear, GELU).

Run from the repository root::

    python benchmarks/transformer_step.py
"""
import os, sys, time, statistics
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import gpt_chars as g
import retrograd as rg
from retrograd.models import charlm
torch.set_num_threads(1)
cfg = g.Config(); batch = 32; V = g.VOCAB

class Torch(torch.nn.Module):
    def __init__(s):
        super().__init__()
        s.tok = torch.nn.Embedding(V, cfg.width); s.pos = torch.nn.Embedding(cfg.seq_len, cfg.width)
        s.blocks = torch.nn.ModuleList([torch.nn.ModuleDict(dict(ln1=torch.nn.LayerNorm(cfg.width), att=torch.nn.MultiheadAttention(cfg.width, cfg.heads, batch_first=True), ln2=torch.nn.LayerNorm(cfg.width), fc1=torch.nn.Linear(cfg.width, 4*cfg.width), fc2=torch.nn.Linear(4*cfg.width, cfg.width))) for _ in range(cfg.layers)])
        s.ln = torch.nn.LayerNorm(cfg.width); s.head = torch.nn.Linear(cfg.width, V)
    def forward(s, ids):
        L = ids.shape[1]; x = s.tok(ids) + s.pos(torch.arange(L))
        for b in s.blocks:
            h = b["ln1"](x); x = x + b["att"](h, h, h, is_causal=True, attn_mask=torch.nn.Transformer.generate_square_subsequent_mask(L), need_weights=False)[0]
            x = x + b["fc2"](torch.nn.functional.gelu(b["fc1"](b["ln2"](x))))
        return s.head(s.ln(x))

ids_all, _ = charlm.load_corpus()
feed = g.batch_major(*charlm.batch_at(ids_all, 0, cfg.seq_len, batch, 0))
tm = Torch(); opt = torch.optim.AdamW(tm.parameters(), 3e-3)
tids, ttg = torch.tensor(feed["ids"]), torch.tensor(feed["targets"])
def torch_step():
    opt.zero_grad(); loss = torch.nn.functional.cross_entropy(tm(tids).reshape(-1, V), ttg.reshape(-1)); loss.backward()
    torch.nn.utils.clip_grad_norm_(tm.parameters(), 1.0); opt.step()
runners = {"torch eager": torch_step}
for b in ("numpy", "torch", "onnxruntime"):
    m = g.build(cfg, 3e-3, 1000); exe = rg.Executor(backend=b); exe.run(m.startup)
    runners[f"retrograd ({b})"] = (lambda exe=exe, m=m: exe.run(m.main, feed=feed, fetch_list=[m.loss]))
for r in runners.values(): r(); r()
times = {k: [] for k in runners}
for _ in range(7):
    for k, r in runners.items():
        t = time.perf_counter(); r(); times[k].append(time.perf_counter() - t)
base = statistics.median(times["torch eager"])
for k, v in times.items():
    m = statistics.median(v); print(f"{k:26s} {m*1e3:7.1f} ms  {batch*cfg.seq_len/m:8,.0f} chars/s  {m/base:5.2f}x torch eager")
