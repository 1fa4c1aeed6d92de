"""Learning-rate schedules against torch.optim.lr_scheduler.LambdaLR (and StepLR), step for step.

The same MLP trains in retrograd and in torch, float64; after every step the
parameters must agree to 1e-10, on every backend (the onnxruntime engine too,
which runs the schedule's ops exported with the training step).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import retrograd as rg
from retrograd.backends import to_numpy

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.engine

NAMES = ["w1", "b1", "w2", "b2"]


def _build(opt):
    main, startup = rg.Program(random_seed=5), rg.Program(random_seed=5)
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 4], "float64")
        y = rg.data("y", [-1, 2], "float64")
        w1 = rg.create_parameter("w1", [4, 6], "float64")
        b1 = rg.create_parameter("b1", [6], "float64", init=("normal", 0.0, 0.1))
        w2 = rg.create_parameter("w2", [6, 2], "float64")
        b2 = rg.create_parameter("b2", [2], "float64", init=("normal", 0.0, 0.1))
        pred = rg.matmul(rg.tanh(rg.matmul(x, w1) + b1), w2) + b2
        loss = rg.mean(rg.square(pred - y))
        opt.minimize(loss)
    return main, startup, loss


def _data():
    rng = np.random.default_rng(2)
    return rng.standard_normal((12, 4)), rng.standard_normal((12, 2))


def _torch_loss(params, X, Y):
    w1, b1, w2, b2 = params
    return (((torch.tanh(torch.tensor(X) @ w1 + b1) @ w2 + b2) - torch.tensor(Y)) ** 2).mean()


def hf_cosine(warmup, total, min_lr_ratio=0.0):
    """Hugging Face's get_cosine_schedule_with_warmup lambda, with min_lr as a fraction of base."""
    def factor(t):
        if t < warmup:
            return t / max(1, warmup)
        p = min(1.0, (t - warmup) / max(1, total - warmup))
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))
    return factor


def optax_warmup_cosine(init_value, peak_value, warmup_steps, decay_steps, end_value):
    """optax.warmup_cosine_decay_schedule written out (linear_schedule, then cosine_decay_schedule
    over decay_steps - warmup_steps with alpha = end / peak), as a multiplier of peak_value."""
    def factor(t):
        if t < warmup_steps:
            return (init_value + (peak_value - init_value) * t / warmup_steps) / peak_value
        p = min(t - warmup_steps, decay_steps - warmup_steps) / (decay_steps - warmup_steps)
        alpha = end_value / peak_value
        return (1 - alpha) * 0.5 * (1 + math.cos(math.pi * p)) + alpha
    return factor


CASES = {
    "cosine-init-value": (lambda: rg.optim.lr.cosine(0.05, total_steps=8, warmup_steps=3, min_lr=0.005,
                                                     init_value=0.02),
                          optax_warmup_cosine(0.02, 0.05, 3, 8, 0.005)),
    "cosine": (lambda: rg.optim.lr.cosine(0.05, total_steps=8, warmup_steps=3, min_lr=0.005),
               hf_cosine(3, 8, 0.1)),
    "cosine-no-warmup": (lambda: rg.optim.lr.cosine(0.05, total_steps=5), hf_cosine(0, 5)),
    "step_decay": (lambda: rg.optim.lr.step_decay(0.05, step_size=3, gamma=0.5), lambda t: 0.5 ** (t // 3)),
    "linear_warmup": (lambda: rg.optim.lr.linear_warmup(0.05, warmup_steps=4), lambda t: min(1.0, t / 4)),
    "custom": (lambda: rg.optim.lr.Schedule(0.05, lambda t: 1.0 / rg.sqrt(t + 1.0)),
               lambda t: 1.0 / math.sqrt(t + 1.0)),
}


def _train(exe, main, loss, steps, X, Y):
    losses = []
    for _ in range(steps):
        losses.append(float(exe.run(main, feed={"x": X, "y": Y}, fetch_list=[loss])[0]))
    return losses


@pytest.mark.parametrize("opt_name", ["SGD", "Adam", "AdamW"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_schedule_matches_lambda_lr(case, opt_name, backend):
    make_schedule, factor = CASES[case]
    X, Y = _data()
    main, startup, loss = _build(getattr(rg.optim, opt_name)(make_schedule()))
    exe = backend.executor()
    exe.run(startup)
    params = [torch.tensor(to_numpy(exe.scope.get(n)).copy(), requires_grad=True) for n in NAMES]
    topt = getattr(torch.optim, opt_name)(params, lr=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(topt, factor)
    for step in range(10):                     # past total_steps: the cosine holds min_lr
        loss_v, = exe.run(main, feed={"x": X, "y": Y}, fetch_list=[loss])
        topt.zero_grad()
        t_loss = _torch_loss(params, X, Y)
        t_loss.backward()
        topt.step()
        sched.step()
        np.testing.assert_allclose(loss_v, t_loss.item(), rtol=1e-10, err_msg=f"step {step}")
    for name, p in zip(NAMES, params):
        np.testing.assert_allclose(to_numpy(exe.scope.get(name)), p.detach().numpy(), atol=1e-10, err_msg=name)
    assert to_numpy(exe.scope.get("lr_schedule.step")).tolist() == [10]


def test_step_decay_matches_step_lr():
    X, Y = _data()
    main, startup, loss = _build(rg.optim.Momentum(rg.optim.lr.step_decay(0.1, step_size=2, gamma=0.3), 0.9))
    exe = rg.Executor()
    exe.run(startup)
    params = [torch.tensor(np.array(exe.scope.get(n)), requires_grad=True) for n in NAMES]
    topt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(topt, step_size=2, gamma=0.3)
    for _ in range(7):
        exe.run(main, feed={"x": X, "y": Y})
        topt.zero_grad()
        _torch_loss(params, X, Y).backward()
        topt.step()
        sched.step()
    for name, p in zip(NAMES, params):
        np.testing.assert_allclose(exe.scope.get(name), p.detach().numpy(), atol=1e-10, err_msg=name)


def test_resumed_run_continues_the_schedule(tmp_path):
    """Saved after 4 steps and loaded into a fresh executor, the next 4 steps are the uninterrupted run's."""
    X, Y = _data()
    schedule = lambda: rg.optim.lr.cosine(0.05, total_steps=8, warmup_steps=2)  # noqa: E731
    main, startup, loss = _build(rg.optim.Adam(schedule()))
    straight = rg.Executor()
    straight.run(startup)
    expected = _train(straight, main, loss, 8, X, Y)
    first = rg.Executor()
    first.run(startup)
    _train(first, main, loss, 4, X, Y)
    rg.save_params(first.scope, tmp_path / "m.npz", main)
    second = rg.Executor()
    second.run(startup)
    rg.load_params(second.scope, tmp_path / "m.npz")
    assert second.scope.get("lr_schedule.step").tolist() == [4]
    np.testing.assert_allclose(_train(second, main, loss, 4, X, Y), expected[4:], rtol=1e-12)


def test_schedule_exports_with_the_training_step(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    X, Y = _data()
    main, startup, loss = _build(rg.optim.SGD(rg.optim.lr.linear_warmup(0.05, warmup_steps=4)))
    exe = rg.Executor()
    exe.run(startup)
    rg.onnx.export(main, str(tmp_path / "step.onnx"), fetch_list=[loss])
    sess = ort.InferenceSession(str(tmp_path / "step.onnx"))
    names = [o.name for o in sess.get_outputs()]
    feed = {"x": X, "y": Y, **{n: np.asarray(exe.scope.get(n)) for n in NAMES},
            "lr_schedule.step": np.asarray(exe.scope.get("lr_schedule.step"))}
    feed = {i.name: feed[i.name] for i in sess.get_inputs()}
    for _ in range(3):
        outs = dict(zip(names, sess.run(None, feed)))
        exe.run(main, feed={"x": X, "y": Y})
        for n in NAMES + ["lr_schedule.step"]:
            feed[n] = outs[f"{n}.new"]
    for n in NAMES:
        np.testing.assert_allclose(feed[n], exe.scope.get(n), rtol=1e-12, atol=1e-14)
    assert feed["lr_schedule.step"].tolist() == [3]


@pytest.mark.parametrize("make", [
    lambda: rg.optim.lr.cosine(1e-3, total_steps=100, warmup_steps=200),
    lambda: rg.optim.lr.cosine(1e-3, total_steps=100, warmup_steps=100),
    lambda: rg.optim.lr.cosine(1e-3, total_steps=0),
    lambda: rg.optim.lr.cosine(1e-3, total_steps=10, min_lr=-1.0),
    lambda: rg.optim.lr.cosine(-1e-3, total_steps=10),
    lambda: rg.optim.lr.step_decay(0.1, step_size=0),
    lambda: rg.optim.lr.step_decay(0.1, step_size=10, gamma=-0.5),
    lambda: rg.optim.lr.linear_warmup(0.1, warmup_steps=-1),
    lambda: rg.optim.lr.linear_warmup(0.1, warmup_steps=2.5),
])
def test_impossible_schedule_settings_raise_program_error(make):
    with pytest.raises(rg.ProgramError):
        make()


def test_a_schedule_that_builds_no_float64_var_is_refused():
    with pytest.raises(rg.ProgramError, match="float64"):
        _build(rg.optim.SGD(rg.optim.lr.Schedule(0.1, lambda t: 2.0)))


def test_cosine_init_value_matches_optax_warmup_cosine_decay_schedule():
    """The schedule's rates, read off the program step by step, against optax itself."""
    optax = pytest.importorskip("optax", reason="the reference schedule is optax's")
    want = optax.warmup_cosine_decay_schedule(0.01, 0.05, warmup_steps=3, decay_steps=8, end_value=0.005)
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        t = rg.data("t", [1], "float64")
        rate = rg.optim.lr.cosine(0.05, total_steps=8, warmup_steps=3, min_lr=0.005, init_value=0.01).rate(t)
    exe = rg.Executor()
    got = [float(exe.run(main, feed={"t": np.array([s], float)}, fetch_list=[rate])[0][0]) for s in range(10)]
    np.testing.assert_allclose(got, [float(want(s)) for s in range(10)], rtol=1e-6)


def test_cosine_rejects_a_negative_init_value():
    with pytest.raises(rg.ProgramError, match="init_value"):
        rg.optim.lr.cosine(1e-3, total_steps=100, warmup_steps=10, init_value=-1.0)
