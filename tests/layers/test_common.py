"""fc and embedding: results against NumPy, parameter names, shapes and dtypes."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg

ACTS = {None: lambda z: z, "tanh": np.tanh, "sigmoid": lambda z: 1 / (1 + np.exp(-z)),
        "relu": lambda z: np.maximum(z, 0),
        "softmax": lambda z: np.exp(z - z.max(-1, keepdims=True)) / np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)}


def _build(fn):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        out = fn()
    exe = rg.Executor()
    exe.run(startup)
    return main, startup, exe, out


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("shape", [(5, 4), (3, 2, 4)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fc_matches_numpy(act, shape, dtype):
    main, _, exe, out = _build(lambda: rg.layers.fc(rg.data("x", [-1] * (len(shape) - 1) + [4], dtype),
                                                    6, act=act, name="fc1"))
    x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    w, b = np.asarray(exe.scope.get("fc1.w")), np.asarray(exe.scope.get("fc1.b"))
    assert w.shape == (4, 6) and b.shape == (6,) and w.dtype == dtype and b.dtype == dtype
    b = b + np.linspace(-1, 1, 6).astype(dtype)      # a non-zero bias must be added
    exe.scope.set("fc1.b", b)
    got, = exe.run(main, feed={"x": x}, fetch_list=[out])
    assert got.shape == shape[:-1] + (6,) and got.dtype == dtype
    assert out.shape == (-1,) * (len(shape) - 1) + (6,)
    np.testing.assert_allclose(got, ACTS[act](x @ w + b), rtol=1e-5 if dtype == "float32" else 1e-12,
                               atol=1e-6)


def test_fc_parameters_are_named_created_in_startup_and_seeded():
    main, startup, exe, _ = _build(lambda: rg.layers.fc(rg.data("x", [-1, 3]), 2, name="proj"))
    params = {v.name: v for v in main.all_parameters()}
    assert set(params) == {"proj.w", "proj.b"}
    assert params["proj.w"].shape == (3, 2) and params["proj.b"].shape == (2,)
    assert params["proj.w"].trainable and params["proj.w"].persistable
    assert {"proj.w", "proj.b"} <= set(startup.global_block().vars)
    np.testing.assert_array_equal(exe.scope.get("proj.b"), np.zeros(2, "float32"))
    _, _, again, _ = _build(lambda: rg.layers.fc(rg.data("x", [-1, 3]), 2, name="proj"))
    np.testing.assert_array_equal(exe.scope.get("proj.w"), again.scope.get("proj.w"))


def test_fc_default_names_are_unique_and_same_name_shares():
    def build():
        x = rg.data("x", [-1, 3])
        a = rg.layers.fc(x, 3)
        b = rg.layers.fc(a, 3)
        c = rg.layers.fc(b, 3, name="shared")
        return rg.layers.fc(c, 3, name="shared")
    main, _, _, _ = _build(build)
    names = sorted(v.name for v in main.all_parameters())
    assert names == ["fc_0.b", "fc_0.w", "fc_1.b", "fc_1.w", "shared.b", "shared.w"]


def test_fc_rejects_bad_input_and_activation():
    with rg.program_guard(rg.Program(), rg.Program()):
        with pytest.raises(rg.ProgramError, match="2-D or 3-D"):
            rg.layers.fc(rg.data("v", [4]), 2)
        with pytest.raises(rg.ProgramError, match="known last dimension"):
            rg.layers.fc(rg.data("u", [2, -1]), 2)
        with pytest.raises(rg.ProgramError, match="unknown act 'swish'.*'gelu', 'silu'"):
            rg.layers.fc(rg.data("x", [2, 3]), 2, act="swish")


@pytest.mark.parametrize("ids_shape", [(), (5,), (4, 3)])
def test_embedding_matches_numpy(ids_shape):
    main, _, exe, out = _build(lambda: rg.layers.embedding(rg.data("ids", [-1] * len(ids_shape), "int64"),
                                                           vocab=7, dim=3, name="emb"))
    ids = np.random.default_rng(1).integers(0, 7, size=ids_shape)
    table = np.asarray(exe.scope.get("emb.w"))
    assert table.shape == (7, 3) and table.dtype == np.float32
    got, = exe.run(main, feed={"ids": ids}, fetch_list=[out])
    np.testing.assert_array_equal(got, table[ids])
    assert out.shape == (-1,) * len(ids_shape) + (3,)


def test_embedding_starts_standard_normal_and_rejects_bad_ids():
    main, _, exe, out = _build(lambda: rg.layers.embedding(rg.data("ids", [-1], "int64"), 500, 40))
    assert [v.name for v in main.all_parameters()] == ["embedding_0.w"]
    table = np.asarray(exe.scope.get("embedding_0.w"))
    assert abs(table.mean()) < 0.02 and abs(table.std() - 1.0) < 0.02
    with pytest.raises(rg.ExecutionError, match="Gather"):
        exe.run(main, feed={"ids": np.array([0, 500])}, fetch_list=[out])


def test_fc_and_embedding_train_end_to_end():
    def build():
        ids = rg.data("ids", [-1], "int64")
        labels = rg.data("labels", [-1], "int64")
        h = rg.layers.fc(rg.layers.embedding(ids, 5, 8, name="emb"), 5, name="out")
        loss = rg.mean(rg.softmax_cross_entropy(h, labels))
        return loss, rg.append_backward(loss)
    main, _, exe, (loss, params_grads) = _build(build)
    assert sorted(p.name for p, _ in params_grads) == ["emb.w", "out.b", "out.w"]
    feed = {"ids": np.arange(5), "labels": (np.arange(5) + 1) % 5}
    first = None
    for _ in range(60):
        values = exe.run(main, feed=feed, fetch_list=[loss] + [g for _, g in params_grads])
        first = values[0] if first is None else first
        for (p, _), g in zip(params_grads, values[1:]):
            exe.scope.set(p.name, exe.scope.get(p.name) - 0.5 * g)
    assert values[0] < 0.2 * first
