"""layers.transformer_block against a torch reference block with the same weights, float64.

The reference is the pre-norm block written with torch.nn modules:
``x + MHA(ln1(x))`` then ``+ fc2(gelu(fc1(ln2(x))))``, causal through a bool
``attn_mask`` (torch: True = masked). Values and the gradients of a loss
mixing the output, with respect to the input and every parameter, on each
backend of the ``backend`` fixture.
"""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.engine

N, L, D, HEADS, FFN = 2, 5, 8, 2, 12
ATT = ("w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o")


def _param_shapes(ffn=FFN):
    shapes = {f"ln{i}.{p}": (D,) for i in (1, 2) for p in "wb"}
    shapes.update({f"att.{p}": (D, D) if p.startswith("w") else (D,) for p in ATT})
    shapes.update({"fc1.w": (D, ffn), "fc1.b": (ffn,), "fc2.w": (ffn, D), "fc2.b": (D,)})
    return shapes


class TorchBlock(torch.nn.Module):
    def __init__(self, causal: bool, ffn=FFN):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
        self.att = torch.nn.MultiheadAttention(D, HEADS, batch_first=True)
        self.fc1, self.fc2 = torch.nn.Linear(D, ffn), torch.nn.Linear(ffn, D)
        self.causal = causal

    def forward(self, x):
        h = self.ln1(x)
        hidden = ~torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril() if self.causal else None
        x = x + self.att(h, h, h, attn_mask=hidden, need_weights=False)[0]
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


def _torch_weights(tp):
    """torch's parameter names -> our tensors (weights of y = x W^T transposed)."""
    att = {p: tp[f"att.{p}"] for p in ATT}
    return {
        "ln1.weight": tp["ln1.w"], "ln1.bias": tp["ln1.b"], "ln2.weight": tp["ln2.w"], "ln2.bias": tp["ln2.b"],
        "att.in_proj_weight": torch.cat([att["w_q"].T, att["w_k"].T, att["w_v"].T]),
        "att.in_proj_bias": torch.cat([att["b_q"], att["b_k"], att["b_v"]]),
        "att.out_proj.weight": att["w_o"].T, "att.out_proj.bias": att["b_o"],
        "fc1.weight": tp["fc1.w"].T, "fc1.bias": tp["fc1.b"], "fc2.weight": tp["fc2.w"].T, "fc2.bias": tp["fc2.b"],
    }


def _compare_with_torch(backend, causal, ffn_dim=None, seed=0):
    ffn = FFN if ffn_dim else 4 * D
    r = np.random.default_rng(seed)
    shapes = _param_shapes(ffn)
    params = {n: r.standard_normal(s) * 0.4 + (1.0 if n.endswith("ln1.w") or n.endswith("ln2.w") else 0.0)
              for n, s in shapes.items()}
    x = r.standard_normal((N, L, D))
    weight = r.standard_normal((N, L, D))
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        xv = rg.data("x", [-1, -1, D], "float64", stop_gradient=False)
        out = rg.layers.transformer_block(xv, HEADS, ffn_dim=ffn_dim, causal=causal, name="blk")
        names = [f"blk.{n}" for n in shapes]
        assert {v.name for v in main.all_parameters()} == set(names)
        loss = rg.sum(out * rg.constant(weight, "float64"))
        grads = rg.gradients(loss, [xv] + [main.global_block().var(n) for n in names])
    exe = backend.executor()
    exe.run(startup)
    for n, value in params.items():
        exe.scope.set(f"blk.{n}", value)
    got = exe.run(main, feed={"x": x}, fetch_list=[out] + grads)

    tp = {n: torch.tensor(v, requires_grad=True) for n, v in params.items()}
    tx = torch.tensor(x, requires_grad=True)
    module = TorchBlock(causal, ffn).double()
    want = torch.func.functional_call(module, _torch_weights(tp), (tx,))
    want_grads = torch.autograd.grad((want * torch.tensor(weight)).sum(), [tx] + [tp[n] for n in shapes])
    np.testing.assert_allclose(got[0], want.detach().numpy(), rtol=1e-9, atol=1e-10)
    for name, g, w in zip(["x"] + list(shapes), got[1:], want_grads):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-8, atol=1e-10, err_msg=f"gradient of {name}")


def test_causal_block_matches_torch(backend):
    _compare_with_torch(backend, causal=True)


def test_bidirectional_block_with_ffn_dim_matches_torch(backend):
    _compare_with_torch(backend, causal=False, ffn_dim=FFN, seed=1)


def test_dropout_applies_to_both_branches_and_is_the_identity_in_a_test_program():
    main, startup = rg.Program(random_seed=1), rg.Program(random_seed=1)
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, D])
        out = rg.layers.transformer_block(x, HEADS, dropout=0.5, name="blk")
        plain = rg.layers.transformer_block(x, HEADS, dropout=0.0, name="blk")   # same parameters
    assert [op.type for op in main.global_block().ops].count("Dropout") == 2
    exe = rg.Executor()
    exe.run(startup)
    feed = {"x": np.random.default_rng(0).standard_normal((N, L, D)).astype(np.float32)}
    dropped, reference = exe.run(main, feed=feed, fetch_list=[out, plain])
    assert not np.allclose(dropped, reference)
    test_program = main.clone(for_test=True)
    evaluated, reference = exe.run(test_program, feed=feed, fetch_list=[out, plain])
    np.testing.assert_allclose(evaluated, reference, rtol=1e-6)


@pytest.mark.parametrize("kwargs,words", [
    ({"num_heads": 3}, "num_heads=3 does not divide the width D=8"),
    ({"num_heads": 2, "ffn_dim": 0}, "ffn_dim must be a positive int"),
    ({"num_heads": 2, "dropout": 1.0}, "dropout must be in"),
])
def test_bad_hyper_parameters_are_program_errors_at_the_users_line(kwargs, words):
    with rg.program_guard(rg.Program(), rg.Program()):
        x = rg.data("x", [-1, -1, D])
        with pytest.raises(rg.ProgramError) as info:
            rg.layers.transformer_block(x, **kwargs, name="blk")
    message = str(info.value)
    assert words in message and "transformer_block 'blk'" in message and "test_transformer.py" in message
