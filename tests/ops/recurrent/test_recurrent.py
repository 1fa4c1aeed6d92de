"""RecurrentNetwork, rg.recurrent and rg.recurrent_net against PyTorch loops (float64).

Each test builds a recurrent program, runs it, and compares values and
gradients (of the sequences, the initial states and the parameters) with the
same recurrence written as a plain loop in PyTorch. Every test runs on every
backend (``_on_every_backend``).
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")

import retrograd as rg
from retrograd.backends import to_numpy
from retrograd.errors import ExecutionError, ProgramError
from retrograd.testing import check_gradients

pytestmark = pytest.mark.engine     # these tests also run on the onnxruntime engine

F64 = "float64"


@pytest.fixture(autouse=True)
def _on_every_backend(backend, monkeypatch):
    """Every test here runs on each backend of the ``backend`` fixture: ``rg.Executor()`` in
    this module makes that backend's executor (results come back as NumPy arrays)."""
    monkeypatch.setattr(rg, "Executor", functools.partial(rg.Executor, **backend.kwargs))


def _rng(seed=0):
    return np.random.default_rng(seed)


def _t(a):
    return torch.tensor(to_numpy(a), dtype=torch.float64, requires_grad=True)


def _close(ours, ref, tol=1e-10):
    ref = ref.detach().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
    np.testing.assert_allclose(np.asarray(ours), ref, rtol=tol, atol=tol)


class TanhRNN:
    """h' = tanh(x_t @ w + h @ u + b), built with rg.recurrent; loss mixes every output."""

    def __init__(self, d=3, h=4, recompute=None, forward_only=False, seq_lengths=False, outputs_with_grads=None,
                 deep=False):
        self.deep = deep
        self.main, self.startup = rg.Program(), rg.Program()
        with rg.program_guard(self.main, self.startup):
            self.x = rg.data("x", [-1, -1, d], F64, stop_gradient=False)
            self.h0 = rg.data("h0", [-1, h], F64, stop_gradient=False)
            self.lengths = rg.data("lengths", [-1], "int64") if seq_lengths else None
            self.w = rg.create_parameter("w", [d, h], F64, init=("normal", 0.0, 0.5))
            self.u = rg.create_parameter("u", [h, h], F64, init=("normal", 0.0, 0.5))
            self.b = rg.create_parameter("b", [h], F64, init=("normal", 0.0, 0.5))
            self.proj = rg.data("proj", [-1, -1, h], F64)       # fixed random projection of h_all
            self.proj_last = rg.data("proj_last", [-1, h], F64)

            def step(xs, hs):
                h_new = rg.tanh(xs[0] @ self.w + hs[0] @ self.u + self.b)
                return [rg.tanh(h_new @ self.u) * rg.sigmoid(h_new) if deep else h_new]

            (self.h_all,), (self.h_last,) = rg.recurrent(
                step, [self.x], [self.h0], seq_lengths=self.lengths, recompute=recompute,
                forward_only=forward_only, outputs_with_grads=outputs_with_grads)
            self.loss = rg.sum(self.h_all * self.proj) + rg.sum(self.h_last * self.proj_last)
            if not forward_only:
                self.grads = rg.gradients(self.loss, [self.x, self.h0, self.w, self.u, self.b])
        self.exe = rg.Executor()
        self.exe.run(self.startup)

    def params(self):
        return [to_numpy(self.exe.scope.get(n)) for n in ("w", "u", "b")]

    def feed(self, t, n, seed=1, lengths=None):
        r = _rng(seed)
        h = self.h0.shape[1]
        feed = {"x": r.standard_normal((t, n, self.x.shape[2])), "h0": r.standard_normal((n, h)),
                "proj": r.standard_normal((t, n, h)), "proj_last": r.standard_normal((n, h))}
        if lengths is not None:
            feed["lengths"] = np.asarray(lengths, dtype=np.int64)
        return feed

    def run(self, feed, with_grads=True):
        fetch = [self.h_all, self.h_last, self.loss] + (self.grads if with_grads else [])
        return self.exe.run(self.main, feed=feed, fetch_list=fetch)


def torch_tanh_rnn(feed, params, lengths=None, deep=False):
    """The reference: values and gradients of the same loss, by a PyTorch loop."""
    x, h0, proj, proj_last = (_t(feed[k]) for k in ("x", "h0", "proj", "proj_last"))
    w, u, b = (_t(p) for p in params)
    h, outs = h0, []
    for t in range(x.shape[0]):
        new = torch.tanh(x[t] @ w + h @ u + b)
        if deep:
            new = torch.tanh(new @ u) * torch.sigmoid(new)
        if lengths is not None:
            keep = torch.tensor(np.asarray(lengths) > t)[:, None]
            new = torch.where(keep, new, h)
        h = new
        outs.append(h)
    h_all = torch.stack(outs)
    loss = (h_all * proj).sum() + (h * proj_last).sum()
    loss.backward()
    return h_all, h, loss, [x.grad, h0.grad, w.grad, u.grad, b.grad]


def _check_against_torch(model, feed, lengths=None):
    ours = model.run(feed)
    h_all, h_last, loss, grads = torch_tanh_rnn(feed, model.params(), lengths, model.deep)
    _close(ours[0], h_all)
    _close(ours[1], h_last)
    _close(ours[2], loss)
    for mine, ref in zip(ours[3:], grads):
        _close(mine, ref)


def test_tanh_rnn_values_and_gradients_match_torch():
    model = TanhRNN()
    _check_against_torch(model, model.feed(t=6, n=3))


@pytest.mark.engine_skip("onnxruntime's buffers are not visible as views")
def test_all_states_are_views_of_one_states_tensor():
    model = TanhRNN()
    h_all, h_last = model.exe.run(model.main, feed=model.feed(t=5, n=2),
                                  fetch_list=[model.h_all, model.h_last], return_numpy=False)
    buffer_of = model.exe.backend.buffer_of            # views share their base's (storage's) identity
    (all_key, all_bytes), (last_key, _) = buffer_of(h_all), buffer_of(h_last)
    assert all_key == last_key and all_bytes == 6 * 2 * 4 * 8     # one (T+1) x N x H float64 tensor
    np.testing.assert_array_equal(to_numpy(h_all)[-1], to_numpy(h_last))


def test_param_grad_correct_when_batch_grows_then_shrinks():
    """Seed bug (Caffe2 alias-and-swap of parameter gradients): rerun with N up, N down, other T."""
    model = TanhRNN()
    for t, n, seed in [(4, 2, 1), (4, 5, 2), (3, 1, 3), (7, 3, 4), (4, 2, 1)]:
        _check_against_torch(model, model.feed(t=t, n=n, seed=seed))


def test_different_sequence_length_between_runs():
    model = TanhRNN()
    _check_against_torch(model, model.feed(t=2, n=3, seed=5))
    _check_against_torch(model, model.feed(t=9, n=3, seed=6))
    _check_against_torch(model, model.feed(t=1, n=3, seed=7))


def test_seq_lengths_carry_states_and_match_masked_reference():
    model = TanhRNN(seq_lengths=True)
    lengths = [5, 2, 0, 3]
    feed = model.feed(t=5, n=4, lengths=lengths)
    ours = model.run(feed)
    _check_against_torch(model, feed, lengths)
    h_all, h_last = ours[0], ours[1]
    np.testing.assert_array_equal(h_last[2], feed["h0"][2])   # length 0: never changes
    np.testing.assert_array_equal(h_last[1], h_all[1, 1])     # last = state at its own length
    np.testing.assert_array_equal(h_all[4, 1], h_all[1, 1])   # carried unchanged afterwards
    # Batch shrinks and lengths change on the next run.
    _check_against_torch(model, model.feed(t=3, n=2, seed=9, lengths=[1, 3]), [1, 3])


def test_outputs_with_grads_drops_the_other_outputs_gradient():
    model = TanhRNN(outputs_with_grads=[0])        # only all-steps output 0 gets gradient
    feed = model.feed(t=4, n=2)
    ours = model.run(feed)
    feed_no_last = dict(feed, proj_last=np.zeros_like(feed["proj_last"]))
    _, _, _, grads = torch_tanh_rnn(feed_no_last, model.params())
    for mine, ref in zip(ours[3:], grads):
        _close(mine, ref)


def test_multiple_states_and_inputs_match_torch():
    r = _rng(3)
    t, n, d, h = 5, 3, 2, 4
    feed = {"a": r.standard_normal((t, n, d)), "c": r.standard_normal((t, n, h)),
            "h0": r.standard_normal((n, h)), "m0": r.standard_normal((n, h))}
    ws = {"w": r.standard_normal((d, h)) * 0.5, "u": r.standard_normal((h, h)) * 0.5}
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        vs = {k: rg.data(k, [-1] * (v.ndim - 1) + [v.shape[-1]], F64, stop_gradient=False)
              for k, v in feed.items()}
        w, u = (rg.data(k, list(v.shape), F64, stop_gradient=False) for k, v in ws.items())

        def step(xs, hs):
            a_t, c_t = xs
            h, m = hs
            h_new = rg.tanh(a_t @ w + h @ u) * rg.sigmoid(m)
            m_new = m * 0.5 + c_t * h_new
            return [h_new, m_new]

        (h_all, m_all), (h_last, m_last) = rg.recurrent(step, [vs["a"], vs["c"]], [vs["h0"], vs["m0"]])
        loss = rg.sum(h_all * h_all) + rg.sum(m_all) + rg.sum(m_last * h_last)
        names = ["a", "c", "h0", "m0"]
        grads = rg.gradients(loss, [vs[k] for k in names] + [w, u])
    exe = rg.Executor()
    ours = exe.run(main, feed={**feed, **ws}, fetch_list=[h_all, m_all, loss] + grads)
    tv = {k: _t(v) for k, v in {**feed, **ws}.items()}
    hh, mm, hs, ms = tv["h0"], tv["m0"], [], []
    for i in range(t):
        h_new = torch.tanh(tv["a"][i] @ tv["w"] + hh @ tv["u"]) * torch.sigmoid(mm)
        mm = mm * 0.5 + tv["c"][i] * h_new
        hh = h_new
        hs.append(hh)
        ms.append(mm)
    H, M = torch.stack(hs), torch.stack(ms)
    loss_t = (H * H).sum() + M.sum() + (mm * hh).sum()
    loss_t.backward()
    _close(ours[0], H)
    _close(ours[1], M)
    _close(ours[2], loss_t)
    for mine, k in zip(ours[3:], names + ["w", "u"]):
        _close(mine, tv[k].grad)


def test_step_reading_encoder_outputs_attention_like():
    """The step attends over outer encoder outputs [N, S, H]: their gradient sums over steps."""
    r = _rng(4)
    t, n, s, h = 4, 2, 5, 3
    feed = {"x": r.standard_normal((t, n, h)), "enc": r.standard_normal((n, s, h)),
            "h0": r.standard_normal((n, h)), "v": r.standard_normal((h, h)) * 0.5}
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, -1, h], F64, stop_gradient=False)
        enc = rg.data("enc", [-1, s, h], F64, stop_gradient=False)
        h0 = rg.data("h0", [-1, h], F64, stop_gradient=False)
        v = rg.data("v", [h, h], F64, stop_gradient=False)
        enc_proj = rg.tanh(enc)          # an outer value computed before the loop

        def step(xs, hs):
            prev = hs[0]
            scores = rg.sum(enc_proj * rg.unsqueeze(prev, 1), axis=2)            # [N, S]
            weights = rg.softmax(scores, axis=1)
            context = rg.sum(enc_proj * rg.unsqueeze(weights, 2), axis=1)       # [N, H]
            return [rg.tanh(xs[0] + context @ v + prev)]

        (h_all,), _ = rg.recurrent(step, [x], [h0])
        loss = rg.sum(h_all * h_all)
        grads = rg.gradients(loss, [x, enc, h0, v])
    ours = rg.Executor().run(main, feed=feed, fetch_list=[h_all, loss] + grads)
    tv = {k: _t(a) for k, a in feed.items()}
    ep = torch.tanh(tv["enc"])
    hh, hs = tv["h0"], []
    for i in range(t):
        w = torch.softmax((ep * hh[:, None, :]).sum(2), dim=1)
        ctx = (ep * w[:, :, None]).sum(1)
        hh = torch.tanh(tv["x"][i] + ctx @ tv["v"] + hh)
        hs.append(hh)
    H = torch.stack(hs)
    (H * H).sum().backward()
    _close(ours[0], H)
    for mine, k in zip(ours[2:], ["x", "enc", "h0", "v"]):
        _close(mine, tv[k].grad)


def _sum_first_program(static_batch: bool):
    """The step's first op adds the previous state to an outer value (seed: backward links)."""
    n = 3 if static_batch else -1
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, n, 4], F64, stop_gradient=False)
        h0 = rg.data("h0", [n, 4], F64, stop_gradient=False)
        enc = rg.data("enc", [n, 4], F64, stop_gradient=False)
        w = rg.data("w", [4, 4], F64, stop_gradient=False)

        def step(xs, hs):
            summed = hs[0] + enc                    # nobody else writes d(prev): it is d(summed)
            return [rg.tanh(summed @ w + xs[0])]

        (h_all,), (h_last,) = rg.recurrent(step, [x], [h0])
        loss = rg.sum(h_all * h_all) + rg.sum(h_last)
        grads = rg.gradients(loss, [x, h0, enc, w])
    return main, [h_all, loss] + grads


def _sum_first_reference(feed):
    tv = {k: _t(a) for k, a in feed.items()}
    hh, hs = tv["h0"], []
    for i in range(feed["x"].shape[0]):
        hh = torch.tanh((hh + tv["enc"]) @ tv["w"] + tv["x"][i])
        hs.append(hh)
    H = torch.stack(hs)
    loss = (H * H).sum() + hh.sum()
    loss.backward()
    return [H, loss] + [tv[k].grad for k in ("x", "h0", "enc", "w")]


@pytest.mark.parametrize("static_batch", [True, False])
def test_first_step_op_is_sum_with_outer_value(static_batch):
    main, fetch = _sum_first_program(static_batch)
    exe = rg.Executor()
    sizes = [(5, 3), (2, 3)] if static_batch else [(5, 3), (4, 6), (2, 1)]
    for i, (t, n) in enumerate(sizes):
        r = _rng(10 + i)
        feed = {"x": r.standard_normal((t, n, 4)), "h0": r.standard_normal((n, 4)),
                "enc": r.standard_normal((n, 4)), "w": r.standard_normal((4, 4)) * 0.5}
        ours = exe.run(main, feed=feed, fetch_list=fetch)
        for mine, ref in zip(ours, _sum_first_reference(feed)):
            _close(mine, ref)


def test_weight_used_twice_and_bias_gradients_accumulate():
    """u is read by two matmuls (AddN of two batched parts), b by a broadcast add (per-step SumTo)."""
    r = _rng(6)
    t, n, h = 4, 3, 3
    feed = {"x": r.standard_normal((t, n, h)), "h0": r.standard_normal((n, h)),
            "u": r.standard_normal((h, h)) * 0.5, "b": r.standard_normal(h)}
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, -1, h], F64, stop_gradient=False)
        h0 = rg.data("h0", [-1, h], F64, stop_gradient=False)
        u = rg.data("u", [h, h], F64, stop_gradient=False)
        b = rg.data("b", [h], F64, stop_gradient=False)

        def step(xs, hs):
            a = rg.tanh(hs[0] @ u + b)
            return [rg.tanh(a @ u + xs[0] + b)]

        (h_all,), _ = rg.recurrent(step, [x], [h0])
        loss = rg.sum(h_all * h_all)
        grads = rg.gradients(loss, [x, h0, u, b])
    ours = rg.Executor().run(main, feed=feed, fetch_list=grads)
    tv = {k: _t(a) for k, a in feed.items()}
    hh, hs = tv["h0"], []
    for i in range(t):
        a = torch.tanh(hh @ tv["u"] + tv["b"])
        hh = torch.tanh(a @ tv["u"] + tv["x"][i] + tv["b"])
        hs.append(hh)
    (torch.stack(hs) ** 2).sum().backward()
    for mine, k in zip(ours, ["x", "h0", "u", "b"]):
        _close(mine, tv[k].grad)


def test_weight_gradients_are_batched_over_time_in_the_ir():
    model = TanhRNN()
    grad_op = next(op for op in model.main.global_block().ops if op.type == "RecurrentNetworkGrad")
    assert len(grad_op.attrs["batched"]) == 2            # w and u: one GEMM each after the loop
    backward = grad_op.attrs["backward"]
    assert not any(op.type == "MatMul" and op.attrs.get("transpose_x") for op in backward.ops)


def _recurrent_net_program(outputs_with_grads=(0,), recompute=None, forward_only=False):
    """Caffe2-style: a cell block with a timestep, two linked states."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, 3], F64, stop_gradient=False)
        h0 = rg.data("h0", [-1, 3], F64, stop_gradient=False)
        c0 = rg.data("c0", [-1, 3], F64, stop_gradient=False)
        w = rg.create_parameter("cell.w", [3, 3], F64, init=("normal", 0.0, 0.5))
        cell = main.create_block(main.global_block())
        with rg.block_guard(cell):
            input_t = cell.create_var("input_t", [-1, 3], F64)
            timestep = cell.create_var("timestep", [], "int64")
            h_prev = cell.create_var("h_prev", [-1, 3], F64)
            c_prev = cell.create_var("c_prev", [-1, 3], F64)
            scale = rg.cast(timestep, F64) * 0.1 + 1.0
            mm = input_t @ w
            pre = mm + h_prev
            gate = rg.tanh(pre)
            c_t = c_prev * 0.5 + gate * scale
            h_t = rg.tanh(c_t)
        outs = rg.recurrent_net(cell, inputs=[(input_t, x)],
                                initial_cell_inputs=[(h_prev, h0), (c_prev, c0)],
                                links={h_prev: h_t, c_prev: c_t}, timestep=timestep,
                                outputs_with_grads=outputs_with_grads,
                                recompute_blobs_on_backward=[mm, pre, gate] if recompute else None,
                                forward_only=forward_only)
        h_all, h_last, c_all, c_last = outs
        loss = rg.sum(h_all * h_all) + rg.sum(c_last)
        grads = None if forward_only else rg.gradients(loss, [x, h0, c0, w])
    exe = rg.Executor()
    exe.run(startup)
    return main, exe, outs, loss, grads


def _recurrent_net_reference(feed, w, use_last=False):
    tv = {k: _t(a) for k, a in feed.items()}
    wt = _t(w)
    h, c, hs = tv["h0"], tv["c0"], []
    for i in range(feed["x"].shape[0]):
        c = c * 0.5 + torch.tanh(tv["x"][i] @ wt + h) * (i * 0.1 + 1.0)
        h = torch.tanh(c)
        hs.append(h)
    H = torch.stack(hs)
    loss = (H * H).sum() + c.sum()
    (loss if use_last else (H * H).sum()).backward()
    return H, h, c, loss, [tv[k].grad for k in ("x", "h0", "c0")] + [wt.grad]


def _net_feed(t=5, n=2, seed=7):
    r = _rng(seed)
    return {"x": r.standard_normal((t, n, 3)), "h0": r.standard_normal((n, 3)),
            "c0": r.standard_normal((n, 3))}


@pytest.mark.parametrize("owg,use_last", [((0,), False), ((0, 3), True)])
def test_recurrent_net_caffe2_style(owg, use_last):
    main, exe, outs, loss, grads = _recurrent_net_program(outputs_with_grads=owg)
    feed = _net_feed()
    ours = exe.run(main, feed=feed, fetch_list=list(outs) + [loss] + grads)
    H, h, c, loss_t, ref_grads = _recurrent_net_reference(feed, exe.scope.get("cell.w"), use_last)
    _close(ours[0], H)
    _close(ours[1], h)
    _close(ours[3], c)
    _close(ours[4], loss_t)
    for mine, ref in zip(ours[5:], ref_grads):
        _close(mine, ref)


@pytest.mark.engine_skip("peak_bytes on the engine counts bound inputs and outputs, not the executor's memory plan")
def test_recurrent_net_recompute_blobs_on_backward_same_gradients_less_memory():
    runs = {}
    for recompute in (False, True):
        main, exe, outs, loss, grads = _recurrent_net_program(outputs_with_grads=(0, 3), recompute=recompute)
        feed = _net_feed(t=20, n=4)
        runs[bool(recompute)] = (exe.run(main, feed=feed, fetch_list=grads), exe.last_stats.peak_bytes, main)
    (stored, peak_stored, _), (recomputed, peak_recomputed, main) = runs[False], runs[True]
    for a, b in zip(stored, recomputed):
        np.testing.assert_array_equal(a, b)
    assert peak_recomputed < peak_stored
    grad_op = next(op for op in main.global_block().ops if op.type == "RecurrentNetworkGrad")
    first = [op.type for op in grad_op.attrs["backward"].ops[:3]]
    assert first == ["MatMul", "Add", "Tanh"]           # recomputed at the start of the backward step
    fwd = next(op for op in main.global_block().ops if op.type == "RecurrentNetwork")
    stored = [fwd.attrs["step"].var(n) for n, full in zip(fwd.attrs["saved"], fwd.attrs["saved_full"]) if full]
    assert [v.shape for v in stored] == [()]              # only the per-step scale, no [N, 3] value


def _peak_and_grads(model, feed):
    out = model.run(feed)
    return out, model.exe.last_stats.peak_bytes


@pytest.mark.engine_skip("peak_bytes on the engine counts bound inputs and outputs, not the executor's memory plan")
def test_recompute_steps_gives_identical_gradients_with_lower_peak():
    base = TanhRNN(d=16, h=16, deep=True)
    feed = base.feed(t=30, n=8)
    _check_against_torch(base, feed)
    stored, peak_stored = _peak_and_grads(base, feed)
    steps = TanhRNN(d=16, h=16, recompute="steps", deep=True)
    recomputed, peak_steps = _peak_and_grads(steps, feed)
    for a, b in zip(stored, recomputed):
        np.testing.assert_array_equal(a, b)
    assert peak_steps < peak_stored


def test_forward_only_matches_and_holds_less():
    full = TanhRNN(d=8, h=8)
    feed = full.feed(t=40, n=4)
    h_all, h_last, loss, *_ = full.run(feed)
    peak_training = full.exe.last_stats.peak_bytes
    fwd = TanhRNN(d=8, h=8, forward_only=True)
    ours = fwd.run(feed, with_grads=False)
    np.testing.assert_array_equal(ours[0], h_all)
    np.testing.assert_array_equal(ours[2], loss)
    assert fwd.exe.last_stats.peak_bytes < peak_training


def test_forward_only_memory_does_not_grow_with_steps_beyond_outputs():
    """Apart from the [T+1, N, H] states, a forward-only run keeps nothing per step."""
    peaks = {}
    for t in (10, 40):
        model = TanhRNN(d=8, h=8, forward_only=True)
        model.run(model.feed(t=t, n=4), with_grads=False)
        peaks[t] = model.exe.last_stats.peak_bytes
    # Per step the run holds one [N=4, 8] float64 row of x, of proj, of the states tensor and of
    # h_all * proj: 4 * 256 bytes. Keeping any step intermediate would add at least 256 more.
    per_step = 4 * (4 * 8 * 8)
    assert peaks[40] - peaks[10] <= 30 * per_step


def test_forward_only_refuses_a_gradient():
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, -1, 2], F64, stop_gradient=False)
        h0 = rg.data("h0", [-1, 2], F64)
        (h_all,), _ = rg.recurrent(lambda xs, hs: [rg.tanh(xs[0] + hs[0])], [x], [h0], forward_only=True)
        with pytest.raises(ProgramError, match="forward_only"):
            rg.gradients(rg.sum(h_all), [x])


def test_json_round_trip_runs_the_same():
    model = TanhRNN(seq_lengths=True, recompute="steps")
    text = model.main.to_json()
    again = rg.Program.from_json(text)
    assert again.to_json() == text
    feed = model.feed(t=4, n=3, lengths=[4, 1, 2])
    ours = model.run(feed)
    names = [v.name for v in [model.h_all, model.h_last, model.loss] + model.grads]
    theirs = model.exe.run(again, feed=feed, fetch_list=names)
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a, b)


def test_int_recompute_budget_is_accepted_and_negative_ones_are_not():
    # Byte budgets are implemented by retrograd/memory/rnn_budget.py (tests in tests/memory).
    TanhRNN(recompute=1 << 20)
    with pytest.raises(ProgramError, match=">= 0"):
        TanhRNN(recompute=-1)


def test_step_function_mistakes_are_program_errors():
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, -1, 2])
        h0 = rg.data("h0", [-1, 2])
        with pytest.raises(ProgramError, match="returned 2 states for 1"):
            rg.recurrent(lambda xs, hs: [hs[0], hs[0]], [x], [h0])
        with pytest.raises(ProgramError, match="float64"):
            rg.recurrent(lambda xs, hs: [rg.cast(hs[0], F64)], [x], [h0])
        with pytest.raises(ProgramError, match="at least one input"):
            rg.recurrent(lambda xs, hs: hs, [], [h0])


def test_mismatched_sequence_lengths_fail_at_run_time_naming_the_op():
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        a = rg.data("a", [-1, -1, 2])
        b = rg.data("b", [-1, -1, 2])
        h0 = rg.data("h0", [-1, 2])
        (h_all,), _ = rg.recurrent(lambda xs, hs: [xs[0] + xs[1] + hs[0]], [a, b], [h0])
    with pytest.raises(ExecutionError, match="RecurrentNetwork"):
        rg.Executor().run(main, feed={"a": np.zeros((3, 1, 2)), "b": np.zeros((4, 1, 2)),
                                      "h0": np.zeros((1, 2))}, fetch_list=[h_all])


def test_finite_differences_with_lengths_and_two_inputs():
    r = _rng(8)
    lengths = np.asarray([3, 1], dtype=np.int64)

    def fn(x, y, h0, w):
        (h_all,), (h_last,) = rg.recurrent(
            lambda xs, hs: [rg.tanh(xs[0] @ w + xs[1] * hs[0])], [x, y], [h0],
            seq_lengths=rg.constant(lengths))
        return [h_all, h_last]

    check_gradients(fn, {"x": r.standard_normal((3, 2, 2)), "y": r.standard_normal((3, 2, 3)),
                                    "h0": r.standard_normal((2, 3)), "w": r.standard_normal((2, 3))})


def test_cond_in_the_step_and_a_second_layer_sharing_a_weight():
    r = _rng(12)
    t, n, d, h = 4, 3, 2, 3
    feed = {"x": r.standard_normal((t, n, d)), "h0": r.standard_normal((n, h)),
            "w": r.standard_normal((d, h)), "u": r.standard_normal((h, h)) * 0.5,
            "v": r.standard_normal((h, h)) * 0.5}
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x, h0, w, u, v = (rg.data(k, [-1] * (a.ndim - 1) + [a.shape[-1]] if k in ("x", "h0") else list(a.shape),
                                  F64, stop_gradient=False) for k, a in feed.items())

        def step1(xs, hs):
            a = xs[0] @ w + hs[0] @ u
            return [rg.cond(rg.sum(a) > 0.0, lambda: rg.tanh(a), lambda: rg.tanh(a) * 0.5)]

        (h1,), _ = rg.recurrent(step1, [x], [h0])
        (h2,), (h2_last,) = rg.recurrent(lambda xs, hs: [rg.tanh(xs[0] @ v + hs[0] @ u)], [h1], [h0])
        loss = rg.sum(h2 * h2) + rg.sum(h2_last)
        grads = rg.gradients(loss, [x, h0, w, u, v])
    ours = rg.Executor().run(main, feed=feed, fetch_list=[loss] + grads)
    tv = {k: _t(a) for k, a in feed.items()}
    hh, hs = tv["h0"], []
    for i in range(t):
        a = tv["x"][i] @ tv["w"] + hh @ tv["u"]
        hh = torch.tanh(a) if a.sum() > 0 else torch.tanh(a) * 0.5
        hs.append(hh)
    h1_t, hh, hs = torch.stack(hs), tv["h0"], []
    for i in range(t):
        hh = torch.tanh(h1_t[i] @ tv["v"] + hh @ tv["u"])
        hs.append(hh)
    loss_t = (torch.stack(hs) ** 2).sum() + hh.sum()
    loss_t.backward()
    _close(ours[0], loss_t)
    for mine, k in zip(ours[1:], ["x", "h0", "w", "u", "v"]):
        _close(mine, tv[k].grad)


def test_recurrent_inside_a_while_loop_body():
    """The RNN's gradient op lands in the loop's backward block, which cannot see the step block."""
    r = _rng(13)
    t, n, h = 3, 2, 3
    feed = {"x": r.standard_normal((t, n, h)), "h0": r.standard_normal((n, h)),
            "u": r.standard_normal((h, h)) * 0.5}
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, -1, h], F64, stop_gradient=False)
        h0 = rg.data("h0", [-1, h], F64, stop_gradient=False)
        u = rg.data("u", [h, h], F64, stop_gradient=False)

        def body(i, state):
            _, (last,) = rg.recurrent(lambda xs, hs: [rg.tanh(xs[0] + hs[0] @ u)], [x], [state])
            return [i + 1, last]

        _, h_final = rg.while_loop(lambda i, state: i < 2, body, [rg.constant(0), h0])
        loss = rg.sum(h_final * h_final)
        grads = rg.gradients(loss, [x, u, h0])
    ours = rg.Executor().run(main, feed=feed, fetch_list=[loss] + grads)
    tv = {k: _t(a) for k, a in feed.items()}
    hh = tv["h0"]
    for _ in range(2):
        for i in range(t):
            hh = torch.tanh(tv["x"][i] + hh @ tv["u"])
    loss_t = (hh * hh).sum()
    loss_t.backward()
    _close(ours[0], loss_t)
    for mine, k in zip(ours[1:], ["x", "u", "h0"]):
        _close(mine, tv[k].grad)


def test_integer_sequence_and_integer_state_with_an_embedding_in_the_step():
    r = _rng(14)
    vocab, h, t, n = 5, 3, 4, 2
    feed = {"ids": r.integers(0, vocab, (t, n)), "emb": r.standard_normal((vocab, h)),
            "h0": r.standard_normal((n, h)), "count0": np.zeros(n, np.int64)}
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        ids = rg.data("ids", [-1, -1], "int64")
        emb = rg.data("emb", [vocab, h], F64, stop_gradient=False)
        h0 = rg.data("h0", [-1, h], F64, stop_gradient=False)
        count0 = rg.data("count0", [-1], "int64")

        def step(xs, hs):
            return [rg.tanh(rg.gather(emb, xs[0]) + hs[0]), hs[1] + 1]

        (h_all, _), (_, count) = rg.recurrent(step, [ids], [h0, count0])
        loss = rg.sum(h_all * h_all)
        grads = rg.gradients(loss, [emb, h0])
    ours = rg.Executor().run(main, feed=feed, fetch_list=[loss, count] + grads)
    emb_t, h0_t = _t(feed["emb"]), _t(feed["h0"])
    hh, hs = h0_t, []
    for i in range(t):
        hh = torch.tanh(emb_t[torch.tensor(feed["ids"][i])] + hh)
        hs.append(hh)
    loss_t = (torch.stack(hs) ** 2).sum()
    loss_t.backward()
    _close(ours[0], loss_t)
    np.testing.assert_array_equal(ours[1], [t, t])
    _close(ours[2], emb_t.grad)
    _close(ours[3], h0_t.grad)


def test_zero_time_steps():
    model = TanhRNN()
    feed = model.feed(t=0, n=2)
    h_all, h_last, loss, dx, dh0, dw, du, db = model.run(feed)
    assert h_all.shape == (0, 2, 4) and dx.shape == (0, 2, 3)
    np.testing.assert_array_equal(h_last, feed["h0"])
    np.testing.assert_array_equal(dh0, feed["proj_last"])        # d loss / d h_last passes straight through
    assert not dw.any() and not du.any() and not db.any()


def _tanh_rnn(x_shape, h_shape, with_lengths=True):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", x_shape, dtype=F64)
        h0 = rg.data("h0", h_shape, dtype=F64)
        lengths = rg.data("lengths", [-1], dtype="int64") if with_lengths else None
        (h_all,), (h_last,) = rg.recurrent(lambda xs, hs: [rg.tanh(xs[0] + hs[0])], [x], [h0],
                                           seq_lengths=lengths)
    return main, h_all, h_last


@pytest.mark.parametrize("lengths", [[4, 1], [-1, 2], [0, 3 + 1]])
def test_seq_lengths_outside_zero_to_t_are_execution_errors(lengths):
    """Regression (issue #10): lengths above T were silently clamped, negative ones ignored."""
    main, h_all, h_last = _tanh_rnn([3, -1, 2], [-1, 2])
    feed = {"x": np.ones((3, 2, 2)), "h0": np.zeros((2, 2)), "lengths": np.array(lengths)}
    with pytest.raises(ExecutionError, match=r"RecurrentNetwork in block 0: seq_lengths holds -?\d+\.\.\d+; "
                                             r"each length must lie in \[0, 3\]"):
        rg.Executor().run(main, feed=feed, fetch_list=[h_last])
    feed["lengths"] = np.array([0, 3])
    _, last = rg.Executor().run(main, feed=feed, fetch_list=[h_all, h_last])
    np.testing.assert_allclose(last, [[0.0, 0.0], np.tanh(1 + np.tanh(1 + np.tanh(1.0))) * np.ones(2)])
    feed["lengths"] = np.array([1, 2, 3])
    with pytest.raises(ExecutionError, match=r"seq_lengths has shape \[3\], expected \[2\]"):
        rg.Executor().run(main, feed=feed, fetch_list=[h_last])


def test_initial_state_batch_differing_from_the_input_names_the_state():
    """Regression (issue #10): the mismatch surfaced as an inner Add that does not broadcast."""
    main, _, h_last = _tanh_rnn([3, -1, 2], [-1, 2], with_lengths=False)
    feed = {"x": np.ones((3, 2, 2)), "h0": np.zeros((5, 2))}
    with pytest.raises(ExecutionError, match=r"RecurrentNetwork in block 0: initial state 'h0' has batch 5 "
                                             r".*the input sequence 'x' has batch 2"):
        rg.Executor().run(main, feed=feed, fetch_list=[h_last])
    with pytest.raises(ProgramError, match=r"initial state 'h0' \(float64\[5, 2\]\) has batch 5, the input "
                                           r"sequence 'x'"):
        _tanh_rnn([3, 2, 2], [5, 2], with_lengths=False)
    with pytest.raises(ProgramError, match=r"initial state 'h0'.* has batch 5"):
        with rg.program_guard(rg.Program(), rg.Program()):
            rg.layers.gru(rg.data("x", [3, 2, 2], dtype=F64), 4, h0=rg.data("h0", [5, 4], dtype=F64))
