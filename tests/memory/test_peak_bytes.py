"""``exe.last_stats.peak_bytes``: exact, deterministic counts of distinct live buffers.

Each expected peak is worked out by hand from the liveness rule (a value dies
after its last read unless fetched) and the sizes of the arrays involved. The
counts are the same on every backend (torch counts tensor storages: views share one).
"""
from __future__ import annotations

import numpy as np

import retrograd as rg
from retrograd import Program
from retrograd.backends import to_numpy
from retrograd.ops.core.registry import append_op

N = 1000          # float64 elements: 8000 bytes per array
A = N * 8


def _run(backend, main, feed, fetch):
    exe = backend.executor()
    out = exe.run(main, feed=feed, fetch_list=fetch)
    return out, exe.last_stats.peak_bytes


def test_chain_frees_each_value_after_its_last_read(backend):
    main = Program()
    with rg.program_guard(main, Program()):
        x = rg.data("x", [N], dtype="float64")
        y = x
        for _ in range(10):
            y = rg.exp(y * 0.0)            # Mul with a scalar constant, then Exp
    xb = np.random.RandomState(0).randn(N)
    (out,), peak = _run(backend, main, {"x": xb}, [y])
    np.testing.assert_array_equal(out, np.ones(N))
    # At most two arrays plus 8-byte scalar constants are ever alive together.
    assert 2 * A <= peak <= 2 * A + 16


def test_peak_is_deterministic_across_runs_and_executors(backend):
    main = Program()
    with rg.program_guard(main, Program()):
        x = rg.data("x", [-1, 50], dtype="float64")
        h = rg.tanh(x)
        loss = rg.mean(rg.concat([h, x * 2.0], axis=0))
        dx, = rg.gradients(loss, x)
    xb = np.random.RandomState(1).randn(20, 50)
    peaks = []
    for _ in range(2):
        exe = backend.executor()
        for _ in range(3):
            exe.run(main, feed={"x": xb}, fetch_list=[dx])
            peaks.append(exe.last_stats.peak_bytes)
    assert len(set(peaks)) == 1 and peaks[0] > xb.nbytes


def test_views_share_their_base_buffer(backend):
    main = Program()
    with rg.program_guard(main, Program()):
        x = rg.data("x", [N], dtype="float64")
        v = rg.reshape(x, [10, 100])                   # a view of the fed array
        t = rg.transpose(v, [1, 0])                    # a view of the view
        y = rg.exp(t)
    xb = np.random.RandomState(2).randn(N)
    exe = backend.executor()
    xx, vv, tt, yy = exe.run(main, feed={"x": xb}, fetch_list=[x, v, t, y], return_numpy=False)
    # On a device the feed is copied there once; the views share that copy's buffer.
    buffers = {exe.backend.buffer_of(a)[0] for a in (xx, vv, tt)}
    assert len(buffers) == 1 and buffers != {exe.backend.buffer_of(yy)[0]}
    if backend.device in (None, "cpu"):            # host backends take the fed array itself
        assert np.shares_memory(to_numpy(vv), xb) and np.shares_memory(to_numpy(tt), xb)
    # (to the last bit on the host; a GPU's exp may round the last bit otherwise)
    np.testing.assert_allclose(to_numpy(yy), np.exp(xb.reshape(10, 100).T), rtol=1e-15, atol=0)
    assert exe.last_stats.peak_bytes == 2 * A       # x (and its two views) + y; views add nothing


def test_a_copy_counts_where_a_view_does_not(backend):
    main = Program()
    with rg.program_guard(main, Program()):
        x = rg.data("x", [N], dtype="float64")
        y = rg.exp(rg.reshape(x * 1.0, [10, 100]))     # the Mul makes a fresh array
    xb = np.ones(N)
    _, peak = _run(backend, main, {"x": xb}, [x, y])
    # x (fetched, so kept), the product (its reshape is a view), then y: x + 2 arrays
    # (the 8-byte constant 1.0 died with the Mul).
    assert peak == 3 * A


def test_in_place_write_counts_old_and_new_value_while_the_op_runs(backend):
    main = Program()
    with rg.program_guard(main, Program()):
        x = rg.data("x", [N], dtype="float64")
        y = rg.exp(x)
        append_op("Exp", [y], outputs=[y])             # y = exp(y), written in place
    xb = np.zeros(N)
    (xv, yv), peak = _run(backend, main, {"x": xb}, [x, y])
    np.testing.assert_allclose(yv, np.exp(np.exp(xb)))
    # x is kept (fetched); while the second Exp runs it reads old y and makes new y.
    assert peak == 3 * A


def test_fetched_values_stay_alive_and_count(backend):
    main = Program()
    with rg.program_guard(main, Program()):
        x = rg.data("x", [N], dtype="float64")
        ys = [rg.neg(x)]
        for _ in range(4):
            ys.append(rg.neg(ys[-1]))
    xb = np.zeros(N)
    _, only_last = _run(backend, main, {"x": xb}, [ys[-1]])
    _, all_of_them = _run(backend, main, {"x": xb}, ys)
    assert only_last == 2 * A
    assert all_of_them == 5 * A    # x dies after the first Neg; then the five results add up
