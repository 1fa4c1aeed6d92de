"""Shape stand-ins (memory/shape_reads.py): a gradient op reading a forward value only for its shape
(the ``like`` of ExpandAs / SumTo) reads a one-element ``ShapeStandIn`` written right after the value,
so the value dies at its last real use in the forward instead of living into the backward."""
from __future__ import annotations

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")

import retrograd as rg
from retrograd.autodiff.rewrites import BACKWARD_REWRITES
from retrograd.ir.verify import verify_program
from retrograd.ops.array.creation import shape_stand_in

N, D, B = 256, 16, 1024
RNG = np.random.RandomState(0)
XB = RNG.randn(N, D)


@pytest.fixture
def no_stand_ins(monkeypatch):
    """Build backward passes the way they were built before the pass: shape reads keep values."""
    monkeypatch.setitem(BACKWARD_REWRITES, "shape_stand_ins", lambda block, n_forward: 0)


def _wide_mlp(checkpoints=None):
    """tanh layers around a wide [N, B] activation that only a mean consumes; one SGD step."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, D], dtype="float64")
        h = rg.layers.fc(x, D, act="tanh", name="fc1")
        w = rg.create_parameter("wide.w", [D, B], dtype="float64")
        wide = h @ w                                   # its gradient reads h and w, mean's reads its shape
        m = rg.mean(wide)
        h2 = rg.layers.fc(h, D, act="tanh", name="fc2")
        out = rg.layers.fc(h2, D, act="tanh", name="fc3")
        loss = m + rg.mean(out * out)
        params_grads = rg.optim.SGD(0.1).minimize(loss, checkpoints=checkpoints([h, h2]) if checkpoints else None)
    verify_program(main)
    return main, startup, loss, params_grads, wide


def _train_step(built):
    main, startup, loss, params_grads, _ = built
    exe = rg.Executor()
    exe.run(startup)
    params = {p.name: np.array(exe.scope.get(p.name)) for p, _ in params_grads}
    values = exe.run(main, feed={"x": XB}, fetch_list=[loss] + [g for _, g in params_grads])
    grads = {p.name: g for (p, _), g in zip(params_grads, values[1:])}
    return values[0], grads, params, exe.last_stats.peak_bytes


def _torch_grads(params):
    t = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    h = torch.tanh(torch.tensor(XB) @ t["fc1.w"] + t["fc1.b"])
    out = torch.tanh(torch.tanh(h @ t["fc2.w"] + t["fc2.b"]) @ t["fc3.w"] + t["fc3.b"])
    loss = (h @ t["wide.w"]).mean() + (out * out).mean()
    loss.backward()
    return loss.item(), {k: v.grad.numpy() for k, v in t.items()}


def test_mean_of_a_wide_activation_no_longer_holds_it_into_the_backward(request):
    with_stand_ins = _wide_mlp()
    block = with_stand_ins[0].global_block()
    wide = with_stand_ins[4]
    stand_in = next(op for op in block.ops if op.type == "ShapeStandIn" and op.inputs == [wide.name])
    producer = next(i for i, op in enumerate(block.ops) if wide.name in op.outputs)
    assert block.ops[producer + 1] is stand_in                   # written right after the value
    assert not any(wide.name in op.inputs for op in block.ops if op.type == "ExpandAs")

    loss, grads, params, peak = _train_step(with_stand_ins)
    request.getfixturevalue("no_stand_ins")
    old_loss, old_grads, _, old_peak = _train_step(_wide_mlp())
    assert loss == old_loss
    for name in grads:
        np.testing.assert_array_equal(grads[name], old_grads[name])   # bit-identical
    # The wide value (N*B doubles) no longer lives next to its gradient at the backward's peak.
    assert old_peak - peak > 0.9 * N * B * 8
    ref_loss, ref_grads = _torch_grads(params)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-12)
    for name, ref in ref_grads.items():
        np.testing.assert_allclose(grads[name], ref, rtol=1e-10, atol=1e-14)


def test_the_report_counts_a_value_read_for_its_shape_as_not_kept(request):
    built = _wide_mlp()
    wide = built[4]
    r = rg.memory.report(built[0], feed_shapes={"x": (N, D)})
    assert r.value(wide.name) is None                            # neither kept nor recomputed
    row = r.value(f"{wide.name}.shape")
    assert (row.status, row.nbytes, row.shape) == ("shape only", 8, (N, B))
    request.getfixturevalue("no_stand_ins")
    old = rg.memory.report(_wide_mlp()[0], feed_shapes={"x": (N, D)})
    assert old.value(wide.name).status == "kept"
    assert old.kept_bytes - r.kept_bytes == N * B * 8 + N * D * 8   # the wide value and out*out


def test_checkpoint_recompute_does_not_recompute_values_for_their_shape(request, mm):
    """With checkpoints the stand-in is kept (one element): recompute copies never rebuild a value
    just for its shape, gradients equal store-all's, and the peak stays below the old one."""
    built = _wide_mlp(checkpoints=lambda hs: [hs[1]])      # the segment up to h2 holds the wide value
    wide = built[4]
    recomputed = {name for op in mm.recompute_ops(built[0]) for name in op.attrs["recompute_of"]}
    assert recomputed and wide.name not in recomputed
    loss, grads, params, peak = _train_step(built)
    ref_loss, ref_grads = _torch_grads(params)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-12)
    for name, ref in ref_grads.items():
        np.testing.assert_allclose(grads[name], ref, rtol=1e-10, atol=1e-14)
    store_all = _train_step(_wide_mlp())
    assert store_all[0] == loss
    for name in grads:
        np.testing.assert_array_equal(grads[name], store_all[1][name])
    request.getfixturevalue("no_stand_ins")
    old = _wide_mlp(checkpoints=lambda hs: [hs[1]])
    assert wide.name in {n for op in mm.recompute_ops(old[0]) for n in op.attrs["recompute_of"]}
    assert _train_step(old)[3] - peak > 0.9 * N * B * 8


def test_hessian_vector_products_through_shape_reads_match_torch():
    """Second order through mean and broadcast adds (ExpandAs / SumTo read shapes): the first
    backward reads stand-ins, the second differentiates it and reads stand-ins of its own values."""
    xv, wv, bv, vv = RNG.randn(5, 3), RNG.randn(3, 4), RNG.randn(4), RNG.randn(3, 4)
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3], dtype="float64")
        w = rg.data("w", [3, 4], dtype="float64", stop_gradient=False)
        b = rg.data("b", [4], dtype="float64", stop_gradient=False)
        v = rg.data("v", [3, 4], dtype="float64")
        z = x @ w + b
        loss = rg.mean(rg.tanh(z) * z) + rg.mean(z)
        gw, gb = rg.gradients(loss, [w, b])
        hvp_w, hvp_b = rg.gradients(rg.sum(gw * v) + rg.sum(gb), [w, b])
    verify_program(main)
    stand_ins = [op for op in main.global_block().ops if op.type == "ShapeStandIn"]
    assert stand_ins and all(op.inputs[0] not in {s.outputs[0] for s in stand_ins} for op in stand_ins)
    out = rg.Executor().run(main, feed={"x": xv, "w": wv, "b": bv, "v": vv}, fetch_list=[gw, gb, hvp_w, hvp_b])
    tw, tb = torch.tensor(wv, requires_grad=True), torch.tensor(bv, requires_grad=True)
    tz = torch.tensor(xv) @ tw + tb
    tloss = (torch.tanh(tz) * tz).mean() + tz.mean()
    dw, db = torch.autograd.grad(tloss, [tw, tb], create_graph=True)
    hw, hb = torch.autograd.grad((dw * torch.tensor(vv)).sum() + db.sum(), [tw, tb])
    for ours, ref in zip(out, [dw, db, hw, hb]):
        np.testing.assert_allclose(ours, ref.detach().numpy(), rtol=1e-10, atol=1e-13)


def test_no_stand_in_where_it_would_not_shorten_a_life():
    """Values read in full after their shape read (Tanh's gradient reads its output), scalars,
    fed values and parameters keep being read as they are."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3], dtype="float64")
        w = rg.create_parameter("w", [3, 3], dtype="float64")
        b = rg.create_parameter("b", [3], dtype="float64")
        h = rg.tanh(x @ w + b)                       # SumTo(., b): b is a parameter
        loss = rg.mean(h) + rg.mean(x)               # ExpandAs(., h): h read in full later
        rg.append_backward(loss)
    block = main.global_block()
    assert "ShapeStandIn" not in {op.type for op in block.ops}
    assert any(op.type == "ExpandAs" and op.inputs[1] == h.name for op in block.ops)
    assert any(op.type == "FillLike" and op.inputs[0] == loss.name for op in block.ops)   # a scalar


def test_a_program_with_stand_ins_round_trips_through_json():
    built = _wide_mlp()
    main, startup, loss, params_grads, _ = built
    loaded = rg.Program.from_json(main.to_json())
    assert "ShapeStandIn" in {op.type for op in loaded.global_block().ops}
    fetch = [loss.name] + [g.name for _, g in params_grads]
    results = []
    for program in (main, loaded):
        exe = rg.Executor()
        exe.run(startup)
        results.append(exe.run(program, feed={"x": XB}, fetch_list=fetch))
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def test_the_stand_in_holds_one_element_of_the_right_shape_and_dtype():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 7], dtype="float32")
        s = shape_stand_in(x * 2.0)
    value, = rg.Executor().run(main, feed={"x": np.ones((5, 7), "float32")}, fetch_list=[s])
    assert value.shape == (5, 7) and value.dtype == np.float32 and not value.any()
    assert value.strides == (0, 0)
