"""recurrent(..., recompute=<bytes>) and layers.lstm/gru/milstm(recompute=<bytes>): binomial
checkpointing over time steps. Gradients match store-all (exactly when the budget holds
everything; otherwise up to the regrouping of sums batched per segment), and the peak stays
within the budget plus the fixed inputs, parameters and gradients."""
from __future__ import annotations

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")

import retrograd as rg
from retrograd import Program
from retrograd.memory.loops.schedules import make_plan

N, D, H = 2, 3, 4


def _lstm_model(recompute, layer="lstm", loss_on="last", lengths=False, static_t=None):
    main, startup = Program(), Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [static_t or -1, N if static_t else -1, D], dtype="float64")
        sl = rg.data("sl", [-1], dtype="int64") if lengths else None
        build = {"lstm": rg.layers.lstm, "gru": rg.layers.gru, "milstm": rg.layers.milstm}[layer]
        outs = build(x, H, name="l", recompute=recompute, seq_lengths=sl)
        h_all, h_last = outs[0], outs[1]
        loss = rg.mean(h_all * h_all) if loss_on == "all" else rg.mean(h_last * h_last)
        params_grads = rg.append_backward(loss)
        dx, = rg.gradients(loss, x)
    return main, startup, loss, params_grads, dx


def _run(built, xb, seq_lengths=None):
    main, startup, loss, params_grads, dx = built
    exe = rg.Executor()
    exe.run(startup)
    feed = {"x": xb}
    if seq_lengths is not None:
        feed["sl"] = seq_lengths
    out = exe.run(main, feed=feed, fetch_list=[loss, dx] + [g for _, g in params_grads])
    return out, exe.last_stats.peak_bytes, exe


def _store_all_bytes(main, steps: int) -> int:
    """Bytes store-all keeps per RecurrentNetwork: (T+1) states and the full saved step values."""
    op = next(o for o in main.global_block().ops if o.type == "RecurrentNetwork")
    step = op.attrs["step"]
    size = lambda name: int(np.prod([N if d < 0 else d for d in step.var(name).shape])) * 8  # noqa: E731
    saved = sum(size(n) for n, full in zip(op.attrs["saved"], op.attrs["saved_full"]) if full)
    return steps * saved + (steps + 1) * sum(size(n) for n in op.attrs["states"])


def _assert_close(out, ref, exact=False):
    for a, b in zip(out, ref):
        if exact:
            np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-15 * max(1.0, float(np.abs(b).max())))


def test_lstm_t1000_five_percent_budget_matches_store_all_torch_and_fits():
    steps = 1000
    xb = np.random.RandomState(0).randn(steps, N, D)
    plain = _lstm_model(None)
    ref, peak_all, exe = _run(plain, xb)
    budget = int(0.05 * _store_all_bytes(plain[0], steps))
    built = _lstm_model(budget)
    out, peak, _ = _run(built, xb)
    _assert_close(out, ref)
    # An independent reference: torch.nn.LSTM with the same weights (b_hh = 0).
    lstm = torch.nn.LSTM(D, H, dtype=torch.float64)
    with torch.no_grad():
        lstm.weight_ih_l0.copy_(torch.tensor(exe.scope.get("l.w_ih").T))
        lstm.weight_hh_l0.copy_(torch.tensor(exe.scope.get("l.w_hh").T))
        lstm.bias_ih_l0.copy_(torch.tensor(exe.scope.get("l.b")))
        lstm.bias_hh_l0.zero_()
    x = torch.tensor(xb, requires_grad=True)
    _, (h_last, _) = lstm(x)
    loss = (h_last[0] ** 2).mean()
    loss.backward()
    np.testing.assert_allclose(out[0], loss.item(), rtol=1e-12)
    np.testing.assert_allclose(out[1], x.grad.numpy(), rtol=1e-8, atol=1e-14)
    grads = {p.name: g for (p, _), g in zip(built[3], out[2:])}
    np.testing.assert_allclose(grads["l.w_hh"], lstm.weight_hh_l0.grad.numpy().T, rtol=1e-8, atol=1e-14)
    # Memory: the budget plus what is there anyway (x, its projection and their gradients,
    # parameters and gradients, a few per-step temporaries) ...
    x_proj = steps * N * 4 * H * 8
    fixed = 2 * xb.nbytes + 2 * x_proj + 2 * 8 * (D * 4 * H + H * 4 * H + 4 * H) + 64 * N * 4 * H * 8
    assert peak <= budget + fixed
    # ... while storing everything holds about 20 times the budget more.
    assert peak_all - peak > 10 * budget


@pytest.mark.parametrize("layer", ["gru", "milstm"])
def test_gru_and_milstm_budgets_match_store_all(layer):
    steps = 200
    xb = np.random.RandomState(1).randn(steps, N, D)
    plain = _lstm_model(None, layer)
    ref, peak_all, _ = _run(plain, xb)
    store_all = _store_all_bytes(plain[0], steps)
    for fraction in (0.2, 0.05):
        out, peak, _ = _run(_lstm_model(int(fraction * store_all), layer), xb)
        _assert_close(out, ref)
        assert peak < peak_all


def test_budget_that_holds_everything_gives_identical_gradients():
    """Identical where no sum is regrouped: the recurrent weights' gradients (one segment, as
    store-all batches them). The input projection is made per step under a budget (its
    gradient sums per step instead of one GEMM): equal to rounding."""
    xb = np.random.RandomState(2).randn(60, N, D)
    built = _lstm_model(None)
    ref, _, _ = _run(built, xb)
    out, _, _ = _run(_lstm_model(10**9), xb)
    names = [p.name for p, _ in built[3]]
    for name, a, b in zip(["loss", "dx"] + names, out, ref):
        _assert_close([a], [b], exact=name in ("loss", "l.w_hh"))
    _assert_close(out, ref)


def test_budget_with_sequence_lengths():
    xb = np.random.RandomState(3).randn(80, N, D)
    lengths = np.array([80, 37])
    ref, _, _ = _run(_lstm_model(None, lengths=True), xb, lengths)
    store_all = _store_all_bytes(_lstm_model(None, lengths=True)[0], 80)
    out, _, _ = _run(_lstm_model(int(0.05 * store_all), lengths=True), xb, lengths)
    _assert_close(out, ref)


def test_budget_when_all_states_are_read_by_the_loss():
    xb = np.random.RandomState(4).randn(100, N, D)
    ref, _, _ = _run(_lstm_model(None, loss_on="all"), xb)
    for budget in (10**9, 3000):
        built = _lstm_model(budget, loss_on="all")
        out, _, _ = _run(built, xb)
        _assert_close(out, ref)        # the input projection is made per step: sums regrouped


def _rnn_with_encoder(recompute):
    """A tanh RNN whose step reads an outer value (an 'encoder output') and a parameter."""
    main, startup = Program(), Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, D], dtype="float64")
        enc = rg.data("enc", [-1, H], dtype="float64", stop_gradient=False)
        h0 = rg.data("h0", [-1, H], dtype="float64", stop_gradient=False)
        w = rg.create_parameter("w", [D, H], dtype="float64")
        u = rg.create_parameter("u", [H, H], dtype="float64")
        _, (h_last,) = rg.recurrent(lambda xs, hs: [rg.tanh(xs[0] @ w + hs[0] @ u + enc)],
                                    [x], [h0], recompute=recompute)
        loss = rg.mean(h_last * h_last)
        params_grads = rg.append_backward(loss)
        grads = rg.gradients(loss, [x, enc, h0])
    return main, startup, loss, [g for _, g in params_grads] + grads


def test_recurrent_with_tiny_budget_advances_from_checkpoints():
    steps = 300
    rng = np.random.RandomState(5)
    feed = {"x": rng.randn(steps, N, D), "enc": rng.randn(N, H) * 0.1, "h0": rng.randn(N, H)}
    results = []
    for recompute in (None, 3 * N * H * 8):          # room for a taped step and a checkpoint or two
        main, startup, loss, fetch = _rnn_with_encoder(recompute)
        exe = rg.Executor()
        exe.run(startup)
        rng_p = np.random.RandomState(6)
        exe.scope.set("w", rng_p.randn(D, H) * 0.5)
        exe.scope.set("u", rng_p.randn(H, H) * 0.5)
        extra = []
        if recompute is not None:
            op = next(o for o in main.global_block().ops if o.type == "RecurrentNetwork")
            extra = [op.outputs[-1]]
        results.append(exe.run(main, feed=feed, fetch_list=[loss] + fetch + extra))
    ref, out = results
    total, segment, slots, _ = (int(v) for v in out[-1][:4])
    plan = make_plan(total, segment, slots)
    assert total == steps and plan.advances > steps      # binomial: steps are advanced several times
    _assert_close(out[:-1], ref)


def test_too_small_budget_is_an_error_naming_the_minimum():
    xb = np.random.RandomState(7).randn(5, N, D)
    with pytest.raises(rg.ExecutionError, match=r"minimum budget is \d+ bytes"):
        _run(_lstm_model(100), xb)
    with pytest.raises(rg.ProgramError, match=r"minimum budget is \d+ bytes"):
        _lstm_model(100, static_t=5)                        # sizes known when the program is built
    with pytest.raises(rg.ProgramError, match=">= 0"):
        _lstm_model(-1)


def test_budgeted_lstm_inside_a_cond_branch():
    def build(recompute):
        main, startup = Program(), Program()
        with rg.program_guard(main, startup):
            x = rg.data("x", [-1, -1, D], dtype="float64")
            p = rg.data("p", [], dtype="bool")
            out = rg.cond(p, lambda: rg.layers.lstm(x, H, name="l", recompute=recompute)[1] * 1.0,
                          lambda: rg.layers.lstm(x, H, name="m")[1])
            loss = rg.mean(out * out)
            grads = [g for _, g in rg.append_backward(loss)]
        return main, startup, [loss] + grads

    xb = np.random.RandomState(8).randn(60, N, D)
    results = []
    for recompute in (None, 1500):
        main, startup, fetch = build(recompute)
        exe = rg.Executor()
        exe.run(startup)
        results.append(exe.run(main, feed={"x": xb, "p": np.array(True)}, fetch_list=fetch))
    _assert_close(results[1], results[0])


def test_budgeted_programs_round_trip_through_json():
    xb = np.random.RandomState(9).randn(40, N, D)
    built = _lstm_model(2000)
    out, _, exe = _run(built, xb)
    again = Program.from_json(built[0].to_json())
    fetch = [built[2].name, built[4].name] + [g.name for _, g in built[3]]
    out2 = exe.run(again, feed={"x": xb}, fetch_list=fetch)
    for a, b in zip(out2, out):
        np.testing.assert_array_equal(a, b)


def _inner_loop_rnn(recompute):
    """A recurrent step whose while_loop runs 2 iterations at step 0 and none at step 1."""
    main, startup = Program(), Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [2, 1, 3], dtype="float64", stop_gradient=False)
        h0 = rg.data("h0", [1, 3], dtype="float64", stop_gradient=False)
        w = rg.create_parameter("w", [3, 3], dtype="float64")

        def step(xs, hs):
            trips = rg.cast(rg.sum(xs[0]) > 0.0, "int64") * 2
            _, h = rg.while_loop(lambda i, h: i < trips, lambda i, h: (i + 1, rg.tanh(h @ w + xs[0])),
                                 [rg.constant(0), hs[0]])
            return [h]
        _, (h_last,) = rg.recurrent(step, [x], [h0], recompute=recompute)
        grads = rg.gradients(rg.sum(h_last * h_last), [x, h0, w])
    return main, grads


def test_bug5_budgeted_recurrent_with_per_step_while_trip_count():
    """Issue #10 bug 5: a per-step trip count made the budgeted backward fail to broadcast
    (0,1,3) into (2,1,3); it now matches store-all and torch."""
    rng = np.random.RandomState(3)
    xb = np.array([[[0.5, 0.2, 0.1]], [[-0.5, -0.2, -0.1]]])
    h0, wv = rng.randn(1, 3) * 0.3, rng.randn(3, 3) * 0.5
    outs = {}
    for recompute in (None, "steps", 4096, 200):
        main, grads = _inner_loop_rnn(recompute)
        exe = rg.Executor()
        exe.scope.set("w", wv)
        outs[recompute] = exe.run(main, feed={"x": xb, "h0": h0}, fetch_list=grads)
    for recompute in ("steps", 4096, 200):
        for a, b in zip(outs[recompute], outs[None]):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)
    x, h, w = (torch.tensor(v, requires_grad=True) for v in (xb, h0, wv))
    state = h
    for t in range(2):
        for _ in range(2 if xb[t].sum() > 0 else 0):
            state = torch.tanh(state @ w + x[t])
    (state * state).sum().backward()
    for a, ref in zip(outs[4096], (x.grad, h.grad, w.grad)):
        np.testing.assert_allclose(a, ref.numpy(), rtol=1e-10, atol=1e-14)


def test_per_op_budget_counts_the_hoisted_projection_and_batched_buffers():
    """Issue #14: a layer's per-op budget bounds everything the op keeps. The peak is the fixed
    part (x, dx, parameters, their gradients), the budget, and a few per-step values; the hoisted
    [T, N, 4H] projection and its gradient (each larger than the budget here) are gone."""
    steps = 200
    xb = np.random.RandomState(7).randn(steps, N, D)
    ref, _, _ = _run(_lstm_model(None), xb)
    projection = steps * N * 4 * H * 8
    budget = projection // 4
    built = _lstm_model(budget)
    out, peak, _ = _run(built, xb)
    params = sum(int(np.prod(p.shape)) * 8 for p, _ in built[3])
    fixed = 2 * xb.nbytes + 2 * params
    assert peak <= fixed + budget + 40 * N * 4 * H * 8
    assert not any(op.type == "SeqLinear" for op in built[0].global_block().ops)
    _assert_close(out, ref)
