"""Contract: optim.SGD / Momentum / Adam .minimize vs torch.optim (float64, several steps), save/resume."""
from __future__ import annotations

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")

import retrograd as rg

R = np.random.default_rng(21)
W1, B1, W2 = R.standard_normal((3, 5)), R.standard_normal(5), R.standard_normal((5, 1))
BATCHES = [(R.standard_normal((8, 3)), R.standard_normal((8, 1))) for _ in range(4)]


def _model(make_opt, **minimize_kw):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3], dtype="float64")
        y = rg.data("y", [-1, 1], dtype="float64")
        w1 = rg.create_parameter("w1", [3, 5], dtype="float64", init=W1)
        b1 = rg.create_parameter("b1", [5], dtype="float64", init=B1)
        w2 = rg.create_parameter("w2", [5, 1], dtype="float64", init=W2)
        pred = rg.tanh(x @ w1 + b1) @ w2
        loss = rg.mean(rg.square(pred - y))
        opt = make_opt()
        kw = {k: (v(main) if callable(v) else v) for k, v in minimize_kw.items()}
        pg = opt.minimize(loss, **kw)
    return main, startup, loss, pg


def _torch_train(make_topt, params=("w1", "b1", "w2"), steps=4):
    tp = {"w1": torch.tensor(W1, requires_grad=True), "b1": torch.tensor(B1, requires_grad=True),
          "w2": torch.tensor(W2, requires_grad=True)}
    opt = make_topt([tp[k] for k in params])
    losses = []
    for xb, yb in BATCHES[:steps]:
        opt.zero_grad()
        pred = torch.tanh(torch.tensor(xb) @ tp["w1"] + tp["b1"]) @ tp["w2"]
        loss = ((pred - torch.tensor(yb)) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {k: v.detach().numpy() for k, v in tp.items()}, losses


OPTS = {
    "sgd": (lambda: rg.optim.SGD(0.1), lambda ps: torch.optim.SGD(ps, lr=0.1)),
    "momentum": (lambda: rg.optim.Momentum(0.05, 0.9), lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)),
    "momentum_kw": (lambda: rg.optim.Momentum(lr=0.05, momentum=0.8),
                    lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.8)),
    "adam": (lambda: rg.optim.Adam(0.01), lambda ps: torch.optim.Adam(ps, lr=0.01)),
    "adam_kw": (lambda: rg.optim.Adam(0.02, beta1=0.8, beta2=0.99, eps=1e-6),
                lambda ps: torch.optim.Adam(ps, lr=0.02, betas=(0.8, 0.99), eps=1e-6)),
}


@pytest.mark.parametrize("which", sorted(OPTS))
def test_optimizer_matches_torch(which):
    make, make_t = OPTS[which]
    main, startup, loss, pg = _model(make)
    assert isinstance(pg, list) and [p.name for p, _ in pg] == ["w1", "b1", "w2"]
    assert all(isinstance(p, rg.Var) and isinstance(g, rg.Var) for p, g in pg)
    exe = rg.Executor()
    exe.run(startup)
    losses = []
    for xb, yb in BATCHES:
        lv, = exe.run(main, feed={"x": xb, "y": yb}, fetch_list=[loss])
        losses.append(float(lv))
    ref, ref_losses = _torch_train(make_t)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-10)
    for k, v in ref.items():
        np.testing.assert_allclose(exe.scope.get(k), v, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("spelling", ["names", "vars"])
def test_minimize_parameter_list_and_no_grad_set(spelling):
    if spelling == "names":
        kw = dict(parameter_list=["w1", "w2"])
        kw2 = dict(no_grad_set={"b1"})
    else:
        kw = dict(parameter_list=lambda m: [m.global_block().vars["w1"], m.global_block().vars["w2"]])
        kw2 = dict(no_grad_set=lambda m: {m.global_block().vars["b1"]})
    for k in (kw, kw2):
        main, startup, loss, pg = _model(lambda: rg.optim.SGD(0.1), **k)
        assert [p.name for p, _ in pg] == ["w1", "w2"]
        exe = rg.Executor()
        exe.run(startup)
        for xb, yb in BATCHES:
            exe.run(main, feed={"x": xb, "y": yb})
        ref, _ = _torch_train(lambda ps: torch.optim.SGD(ps, lr=0.1), params=("w1", "w2"))
        for name in ("w1", "b1", "w2"):
            np.testing.assert_allclose(exe.scope.get(name), ref[name], rtol=1e-9, atol=1e-12)
        np.testing.assert_array_equal(exe.scope.get("b1"), B1)


def test_minimize_with_checkpoints_same_training():
    res = []
    for ck in (False, True):
        def make():
            return rg.optim.Adam(0.01)
        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            x = rg.data("x", [-1, 3], dtype="float64")
            y = rg.data("y", [-1, 1], dtype="float64")
            h = x
            hs = []
            for i in range(4):
                h = rg.layers.fc(h, 6, act="tanh", name=f"l{i}")
                hs.append(h)
            pred = rg.layers.fc(h, 1, name="out")
            loss = rg.mean(rg.square(pred - y))
            rg.optim.Adam(0.01).minimize(loss, checkpoints=[hs[1]] if ck else None)
        exe = rg.Executor()
        exe.run(startup)
        for xb, yb in BATCHES:
            exe.run(main, feed={"x": xb, "y": yb})
        res.append([np.array(exe.scope.get(f"l{i}.w")) for i in range(4)])
    for a, b in zip(*res):
        np.testing.assert_array_equal(a, b)


def test_save_and_resume_adam_exactly(tmp_path):
    path = str(tmp_path / "ckpt.npz")
    main, startup, loss, _ = _model(lambda: rg.optim.Adam(0.01))
    exe = rg.Executor()
    exe.run(startup)
    for xb, yb in BATCHES[:2]:
        exe.run(main, feed={"x": xb, "y": yb})
    rg.save_params(exe.scope, path, main)
    for xb, yb in BATCHES[2:]:
        exe.run(main, feed={"x": xb, "y": yb})
    straight = {k: np.array(exe.scope.get(k)) for k in ("w1", "b1", "w2")}

    main2, startup2, loss2, _ = _model(lambda: rg.optim.Adam(0.01))
    exe2 = rg.Executor()
    exe2.run(startup2)
    rg.load_params(exe2.scope, path)
    for xb, yb in BATCHES[2:]:
        exe2.run(main2, feed={"x": xb, "y": yb})
    for k, v in straight.items():
        np.testing.assert_array_equal(exe2.scope.get(k), v)
    ref, _ = _torch_train(lambda ps: torch.optim.Adam(ps, lr=0.01))
    for k, v in ref.items():
        np.testing.assert_allclose(straight[k], v, rtol=1e-9, atol=1e-12)


def test_training_program_round_trips_json():
    main, startup, loss, _ = _model(lambda: rg.optim.Momentum(0.05, 0.9))
    main2 = rg.Program.from_json(main.to_json())
    startup2 = rg.Program.from_json(startup.to_json())
    exe = rg.Executor()
    exe.run(startup2)
    for xb, yb in BATCHES:
        exe.run(main2, feed={"x": xb, "y": yb})
    ref, _ = _torch_train(lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9))
    for k, v in ref.items():
        np.testing.assert_allclose(exe.scope.get(k), v, rtol=1e-9, atol=1e-12)
