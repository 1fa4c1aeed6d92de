"""fuse_optimizer_updates: one FusedAdamUpdate gives the separate AdamUpdate ops' numbers exactly."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd.ir.verify import verify_program
from retrograd.passes import fuse_optimizer_updates, optimize_for_engine


def _training(weight_decay: float = 0.0):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 6])
        y = rg.data("y", [-1, 3])
        h = rg.layers.fc(x, 5, act="tanh", name="fc1")
        pred = rg.layers.fc(h, 3, name="fc2")
        loss = rg.mean(rg.square(pred - y))
        rg.optim.Adam(0.05, clip_norm=1.0, weight_decay=weight_decay).minimize(loss)
    return main, startup, loss


def _train(main, startup, loss, steps: int = 4) -> dict:
    exe = rg.Executor()
    exe.run(startup)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        exe.run(main, feed={"x": rng.standard_normal((8, 6)), "y": rng.standard_normal((8, 3))},
                fetch_list=[loss])
    return {v.name: np.array(exe.scope.get(v.name)) for v in main.list_vars() if v.persistable}


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_fused_adam_matches_separate_updates_bit_for_bit(weight_decay):
    main, startup, loss = _training(weight_decay)
    fused = main.clone()
    removed = fuse_optimizer_updates(fused)
    types = [op.type for op in fused.global_block().ops]
    assert removed == 3 and types.count("FusedAdamUpdate") == 1 and "AdamUpdate" not in types
    verify_program(fused)
    want = _train(main, startup, loss)
    got = _train(fused, startup, loss)
    assert want.keys() == got.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert int(got["fc1.w.step"][0]) == 4


def test_updates_with_different_hyperparameters_stay_apart():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 4])
        a = rg.layers.fc(x, 4, name="a")
        b = rg.layers.fc(x, 4, name="b")
        pa = rg.append_backward(rg.mean(a * a), parameter_list=["a.w", "a.b"])
        pb = rg.append_backward(rg.mean(b * b), parameter_list=["b.w", "b.b"])
        rg.optim.Adam(0.1).apply_gradients(pa)
        rg.optim.Adam(0.2).apply_gradients(pb)
    fused = main.clone()
    assert fuse_optimizer_updates(fused) == 2
    assert [op.attrs["lr"] for op in fused.global_block().ops if op.type == "FusedAdamUpdate"] == [0.1, 0.2]


def test_an_update_whose_parameter_is_read_before_the_last_update_stays():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 4])
        a = rg.layers.fc(x, 4, name="a")
        b = rg.layers.fc(x, 4, name="b")
        pa = rg.append_backward(rg.mean(a * a), parameter_list=["a.w", "a.b"])
        pb = rg.append_backward(rg.mean(b * b), parameter_list=["b.w", "b.b"])
        opt = rg.optim.Adam(0.1)
        opt.apply_gradients(pa)
        probe = rg.sum(main.global_block().var("a.w"))      # reads a.w after its update
        opt.apply_gradients(pb)
    fused = main.clone()
    fuse_optimizer_updates(fused)
    ops = fused.global_block().ops
    assert [op.type for op in ops].count("AdamUpdate") == 1      # a.w's stays before the read
    want = _train_probe(main, startup, probe)
    got = _train_probe(fused, startup, probe)
    np.testing.assert_array_equal(got, want)


def _train_probe(main, startup, probe):
    exe = rg.Executor()
    exe.run(startup)
    out, = exe.run(main, feed={"x": np.ones((2, 4), "float32")}, fetch_list=[probe])
    return out


def test_optimize_for_engine_leaves_the_program_alone():
    main, _, _ = _training()
    version = main.version
    text = str(main)
    rewritten = optimize_for_engine(main)
    assert str(main) == text and main.version == version
    assert "FusedAdamUpdate" in str(rewritten)


def test_readme_spelling_rg_passes():
    main, _, _ = _training()
    assert "FusedAdamUpdate" in str(rg.passes.optimize_for_engine(main))


# --- scheduled rates, the torch backend's multi-tensor Adam (issue 22) ---------------------------

def _scheduled_training(decoupled: bool, weight_decay: float = 0.01):
    main, startup = rg.Program(random_seed=2), rg.Program(random_seed=2)
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 6])
        y = rg.data("y", [-1, 3])
        h = rg.layers.fc(x, 5, act="tanh", name="fc1")
        pred = rg.layers.fc(h, 3, name="fc2")
        loss = rg.mean(rg.square(pred - y))
        schedule = rg.optim.lr.cosine(0.05, total_steps=6, warmup_steps=2)
        opt = (rg.optim.AdamW(schedule, weight_decay=weight_decay, clip_norm=1.0) if decoupled else
               rg.optim.Adam(schedule, weight_decay=weight_decay, clip_norm=1.0))
        opt.minimize(loss)
    return main, startup, loss


@pytest.mark.parametrize("decoupled", [False, True])
def test_updates_reading_one_schedule_fuse_bit_for_bit(decoupled):
    main, startup, loss = _scheduled_training(decoupled)
    fused = main.clone()
    assert fuse_optimizer_updates(fused) == 3
    op, = [op for op in fused.global_block().ops if op.type == "FusedAdamUpdate"]
    assert len(op.inputs) == 5 * 4 + 1          # the schedule's rate Var comes last
    verify_program(fused)
    want = _train(main, startup, loss, steps=5)
    got = _train(fused, startup, loss, steps=5)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def _train_on(backend: str, main, startup, loss, steps: int = 5) -> tuple[list, dict]:
    exe = rg.Executor(backend=backend)
    exe.run(startup)
    rng = np.random.default_rng(0)
    losses = [float(exe.run(main, feed={"x": rng.standard_normal((8, 6)).astype("float32"),
                                        "y": rng.standard_normal((8, 3)).astype("float32")},
                            fetch_list=[loss])[0]) for _ in range(steps)]
    return losses, {v.name: rg.backends.to_numpy(exe.scope.get(v.name)) for v in main.list_vars()
                    if v.persistable}


@pytest.mark.parametrize("decoupled,weight_decay", [(False, 0.0), (False, 0.01), (True, 0.01)])
def test_torch_multi_tensor_adam_gives_the_separate_updates_numbers(decoupled, weight_decay):
    """The torch backend fuses the updates (its ``program_passes``) and runs ATen's multi-tensor
    Adam/AdamW: parameters, moments and step counts as NumPy's separate AdamUpdate ops give them
    to float32 rounding, and the user's program is left as it was."""
    pytest.importorskip("torch")
    main, startup, loss = _scheduled_training(decoupled, weight_decay)
    text = str(main)
    want_losses, want = _train_on("numpy", main, startup, loss)
    got_losses, got = _train_on("torch", main, startup, loss)
    assert str(main) == text
    np.testing.assert_allclose(got_losses, want_losses, rtol=2e-5)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=2e-5, atol=1e-6, err_msg=name)
    assert int(got["fc1.w.step"][0]) == 5


def test_torch_backend_runs_the_fused_update():
    pytest.importorskip("torch")
    main, startup, loss = _scheduled_training(True)
    exe = rg.Executor(backend="torch")
    exe.run(startup)
    exe.run(main, feed={"x": np.ones((2, 6), "float32"), "y": np.ones((2, 3), "float32")}, fetch_list=[loss])
    ran = [step.op.type for plan in exe._plans.values() for step in plan.steps]
    assert "FusedAdamUpdate" in ran and "AdamUpdate" not in ran
    assert "AdamUpdate" in {op.type for op in main.global_block().ops}


@pytest.mark.engine
def test_scheduled_fused_update_exports_to_onnx():
    """The onnxruntime engine fuses scheduled updates too: the flat-buffer lowering reads the rate
    input; numbers as NumPy's to float32 rounding."""
    pytest.importorskip("onnxruntime")
    main, startup, loss = _scheduled_training(True)
    assert "FusedAdamUpdate" in str(optimize_for_engine(main))
    want_losses, want = _train_on("numpy", main, startup, loss)
    got_losses, got = _train_on("onnxruntime", main, startup, loss)
    np.testing.assert_allclose(got_losses, want_losses, rtol=2e-5)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=2e-5, atol=1e-6, err_msg=name)


def test_torch_multi_adam_with_transposed_gradients_matches_numpy():
    """Regression: oneDNN's LSTM gradients come as transposed views, and ATen's fused Adam walks
    each tensor as one flat buffer: unless every operand is made contiguous first, the update
    pairs a parameter's entries with the wrong gradient entries (training still ran, slower)."""
    pytest.importorskip("torch")
    from retrograd.cli import train
    corpus, _ = train.load_corpus()
    losses = {}
    for backend in ("numpy", "torch"):
        cfg = train.ModelConfig("lstm", 16, 1, 8, None).for_backend(backend)
        t = train.build_training(cfg, 12, "adam", 3e-2, 5.0, seed=0)
        exe = rg.Executor(backend=backend)
        exe.run(t.startup)
        losses[backend] = []
        for i in range(5):
            xs, ys = train.batch_at(corpus, i, 12, 4, 0)
            losses[backend].append(float(exe.run(t.main, feed={"chars": xs, "next_chars": ys},
                                                 fetch_list=[t.loss])[0]))
    np.testing.assert_allclose(losses["torch"], losses["numpy"], rtol=1e-4)


def test_torch_multi_adam_leaves_values_fetched_earlier_unchanged():
    """The fused kernel updates in place: it must work on copies, never on the arrays a run read
    (a parameter or moment fetched earlier, or a NumPy array sharing their memory)."""
    pytest.importorskip("torch")
    main, startup, loss = _scheduled_training(True)
    exe = rg.Executor(backend="torch")
    exe.run(startup)
    feed = {"x": np.ones((2, 6), "float32"), "y": np.ones((2, 3), "float32")}
    exe.run(main, feed=feed, fetch_list=[loss])
    held = {name: exe.scope.get(name) for name in ("fc1.w", "fc1.w.moment1", "fc1.w.moment2")}
    copies = {name: value.clone() for name, value in held.items()}
    exe.run(main, feed=feed, fetch_list=[loss])
    for name, value in held.items():
        assert bool((value == copies[name]).all()), name
        assert exe.scope.get(name) is not value


def test_torch_multi_adam_keeps_transposed_weights_in_the_gradients_layout():
    """oneDNN's LSTM weight gradients are transposed views of [4H, D] buffers: the fused Adam
    returns the updated weights and moments in that layout (so the next forward reads them without
    a transposing copy) with the numbers of the update on contiguous copies."""
    torch = pytest.importorskip("torch")
    backend = rg.backends.get_backend("torch")
    if backend.fused_adam is None:
        pytest.skip("this torch has no aten::_fused_adam_")
    gen = torch.Generator().manual_seed(0)
    shape = (6, 20)
    param, m1, m2 = (torch.randn(shape, generator=gen) for _ in range(3))
    m2 = m2.abs()
    grad = torch.randn(shape[::-1], generator=gen).t()          # a transposed view, as oneDNN's
    steps = [torch.zeros(1, dtype=torch.int64)]
    hyper = dict(lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, decoupled=False)
    got = backend.multi_adam([param], [grad], [m1], [m2], steps, None, **hyper)
    want = backend.multi_adam([param], [grad.contiguous()], [m1], [m2], steps, None, **hyper)
    for got_value, want_value in zip(got[:3], want[:3]):
        assert got_value[0].stride() == grad.stride()
        assert torch.equal(got_value[0], want_value[0])
    again = backend.multi_adam(list(got[0]), [grad], list(got[1]), list(got[2]), list(got[3]), None, **hyper)
    assert again[0][0].stride() == grad.stride()
