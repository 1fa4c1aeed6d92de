"""append_backward(checkpoints=...): same gradients as storing everything, less memory."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")

import retrograd as rg
from retrograd import Program


def _torch_mlp_grads(xb, params, masks=None, residual=False):
    x = torch.tensor(xb)
    ws = [torch.tensor(p, requires_grad=True) for p in params]
    h = x
    for i, w in enumerate(ws):
        z = torch.tanh(h @ w)
        if masks is not None:
            z = z * torch.tensor(masks[i])
        h = h + z if residual else z
    loss = (h * h).mean()
    loss.backward()
    return loss.item(), [w.grad.numpy() for w in ws]


def test_checkpointed_mlp_gives_store_all_gradients_exactly_float64(mm):
    xb = np.random.RandomState(0).randn(16, 32)
    ref_loss, ref, _, _ = mm.run_grads(mm.mlp(8, 32), xb)
    built = mm.mlp(8, 32, pick=lambda hs: [hs[1], hs[4]])
    loss, grads, _, _ = mm.run_grads(built, xb)
    assert len(mm.recompute_ops(built[0])) > 0
    assert loss == ref_loss
    for name in ref:
        np.testing.assert_array_equal(grads[name], ref[name])
    # ... and both agree with PyTorch autograd.
    exe = rg.Executor()
    mm.init_params(exe, built[0])
    params = [exe.scope.get(f"w{i}") for i in range(8)]
    t_loss, t_grads = _torch_mlp_grads(xb, params)
    np.testing.assert_allclose(loss, t_loss, rtol=1e-12)
    for i, g in enumerate(t_grads):
        np.testing.assert_allclose(grads[f"w{i}"], g, rtol=1e-10, atol=1e-14)


def test_checkpointed_mlp_float32_within_1e_6(mm):
    xb = np.random.RandomState(1).randn(16, 32).astype("float32")
    _, ref, _, _ = mm.run_grads(mm.mlp(8, 32, dtype="float32"), xb)
    _, grads, _, _ = mm.run_grads(mm.mlp(8, 32, dtype="float32", pick=lambda hs: [hs[2], hs[5]]), xb)
    for name in ref:
        np.testing.assert_allclose(grads[name], ref[name], rtol=1e-6, atol=1e-6 * np.abs(ref[name]).max())


def test_checkpoints_lower_peak_bytes(mm):
    xb = np.random.RandomState(2).randn(512, 64)
    _, ref, _, peak_all = mm.run_grads(mm.mlp(16, 64), xb)
    _, grads, _, peak_ck = mm.run_grads(mm.mlp(16, 64, pick=lambda hs: hs[3:15:4]), xb)
    for name in ref:
        np.testing.assert_array_equal(grads[name], ref[name])
    act = xb.nbytes
    # Store-all holds all 16 activations at the turn; with 3 checkpoints every 4 layers
    # the backward holds about 3 checkpoints + 4 tail + 1 segment of 3.
    assert peak_all - peak_ck > 5 * act


def _dropout_masks(program: Program):
    ops = [op for op in program.global_block().ops if op.type == "Dropout"]
    forward = [op.outputs[1] for op in ops if "recompute_of" not in op.attrs]
    copies = {op.attrs["recompute_of"][1]: op.outputs[1] for op in ops if "recompute_of" in op.attrs}
    return forward, copies


def test_dropout_in_recomputed_segments_replays_the_same_masks(mm):
    xb = np.random.RandomState(3).randn(32, 16)
    plain = mm.mlp(4, 16, dropout=0.5)
    masks, _ = _dropout_masks(plain[0])
    _, ref, ref_masks, _ = mm.run_grads(plain, xb, extra_fetch=masks)
    built = mm.mlp(4, 16, dropout=0.5, pick=lambda hs: [hs[2]])
    forward, copies = _dropout_masks(built[0])
    assert sorted(copies) == forward[:3]           # the masks of layers 0..2 are recomputed
    _, grads, fetched, _ = mm.run_grads(built, xb, extra_fetch=forward + [copies[m] for m in forward[:3]])
    fwd_masks, rc_masks = fetched[:4], fetched[4:]
    for a, b in zip(fwd_masks[:3], rc_masks):
        np.testing.assert_array_equal(a, b)        # bit-identical replay
    for a, b in zip(fwd_masks, ref_masks):
        np.testing.assert_array_equal(a, b)        # same seeds, same run id: same draws
    assert 0 < np.mean(fwd_masks[0] == 0) < 1
    for name in ref:
        np.testing.assert_array_equal(grads[name], ref[name])
    exe = rg.Executor()
    mm.init_params(exe, built[0])
    _, t_grads = _torch_mlp_grads(xb, [exe.scope.get(f"w{i}") for i in range(4)], masks=fwd_masks)
    for i, g in enumerate(t_grads):
        np.testing.assert_allclose(grads[f"w{i}"], g, rtol=1e-10, atol=1e-14)


def test_dropout_masks_differ_between_runs_but_match_within_one(mm):
    built = mm.mlp(3, 8, dropout=0.5, pick=lambda hs: [hs[1]])
    forward, copies = _dropout_masks(built[0])
    exe = rg.Executor()
    mm.init_params(exe, built[0])
    xb = np.ones((64, 8))
    first = exe.run(built[0], feed={"x": xb}, fetch_list=[forward[0], copies[forward[0]]])
    second = exe.run(built[0], feed={"x": xb}, fetch_list=[forward[0], copies[forward[0]]])
    np.testing.assert_array_equal(first[0], first[1])
    np.testing.assert_array_equal(second[0], second[1])
    assert not np.array_equal(first[0], second[0])


def test_residual_blocks_keep_values_that_cross_segments(mm):
    xb = np.random.RandomState(4).randn(8, 16)
    _, ref, _, _ = mm.run_grads(mm.mlp(6, 16, residual=True), xb)
    built = mm.mlp(6, 16, residual=True, pick=lambda hs: [hs[1], hs[3]])
    _, grads, _, _ = mm.run_grads(built, xb)
    for name in ref:
        np.testing.assert_array_equal(grads[name], ref[name])
    exe = rg.Executor()
    mm.init_params(exe, built[0])
    _, t_grads = _torch_mlp_grads(xb, [exe.scope.get(f"w{i}") for i in range(6)], residual=True)
    for i, g in enumerate(t_grads):
        np.testing.assert_allclose(grads[f"w{i}"], g, rtol=1e-10, atol=1e-14)


def test_unusable_checkpoints_warn_naming_them_and_are_ignored(mm):
    xb = np.random.RandomState(5).randn(8, 16)
    _, ref, _, _ = mm.run_grads(mm.mlp(4, 16), xb)
    other = Program()
    with rg.program_guard(other, Program()):
        stranger = rg.data("stranger", [3])

    def pick(hs):
        with rg.program_guard(hs[0].block.program, Program()):
            side = rg.exp(hs[0].block.var("x"))   # computed, but the loss does not use it
        return ["no_such_var", "x", "w1", side, stranger, hs[1]]

    with pytest.warns(UserWarning) as record:
        built = mm.mlp(4, 16, pick=pick)
    message = " ".join(str(w.message) for w in record)
    for name in ("no_such_var", "'x'", "'w1'", "exp_0", "stranger"):
        assert name in message
    assert "tanh_1" not in message
    copies = mm.recompute_ops(built[0])
    assert {name for op in copies for name in op.attrs["recompute_of"]} == {"matmul_0", "tanh_0"}
    _, grads, _, _ = mm.run_grads(built, xb)
    for name in ref:
        np.testing.assert_array_equal(grads[name], ref[name])


def test_only_bad_checkpoints_leave_the_backward_unchanged(mm):
    with pytest.warns(UserWarning, match="nothing_here"):
        built = mm.mlp(3, 4, checkpoints=["nothing_here"])
    plain = mm.mlp(3, 4)
    assert str(built[0]) == str(plain[0])


def test_checkpoints_are_sorted_and_deduplicated(mm):
    a = mm.mlp(6, 8, pick=lambda hs: [hs[4], hs[1], hs[4]])
    b = mm.mlp(6, 8, pick=lambda hs: [hs[1].name, hs[4].name])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = mm.mlp(6, 8, pick=lambda hs: hs[1])    # a single Var is accepted too
    assert str(a[0]) == str(b[0])
    assert len(mm.recompute_ops(c[0])) == 2


def test_recompute_ops_sit_just_before_their_first_reader(mm):
    main = mm.mlp(8, 8, pick=lambda hs: [hs[1], hs[3], hs[5]])[0]
    ops = main.global_block().ops
    groups, i = [], 0
    while i < len(ops):
        if "recompute_of" in ops[i].attrs:
            start = i
            while "recompute_of" in ops[i].attrs:
                i += 1
            groups.append((start, i))
        i += 1
    assert len(groups) == 3
    for start, stop in groups:
        written = {n for op in ops[start:stop] for n in op.outputs}
        assert written & set(ops[stop].inputs)     # the next op needs the recomputation
        assert not any(written & set(op.inputs) for op in ops[:start])
    # No gradient op reads a recomputed value's forward original any more.
    originals = {n for op in ops if "recompute_of" in op.attrs for n in op.attrs["recompute_of"]}
    seed = next(i for i, op in enumerate(ops) if op.type == "FillLike")
    assert not any(originals & set(op.inputs) for op in ops[seed:] if "recompute_of" not in op.attrs)


def test_recompute_program_round_trips_through_json(mm):
    xb = np.random.RandomState(6).randn(4, 8)
    built = mm.mlp(5, 8, dropout=0.2, pick=lambda hs: [hs[2]])
    _, grads, _, _ = mm.run_grads(built, xb)
    again = Program.from_json(built[0].to_json())
    exe = rg.Executor()
    mm.init_params(exe, again)
    out = exe.run(again, feed={"x": xb}, fetch_list=[g.name for _, g in built[3]])
    for (p, _), g in zip(built[3], out):
        np.testing.assert_array_equal(g, grads[p.name])


def test_auto_checkpoints_keep_gradients_and_lower_the_peak(mm):
    xb = np.random.RandomState(7).randn(256, 32)
    _, ref, _, peak_all = mm.run_grads(mm.mlp(24, 32), xb)
    built = mm.mlp(24, 32, checkpoints="auto")
    _, grads, _, peak_auto = mm.run_grads(built, xb)
    assert len(mm.recompute_ops(built[0])) > 0
    for name in ref:
        np.testing.assert_array_equal(grads[name], ref[name])
    # sqrt(24) ~ 5 checkpoints + a segment of ~5 instead of 24 activations.
    assert peak_all - peak_auto > 10 * xb.nbytes


def test_fetching_a_recomputed_value_still_gives_the_forward_value(mm):
    built = mm.mlp(4, 8, pick=lambda hs: [hs[2]])
    exe = rg.Executor()
    mm.init_params(exe, built[0])
    xb = np.random.RandomState(8).randn(3, 8)
    h0, = exe.run(built[0], feed={"x": xb}, fetch_list=[built[4][0]])
    np.testing.assert_allclose(h0, np.tanh(xb @ exe.scope.get("w0")), rtol=1e-12)


# --- control flow inside recomputed segments ------------------------------------------------------

def _control_flow_model(kind: str, checkpoints: bool):
    """x -> h0 -> [cond | while | while with a nested cond] -> h2 -> h3 -> loss; checkpoint h2."""
    main, startup = Program(), Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 8], dtype="float64")
        n = rg.data("n", [], dtype="int64")
        ws = [rg.create_parameter(f"w{i}", [8, 8], dtype="float64") for i in range(4)]
        h0 = rg.tanh(x @ ws[0])
        if kind == "cond":
            h1 = rg.cond(rg.sum(h0) > 0.0, lambda: rg.tanh(h0 @ ws[1]), lambda: rg.sigmoid(h0 @ ws[1]) * h0)
        elif kind == "while":
            _, h1 = rg.while_loop(lambda i, h: i < n, lambda i, h: (i + 1, rg.tanh(h @ ws[1]) + h0),
                                  [rg.constant(0), h0])
        else:  # a cond nested in the loop body, reading the recomputed h0 from two levels up
            def body(i, h):
                g = rg.cond(rg.sum(h) > 0.0, lambda: rg.tanh(h @ ws[1]) * h0, lambda: h - h0)
                return i + 1, g
            _, h1 = rg.while_loop(lambda i, h: i < n, body, [rg.constant(0), h0])
        h2 = rg.tanh(h1 @ ws[2])
        h3 = rg.tanh(h2 @ ws[3])
        loss = rg.mean(h3 * h3)
        params_grads = rg.append_backward(loss, checkpoints=[h2] if checkpoints else None)
    return main, loss, params_grads


def _run_control_flow(main, loss, params_grads, xb, n):
    exe = rg.Executor()
    rng = np.random.RandomState(0)
    for p in main.all_parameters():
        exe.scope.set(p.name, rng.randn(8, 8) * 0.5)
    out = exe.run(main, feed={"x": xb, "n": np.array(n)}, fetch_list=[loss] + [g for _, g in params_grads])
    params = [exe.scope.get(f"w{i}") for i in range(4)]
    return out, params


def _torch_control_flow(kind, xb, n, params):
    x = torch.tensor(xb)
    ws = [torch.tensor(p, requires_grad=True) for p in params]
    h0 = torch.tanh(x @ ws[0])
    if kind == "cond":
        h1 = torch.tanh(h0 @ ws[1]) if h0.sum() > 0 else torch.sigmoid(h0 @ ws[1]) * h0
    else:
        h1 = h0
        for _ in range(n):
            if kind == "while":
                h1 = torch.tanh(h1 @ ws[1]) + h0
            else:
                h1 = torch.tanh(h1 @ ws[1]) * h0 if h1.sum() > 0 else h1 - h0
    h3 = torch.tanh(torch.tanh(h1 @ ws[2]) @ ws[3])
    loss = (h3 * h3).mean()
    loss.backward()
    return [np.zeros(w.shape) if w.grad is None else w.grad.numpy() for w in ws]


@pytest.mark.parametrize("kind,n,seed", [("cond", 0, 0), ("cond", 0, 3), ("while", 3, 0), ("while", 0, 0),
                                         ("nested", 4, 1)])
def test_control_flow_inside_a_recomputed_segment(kind, n, seed):
    xb = np.random.RandomState(seed).randn(5, 8)
    ref, _ = _run_control_flow(*_control_flow_model(kind, False), xb, n)
    main, loss, params_grads = _control_flow_model(kind, True)
    copies = [op for op in main.global_block().ops if "recompute_of" in op.attrs]
    assert any(op.sub_blocks() for op in copies)        # the control-flow op itself is recomputed
    out, params = _run_control_flow(main, loss, params_grads, xb, n)
    for a, b in zip(out, ref):
        np.testing.assert_array_equal(a, b)
    grads = {p.name: g for (p, _), g in zip(params_grads, out[1:])}
    for i, g in enumerate(_torch_control_flow(kind, xb, n, params)):
        np.testing.assert_allclose(grads[f"w{i}"], g, rtol=1e-10, atol=1e-13)
    again = Program.from_json(main.to_json())          # clones of sub-blocks survive a round trip
    assert str(again) == str(main)
