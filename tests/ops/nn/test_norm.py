"""layer_norm, rms_norm and batch_norm against torch (float64): forward, gradients, second order,
the running statistics, and the errors for shapes that cannot work."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg

torch = pytest.importorskip("torch")
F = torch.nn.functional

pytestmark = pytest.mark.engine

RNG = np.random.default_rng(7)
X = RNG.standard_normal((3, 4, 6)) * 2.0 + 0.5
W, B = RNG.standard_normal(6), RNG.standard_normal(6)
COTANGENT = RNG.standard_normal((3, 4, 6))


def _objective(y, c):
    return rg.sum(y * c + 0.5 * y * y * c)


def _torch_objective(y, c):
    return (y * c + 0.5 * y * y * c).sum()


def _run(backend, build, feeds):
    """Build ``build(*vars)`` over float64 data Vars named like ``feeds``; returns (program, vars)."""
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        vars_ = {n: rg.data(n, list(np.shape(a)), "float64" if np.asarray(a).dtype.kind == "f" else "int64")
                 for n, a in feeds.items()}
        fetch = build(**vars_)
    exe = backend.executor()
    return exe.run(main, feed=feeds, fetch_list=fetch)


def _first_and_second(norm, wrt_names, feeds):
    """[y, loss, first-order grads..., grads of sum(first grads^2)...]."""
    def build(**v):
        y = norm(**v)
        loss = _objective(y, v["c"])
        wrt = [v[n] for n in wrt_names]
        firsts = rg.gradients(loss, wrt)
        second = rg.add_n([rg.sum(g * g) for g in firsts])
        return [y, loss, *firsts, *rg.gradients(second, wrt)]
    return build


def _torch_first_and_second(norm, wrt_names, feeds):
    t = {n: torch.tensor(a, requires_grad=n in wrt_names) for n, a in feeds.items()}
    y = norm(**t)
    loss = _torch_objective(y, t["c"])
    wrt = [t[n] for n in wrt_names]
    firsts = torch.autograd.grad(loss, wrt, create_graph=True)
    seconds = torch.autograd.grad(sum((g * g).sum() for g in firsts), wrt)
    return [v.detach().numpy() for v in (y, loss, *firsts, *seconds)]


def _assert_all_close(got, want, rtol=1e-9, atol=1e-9):
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_allclose(np.asarray(a), b, rtol=rtol, atol=atol, err_msg=f"value #{i}")


LAYER_NORMS = {
    "weight_bias": (lambda x, w, b, c: rg.layer_norm(x, w, b), lambda x, w, b, c: F.layer_norm(x, [6], w, b),
                    ["x", "w", "b"]),
    "weight": (lambda x, w, b, c: rg.layer_norm(x, w), lambda x, w, b, c: F.layer_norm(x, [6], w), ["x", "w"]),
    "plain_eps": (lambda x, w, b, c: rg.layer_norm(x, eps=0.3), lambda x, w, b, c: F.layer_norm(x, [6], eps=0.3),
                  ["x"]),
}


@pytest.mark.parametrize("case", sorted(LAYER_NORMS))
def test_layer_norm_and_its_first_and_second_gradients_match_torch(backend, case):
    ours, theirs, wrt = LAYER_NORMS[case]
    feeds = {"x": X, "w": W, "b": B, "c": COTANGENT}
    got = _run(backend, _first_and_second(ours, wrt, feeds), feeds)
    _assert_all_close(got, _torch_first_and_second(theirs, wrt, feeds))


RMS_NORMS = {
    "weight": (lambda x, w, c: rg.rms_norm(x, w), lambda x, w, c: F.rms_norm(x, [6], w, eps=1e-6), ["x", "w"]),
    "plain_eps": (lambda x, w, c: rg.rms_norm(x, eps=0.5), lambda x, w, c: F.rms_norm(x, [6], eps=0.5), ["x"]),
}


@pytest.mark.parametrize("case", sorted(RMS_NORMS))
def test_rms_norm_and_its_first_and_second_gradients_match_torch(backend, case):
    ours, theirs, wrt = RMS_NORMS[case]
    feeds = {"x": X, "w": W, "c": COTANGENT}
    got = _run(backend, _first_and_second(ours, wrt, feeds), feeds)
    _assert_all_close(got, _torch_first_and_second(theirs, wrt, feeds))


def test_layer_norm_in_float32_matches_torch(backend):
    x = X.astype(np.float32)
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        xv = rg.data("x", [-1, 4, 6])
        y = rg.layer_norm(xv, rg.constant(W, "float32"), rg.constant(B, "float32"))
        dx, = rg.gradients(rg.sum(y * y * rg.constant(COTANGENT[0], "float32")), [xv])
    y_v, dx_v = backend.executor().run(main, feed={"x": x}, fetch_list=[y, dx])
    xt = torch.tensor(x, requires_grad=True)
    yt = F.layer_norm(xt, [6], torch.tensor(W, dtype=torch.float32), torch.tensor(B, dtype=torch.float32))
    dxt, = torch.autograd.grad((yt * yt * torch.tensor(COTANGENT[0], dtype=torch.float32)).sum(), [xt])
    np.testing.assert_allclose(y_v, yt.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx_v, dxt.numpy(), rtol=1e-4, atol=1e-4)


# --- batch_norm --------------------------------------------------------------------------------

BN_X = RNG.standard_normal((4, 3, 5)) * 1.5 + 0.3
BN_W, BN_B = RNG.standard_normal(3), RNG.standard_normal(3)
BN_C = RNG.standard_normal((4, 3, 5))
RUNNING_MEAN, RUNNING_VAR = RNG.standard_normal(3), RNG.uniform(0.5, 2.0, 3)


def _batch_norm_program(training: bool, shape=BN_X.shape):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", list(shape), "float64")
        w, b = rg.data("w", [shape[1]], "float64"), rg.data("b", [shape[1]], "float64")
        c = rg.data("c", list(shape), "float64")
        mean = rg.create_parameter("bn.mean", [shape[1]], "float64", init=RUNNING_MEAN[:shape[1]], trainable=False)
        var = rg.create_parameter("bn.var", [shape[1]], "float64", init=RUNNING_VAR[:shape[1]], trainable=False)
        y = rg.batch_norm(x, mean, var, w, b, training=training, momentum=0.2)
        loss = _objective(y, c)
        firsts = rg.gradients(loss, [x, w, b])
        seconds = rg.gradients(rg.add_n([rg.sum(g * g) for g in firsts[:2]]), [x, w])
    return main, startup, [y, loss, *firsts, *seconds]


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_gradients_and_running_statistics_match_torch(backend, training):
    main, startup, fetch = _batch_norm_program(training)
    exe = backend.executor()
    exe.run(startup)
    feeds = {"x": BN_X, "w": BN_W, "b": BN_B, "c": BN_C}
    got = exe.run(main, feed=feeds, fetch_list=fetch)
    running_mean, running_var = torch.tensor(RUNNING_MEAN), torch.tensor(RUNNING_VAR)
    t = {n: torch.tensor(a, requires_grad=n in "xwb") for n, a in feeds.items()}
    y = F.batch_norm(t["x"], running_mean, running_var, t["w"], t["b"], training=training, momentum=0.2)
    loss = _torch_objective(y, t["c"])
    firsts = torch.autograd.grad(loss, [t["x"], t["w"], t["b"]], create_graph=True)
    seconds = torch.autograd.grad(sum((g * g).sum() for g in firsts[:2]), [t["x"], t["w"]])
    _assert_all_close(got, [v.detach().numpy() for v in (y, loss, *firsts, *seconds)])
    np.testing.assert_allclose(_numpy(exe.scope.get("bn.mean")), running_mean.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(_numpy(exe.scope.get("bn.var")), running_var.numpy(), rtol=1e-12, atol=1e-12)
    if training:
        assert not np.allclose(running_mean.numpy(), RUNNING_MEAN)     # torch did update them


def _numpy(value):
    return rg.backends.to_numpy(value)         # torch (CPU/CUDA) and CuPy arrays alike


def test_batch_norm_of_2d_input_updates_running_statistics_over_several_runs(backend):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3], "float64")
        mean = rg.create_parameter("m", [3], "float64", init="zeros", trainable=False)
        var = rg.create_parameter("v", [3], "float64", init="ones", trainable=False)
        y = rg.batch_norm(x, mean, var)
    exe = backend.executor()
    exe.run(startup)
    running_mean, running_var = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    for step in range(3):
        xb = RNG.standard_normal((5 + step, 3)) * (step + 1)
        y_v, = exe.run(main, feed={"x": xb}, fetch_list=[y])
        y_t = F.batch_norm(torch.tensor(xb), running_mean, running_var, training=True)
        np.testing.assert_allclose(y_v, y_t.numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(_numpy(exe.scope.get("m")), running_mean.numpy(), rtol=1e-12)
    np.testing.assert_allclose(_numpy(exe.scope.get("v")), running_var.numpy(), rtol=1e-12)


def test_batch_norm_training_exports_the_running_statistics_as_new_outputs(tmp_path):
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3], "float64")
        mean = rg.create_parameter("bn.mean", [3], "float64", init="zeros", trainable=False)
        var = rg.create_parameter("bn.var", [3], "float64", init="ones", trainable=False)
        y = rg.batch_norm(x, mean, var, momentum=0.5)
    exe = rg.Executor()
    exe.run(startup)
    rg.onnx.export(main, str(tmp_path / "bn.onnx"), fetch_list=[y], scope=exe.scope)
    session = ort.InferenceSession(str(tmp_path / "bn.onnx"))
    xb = RNG.standard_normal((4, 3))
    new_mean, new_var = session.run(["bn.mean.new", "bn.var.new"], {"x": xb})
    np.testing.assert_allclose(new_mean, 0.5 * xb.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(new_var, 0.5 + 0.5 * xb.var(axis=0, ddof=1), rtol=1e-12)


def test_batch_norm_with_one_value_per_channel_fails_the_run_naming_the_op(backend):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3], "float64")
        mean = rg.create_parameter("m", [3], "float64", init="zeros", trainable=False)
        var = rg.create_parameter("v", [3], "float64", init="ones", trainable=False)
        y = rg.batch_norm(x, mean, var)
    exe = backend.executor()
    exe.run(startup)
    if backend.name == "onnxruntime":
        pytest.skip("the engine computes the (NaN) unbiased variance; only kernels can raise here")
    with pytest.raises(rg.ExecutionError, match="BatchNorm"):
        exe.run(main, feed={"x": np.ones((1, 3))}, fetch_list=[y])


# --- errors at build time ----------------------------------------------------------------------

def test_a_weight_of_the_wrong_width_is_a_shape_error_naming_the_op():
    with rg.program_guard(rg.Program(), rg.Program()):
        x = rg.data("x", [-1, 6])
        with pytest.raises(rg.ShapeError, match=r"LayerNorm.*float32\[5\]"):
            rg.layer_norm(x, rg.data("w", [5]))
        with pytest.raises(rg.ShapeError, match="RMSNorm"):
            rg.rms_norm(x, rg.data("w64", [6], "float64"))


def test_batch_norm_needs_a_channel_axis_and_per_channel_statistics():
    with rg.program_guard(rg.Program(), rg.Program()):
        stats = rg.data("m", [4]), rg.data("v", [4])
        with pytest.raises(rg.ShapeError, match="BatchNorm"):
            rg.batch_norm(rg.data("x", [4]), *stats)
        with pytest.raises(rg.ShapeError, match=r"one value per channel"):
            rg.batch_norm(rg.data("x2", [-1, 3, 5]), *stats)
        with pytest.raises(rg.ProgramError, match="momentum"):
            rg.batch_norm(rg.data("x3", [-1, 4]), *stats, momentum=1.5)
