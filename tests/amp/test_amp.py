"""rg.amp: the rewrite against torch.autocast, master weights, dynamic loss scaling, the program forms.

The reference is ``torch.autocast`` (CPU) on the same program and weights: the
ops it lists as lower precision (matmul) run in bfloat16/float16, the rest in
float32, parameter gradients in float32. Tolerances are the dtype's: a few
units of its last place relative to the largest value.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import retrograd as rg
from retrograd.backends import to_numpy
from retrograd.ir.verify import verify_program

torch = pytest.importorskip("torch", reason="the reference values come from torch.autocast (pip install torch)")
ml_dtypes = pytest.importorskip("ml_dtypes", reason="NumPy's bfloat16 is ml_dtypes' (pip install ml_dtypes)")

pytestmark = pytest.mark.engine     # these tests also run on the onnxruntime engine

TOL = {"bfloat16": 2e-2, "float16": 3e-3}
PARAMS = ["fc1.w", "fc1.b", "ln.w", "ln.b", "fc2.w", "fc2.b"]


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((16, 8)).astype("float32"), rng.integers(0, 5, 16)


def _mlp(x, y):
    h = rg.tanh(rg.layers.fc(x, 32, name="fc1"))
    h = rg.layers.layer_norm(h, name="ln")
    logits = rg.layers.fc(h, 5, name="fc2")
    return logits, rg.mean(rg.softmax_cross_entropy(logits, y))


def _build(dtype: str, optimizer=None, **decorate):
    main, startup = rg.Program(random_seed=1), rg.Program(random_seed=1)
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 8])
        y = rg.data("y", [-1], "int64")
        logits, loss = _mlp(x, y)
        opt = rg.amp.decorate(optimizer or rg.optim.SGD(0.1), dtype=dtype, **decorate)
        params_grads = opt.minimize(loss)
    return main, startup, logits, loss, params_grads, opt


def _torch_autocast(weights: dict, x, y, dtype: str):
    """The same MLP in torch under autocast: (logits, loss, {param: grad})."""
    t = {n: torch.tensor(v, requires_grad=True) for n, v in weights.items()}
    linear = torch.nn.functional.linear      # fc: the product and its bias, as rg.amp's SeqLinear
    with torch.autocast("cpu", dtype=getattr(torch, dtype)):
        h = torch.tanh(linear(torch.tensor(x), t["fc1.w"].T, t["fc1.b"]))
        h = torch.nn.functional.layer_norm(h, (32,), t["ln.w"], t["ln.b"])
        logits = linear(h, t["fc2.w"].T, t["fc2.b"])
        loss = torch.nn.functional.cross_entropy(logits, torch.tensor(y))
    loss.backward()
    return logits, loss, {n: t[n].grad.numpy() for n in weights}


def _close(actual, expected, dtype: str, what: str):
    actual, expected = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    scale = max(np.abs(expected).max(), 1e-6)
    err = np.abs(actual - expected).max() / scale
    assert err <= TOL[dtype], f"{what}: relative error {err:.2e} > {TOL[dtype]}"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_values_and_gradients_match_torch_autocast(backend, dtype):
    main, startup, logits, loss, params_grads, _ = _build(dtype, loss_scale=None)
    exe = backend.executor()
    exe.run(startup)
    weights = {n: to_numpy(exe.scope.get(n)).copy() for n in PARAMS}
    xb, yb = _data()
    fetch = [logits, loss] + [g for _, g in params_grads]
    if backend.name == "onnxruntime" and dtype == "bfloat16":
        with pytest.raises(rg.BackendError, match=r"MatMul.*no onnxruntime kernel for bfloat16"):
            exe.run(main, feed={"x": xb, "y": yb}, fetch_list=fetch)
        return
    got = exe.run(main, feed={"x": xb, "y": yb}, fetch_list=fetch)
    ref_logits, ref_loss, ref_grads = _torch_autocast(weights, xb, yb, dtype)
    assert str(ref_logits.dtype) == f"torch.{dtype}" and got[0].dtype.name == dtype
    _close(got[0], ref_logits.detach().float().numpy(), dtype, "logits")
    _close(got[1], ref_loss.detach().numpy(), dtype, "loss")
    for (param, grad), value in zip(params_grads, got[2:]):
        assert value.dtype == np.float32, f"{param.name}'s gradient is {value.dtype}"
        _close(value, ref_grads[param.name], dtype, f"d{param.name}")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_ops_compute_in_dtype_and_float32_ops_in_float32(dtype):
    main, *_ = _build(dtype)
    verify_program(main)
    block = main.global_block()
    forward = block.ops[:next(i for i, op in enumerate(block.ops) if op.type in ("FillLike", "ScaleLoss"))]
    for op in forward:
        dtypes = {block.var(n).dtype for n in op.inputs if block.var(n).dtype != "int64"}
        if op.type in ("MatMul", "SeqLinear"):
            assert dtypes == {dtype} and block.var(op.outputs[0]).dtype == dtype
        if op.type in rg.amp.FLOAT32:
            assert dtypes == {"float32"}, f"{op.type} reads {dtypes}"
    # each parameter a low-precision op reads is cast once per step, in the forward
    casts = [op.inputs[0] for op in forward if op.type == "Cast"]
    assert sorted(n for n in casts if n in PARAMS) == ["fc1.b", "fc1.w", "fc2.b", "fc2.w"]


def test_master_weights_and_optimizer_state_stay_float32(backend):
    main, startup, _, loss, params_grads, _ = _build("bfloat16", rg.optim.AdamW(1e-2))
    if backend.name == "onnxruntime":
        pytest.skip("onnxruntime has no bfloat16 MatMul on the CPU (test_values_... checks the error)")
    exe = backend.executor()
    exe.run(startup)
    xb, yb = _data()
    losses = [float(exe.run(main, feed={"x": xb, "y": yb}, fetch_list=[loss])[0]) for _ in range(5)]
    assert losses[-1] < losses[0]
    for var in main.global_block().vars.values():
        if var.persistable and var.dtype != "int64":
            assert var.dtype == "float32", var.name
            assert to_numpy(exe.scope.get(var.name)).dtype == np.float32, var.name
    assert all(g.dtype == "float32" for _, g in params_grads)


def _fp16_adam(growth_interval=2000, schedule=False):
    lr = rg.optim.lr.linear_warmup(1e-2, 10) if schedule else 1e-2
    return _build("float16", rg.optim.Adam(lr), growth_interval=growth_interval)


def _persistables(exe, main) -> dict:
    return {v.name: to_numpy(exe.scope.get(v.name)).copy() for v in main.global_block().vars.values()
            if v.persistable}


def test_overflow_skips_exactly_that_step_and_halves_the_scale(backend):
    main, startup, _, loss, _, opt = _fp16_adam(schedule=True)
    assert opt.loss_scale.name == "amp.loss_scale"
    exe = backend.executor()
    exe.run(startup)
    xb, yb = _data()
    exe.run(main, feed={"x": xb, "y": yb})
    before = _persistables(exe, main)
    assert before["amp.loss_scale"][0] == 2.0 ** 16 and before["amp.good_steps"][0] == 1
    finite, = exe.run(main, feed={"x": _non_finite(xb), "y": yb}, fetch_list=[opt.finite])
    assert not finite.any()
    after = _persistables(exe, main)
    for name, value in before.items():
        if not name.startswith("amp."):
            assert np.array_equal(after[name], value), f"{name} changed on a skipped step"
    assert "fc1.w.moment1" in after and "lr_schedule.step" in after
    assert after["amp.loss_scale"][0] == 2.0 ** 15 and after["amp.good_steps"][0] == 0
    exe.run(main, feed={"x": xb, "y": yb})          # a finite step updates again
    again = _persistables(exe, main)
    assert not np.array_equal(again["fc1.w"], after["fc1.w"])
    assert again["lr_schedule.step"][0] == after["lr_schedule.step"][0] + 1
    assert again["amp.loss_scale"][0] == 2.0 ** 15 and again["amp.good_steps"][0] == 1


def _non_finite(xb):
    """A batch whose gradients are not finite on every backend (a NaN feature)."""
    bad = xb.copy()
    bad[0, 0] = np.nan
    return bad


@pytest.mark.engine_skip("onnxruntime's CPU runs float16 graphs in float32 (it removes the Cast pairs "
                         "its optimizer inserts), so float16 never overflows there")
def test_a_float16_overflow_is_skipped_and_halves_the_scale(backend):
    main, startup, _, loss, _, opt = _fp16_adam()
    exe = backend.executor()
    exe.run(startup)
    before = _persistables(exe, main)
    exe.scope.set("amp.loss_scale", np.array([2.0 ** 40], np.float32))   # gradients * 2**40 > 65504
    xb, yb = _data()
    finite, = exe.run(main, feed={"x": xb, "y": yb}, fetch_list=[opt.finite])
    after = _persistables(exe, main)
    assert not finite.any() and after["amp.loss_scale"][0] == 2.0 ** 39
    assert all(np.array_equal(after[n], v) for n, v in before.items() if not n.startswith("amp."))


def test_finite_steps_match_unscaled_float16_training(backend):
    """Scaling by 2**16 and dividing back is exact in float32: the updates are those of the same
    float16 program without scaling (as long as no float16 gradient overflows)."""
    xb, yb = _data()
    results = []
    for loss_scale in ("dynamic", None):
        main, startup, *_ = _build("float16", rg.optim.Adam(1e-2), loss_scale=loss_scale)
        exe = backend.executor()
        exe.run(startup)
        for _ in range(3):
            exe.run(main, feed={"x": xb, "y": yb})
        results.append(to_numpy(exe.scope.get("fc1.w")))
    np.testing.assert_allclose(results[0], results[1], rtol=1e-3, atol=1e-5)


def test_growth_interval_finite_steps_double_the_scale(backend):
    main, startup, *_ = _fp16_adam(growth_interval=3)
    exe = backend.executor()
    exe.run(startup)
    xb, yb = _data()
    scales = []
    for _ in range(7):
        exe.run(main, feed={"x": xb, "y": yb})
        scales.append((float(to_numpy(exe.scope.get("amp.loss_scale"))[0]),
                       int(to_numpy(exe.scope.get("amp.good_steps"))[0])))
    s = 2.0 ** 16
    assert scales == [(s, 1), (s, 2), (2 * s, 0), (2 * s, 1), (2 * s, 2), (4 * s, 0), (4 * s, 1)]


def test_resume_continues_the_scale(backend, tmp_path):
    xb, yb = _data()
    overflow = _non_finite(xb)
    feeds = [xb, overflow, xb, xb, overflow, xb]
    main, startup, *_ = _fp16_adam(growth_interval=2)
    straight = backend.executor()
    straight.run(startup)
    for xv in feeds:
        straight.run(main, feed={"x": xv, "y": yb})
    first = backend.executor()
    first.run(startup)
    for xv in feeds[:3]:
        first.run(main, feed={"x": xv, "y": yb})
    rg.save_params(first.scope, tmp_path / "ckpt.npz", main)
    resumed = backend.executor()
    rg.load_params(resumed.scope, tmp_path / "ckpt.npz", main)
    assert float(to_numpy(resumed.scope.get("amp.loss_scale"))[0]) == 2.0 ** 15
    for xv in feeds[3:]:
        resumed.run(main, feed={"x": xv, "y": yb})
    for name, value in _persistables(straight, main).items():
        assert np.array_equal(to_numpy(resumed.scope.get(name)), value), name


def test_bfloat16_defaults_to_no_scaling_float16_to_dynamic():
    types = lambda main: {op.type for op in main.global_block().ops}   # noqa: E731
    assert not {"ScaleLoss", "UpdateLossScale"} & types(_build("bfloat16")[0])
    assert {"ScaleLoss", "AllFinite", "SelectUpdates", "UpdateLossScale"} <= types(_build("float16")[0])
    assert not {"ScaleLoss", "SelectUpdates"} & types(_build("float16", loss_scale=None)[0])
    static = types(_build("float16", loss_scale=1024.0)[0])
    assert {"ScaleLoss", "SelectUpdates"} <= static and "UpdateLossScale" not in static


def test_static_loss_scale_multiplies_the_loss(backend):
    main, startup, _, loss, params_grads, opt = _build("float16", loss_scale=1024.0)
    exe = backend.executor()
    exe.run(startup)
    xb, yb = _data()
    scale, = exe.run(main, feed={"x": xb, "y": yb}, fetch_list=[opt.loss_scale])
    assert scale[0] == 1024.0


def test_custom_lists_extend_the_defaults():
    main, *_ = _build("bfloat16", custom_float32=["MatMul", "SeqLinear"])
    block = main.global_block()
    assert all(block.var(n).dtype != "bfloat16" for op in block.ops for n in op.inputs)
    main, *_ = _build("bfloat16", custom_low=["Tanh"])
    tanh = next(op for op in main.global_block().ops if op.type == "Tanh")
    assert main.global_block().var(tanh.outputs[0]).dtype == "bfloat16"


def test_print_json_round_trip_and_clone_for_test(backend):
    main, startup, logits, loss, _, _ = _build("float16")
    text = str(main)
    assert "Cast(fc1.w; dtype='float16')" in text and "SeqLinear(x.float16, fc1.w.float16, fc1.b.float16" in text \
        and "ScaleLoss(" in text and "UpdateLossScale(" in text
    loaded = rg.Program.from_json(main.to_json())
    assert str(loaded) == text
    test = main.clone(for_test=True)
    types = [op.type for op in test.global_block().ops]
    assert "Cast" in types and "SeqLinear" in types
    assert not {"ScaleLoss", "AllFinite", "SelectUpdates", "UpdateLossScale", "AdamUpdate", "SGDUpdate"} & set(types)
    exe = backend.executor()
    exe.run(startup)
    xb, yb = _data()
    evaluated, = exe.run(test, feed={"x": xb, "y": yb}, fetch_list=[loss.name])
    trained, = exe.run(loaded, feed={"x": xb, "y": yb}, fetch_list=[loss.name])
    assert evaluated == trained          # the same forward, before the step's update


def test_memory_report_counts_low_precision_activations_at_their_size():
    main, *_ = _build("bfloat16")
    info = {v.name: v for v in rg.memory.report(main, feed_shapes={"x": (64, 8), "y": (64,)}).kept}
    low = [v for v in info.values() if v.dtype == "bfloat16" and v.nbytes is not None]
    assert low, "the backward keeps bfloat16 values"
    for v in low:
        assert v.nbytes == 2 * math.prod(v.shape), v


def test_decorate_rejects_bad_arguments():
    with pytest.raises(rg.ProgramError, match="bfloat16' or 'float16"):
        rg.amp.decorate(rg.optim.SGD(0.1), dtype="float64")
    with pytest.raises(rg.ProgramError, match="loss_scale"):
        rg.amp.decorate(rg.optim.SGD(0.1), dtype="float16", loss_scale=-1.0)
    with pytest.raises(rg.ProgramError, match="growth_interval"):
        rg.amp.decorate(rg.optim.SGD(0.1), dtype="float16", growth_interval=0)
    with pytest.raises(rg.ProgramError, match="wraps an rg.optim optimizer"):
        rg.amp.decorate("adam")


def test_ops_after_a_low_op_take_its_dtype_regression():
    """An op whose float inputs all share one dtype is not cast, but its outputs still follow the
    inputs' new dtype (a Transpose of a bfloat16 product was left declared float32)."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 8])
        t = rg.transpose(x @ rg.create_parameter("w", [8, 4]), [1, 0])
    rg.passes.cast_to_low_precision(main, "bfloat16", rg.amp.LOW, rg.amp.FLOAT32)
    assert t.dtype == "bfloat16"
    exe = rg.Executor()
    exe.run(startup)
    value, = exe.run(main, feed={"x": np.ones((2, 8), np.float32)}, fetch_list=[t])
    assert value.dtype.name == "bfloat16" and value.shape == (4, 2)


def test_onnx_export_has_cast_nodes_and_names_ops_onnxruntime_lacks(tmp_path):
    onnx = pytest.importorskip("onnx", reason="ONNX export needs onnx (pip install onnx onnxruntime)")
    ort = pytest.importorskip("onnxruntime", reason="the exported model runs in onnxruntime")
    xb, yb = _data()
    main, startup, logits, loss, _, _ = _build("float16", loss_scale=None)
    test = main.clone(for_test=True)
    exe = rg.Executor()
    exe.run(startup)
    expected, = exe.run(test, feed={"x": xb, "y": yb}, fetch_list=[logits.name])
    model = rg.onnx.export(test, tmp_path / "m.onnx", fetch_list=[logits.name], scope=exe.scope)
    casts = [n for n in model.graph.node if n.op_type == "Cast"]
    assert any(a.i == onnx.TensorProto.FLOAT16 for n in casts for a in n.attribute if a.name == "to")
    got, = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, {"x": xb})
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-3)
    main, startup, logits, *_ = _build("bfloat16")
    with pytest.raises(rg.BackendError, match=r"MatMul.*no onnxruntime kernel for bfloat16"):
        rg.onnx.export(main.clone(for_test=True), tmp_path / "b.onnx", fetch_list=[logits.name])


def test_loops_and_batch_norm_read_their_declared_dtypes(backend):
    """A while_loop reading a bfloat16 product from outside, and batch_norm (which writes its
    running statistics in place), get the values at the dtype they were built with."""
    if backend.name == "onnxruntime":
        pytest.skip("onnxruntime has no bfloat16 MatMul on the CPU")
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [4, 8])
        h = x @ rg.create_parameter("w", [8, 8])
        normed = rg.layers.batch_norm(h, name="bn")
        i0 = rg.constant(0)
        _, total = rg.while_loop(lambda i, acc: i < 3, lambda i, acc: (i + 1, acc + h), [i0, normed * 0.0])
        loss = rg.mean(total) + rg.mean(normed * normed)
        rg.amp.decorate(rg.optim.SGD(0.1), "bfloat16").minimize(loss)
    assert h.dtype == "float32" and any(v.dtype == "bfloat16" for v in main.global_block().vars.values())
    verify_program(main)
    exe = backend.executor()
    exe.run(startup)
    w = to_numpy(exe.scope.get("w")).copy()
    xb = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    loss_v, = exe.run(main, feed={"x": xb}, fetch_list=[loss])
    product = (xb.astype(ml_dtypes.bfloat16).astype(np.float32) @ w.astype(ml_dtypes.bfloat16).astype(np.float32))
    product = product.astype(ml_dtypes.bfloat16).astype(np.float32)
    normed = (product - product.mean(0)) / np.sqrt(product.var(0) + 1e-5)
    np.testing.assert_allclose(loss_v, 3 * product.mean() + (normed * normed).mean(), rtol=1e-5, atol=1e-5)
    assert to_numpy(exe.scope.get("bn.mean")).dtype == np.float32
