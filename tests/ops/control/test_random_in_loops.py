"""Random ops inside loops (ops/streams.py): a new mask per iteration, the same mask whenever
that iteration runs again in the same run, and gradients that agree with PyTorch given the
masks the forward drew."""
from __future__ import annotations

import functools

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")

import retrograd as rg
from retrograd.testing import build_program as build, started_executor as executor
from retrograd.testing import check_gradients

F64 = "float64"
P = 0.5
RNG = np.random.default_rng(7)
X0 = RNG.standard_normal((3, 5))
W0 = RNG.standard_normal((5, 5)) * 0.5


@pytest.fixture(autouse=True)
def _on_every_backend(backend, monkeypatch):
    """Every test here runs on each backend of the ``backend`` fixture: ``rg.Executor()`` in
    this module makes that backend's executor (results come back as NumPy arrays)."""
    monkeypatch.setattr(rg, "Executor", functools.partial(rg.Executor, **backend.kwargs))


def t(a, grad=False):
    return torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=grad)


def close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)




def loops(block, op_type="While"):
    return [op for op in block.ops if op.type == op_type]


def dropout_mask_name(block) -> str:
    """The mask output of the (single) Dropout op of ``block``."""
    op, = [op for op in block.ops if op.type == "Dropout"]
    return op.outputs[1]


def kept_stack(op, body_name: str) -> str:
    """The outer name of ``body_name`` stacked over the iterations of While ``op`` (kept for the backward)."""
    return op.outputs[len(op.attrs["carry_binds"]) + 1 + op.attrs["ys"].index(body_name)]


def check_masks(masks: np.ndarray, count: int) -> None:
    """``count`` masks of inverted dropout, pairwise different."""
    assert masks.shape[0] == count
    assert set(np.unique(masks)) <= {0.0, 1.0 / (1.0 - P)}
    flat = masks.reshape(count, -1)
    for i in range(count):
        for j in range(i):
            assert not np.array_equal(flat[i], flat[j]), f"iterations {j} and {i} drew the same mask"


# --- while_loop ----------------------------------------------------------------------------------

def _dropout_loop(recompute=None):
    """h <- dropout(tanh(h @ w)), n times (n fed); loss = sum(tanh(h @ w2)^2)."""
    x = rg.data("x", [3, 5], dtype=F64, stop_gradient=False)
    n = rg.data("n", [], dtype="int64")
    w = rg.create_parameter("w", [5, 5], dtype=F64, init=W0)
    w2 = rg.create_parameter("w2", [5, 5], dtype=F64, init=W0.T.copy())
    h1 = rg.tanh(x @ w2)
    _, h = rg.while_loop(lambda i, h: i < n, lambda i, h: (i + 1, rg.dropout(rg.tanh(h @ w), P)),
                         [rg.constant(0), h1], recompute=recompute)
    h2 = rg.tanh(h @ w2)
    loss = rg.sum(h2 * h2)
    dx, dw, dw2 = rg.gradients(loss, [x, w, w2])
    return loss, dx, dw, dw2


def _torch_loop(masks):
    x, w, w2 = t(X0, True), t(W0, True), t(W0.T, True)
    h = torch.tanh(x @ w2)
    for mask in masks:
        h = torch.tanh(h @ w) * t(mask)
    h2 = torch.tanh(h @ w2)
    loss = (h2 * h2).sum()
    return [loss.detach().numpy()] + [g.numpy() for g in torch.autograd.grad(loss, [x, w, w2])]


@pytest.mark.parametrize("n", [1, 4])
def test_while_body_draws_a_new_mask_per_iteration_and_gradients_match_torch(n):
    main, startup, outs = build(_dropout_loop)
    op, = loops(main.global_block())
    masks_name = kept_stack(op, dropout_mask_name(op.attrs["body"]))
    exe = executor(startup)
    *ours, masks = exe.run(main, feed={"x": X0, "n": np.array(n)}, fetch_list=list(outs) + [masks_name])
    check_masks(masks, n)
    for a, b in zip(ours, _torch_loop(masks)):
        close(a, b)


def test_while_masks_change_between_runs():
    main, startup, outs = build(_dropout_loop)
    op, = loops(main.global_block())
    masks_name = kept_stack(op, dropout_mask_name(op.attrs["body"]))
    exe = executor(startup)
    first, = exe.run(main, feed={"x": X0, "n": np.array(3)}, fetch_list=[masks_name])
    second, = exe.run(main, feed={"x": X0, "n": np.array(3)}, fetch_list=[masks_name])
    check_masks(np.concatenate([first, second]), 6)


def test_loops_without_random_ops_get_no_stream_key():
    def fn():
        x = rg.data("x", [3], dtype=F64)
        return rg.while_loop(lambda h: rg.sum(h) < 10.0, lambda h: h + 1.0, x)

    main, _, _ = build(fn)
    assert "rng_id" not in loops(main.global_block())[0].attrs


def test_gradient_scan_carries_the_forward_loops_key():
    main, _, _ = build(_dropout_loop)
    op, = loops(main.global_block())
    scan, = loops(main.global_block(), "Scan")
    assert isinstance(op.attrs["rng_id"], int) and scan.attrs["rng_id"] == op.attrs["rng_id"]
    assert scan.attrs["reverse"] is True


def test_nested_loops_draw_a_mask_per_inner_and_outer_iteration():
    """The outer body keeps the inner loop's stack of masks: [outer, inner, 3, 5]."""
    def fn():
        x = rg.data("x", [3, 5], dtype=F64, stop_gradient=False)
        w = rg.create_parameter("w", [5, 5], dtype=F64, init=W0)

        def outer(i, h):
            _, g = rg.while_loop(lambda j, g: j < 2, lambda j, g: (j + 1, rg.dropout(rg.tanh(g @ w), P)),
                                 [rg.constant(0), h])
            return i + 1, g * 0.5 + h

        _, h = rg.while_loop(lambda i, h: i < 3, outer, [rg.constant(0), x])
        loss = rg.sum(h * h)
        return (loss,) + tuple(rg.gradients(loss, [x, w]))

    main, startup, outs = build(fn)
    op, = loops(main.global_block())
    inner, = loops(op.attrs["body"])
    name = kept_stack(op, kept_stack(inner, dropout_mask_name(inner.attrs["body"])))
    exe = executor(startup)
    *ours, masks = exe.run(main, feed={"x": X0}, fetch_list=list(outs) + [name])
    assert masks.shape == (3, 2, 3, 5)
    check_masks(masks.reshape(6, 3, 5), 6)
    x, w = t(X0, True), t(W0, True)
    h = x
    for i in range(3):
        g = h
        for j in range(2):
            g = torch.tanh(g @ w) * t(masks[i, j])
        h = g * 0.5 + h
    loss = (h * h).sum()
    for a, b in zip(ours, [loss.detach().numpy()] + [v.numpy() for v in torch.autograd.grad(loss, [x, w])]):
        close(a, b)


def test_while_with_dropout_passes_a_finite_difference_check():
    """check_gradients reruns the program with one run id: the masks of each iteration repeat."""
    def fn(x, w):
        _, h = rg.while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, rg.dropout(rg.tanh(h @ w), 0.3)),
                             [rg.constant(0), x])
        return h

    check_gradients(fn, {"x": X0, "w": W0}, rtol=1e-5)


def test_second_order_through_a_loop_with_dropout_matches_torch():
    """d/dw of |d loss/d x|^2: the double backward runs the gradient Scan's backward (a Scan again)."""
    def fn():
        x = rg.data("x", [3, 5], dtype=F64, stop_gradient=False)
        w = rg.create_parameter("w", [5, 5], dtype=F64, init=W0)
        _, h = rg.while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, rg.dropout(rg.tanh(h @ w), P)),
                             [rg.constant(0), x])
        dx, = rg.gradients(rg.sum(h * h * h), [x])
        dw, = rg.gradients(rg.sum(dx * dx), [w])
        return dx, dw

    main, startup, (dx, dw) = build(fn)
    op, = loops(main.global_block())
    name = kept_stack(op, dropout_mask_name(op.attrs["body"]))
    exe = executor(startup)
    dxv, dwv, masks = exe.run(main, feed={"x": X0}, fetch_list=[dx, dw, name])
    check_masks(masks, 3)
    x, w = t(X0, True), t(W0, True)
    h = x
    for mask in masks:
        h = torch.tanh(h @ w) * t(mask)
    tdx, = torch.autograd.grad((h ** 3).sum(), [x], create_graph=True)
    tdw, = torch.autograd.grad((tdx * tdx).sum(), [w])
    close(dxv, tdx.detach().numpy())
    close(dwv, tdw.numpy())


def _checkpointed_loop():
    """A while loop between two checkpoints: the backward recomputes the whole loop (a copy of the op)."""
    x = rg.data("x", [3, 5], dtype=F64, stop_gradient=False)
    n = rg.data("n", [], dtype="int64")
    w = rg.create_parameter("w", [5, 5], dtype=F64, init=W0)
    w2 = rg.create_parameter("w2", [5, 5], dtype=F64, init=W0.T.copy())
    h1 = rg.tanh(x @ w2)
    _, h = rg.while_loop(lambda i, h: i < n, lambda i, h: (i + 1, rg.dropout(rg.tanh(h @ w), P)),
                         [rg.constant(0), h1])
    h2 = rg.tanh(h @ w2)
    loss = rg.sum(h2 * h2)
    grads = dict((p.name, g) for p, g in rg.append_backward(loss, checkpoints=[h1, h2]))
    return loss, grads["w"], grads["w2"]


def test_checkpoint_recompute_of_a_loop_replays_every_iterations_mask():
    main, startup, outs = build(_checkpointed_loop)
    forward, copy = loops(main.global_block())
    assert "recompute_of" in copy.attrs and copy.attrs["rng_id"] == forward.attrs["rng_id"]
    body_mask = dropout_mask_name(forward.attrs["body"])
    exe = executor(startup)
    feed = {"x": X0, "n": np.array(4)}
    *ours, fwd_masks, rc_masks = exe.run(main, feed=feed, fetch_list=list(outs) + [
        kept_stack(forward, body_mask), kept_stack(copy, dropout_mask_name(copy.attrs["body"]))])
    check_masks(fwd_masks, 4)
    np.testing.assert_array_equal(rc_masks, fwd_masks)
    loss, _, dw, dw2 = _torch_loop(fwd_masks)
    for a, b in zip(ours, [loss, dw, dw2]):
        close(a, b)


def test_budgeted_while_recomputes_the_masks_the_stored_loop_draws():
    """recompute=<bytes> re-runs iterations in the backward, from checkpoints; built in the same
    order and run as the same run of a fresh executor, the program draws the masks the
    store-all one does, so the gradients agree with it and with torch given its masks."""
    budget = 3 * 15 * 8 * 6
    results = {}
    for recompute in (None, budget):
        main, startup, outs = build(lambda: _dropout_loop(recompute=recompute))
        op, = loops(main.global_block())
        extra = [] if recompute else [kept_stack(op, dropout_mask_name(op.attrs["body"]))]
        results[recompute] = executor(startup).run(main, feed={"x": X0, "n": np.array(9)},
                                                   fetch_list=list(outs) + extra)
    *stored, masks = results[None]
    check_masks(masks, 9)
    for a, b in zip(results[budget], stored):
        close(a, b)
    for a, b in zip(stored, _torch_loop(masks)):
        close(a, b)


# --- recurrent networks ---------------------------------------------------------------------------

T, N, D, H = 6, 3, 4, 5
XS = RNG.standard_normal((T, N, D))
H0 = RNG.standard_normal((N, H)) * 0.5
WX = RNG.standard_normal((D, H)) * 0.5
WH = RNG.standard_normal((H, H)) * 0.5
RNN_FEED = {"x": XS, "h0": H0}


def _rnn_inputs():
    x = rg.data("x", [-1, N, D], dtype=F64, stop_gradient=False)
    h0 = rg.data("h0", [N, H], dtype=F64, stop_gradient=False)
    wx = rg.create_parameter("wx", [D, H], dtype=F64, init=WX)
    wh = rg.create_parameter("wh", [H, H], dtype=F64, init=WH)
    return x, h0, wx, wh


def _rnn_loss(h_all, h_last, inputs):
    loss = rg.sum(h_all * h_all) + rg.sum(h_last)
    return [loss] + rg.gradients(loss, list(inputs))


def _dropout_rnn(recompute=None):
    """h_t = dropout(tanh(x_t @ wx + h_{t-1} @ wh)); loss = sum(h_all^2) + sum(h_last)."""
    x, h0, wx, wh = inputs = _rnn_inputs()
    (h_all,), (h_last,) = rg.recurrent(lambda xs, hs: [rg.dropout(rg.tanh(xs[0] @ wx + hs[0] @ wh), P)],
                                       [x], [h0], recompute=recompute)
    return _rnn_loss(h_all, h_last, inputs)


def _torch_rnn(masks):
    x, h0, wx, wh = ins = [t(a, True) for a in (XS, H0, WX, WH)]
    h, hs = h0, []
    for step in range(T):
        h = torch.tanh(x[step] @ wx + h @ wh) * t(masks[step])
        hs.append(h)
    loss = (torch.stack(hs) ** 2).sum() + h.sum()
    return [loss.detach().numpy()] + [g.numpy() for g in torch.autograd.grad(loss, ins)]


def _rnn_op(main):
    op, = [op for op in main.global_block().ops if op.type == "RecurrentNetwork"]
    return op


def _saved_mask(op) -> str:
    """The outer [T, ...] name of the step's dropout mask, stored for the backward."""
    mask = dropout_mask_name(op.attrs["step"])
    return op.outputs[2 * len(op.attrs["states"]) + op.attrs["saved"].index(mask)]


def _run_rnn(builder, fetch_masks=False):
    """Build with ``builder``, run (startup is run 1, this is run 2 of a fresh executor)."""
    main, startup, outs = build(builder)
    extra = [_saved_mask(_rnn_op(main))] if fetch_masks else []
    return main, executor(startup).run(main, feed=RNN_FEED, fetch_list=list(outs) + extra)


def test_recurrent_step_draws_a_mask_per_time_step_and_gradients_match_torch():
    main, (*ours, masks) = _run_rnn(_dropout_rnn, fetch_masks=True)
    assert masks.shape == (T, N, H)
    check_masks(masks, T)
    grad_op, = [op for op in main.global_block().ops if op.type == "RecurrentNetworkGrad"]
    assert grad_op.attrs["rng_id"] == _rnn_op(main).attrs["rng_id"]
    for a, b in zip(ours, _torch_rnn(masks)):
        close(a, b)


@pytest.mark.parametrize("recompute", ["steps", 2000])
def test_recurrent_recompute_replays_each_steps_mask(recompute):
    """recompute="steps" recomputes the dropout of step t in the backward (its mask is not stored);
    a byte budget re-runs whole steps from checkpoints. Either way step t draws in stream
    (rng_id, t) again, so the gradients are the store-all program's (built and run alike)."""
    _, (*stored, masks) = _run_rnn(_dropout_rnn, fetch_masks=True)
    main, ours = _run_rnn(lambda: _dropout_rnn(recompute=recompute))
    op = _rnn_op(main)
    if recompute == "steps":
        assert dropout_mask_name(op.attrs["step"]) not in op.attrs["saved"]
    else:
        assert any(o.type == "RecurrentNetworkBudgetGrad" for o in main.global_block().ops)
    for a, b in zip(ours, stored):
        close(a, b)
    for a, b in zip(ours, _torch_rnn(masks)):
        close(a, b)


def _dropout_recurrent_net(recompute_mask: bool):
    """The same network through the Caffe2-style recurrent_net, recomputing the mask on request."""
    x, h0, wx, wh = inputs = _rnn_inputs()
    main = x.block.program
    cell = main.create_block(main.global_block())
    with rg.block_guard(cell):
        x_t = cell.create_var("x_t", [N, D], F64)
        h_prev = cell.create_var("h_prev", [N, H], F64)
        h = rg.dropout(rg.tanh(x_t @ wx + h_prev @ wh), P)
    recompute = [dropout_mask_name(cell), h.name] if recompute_mask else None
    h_all, h_last = rg.recurrent_net(cell, inputs=[(x_t, x)], initial_cell_inputs=[(h_prev, h0)],
                                     links={h_prev: h}, outputs_with_grads=(0, 1),
                                     recompute_blobs_on_backward=recompute)
    return _rnn_loss(h_all, h_last, inputs)


def test_recompute_blobs_on_backward_replays_the_mask():
    _, (*stored, masks) = _run_rnn(lambda: _dropout_recurrent_net(False), fetch_masks=True)
    check_masks(masks, T)
    main, ours = _run_rnn(lambda: _dropout_recurrent_net(True))
    op = _rnn_op(main)
    assert dropout_mask_name(op.attrs["step"]) not in op.attrs["saved"]
    for a, b in zip(ours, _torch_rnn(masks)):
        close(a, b)
    for a, b in zip(ours, stored):
        close(a, b)


def test_loop_keys_survive_json_and_show_in_the_printed_program():
    main, startup, outs = build(_dropout_loop)
    op, = loops(main.global_block())
    assert f"rng_id={op.attrs['rng_id']}" in str(main)
    again = rg.Program.from_json(main.to_json())
    names = [v.name for v in outs] + [kept_stack(op, dropout_mask_name(op.attrs["body"]))]
    feed = {"x": X0, "n": np.array(5)}
    first = executor(startup).run(main, feed=feed, fetch_list=names)
    second = executor(startup).run(again, feed=feed, fetch_list=names)
    check_masks(first[-1], 5)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
