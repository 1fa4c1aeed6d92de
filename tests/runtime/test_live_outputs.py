"""Live outputs (``KernelCtx.live_outputs``): a plan tells each kernel which of its outputs are read
later, fetched or kept, and loops do not keep per-iteration values for outputs nobody reads -- so a
program built with a gradient and run for inference costs what the forward alone costs."""
from __future__ import annotations

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")

import retrograd as rg
from retrograd.testing import build_program, started_executor

F64 = "float64"
RNG = np.random.default_rng(3)
X0 = RNG.standard_normal((8, 32)) * 0.5
W0 = RNG.standard_normal((32, 32)) * 0.2


def t(a, grad=False):
    return torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=grad)


def close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)


def build(fn):
    main, startup, out = build_program(fn)
    return main, started_executor(startup), out


def peak(exe, main, feed, fetch):
    values = exe.run(main, feed=feed, fetch_list=fetch)
    return values, exe.last_stats.peak_bytes


# --- the plan ---------------------------------------------------------------------------------------

def test_plan_marks_outputs_that_nothing_reads_later():
    def fn():
        x = rg.data("x", [4], dtype=F64)
        w = rg.create_parameter("w", [4], dtype=F64, init=1.0)
        y = rg.dropout(x, 0.5)                      # outputs (out, mask)
        z = y * w
        rg.optim.SGD(0.1).minimize(rg.sum(z))       # writes w (persistable) in place
        return y, z

    main, exe, (y, z) = build(fn)
    block = main.global_block()

    def live(keep, op_type):
        plan = exe.plan_for(block, frozenset(keep))
        return [s.k.live_outputs for s in plan.steps if s.op.type == op_type]

    mask = next(op for op in block.ops if op.type == "Dropout").outputs[1]
    assert live([z.name], "Dropout") == [frozenset({0})]      # the mask is read by no op of the plan
    assert live([z.name, mask], "Dropout") == [frozenset({0, 1})]
    update, = [op for op in block.ops if op.type not in ("Dropout",) and "w" in op.outputs]
    assert live([], update.type) == [frozenset({update.outputs.index("w")})]   # persistable: written back


# --- while_loop ---------------------------------------------------------------------------------------

def _loop(grad: str | None):
    """h <- h + 0.1 tanh(h @ w), n times; loss = mean(h * h); with no, first or second order gradients."""
    def fn():
        x = rg.data("x", [8, 32], dtype=F64, stop_gradient=False)
        n = rg.data("n", [], dtype="int64")
        w = rg.create_parameter("w", [32, 32], dtype=F64, init=W0)
        _, h = rg.while_loop(lambda i, h: i < n, lambda i, h: (i + 1, h + 0.1 * rg.tanh(h @ w)),
                             [rg.constant(0), x])
        loss = rg.mean(h * h)
        grads = []
        if grad is not None:
            grads = rg.gradients(loss, [x, w])
        if grad == "second":
            grads += rg.gradients(rg.sum(grads[0] * grads[0]), [w])
        return loss, grads
    return build(fn)


def _torch_loop(n):
    x, w = t(X0, True), t(W0, True)
    h = x
    for _ in range(n):
        h = h + 0.1 * torch.tanh(h @ w)
    loss = (h * h).mean()
    dx, dw = torch.autograd.grad(loss, [x, w], create_graph=True)
    ddw, = torch.autograd.grad((dx * dx).sum(), [w])
    return loss.detach().numpy(), dx.detach().numpy(), dw.detach().numpy(), ddw.numpy()


def test_while_with_a_gradient_run_for_inference_keeps_nothing_per_iteration():
    plain, plain_exe, (plain_loss, _) = _loop(None)
    main, exe, (loss, (dx, dw)) = _loop("first")
    peaks = {}
    for n in (10, 10_000):
        feed = {"x": X0, "n": np.array(n)}
        (ref,), ref_peak = peak(plain_exe, plain, feed, [plain_loss])
        (ours,), peaks[n] = peak(exe, main, feed, [loss])
        assert ours == ref
        assert peaks[n] == ref_peak
    assert peaks[10] == peaks[10_000]
    # The same executor then trains: its plan keeps what each iteration's backward reads.
    lv, dxv, dwv = exe.run(main, feed={"x": X0, "n": np.array(30)}, fetch_list=[loss, dx, dw])
    assert exe.last_stats.peak_bytes > peaks[10] + 30 * X0.nbytes
    tl, tdx, tdw, _ = _torch_loop(30)
    close(lv, tl)
    close(dxv, tdx)
    close(dwv, tdw)


def test_a_first_order_run_of_a_twice_differentiated_loop_costs_what_first_order_costs():
    """The second-order backward makes the loops keep more per iteration (the forward While and
    the gradient Scan); a run fetching only first-order gradients keeps none of it."""
    first, first_exe, (_, (dx1, dw1)) = _loop("first")
    second, exe, (_, (dx, dw, ddw)) = _loop("second")
    feed = {"x": X0, "n": np.array(20)}
    (rdx, rdw), ref_peak = peak(first_exe, first, feed, [dx1, dw1])
    (odx, odw), ours = peak(exe, second, feed, [dx, dw])
    close(odx, rdx)
    close(odw, rdw)
    assert ours == ref_peak
    (full,), full_peak = peak(exe, second, feed, [ddw])
    assert full_peak > ours
    close(full, _torch_loop(20)[3])


# --- recurrent networks ---------------------------------------------------------------------------

RN, RD, RH = 4, 3, 64
RWX = RNG.standard_normal((RD, RH)) * 0.3
RWH = RNG.standard_normal((RH, RH)) * 0.1
RX_ROW = RNG.standard_normal((1, RN, RD))
RH0 = RNG.standard_normal((RN, RH)) * 0.1


def _tanh_rnn(grad: bool):
    """h_t = tanh(x_t @ wx + h_{t-1} @ wh); loss = mean(h_T^2) (the last state only)."""
    def fn():
        x = rg.data("x", [-1, RN, RD], dtype=F64, stop_gradient=False)
        h0 = rg.data("h0", [RN, RH], dtype=F64)
        wx = rg.create_parameter("wx", [RD, RH], dtype=F64, init=RWX)
        wh = rg.create_parameter("wh", [RH, RH], dtype=F64, init=RWH)
        _, (h_last,) = rg.recurrent(lambda xs, hs: [rg.tanh(xs[0] @ wx + hs[0] @ wh)], [x], [h0])
        loss = rg.mean(h_last * h_last)
        return loss, (rg.gradients(loss, [x, wx, wh]) if grad else [])
    return build(fn)


def _rnn_feed(steps):
    # A zero-stride view: the fed sequence costs the same for any T, so the peak shows what the op keeps.
    return {"x": np.broadcast_to(RX_ROW, (steps, RN, RD)), "h0": RH0}


def test_recurrent_with_a_gradient_run_for_inference_keeps_nothing_per_step():
    plain, plain_exe, (plain_loss, _) = _tanh_rnn(grad=False)
    main, exe, (loss, grads) = _tanh_rnn(grad=True)
    peaks = {}
    for steps in (10, 1000):
        (ref,), ref_peak = peak(plain_exe, plain, _rnn_feed(steps), [plain_loss])
        (ours,), peaks[steps] = peak(exe, main, _rnn_feed(steps), [loss])
        assert ours == ref and peaks[steps] == ref_peak
    assert peaks[10] == peaks[1000]
    # The parameters and a few [N, H] values (two state rows, h0, matmuls, their sum):
    assert peaks[10] < RWX.nbytes + RWH.nbytes + 8 * RH0.nbytes
    # Training in the same executor: gradients against torch.
    feed = {"x": np.ascontiguousarray(_rnn_feed(7)["x"]) + RNG.standard_normal((7, RN, RD)), "h0": RH0}
    lv, dx, dwx, dwh = exe.run(main, feed=feed, fetch_list=[loss] + grads)
    x, wx, wh = t(feed["x"], True), t(RWX, True), t(RWH, True)
    h = t(RH0)
    for step in range(7):
        h = torch.tanh(x[step] @ wx + h @ wh)
    tloss = (h * h).mean()
    close(lv, tloss.detach().numpy())
    for ours, theirs in zip([dx, dwx, dwh], torch.autograd.grad(tloss, [x, wx, wh])):
        close(ours, theirs.numpy())


@pytest.mark.parametrize("layer", ["lstm", "gru"])
def test_a_layer_with_a_gradient_run_for_inference_costs_what_its_forward_costs(layer):
    """The layers hoist x @ w_ih out of the loop ([T, N, 4H] either way); beyond that, the graded
    program run for the loss holds what the forward-only program holds."""
    def make(grad):
        def fn():
            x = rg.data("x", [-1, RN, RD], dtype=F64)
            outs = getattr(rg.layers, layer)(x, 16, name="rnn")
            loss = rg.mean(outs[1] * outs[1])
            if grad:
                rg.append_backward(loss)
            return loss
        main, startup = rg.Program(), rg.Program()
        with rg.program_guard(main, startup):
            loss = fn()
        return main, startup, loss

    feed = {"x": RNG.standard_normal((200, RN, RD))}
    (plain, plain_startup, plain_loss), (main, startup, loss) = make(False), make(True)
    results = []
    for program, start, var in ((plain, plain_startup, plain_loss), (main, startup, loss)):
        exe = rg.Executor()
        exe.run(start)
        results.append(peak(exe, program, feed, [var]))
    (ref,), ref_peak = results[0]
    (ours,), our_peak = results[1]
    assert ours == ref
    assert our_peak == ref_peak


def test_an_output_nobody_reads_may_be_left_none_by_its_kernel():
    """Regression: LSTMSequence's oneDNN kernel leaves c_all (not live) as None; the torch
    executor's memory meter asked None for its storage and every fused LSTM program failed."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, 8], stop_gradient=False)
        h_all, _, _, _ = rg.layers.lstm(x, 8, name="lstm", fused=True)
        loss = rg.sum(h_all)
        dx, = rg.gradients(loss, [x])
    feed = {"x": RNG.standard_normal((5, 3, 8)).astype(np.float32)}
    results = {}
    for backend in ("numpy", "torch"):
        exe = rg.Executor(backend=backend)
        exe.run(startup)
        for name in ("w_ih", "w_hh", "b"):
            exe.scope.set(f"lstm.{name}", np.full(exe.scope.get(f"lstm.{name}").shape, 0.1, np.float32))
        results[backend] = exe.run(main, feed=feed, fetch_list=[loss, dx])
        assert exe.last_stats.peak_bytes > 0
    for got, want in zip(results["torch"], results["numpy"]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
