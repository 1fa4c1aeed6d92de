"""Optimizers against torch.optim: the same MLP, the same data, several steps, float64.

The comparisons with torch.optim run on every backend (the ``backend`` fixture):
the NumPy and the torch executor must both match it to 1e-10.
"""
from __future__ import annotations

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")

import retrograd as rg
from retrograd.backends import to_numpy

pytestmark = pytest.mark.engine     # these tests also run on the onnxruntime engine

NAMES = ["w1", "b1", "w2", "b2"]


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((16, 5)), rng.standard_normal((16, 3))


def _build(opt, loss_scale: float = 1.0):
    main, startup = rg.Program(random_seed=3), rg.Program(random_seed=3)
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 5], "float64")
        y = rg.data("y", [-1, 3], "float64")
        w1 = rg.create_parameter("w1", [5, 8], "float64")
        b1 = rg.create_parameter("b1", [8], "float64", init=("normal", 0.0, 0.1))
        w2 = rg.create_parameter("w2", [8, 3], "float64")
        b2 = rg.create_parameter("b2", [3], "float64", init=("normal", 0.0, 0.1))
        pred = rg.matmul(rg.tanh(rg.matmul(x, w1) + b1), w2) + b2
        loss = rg.mean(rg.square(pred - y)) * loss_scale
        params_grads = opt.minimize(loss)
    return main, startup, loss, params_grads


def _torch_loss(params, X, Y, loss_scale: float = 1.0):
    w1, b1, w2, b2 = params
    pred = torch.tanh(torch.tensor(X) @ w1 + b1) @ w2 + b2
    return ((pred - torch.tensor(Y)) ** 2).mean() * loss_scale


def _compare(opt, make_torch, backend, steps: int = 6, clip: float | None = None, loss_scale: float = 1.0):
    X, Y = _data()
    main, startup, loss, _ = _build(opt, loss_scale)
    exe = backend.executor()
    exe.run(startup)
    params = [torch.tensor(to_numpy(exe.scope.get(n)).copy(), requires_grad=True) for n in NAMES]
    topt = make_torch(params)
    norms = []
    for _ in range(steps):
        loss_v, = exe.run(main, feed={"x": X, "y": Y}, fetch_list=[loss])
        topt.zero_grad()
        t_loss = _torch_loss(params, X, Y, loss_scale)
        t_loss.backward()
        if clip is not None:
            norms.append(float(torch.nn.utils.clip_grad_norm_(params, clip)))
        topt.step()
        np.testing.assert_allclose(loss_v, t_loss.item(), rtol=1e-10, atol=1e-12)
    for name, p in zip(NAMES, params):
        np.testing.assert_allclose(to_numpy(exe.scope.get(name)), p.detach().numpy(), rtol=0, atol=1e-10,
                                   err_msg=name)
    return exe, norms


def test_sgd_matches_torch(backend):
    exe, _ = _compare(rg.optim.SGD(0.1), lambda p: torch.optim.SGD(p, lr=0.1), backend)
    assert to_numpy(exe.scope.get("w1")).dtype == np.float64


def test_momentum_matches_torch(backend):
    _compare(rg.optim.Momentum(0.05, momentum=0.9), lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
             backend)


def test_nesterov_and_weight_decay_match_torch(backend):
    _compare(rg.optim.Momentum(0.05, 0.8, nesterov=True, weight_decay=0.01),
             lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.01), backend)


@pytest.mark.parametrize("betas", [(0.9, 0.999), (0.5, 0.9)])
def test_adam_matches_torch(betas, backend):
    _compare(rg.optim.Adam(0.02, betas[0], betas[1], eps=1e-6),
             lambda p: torch.optim.Adam(p, lr=0.02, betas=betas, eps=1e-6), backend, steps=8)


def test_adam_weight_decay_matches_torch(backend):
    _compare(rg.optim.Adam(0.02, weight_decay=0.1),
             lambda p: torch.optim.Adam(p, lr=0.02, weight_decay=0.1), backend)


def test_clip_norm_matches_clip_grad_norm(backend):
    # The loss is scaled up so the gradient norm is far above the clip and clipping acts.
    opt = rg.optim.SGD(0.01, clip_norm=0.5)
    _, norms = _compare(opt, lambda p: torch.optim.SGD(p, lr=0.01), backend, clip=0.5, loss_scale=20.0)
    assert min(norms) > 0.5


def test_clip_norm_below_threshold_is_identity_and_norm_is_fetchable(backend):
    X, Y = _data()
    opt = rg.optim.Adam(0.01, clip_norm=1e6)
    main, startup, loss, params_grads = _build(opt)
    exe = backend.executor()
    exe.run(startup)
    grads = exe.run(main, feed={"x": X, "y": Y}, fetch_list=[g for _, g in params_grads] + [opt.grad_norm])
    expected = np.sqrt(sum(float(np.sum(g * g)) for g in grads[:-1]))
    np.testing.assert_allclose(grads[-1], expected, rtol=1e-12)
    _compare(rg.optim.Adam(0.01, clip_norm=1e6), lambda p: torch.optim.Adam(p, lr=0.01), backend, clip=1e6)


def test_minimize_returns_raw_gradients():
    X, Y = _data()
    main, startup, loss, params_grads = _build(rg.optim.SGD(0.1, clip_norm=1e-3))
    assert [p.name for p, _ in params_grads] == NAMES
    exe = rg.Executor()
    exe.run(startup)
    params = [torch.tensor(np.array(exe.scope.get(n)), requires_grad=True) for n in NAMES]
    grads = exe.run(main, feed={"x": X, "y": Y}, fetch_list=[g for _, g in params_grads])
    _torch_loss(params, X, Y).backward()
    for g, p in zip(grads, params):
        np.testing.assert_allclose(g, p.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_state_is_persistable_and_initialised_by_startup():
    main, startup, _, _ = _build(rg.optim.Adam(0.01))
    block = main.global_block()
    for name in NAMES:
        for slot in ("moment1", "moment2", "step"):
            var = block.vars[f"{name}.{slot}"]
            assert var.persistable and not var.trainable
    exe = rg.Executor()
    exe.run(startup)
    assert np.all(exe.scope.get("w1.moment1") == 0) and exe.scope.get("w1.moment1").shape == (5, 8)
    assert exe.scope.get("w1.step").tolist() == [0]
    exe.run(main, feed=dict(zip(["x", "y"], _data())))
    assert exe.scope.get("w1.step").tolist() == [1]


def test_parameter_list_and_no_grad_set_limit_updates():
    X, Y = _data()
    main, startup = rg.Program(random_seed=3), rg.Program(random_seed=3)
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 5], "float64")
        w = rg.create_parameter("w", [5, 3], "float64")
        b = rg.create_parameter("b", [3], "float64", init=1.0)
        loss = rg.mean(rg.square(rg.matmul(x, w) + b))
        params_grads = rg.optim.SGD(0.1).minimize(loss, parameter_list=[w])
    assert [p.name for p, _ in params_grads] == ["w"]
    exe = rg.Executor()
    exe.run(startup)
    w0 = np.array(exe.scope.get("w"))
    exe.run(main, feed={"x": X})
    assert np.all(exe.scope.get("b") == 1.0)
    assert not np.allclose(exe.scope.get("w"), w0)


def test_update_does_not_mutate_fetched_arrays():
    X, Y = _data()
    main, startup, loss, _ = _build(rg.optim.Momentum(0.1, 0.9))
    exe = rg.Executor()
    exe.run(startup)
    before = exe.scope.get("w1")
    snapshot = np.array(before)
    exe.run(main, feed={"x": X, "y": Y})
    np.testing.assert_array_equal(before, snapshot)
    assert not np.array_equal(exe.scope.get("w1"), snapshot)


def test_float32_training_keeps_float32(backend):
    rng = np.random.default_rng(1)
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 4])
        w = rg.create_parameter("w", [4, 2])
        loss = rg.mean(rg.square(rg.matmul(x, w) - 1.0))
        rg.optim.Adam(0.05, clip_norm=1.0).minimize(loss)
    exe = backend.executor()
    exe.run(startup)
    xb = rng.standard_normal((8, 4)).astype("float32")
    first, = exe.run(main, feed={"x": xb}, fetch_list=[loss])
    for _ in range(30):
        last, = exe.run(main, feed={"x": xb}, fetch_list=[loss])
    assert to_numpy(exe.scope.get("w")).dtype == np.float32
    assert to_numpy(exe.scope.get("w.moment2")).dtype == np.float32
    # Training closes most of the gap to the least-squares optimum (it cannot go below it).
    w_best = np.linalg.lstsq(xb.astype(np.float64), np.ones((8, 2)), rcond=None)[0]
    best = np.mean((xb @ w_best - 1.0) ** 2)
    assert best - 1e-6 <= last and last - best < 0.5 * (first - best)


def test_program_with_updates_round_trips_and_verifies():
    main, startup, _, _ = _build(rg.optim.Adam(0.01, clip_norm=1.0))
    again = rg.Program.from_json(main.to_json())
    assert str(again) == str(main)
    X, Y = _data()
    exe1, exe2 = rg.Executor(), rg.Executor()
    exe1.run(startup)
    exe2.run(startup)
    exe1.run(main, feed={"x": X, "y": Y})
    exe2.run(again, feed={"x": X, "y": Y})
    np.testing.assert_array_equal(exe1.scope.get("w2"), exe2.scope.get("w2"))


@pytest.mark.parametrize("make", [lambda: rg.optim.SGD(0.0), lambda: rg.optim.SGD(-1.0),
                                  lambda: rg.optim.Momentum(0.1, 1.5),
                                  lambda: rg.optim.Adam(0.1, beta1=1.0),
                                  lambda: rg.optim.Adam(0.1, clip_norm=0.0)])
def test_bad_hyperparameters_are_program_errors(make):
    with pytest.raises(rg.ProgramError):
        make()


def test_loss_without_parameters_is_a_program_error():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3])
        loss = rg.mean(x)
        with pytest.raises(rg.ProgramError, match="no trainable parameter"):
            rg.optim.SGD(0.1).minimize(loss)


def test_minimize_outside_the_guard_needs_the_startup_program():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 2], "float64")
        w = rg.create_parameter("w", [2, 1], "float64", init=1.0)
        loss = rg.mean(rg.matmul(x, w))
    n_ops = len(main.global_block().ops)
    with pytest.raises(rg.ProgramError, match="startup_program=startup"):
        rg.optim.Momentum(0.5, 0.5).minimize(loss)
    assert len(main.global_block().ops) == n_ops          # refused before changing the program
    rg.optim.Momentum(0.5, 0.5).minimize(loss, startup_program=startup)
    exe = rg.Executor()
    exe.run(startup)
    for _ in range(2):
        exe.run(main, feed={"x": np.array([[1.0, 2.0]])})
    # v1 = g = [1, 2]; v2 = 0.5 v1 + g = [1.5, 3]; w = 1 - 0.5 (v1 + v2)
    np.testing.assert_allclose(exe.scope.get("w")[:, 0], [1 - 0.5 * 2.5, 1 - 0.5 * 5.0])


# --- AdamW, RMSProp, Adagrad ---------------------------------------------------------------------

@pytest.mark.parametrize("weight_decay", [0.01, 0.3])
def test_adamw_matches_torch(weight_decay, backend):
    _compare(rg.optim.AdamW(0.02, weight_decay=weight_decay),
             lambda p: torch.optim.AdamW(p, lr=0.02, weight_decay=weight_decay), backend, steps=8)


def test_adamw_default_decay_is_torchs():
    assert rg.optim.AdamW(1e-3).weight_decay == torch.optim.AdamW([torch.zeros(1)]).defaults["weight_decay"]


def test_adamw_with_clip_norm_matches_torch(backend):
    _compare(rg.optim.AdamW(0.02, weight_decay=0.1, clip_norm=0.5),
             lambda p: torch.optim.AdamW(p, lr=0.02, weight_decay=0.1), backend, clip=0.5, loss_scale=20.0)


@pytest.mark.parametrize("kwargs", [{}, {"alpha": 0.9, "momentum": 0.5}, {"centered": True},
                                    {"centered": True, "momentum": 0.3, "weight_decay": 0.05}])
def test_rmsprop_matches_torch(kwargs, backend):
    _compare(rg.optim.RMSProp(0.01, **kwargs), lambda p: torch.optim.RMSprop(p, lr=0.01, **kwargs), backend)


@pytest.mark.parametrize("kwargs", [{}, {"lr_decay": 0.1, "initial_accumulator_value": 0.2},
                                    {"weight_decay": 0.05, "eps": 1e-6}])
def test_adagrad_matches_torch(kwargs, backend):
    _compare(rg.optim.Adagrad(0.1, **kwargs), lambda p: torch.optim.Adagrad(p, lr=0.1, **kwargs), backend)


def test_rmsprop_and_adagrad_with_clip_norm_match_torch(backend):
    _compare(rg.optim.RMSProp(0.01, clip_norm=0.5), lambda p: torch.optim.RMSprop(p, lr=0.01), backend,
             clip=0.5, loss_scale=20.0)
    _compare(rg.optim.Adagrad(0.1, clip_norm=0.5), lambda p: torch.optim.Adagrad(p, lr=0.1), backend,
             clip=0.5, loss_scale=20.0)


@pytest.mark.parametrize("make", [lambda: rg.optim.AdamW(1e-3, weight_decay=-0.1),
                                  lambda: rg.optim.RMSProp(1e-3, alpha=1.5),
                                  lambda: rg.optim.RMSProp(1e-3, momentum=-0.1),
                                  lambda: rg.optim.Adagrad(1e-3, eps=0.0),
                                  lambda: rg.optim.Adagrad(1e-3, lr_decay=-1.0),
                                  lambda: rg.optim.Adagrad(-1.0)])
def test_impossible_optimizer_settings_raise_program_error(make):
    with pytest.raises(rg.ProgramError):
        make()


def test_state_names_of_the_new_optimizers():
    for opt, slots in ((rg.optim.AdamW(0.01), ("moment1", "moment2", "step")),
                       (rg.optim.RMSProp(0.01, momentum=0.5, centered=True),
                        ("square_avg", "momentum_buf", "grad_avg")),
                       (rg.optim.Adagrad(0.01), ("sum", "step"))):
        main, _, _, _ = _build(opt)
        block = main.global_block()
        for slot in slots:
            var = block.vars[f"w1.{slot}"]
            assert var.persistable and not var.trainable
