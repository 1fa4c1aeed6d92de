"""Budgeted recurrent networks and while loops follow the running plan (``KernelCtx.live_outputs``):

* a ``<state>_all`` that the plan fetches is computed (it used to be a NaN placeholder when no op
  read it), and one nobody fetches or reads is not materialised;
* a run that does not need the gradient (fetching only the loss of a program with a backward)
  keeps no checkpoints: its peak is the forward's, whatever the length of the sequence or loop.
"""
from __future__ import annotations

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")

import retrograd as rg
from retrograd.testing import build_program, started_executor

F64 = "float64"
RNG = np.random.default_rng(11)


def build(fn):
    main, startup, out = build_program(fn)
    return main, started_executor(startup), out


def run(exe, main, feed, fetch):
    values = exe.run(main, feed=feed, fetch_list=fetch)
    return values, exe.last_stats.peak_bytes


# --- a budgeted LSTM: fetching <state>_all ------------------------------------------------------------

N, D, H, T = 3, 4, 5, 40
XB = RNG.standard_normal((T, N, D))


def _lstm(recompute):
    def fn():
        x = rg.data("x", [-1, N, D], dtype=F64, stop_gradient=False)
        h_all, h_last, c_all, c_last = rg.layers.lstm(x, H, name="l", recompute=recompute)
        loss = rg.mean(h_last * h_last)                       # nothing in the program reads h_all, c_all
        grads = [g for _, g in rg.append_backward(loss)] + rg.gradients(loss, x)
        return loss, grads, h_all, c_all
    return build(fn)


def _torch_lstm(exe):
    lstm = torch.nn.LSTM(D, H, dtype=torch.float64)
    with torch.no_grad():
        lstm.weight_ih_l0.copy_(torch.tensor(exe.scope.get("l.w_ih").T))
        lstm.weight_hh_l0.copy_(torch.tensor(exe.scope.get("l.w_hh").T))
        lstm.bias_ih_l0.copy_(torch.tensor(exe.scope.get("l.b")))
        lstm.bias_hh_l0.zero_()
    x = torch.tensor(XB, requires_grad=True)
    h_all, (h_last, _) = lstm(x)
    loss = (h_last[0] ** 2).mean()
    loss.backward()
    return h_all.detach().numpy(), loss.item(), x.grad.numpy()


@pytest.mark.parametrize("with_grads", [True, False], ids=["training", "inference"])
def test_fetched_all_states_of_a_budgeted_lstm_are_computed(with_grads):
    main, exe, (loss, grads, h_all, c_all) = _lstm(recompute=3000)
    ref_main, ref_exe, (ref_loss, ref_grads, ref_h_all, ref_c_all) = _lstm(recompute=None)
    fetch = [loss, h_all, c_all] + (grads if with_grads else [])
    ours, _ = run(exe, main, {"x": XB}, fetch)
    ref, _ = run(ref_exe, ref_main, {"x": XB}, [ref_loss, ref_h_all, ref_c_all] + (ref_grads if with_grads else []))
    assert ours[1].shape == ours[2].shape == (T, N, H)
    assert np.isfinite(ours[1]).all() and np.isfinite(ours[2]).all()
    for a, b in zip(ours[:3], ref[:3]):
        np.testing.assert_array_equal(a, b)                   # the same forward computation
    torch_h_all, torch_loss, torch_dx = _torch_lstm(exe)
    np.testing.assert_allclose(ours[1], torch_h_all, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(ours[0], torch_loss, rtol=1e-12)
    if with_grads:
        for a, b in zip(ours[3:], ref[3:]):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-15)
        np.testing.assert_allclose(ours[-1], torch_dx, rtol=1e-8, atol=1e-14)
        # Fetching the states changes no gradient.
        plain, _ = run(exe, main, {"x": XB}, [loss] + grads)
        for a, b in zip(plain[1:], ours[3:]):
            np.testing.assert_array_equal(a, b)


# --- a tanh RNN with the loss on its last state -----------------------------------------------------

RN, RD, RH = 4, 3, 64
RWX = RNG.standard_normal((RD, RH)) * 0.3
RWH = RNG.standard_normal((RH, RH)) * 0.1
RX_ROW = RNG.standard_normal((1, RN, RD))
RH0 = RNG.standard_normal((RN, RH)) * 0.1
RNN_BUDGET = 30 * RN * RH * 8


def _tanh_rnn(grad: bool, recompute=RNN_BUDGET):
    def fn():
        x = rg.data("x", [-1, RN, RD], dtype=F64, stop_gradient=False)
        h0 = rg.data("h0", [RN, RH], dtype=F64)
        wx = rg.create_parameter("wx", [RD, RH], dtype=F64, init=RWX)
        wh = rg.create_parameter("wh", [RH, RH], dtype=F64, init=RWH)
        (h_all,), (h_last,) = rg.recurrent(lambda xs, hs: [rg.tanh(xs[0] @ wx + hs[0] @ wh)], [x], [h0],
                                           recompute=recompute)
        loss = rg.mean(h_last * h_last)
        return loss, (rg.gradients(loss, [x, wx, wh]) if grad else []), h_all
    return build(fn)


def _rnn_feed(steps, x=None):
    # A zero-stride view: the fed sequence costs the same for any T, so peaks show what the op keeps.
    return {"x": np.broadcast_to(RX_ROW, (steps, RN, RD)) if x is None else x, "h0": RH0}


def _torch_rnn(xv):
    x, wx, wh = (torch.tensor(np.asarray(a), requires_grad=True) for a in (xv, RWX, RWH))
    h = torch.tensor(RH0)
    states = []
    for step in range(xv.shape[0]):
        h = torch.tanh(x[step] @ wx + h @ wh)
        states.append(h)
    loss = (h * h).mean()
    return loss.item(), [g.numpy() for g in torch.autograd.grad(loss, [x, wx, wh])], torch.stack(states)


def test_an_unfetched_all_is_never_materialised_and_a_fetched_one_is():
    main, exe, (loss, grads, h_all) = _tanh_rnn(grad=True)
    steps = 300
    xv = np.ascontiguousarray(_rnn_feed(steps)["x"])
    (lv, *gs), peak = run(exe, main, _rnn_feed(steps, xv), [loss] + grads)
    (lv2, all_v, *gs2), peak_all = run(exe, main, _rnn_feed(steps, xv), [loss, h_all] + grads)
    assert peak_all - peak >= (steps + 1) * RN * RH * 8        # the (T+1) x N x H states tensor
    tl, tg, t_states = _torch_rnn(xv)
    np.testing.assert_allclose(all_v, t_states.detach().numpy(), rtol=1e-12, atol=1e-15)
    assert lv == lv2
    np.testing.assert_allclose(lv, tl, rtol=1e-12)
    for ours, again, ref in zip(gs, gs2, tg):
        np.testing.assert_array_equal(ours, again)
        np.testing.assert_allclose(ours, ref, rtol=1e-9, atol=1e-14)


def test_a_schedule_promising_states_the_backward_did_not_receive_is_an_error_not_nan():
    """The backward reads the forward's states tensors only when it was built to receive them; a
    tampered program whose forward promises them anyway fails with a clear ExecutionError."""
    main, exe, (loss, grads, h_all) = _tanh_rnn(grad=True)
    op = next(o for o in main.global_block().ops if o.type == "RecurrentNetwork")
    assert op.attrs["budget_all"] == [False]
    grad_op = next(o for o in main.global_block().ops if o.type == "RecurrentNetworkBudgetGrad")
    assert grad_op.attrs["alls_given"] is False and op.outputs[0] not in grad_op.inputs
    op.attrs["budget_all"] = [True]
    main.bump()
    with pytest.raises(rg.ExecutionError, match="states tensors"):
        exe.run(main, feed=_rnn_feed(10), fetch_list=[loss] + grads)


def test_budgeted_recurrent_run_for_inference_keeps_no_checkpoints():
    plain, plain_exe, (plain_loss, _, _) = _tanh_rnn(grad=False)
    main, exe, (loss, grads, _) = _tanh_rnn(grad=True)
    peaks = {}
    for steps in (10, 600):
        (ref,), ref_peak = run(plain_exe, plain, _rnn_feed(steps), [plain_loss])
        (ours,), peaks[steps] = run(exe, main, _rnn_feed(steps), [loss])
        assert ours == ref and peaks[steps] == ref_peak
    assert peaks[10] == peaks[600]
    # Training in the same executor: checkpoints are kept (more memory), gradients as before.
    xv = np.ascontiguousarray(_rnn_feed(100)["x"]) + RNG.standard_normal((100, RN, RD))
    (lv, *gs), train_peak = run(exe, main, _rnn_feed(100, xv), [loss] + grads)
    assert train_peak > peaks[600] + 2 * RN * RH * 8
    store, store_exe, (store_loss, store_grads, _) = _tanh_rnn(grad=True, recompute=None)
    (sl, *sgs), _ = run(store_exe, store, _rnn_feed(100, xv), [store_loss] + store_grads)
    tl, tg, _ = _torch_rnn(xv)
    assert lv == sl
    np.testing.assert_allclose(lv, tl, rtol=1e-12)
    for ours, stored, ref in zip(gs, sgs, tg):
        np.testing.assert_allclose(ours, stored, rtol=1e-11, atol=1e-16)
        np.testing.assert_allclose(ours, ref, rtol=1e-9, atol=1e-14)


# --- a budgeted while_loop ------------------------------------------------------------------------------

X0 = RNG.standard_normal((8, 32)) * 0.5
W0 = RNG.standard_normal((32, 32)) * 0.2
LOOP_BUDGET = 20 * X0.nbytes


def _loop(grad: bool, recompute=LOOP_BUDGET):
    def fn():
        x = rg.data("x", [8, 32], dtype=F64, stop_gradient=False)
        n = rg.data("n", [], dtype="int64")
        w = rg.create_parameter("w", [32, 32], dtype=F64, init=W0)
        _, h = rg.while_loop(lambda i, h: i < n, lambda i, h: (i + 1, h + 0.1 * rg.tanh(h @ w)),
                             [rg.constant(0), x], recompute=recompute)
        loss = rg.mean(h * h)
        return loss, (rg.gradients(loss, [x, w]) if grad else [])
    return build(fn)


def _torch_loop(n):
    x, w = torch.tensor(X0, requires_grad=True), torch.tensor(W0, requires_grad=True)
    h = x
    for _ in range(n):
        h = h + 0.1 * torch.tanh(h @ w)
    loss = (h * h).mean()
    return loss.item(), [g.numpy() for g in torch.autograd.grad(loss, [x, w])]


def test_budgeted_while_run_for_inference_keeps_no_checkpoints():
    plain, plain_exe, (plain_loss, _) = _loop(grad=False)
    main, exe, (loss, grads) = _loop(grad=True)
    peaks = {}
    for n in (10, 1000):
        feed = {"x": X0, "n": np.array(n)}
        (ref,), ref_peak = run(plain_exe, plain, feed, [plain_loss])
        (ours,), peaks[n] = run(exe, main, feed, [loss])
        assert ours == ref and peaks[n] == ref_peak
    assert peaks[10] == peaks[1000]
    # Training in the same executor keeps checkpoints and gives store-all's gradients.
    feed = {"x": X0, "n": np.array(60)}
    (lv, *gs), train_peak = run(exe, main, feed, [loss] + grads)
    assert train_peak > peaks[1000] + 4 * X0.nbytes
    store, store_exe, (store_loss, store_grads) = _loop(grad=True, recompute=None)
    (sl, *sgs), _ = run(store_exe, store, feed, [store_loss] + store_grads)
    assert lv == sl
    for ours, stored in zip(gs, sgs):
        np.testing.assert_array_equal(ours, stored)
    tl, tg = _torch_loop(60)
    np.testing.assert_allclose(lv, tl, rtol=1e-12)
    for ours, ref in zip(gs, tg):
        np.testing.assert_allclose(ours, ref, rtol=1e-9, atol=1e-14)
