"""rand, randn, randint, categorical, rand_like, randn_like: the keyed generator's promises
(the same numbers on every backend and in exported ONNX for one program and run, new numbers
on the next run, the same again when replayed) and their distributions."""
from __future__ import annotations

import math

import numpy as np
import pytest

import retrograd as rg

pytestmark = pytest.mark.engine

LOGITS = np.log(np.array([[0.1, 0.2, 0.3, 0.4], [0.7, 0.0, 0.0, 0.3], [0.25, 0.25, 0.25, 0.25]]) + 1e-300)


def draws(seed_base=0):
    main = rg.Program(random_seed=11)
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, 3], "float64")
        logits = rg.data("logits", [-1, 4], "float64")
        outs = [rg.rand([4, 5]), rg.randn([3, 2], seed=seed_base + 7, dtype="float64"), rg.randint(-5, 9, [6]),
                rg.categorical(logits), rg.rand_like(x), rg.randn_like(x, dtype="float32")]
    return main, outs


FEED = {"x": np.zeros((2, 3)), "logits": np.repeat(LOGITS, 4, axis=0)}


def test_same_numbers_on_every_backend_and_new_ones_each_run(backend):
    main, outs = draws()
    numpy_exe, exe = rg.Executor(), backend.executor()
    runs = []
    for _ in range(2):
        want = numpy_exe.run(main, feed=FEED, fetch_list=outs)
        got = exe.run(main, feed=FEED, fetch_list=outs)
        for g, w, var in zip(got, want, outs):
            assert g.dtype == w.dtype == np.dtype(var.dtype), var.name
            np.testing.assert_array_equal(g, w, err_msg=f"{var.name} on {backend}")
        runs.append(got)
    for first, second, var in zip(*runs, outs):
        assert first.shape == second.shape
        if var.dtype != "int64" or first.size > 10:
            assert not np.array_equal(first, second), f"{var.name} drew the same numbers twice"


def test_shapes_and_dtypes():
    main, outs = draws()
    got = rg.Executor().run(main, feed={**FEED, "x": np.zeros((5, 3))}, fetch_list=outs)
    assert [g.shape for g in got] == [(4, 5), (3, 2), (6,), (12,), (5, 3), (5, 3)]
    assert [g.dtype.name for g in got] == ["float32", "float64", "int64", "int64", "float64", "float32"]
    assert outs[4].shape == (-1, 3) and outs[3].shape == (-1,)


def test_replaying_an_op_draws_the_same_numbers_within_a_run(backend):
    """What recompute does: the same op (seed) run again in the same run gives the same values;
    the gradient of x * rand_like(x) is the very draw of the forward."""
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, 4], "float64", stop_gradient=False)
        noise = rg.rand_like(x, seed=3)
        dx, = rg.gradients(rg.sum(x * noise), x)
        again = [rg.rand([2, 2], seed=9), rg.rand([2, 2], seed=9), rg.randn_like(x, seed=4), rg.randn_like(x, seed=4)]
    got = backend.executor().run(main, feed={"x": np.ones((3, 4))}, fetch_list=[noise, dx, *again])
    np.testing.assert_array_equal(got[0], got[1])
    np.testing.assert_array_equal(got[2], got[3])
    np.testing.assert_array_equal(got[4], got[5])


def test_draws_in_a_loop_differ_per_iteration_and_match_across_backends(backend):
    main = rg.Program(random_seed=2)
    with rg.program_guard(main, rg.Program()):
        def body(i, total, last):
            draw = rg.randn([3])
            return i + 1, total + draw, draw
        _, total, last = rg.while_loop(lambda i, total, last: i < 3, body,
                                       [rg.constant(0), rg.fill([3], 0.0), rg.fill([3], 0.0)])
    got = backend.executor().run(main, fetch_list=[total, last])
    want = rg.Executor().run(main, fetch_list=[total, last])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert not np.allclose(got[0], 3.0 * got[1])          # not one draw repeated


def test_exported_onnx_draws_the_executors_numbers():
    onnx = pytest.importorskip("onnx", reason="ONNX export needs onnx")
    ort = pytest.importorskip("onnxruntime", reason="the exported model runs in onnxruntime")
    main, outs = draws()
    exe = rg.Executor()
    model = rg.onnx.export(main, None, outs)
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for run_id in (1, 2):
        want = exe.run(main, feed=FEED, fetch_list=outs)
        got = session.run([v.name for v in outs], {**FEED, "retrograd.run_id": np.array(run_id)})
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def _ks_statistic(samples, cdf):
    s = np.sort(samples.astype(np.float64))
    n = s.size
    f = cdf(s)
    return max(np.max(np.arange(1, n + 1) / n - f), np.max(f - np.arange(n) / n))


N = 200_000
KS_LIMIT = 1.95 / math.sqrt(N)          # the 0.1% critical value


def _one(build, feed=None):
    main = rg.Program(random_seed=123)
    with rg.program_guard(main, rg.Program()):
        out = build()
    return rg.Executor().run(main, feed=feed or {}, fetch_list=[out])[0]


def test_rand_is_uniform():
    u = _one(lambda: rg.rand([N], dtype="float64"))
    assert u.min() >= 0.0 and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 0.003 and abs(u.var() - 1.0 / 12.0) < 0.002
    assert _ks_statistic(u, lambda s: s) < KS_LIMIT


def test_randn_is_standard_normal():
    z = _one(lambda: rg.randn_like(rg.data("x", [-1], "float64")), {"x": np.zeros(N)})
    assert abs(z.mean()) < 0.01 and abs(z.var() - 1.0) < 0.01
    normal_cdf = np.vectorize(lambda v: 0.5 * (1.0 + math.erf(v / math.sqrt(2.0))))
    assert _ks_statistic(z, normal_cdf) < KS_LIMIT


def test_randint_covers_the_range_evenly():
    v = _one(lambda: rg.randint(-3, 7, [N]))
    assert v.dtype == np.int64 and v.min() == -3 and v.max() == 6
    counts = np.bincount(v + 3, minlength=10) / N
    np.testing.assert_allclose(counts, 0.1, atol=0.004)


def test_categorical_frequencies_follow_the_softmax():
    logits = np.array([2.0, 0.5, -1.0, 1.0, -np.inf])
    probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    samples = _one(lambda: rg.categorical(rg.data("l", [-1, 5], "float64")), {"l": np.tile(logits, (N, 1))})
    freq = np.bincount(samples, minlength=5) / N
    assert freq[4] == 0.0                                       # -inf: never drawn
    chi2 = N * np.sum((freq[:4] - probs[:4]) ** 2 / probs[:4])
    assert chi2 < 16.3                                          # 3 degrees of freedom, p = 0.001
    np.testing.assert_allclose(freq, probs, atol=0.005)


def test_bad_arguments_are_refused_when_built():
    with rg.program_guard(rg.Program(), rg.Program()):
        with pytest.raises(rg.ShapeError, match="rand needs a fully known shape.*rand_like"):
            rg.rand([-1, 3])
        with pytest.raises(rg.ProgramError, match="randint: needs low < high"):
            rg.randint(5, 5, [2])
        with pytest.raises(rg.ProgramError, match="dtype must be float32 or float64"):
            rg.randn([2], dtype="int64")
        with pytest.raises(rg.ShapeError, match=r"categorical needs logits \[N, C\]"):
            rg.categorical(rg.data("l", [-1], "float32"))
        with pytest.raises(rg.ShapeError, match="float32 or float64"):
            rg.categorical(rg.data("i", [2, 3], "int64"))


def test_the_backward_recomputes_the_forwards_draws(backend):
    """Loop bodies and recurrent steps are replayed in the backward: their draws must repeat
    (else the gradients would not match finite differences)."""
    from retrograd.ops.recurrent.network import recurrent

    def looped(x, w):
        def body(i, y):
            return i + 1, rg.tanh(y @ w) * (1.0 + rg.randn_like(y)) + rg.rand([3], dtype="float64")
        return rg.while_loop(lambda i, y: i < 3, body, [rg.constant(0), x])[1]

    def stepped(x, h0, w):
        step = lambda xs, hs: [rg.tanh(xs[0] @ w + hs[0]) * rg.rand_like(hs[0])]     # noqa: E731
        (h_all,), _ = recurrent(step, [x], [h0], recompute="steps")
        return h_all
    r = np.random.default_rng(0)
    rg.testing.check_gradients(looped, {"x": r.standard_normal((2, 3)), "w": r.standard_normal((3, 3)) * 0.5},
                               **backend.kwargs)
    rg.testing.check_gradients(stepped, {"x": r.standard_normal((4, 2, 3)), "h0": r.standard_normal((2, 3)),
                                         "w": r.standard_normal((3, 3))}, **backend.kwargs)


# --- categorical with a seed chosen at run time --------------------------------------------------

def _seeded_categorical():
    main = rg.Program(random_seed=5)
    with rg.program_guard(main, rg.Program()):
        logits = rg.data("logits", [-1, 4], "float64")
        seed = rg.data("seed", [], dtype="int64")
        outs = [rg.categorical(logits, seed=seed), rg.categorical(logits, seed=seed)]
    return main, outs


def test_categorical_with_a_seed_var_draws_by_the_seed_not_the_run(backend):
    main, outs = _seeded_categorical()
    exe, numpy_exe = backend.executor(), rg.Executor()
    feed = {"logits": np.tile(LOGITS, (20, 1))}
    by_seed = {}
    for seed in (3, 3, 4, -7, 2 ** 40):
        got = exe.run(main, feed={**feed, "seed": np.array(seed)}, fetch_list=outs)
        want = numpy_exe.run(main, feed={**feed, "seed": np.array(seed)}, fetch_list=outs)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w, err_msg=f"seed {seed} on {backend}")
        by_seed.setdefault(seed, []).append(got[0])
        assert not np.array_equal(got[0], got[1])       # two ops, one seed: their own draws
    np.testing.assert_array_equal(*by_seed[3])          # the same seed in another run: the same draws
    assert len({tuple(v[0]) for v in by_seed.values()}) == 4


def test_seeded_categorical_exports_without_a_run_id_input():
    onnx = pytest.importorskip("onnx", reason="ONNX export needs onnx")
    ort = pytest.importorskip("onnxruntime", reason="the exported model runs in onnxruntime")
    main, outs = _seeded_categorical()
    model = rg.onnx.export(main, None, outs)
    onnx.checker.check_model(model)
    assert sorted(i.name for i in model.graph.input) == ["logits", "seed"]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {"logits": np.tile(LOGITS, (5, 1))}
    for seed in (0, 9, -1):
        want = rg.Executor().run(main, feed={**feed, "seed": np.array(seed)}, fetch_list=outs)
        got = session.run([v.name for v in outs], {**feed, "seed": np.array(seed)})
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_seeded_categorical_frequencies_over_seeds_follow_the_softmax():
    """One row, one draw per seed: over many seeds the draws follow softmax(logits)."""
    logits = np.array([[2.0, 0.5, -1.0, 1.0, -np.inf]])
    probs = np.exp(logits[0] - 2.0) / np.exp(logits[0] - 2.0).sum()
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        seeds = rg.data("seeds", [-1], dtype="int64")
        table = rg.data("l", [1, 5], "float64")
        count = rg.ops.tensor.dim(seeds, 0)
        _, drawn = rg.while_loop(
            lambda i, out: i < count,
            lambda i, out: (i + 1, rg.update_slice(out, rg.categorical(table, seed=seeds[i]), [i])),
            [rg.constant(0, "int64"), seeds * 0])
    n = 4000
    samples, = rg.Executor().run(main, feed={"seeds": np.arange(n), "l": logits}, fetch_list=[drawn])
    freq = np.bincount(samples, minlength=5) / n
    assert freq[4] == 0.0
    assert n * np.sum((freq[:4] - probs[:4]) ** 2 / probs[:4]) < 16.3      # chi2, 3 dof, p = 0.001


def test_a_seed_var_must_be_an_int64_scalar():
    with rg.program_guard(rg.Program(), rg.Program()):
        logits = rg.data("l", [2, 3], "float32")
        with pytest.raises(rg.ShapeError, match="seed Var must be int64 0-d"):
            rg.categorical(logits, seed=rg.data("s", [1], dtype="int64"))


def test_sampling_in_a_loop_draws_per_step_and_matches_across_backends(backend):
    """Text generation's shape: a while_loop carrying the last sample, drawing the next with
    categorical from logits that depend on it."""
    table = np.log(np.random.default_rng(3).dirichlet(np.ones(5), size=5))
    main = rg.Program(random_seed=4)
    with rg.program_guard(main, rg.Program()):
        logits_table = rg.constant(table, "float64")

        def body(i, token, total):
            logits = rg.gather(logits_table, token)                     # [N, 5]
            nxt = rg.categorical(logits)
            return i + 1, nxt, total + nxt
        start = rg.fill([64], 0, "int64")
        _, last, total = rg.while_loop(lambda i, token, total: i < 6, body, [rg.constant(0), start, start])
    got = backend.executor().run(main, fetch_list=[last, total])
    want = rg.Executor().run(main, fetch_list=[last, total])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert len(set(got[1].tolist())) > 3
