"""rg.memory.report: what the backward keeps from the forward, what it recomputes, and sizes."""
from __future__ import annotations

import pytest

import retrograd as rg
from retrograd import Program

N, W = 10, 6


def _names(rows):
    return sorted(r.name for r in rows)


def test_store_all_report_lists_the_activations_the_gradients_read(mm):
    main, _, loss, _, hidden = mm.mlp(3, W)
    r = rg.memory.report(main, feed_shapes={"x": (N, W)})
    assert r.recomputed == []
    # Tanh gradients read their outputs; MatMul gradients read their inputs (x, h0, h1, weights).
    # mul_0 (h*h) and mean_0 are read by the loss gradient for their shapes: mul_0 through a
    # one-element stand-in, so it is not kept; mean_0 is a scalar (a stand-in would save nothing).
    assert _names(r.kept) == sorted([h.name for h in hidden] + ["mean_0"])
    assert _names(r.inputs) == ["w1", "w2", "x"]    # dx is not needed, so w0 is not read
    for row in r.kept:
        if row.name != "mean_0":
            assert row.shape == (N, W) and row.nbytes == N * W * 8 and row.status == "kept"
    assert r.kept_bytes == 3 * N * W * 8 + 8
    stand_in, = r.stand_ins
    assert (stand_in.name, stand_in.shape, stand_in.nbytes, stand_in.status) == ("mul_0.shape", (N, W), 8,
                                                                                 "shape only")
    assert "1 read for their shape only" in str(r)
    assert r.input_bytes == N * W * 8 + 2 * W * W * 8
    assert r.value("tanh_0").readers >= 2          # Tanh's and the next MatMul's gradients


def test_checkpoint_report_separates_kept_and_recomputed(mm):
    main, _, loss, _, hidden = mm.mlp(5, W, pick=lambda hs: [hs[1], hs[3]])
    r = rg.memory.report(main, feed_shapes={"x": (N, W)})
    recomputed = {"matmul_0", "tanh_0", "matmul_2", "tanh_2"}
    assert set(_names(r.recomputed)) == recomputed
    assert not recomputed & set(_names(r.kept))
    assert r.value(hidden[1].name).status == "checkpoint"   # segment (h1, h3] restarts from it
    assert r.value(hidden[3].name).status == "kept"         # ends the last segment
    assert r.value(hidden[4].name).status == "kept"         # after the last checkpoint
    assert r.value("tanh_2").recomputed_as == ["tanh_2.rc"]
    assert r.recomputed_bytes == 4 * N * W * 8
    assert r.peak_recompute_bytes == 2 * N * W * 8          # one segment at a time
    text = str(r)
    assert "recomputed" in text and "tanh_2.rc" in text and f"{N * W * 8:,}" in text


def test_sizes_unknown_without_feed_shapes(mm):
    main = mm.mlp(2, W)[0]
    r = rg.memory.report(main)
    assert r.value("tanh_0").nbytes is None and r.kept_bytes is None
    assert r.value("w1").nbytes == W * W * 8
    assert "?" in str(r)


def test_loss_argument_agrees_with_the_detected_backward(mm):
    main, _, loss, _, _ = mm.mlp(3, W, pick=lambda hs: [hs[0]])
    a = rg.memory.report(main, {"x": (N, W)})
    b = rg.memory.report(main, {"x": (N, W)}, loss=loss)
    assert a.backward_start == b.backward_start
    assert str(a) == str(b)


def test_program_without_backward_is_an_error():
    main = Program()
    with rg.program_guard(main, Program()):
        rg.tanh(rg.data("x", [3]))
    with pytest.raises(rg.ProgramError, match="no backward part"):
        rg.memory.report(main)


def test_bad_feed_shape_is_an_error(mm):
    main = mm.mlp(2, W)[0]
    with pytest.raises(rg.ProgramError, match="'x'"):
        rg.memory.report(main, {"x": (N, W + 1)})
