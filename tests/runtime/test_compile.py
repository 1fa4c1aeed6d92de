"""``Executor(backend="torch", compile=True)``: compiled regions give the eager executor's numbers.

The reference is the eager torch executor running the same program on the
same feeds (itself checked against PyTorch and finite differences elsewhere);
training steps compare every step's loss and the parameters at the end, so an
update the compiled region lost or applied twice fails.

Inductor compiles slowly on a small shared CPU, so most cases hand the regions
to ``torch.compile(backend="aot_eager")``: the same tracing (Dynamo, ATen
graphs, functionalised in-place updates, dynamic sizes) without generating C++.
One case compiles with Inductor exactly as users do (``compile=True``); the
heavier models run with ``RETROGRAD_COMPILE_TESTS=all``.
"""
from __future__ import annotations

import logging
import os

import numpy as np
import pytest

import retrograd as rg
from retrograd.backends import to_numpy
from retrograd.runtime.regions import Region

torch = pytest.importorskip("torch")

# The default run (< 90 s on 2 shared cores) compiles the MLP step with Inductor and the while_loop
# program with aot_eager; the CNN, transformer and LSTM steps take about a minute each even with
# aot_eager there: they run with RETROGRAD_COMPILE_TESTS=all.
ALL_CASES = os.environ.get("RETROGRAD_COMPILE_TESTS") == "all"
compile_heavy = pytest.mark.skipif(not ALL_CASES, reason="compiling these takes minutes on a small CPU: "
                                   "set RETROGRAD_COMPILE_TESTS=all")


_aot_eager = "aot_eager"      # a torch.compile backend: the backend's region compiler with it


def _executor(compiler=None) -> rg.Executor:
    """compiler: None (Inductor, as users get), a torch.compile backend (its name or function), or a
    stand-in ``compile(fn) -> fn``."""
    exe = rg.Executor(backend="torch", compile=True)
    if isinstance(compiler, str) or getattr(compiler, "is_dynamo_backend", False):
        exe.regions.compile_function = exe.backend.region_compiler(backend=compiler)
    elif compiler is not None:
        exe.regions.compile_function = compiler
    return exe


def _params(exe, main) -> dict:
    return {v.name: to_numpy(exe.scope.get(v.name)) for v in main.list_vars() if v.persistable}


def _regions(exe) -> list[Region]:
    return [r for _, layout in exe.regions.layouts.values() for r in layout.regions]


def _compare(main, startup, loss, feeds, compiler=_aot_eager, rtol=1e-5, atol=1e-6):
    """Train on ``feeds`` eagerly and compiled; the losses and final parameters agree."""
    text = str(main)
    want_exe = rg.Executor(backend="torch")
    want_exe.run(startup)
    want = [float(want_exe.run(main, feed=f, fetch_list=[loss])[0]) for f in feeds]
    exe = _executor(compiler)
    exe.run(startup)
    got = [float(exe.run(main, feed=f, fetch_list=[loss])[0]) for f in feeds]
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    for name, value in _params(want_exe, main).items():
        np.testing.assert_allclose(_params(exe, main)[name], value, rtol=rtol, atol=atol, err_msg=name)
    assert str(main) == text                                 # the program is not changed
    compiled = [r for r in _regions(exe) if r.calls > 0]
    assert compiled and all(r.eager_reason is None for r in compiled)
    return exe


# --- models ---------------------------------------------------------------------------------------

def _mlp(activation=rg.relu, optimizer=None):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 8])
        y = rg.data("y", [-1], dtype="int64")
        h = activation(rg.layers.fc(x, 16, name="fc1"))
        loss = rg.mean(rg.softmax_cross_entropy(rg.layers.fc(h, 4, name="fc2"), y))
        (optimizer or rg.optim.Momentum(0.1, 0.9)).minimize(loss)
    return main, startup, loss


def _mlp_feeds(sizes=(5, 5, 7, 9, 5)):
    rng = np.random.default_rng(0)
    return [{"x": rng.standard_normal((n, 8)).astype("float32"), "y": rng.integers(0, 4, (n,))} for n in sizes]


def _cnn():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 1, 12, 12])
        y = rg.data("y", [-1], dtype="int64")
        h = rg.max_pool2d(rg.layers.conv2d(x, 4, 3, padding=1, act="relu", name="c1"), 2)
        h = rg.max_pool2d(rg.layers.conv2d(h, 8, 3, padding=1, act="relu", name="c2"), 2)
        logits = rg.layers.fc(rg.reshape(h, [-1, 8 * 3 * 3]), 5, name="out")
        loss = rg.mean(rg.softmax_cross_entropy(logits, y))
        rg.optim.Momentum(0.05, 0.9).minimize(loss)
    return main, startup, loss


def _cnn_feeds(sizes=(4, 4, 6)):
    rng = np.random.default_rng(1)
    return [{"x": rng.standard_normal((n, 1, 12, 12)).astype("float32"), "y": rng.integers(0, 5, (n,))}
            for n in sizes]


def _transformer():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        ids = rg.data("ids", [-1, 6], dtype="int64")
        target = rg.data("target", [-1, 6], dtype="int64")
        h = rg.layers.embedding(ids, 11, 16, name="emb")
        h = rg.layers.transformer_block(h, num_heads=2, name="blk")
        loss = rg.mean(rg.softmax_cross_entropy(rg.layers.fc(h, 11, name="head"), target))
        rg.optim.Momentum(0.05, 0.9).minimize(loss)    # (Adam would amplify the key bias' zero gradient's noise)
    return main, startup, loss


def _transformer_feeds(sizes=(3, 3, 5)):
    rng = np.random.default_rng(2)
    return [{"ids": rng.integers(0, 11, (n, 6)), "target": rng.integers(0, 11, (n, 6))} for n in sizes]


def _lstm_lm(dtype="float32"):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        chars = rg.data("chars", [-1, -1], dtype="int64")
        target = rg.data("target", [-1, -1], dtype="int64")
        emb = rg.layers.embedding(chars, 11, 6, name="emb", dtype=dtype)
        h_all, _, _, _ = rg.layers.lstm(emb, 8, name="lstm")
        loss = rg.mean(rg.softmax_cross_entropy(rg.layers.fc(h_all, 11, name="head"), target))
        rg.optim.Adam(0.05, clip_norm=1.0).minimize(loss)
    return main, startup, loss


def _lstm_feeds(shapes=((7, 3), (7, 3), (5, 3))):
    rng = np.random.default_rng(3)
    return [{"chars": rng.integers(0, 11, s), "target": rng.integers(0, 11, s)} for s in shapes]


def _while_program():
    """x <- tanh(x @ w) + 0.5 x, n times (n fed), then an SGD step on sum(x^2): the loop and its
    gradient stay the executor's, the straight-line parts around and inside them are compiled."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [2, 4], dtype="float64")
        n = rg.data("n", [], dtype="int64")
        w = rg.create_parameter("w", [4, 4], dtype="float64", init=np.eye(4) * 0.5 + 0.1)
        _, y = rg.while_loop(lambda i, y: i < n, lambda i, y: (i + 1, rg.tanh(y @ w) + y * 0.5),
                             [rg.constant(0), rg.tanh(x * 2.0)])
        loss = rg.sum(y * y)
        rg.optim.SGD(0.05).minimize(loss)
    return main, startup, loss


def _while_feeds():
    rng = np.random.default_rng(4)
    return [{"x": rng.standard_normal((2, 4)), "n": np.array(n)} for n in (2, 3, 0, 5)]


# --- results equal eager's ---------------------------------------------------------------------------

def test_mlp_train_step_compiled_by_inductor_matches_eager():
    exe = _compare(*_mlp(), _mlp_feeds((5, 5, 7)), compiler=None)      # 7: one recompile, size symbolic
    assert max(len(r.steps) for r in _regions(exe) if r.calls > 1) > 15   # forward, backward, updates


@compile_heavy
@pytest.mark.parametrize("model, feeds", [(_cnn, _cnn_feeds), (_transformer, _transformer_feeds),
                                          (_lstm_lm, _lstm_feeds)],
                         ids=["cnn", "transformer", "lstm_lm"])
def test_traced_regions_match_eager(model, feeds):
    _compare(*model(), feeds())


@compile_heavy
def test_lstm_lm_float64_runs_its_recurrence_eagerly_between_regions():
    exe = _compare(*_lstm_lm("float64"), _lstm_feeds(), rtol=1e-10, atol=1e-12)
    assert any(any(r.calls for r in layout.regions) and
               any(not isinstance(item, Region) and item.op.sub_blocks() for item in layout.items)
               for _, layout in exe.regions.layouts.values())


def test_while_loop_splits_regions_and_matches_eager():
    exe = _compare(*_while_program(), _while_feeds(), rtol=1e-10, atol=1e-12)
    top = exe.regions.layouts
    kinds = [type(item).__name__ for _, layout in top.values() for item in layout.items]
    assert "Region" in kinds and "Step" in kinds


@compile_heavy
@pytest.mark.parametrize("model, feeds", [(_cnn, _cnn_feeds), (_transformer, _transformer_feeds),
                                          (_lstm_lm, _lstm_feeds), (_while_program, _while_feeds)],
                         ids=["cnn", "transformer", "lstm_lm", "while"])
def test_inductor_regions_match_eager(model, feeds):
    _compare(*model(), feeds(), compiler=None, rtol=1e-4, atol=1e-5)


# --- what compile=True promises besides the numbers --------------------------------------------------

def test_compile_needs_the_torch_backend():
    with pytest.raises(rg.BackendError, match='compile=True.*needs backend "torch"'):
        rg.Executor(compile=True)


def test_startup_program_is_not_compiled():
    main, startup, loss = _mlp()
    compiled = []
    exe = _executor(lambda f: compiled.append(f) or f)
    exe.run(startup)
    assert compiled == []          # a region is compiled on its second run: startup runs once


def test_region_the_compiler_fails_on_runs_eagerly_with_one_logged_line(caplog):
    def broken(function):
        def fails(*args):
            raise RuntimeError("the compiler cannot trace this")
        return fails

    main, startup, loss = _mlp()
    feeds = _mlp_feeds()
    want_exe = rg.Executor(backend="torch")
    want_exe.run(startup)
    exe = _executor(broken)
    exe.run(startup)
    with caplog.at_level(logging.WARNING, logger="retrograd"):
        for f in feeds:
            got, = exe.run(main, feed=f, fetch_list=[loss])
            want, = want_exe.run(main, feed=f, fetch_list=[loss])
            np.testing.assert_allclose(got, want, rtol=1e-6)
    lines = [r.getMessage() for r in caplog.records if "runs eagerly" in r.getMessage()]
    assert len(lines) == 1 and "the compiler cannot trace this" in lines[0]
    assert all(r.function is None for r in _regions(exe) if r.eager_reason)


def test_bad_label_in_a_compiled_region_raises_the_eager_error():
    main, startup, loss = _mlp()
    exe = _executor(lambda f: f)       # a stand-in compiler: the checks deferred as when compiled
    exe.run(startup)
    feed = _mlp_feeds()[0]
    for _ in range(2):
        exe.run(main, feed=feed, fetch_list=[loss])
    bad = dict(feed, y=np.array([0, 1, 7, 2, 3]))
    with pytest.raises(rg.ExecutionError, match="SoftmaxCrossEntropy.*label 7 is out of range"):
        exe.run(main, feed=bad, fetch_list=[loss])
    got, = exe.run(main, feed=feed, fetch_list=[loss])      # still compiled, still right
    assert np.isfinite(got) and all(r.eager_reason is None for r in _regions(exe))


def test_check_finite_runs_op_by_op():
    main, startup, loss = _mlp()
    calls = []
    exe = rg.Executor(backend="torch", compile=True, check_finite=True)
    exe.regions.compile_function = lambda f: calls.append(f) or f
    exe.run(startup)
    for f in _mlp_feeds()[:3]:
        exe.run(main, feed=f, fetch_list=[loss])
    assert calls == []


def test_train_cli_compile_flag_reaches_the_executor():
    import argparse
    from retrograd.cli.train import add_train_arguments, choose_backend
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    args = parser.parse_args(["--compile"])
    assert args.compile and choose_backend(args) == "torch"


def test_ops_declared_compile_false_run_between_regions(monkeypatch):
    from retrograd.ops.core.registry import OPS
    from retrograd.runtime.regions import compilable
    monkeypatch.setitem(OPS["FusedAdamUpdate"].extra, "compile", False)    # as defop(..., compile=False)
    main, startup, loss = _lstm_lm()        # Adam: one FusedAdamUpdate on the torch backend
    exe = _executor(lambda f: f)
    exe.run(startup)
    exe.run(main, feed=_lstm_feeds()[0], fetch_list=[loss])
    steps = [item for _, layout in exe.regions.layouts.values() for item in layout.items
             if not isinstance(item, Region)]
    assert "FusedAdamUpdate" in [s.op.type for s in steps]
    assert not any(compilable(s) for s in steps if s.op.type == "FusedAdamUpdate")


def test_embedding_ids_checked_from_the_end_after_a_compiled_region():
    """Regression: Gather's ids may count from the end (``wrap_ids`` defers a 6-field check); the
    region's check unpacked 5 fields, so every region with an embedding ran eagerly."""
    main, startup, loss = _lstm_lm()
    want_exe = rg.Executor(backend="torch")
    want_exe.run(startup)
    exe = _executor(lambda f: f)       # a stand-in compiler: the checks deferred as when compiled
    exe.run(startup)
    feeds = _lstm_feeds()
    negative = dict(feeds[0], chars=feeds[0]["chars"] - 11)           # the same rows, counted from the end
    for f in (feeds[0], feeds[1], negative):
        got, = exe.run(main, feed=f, fetch_list=[loss])
        want, = want_exe.run(main, feed=f, fetch_list=[loss])
        np.testing.assert_allclose(got, want, rtol=1e-6)
    assert all(r.eager_reason is None for r in _regions(exe)) and any(r.calls for r in _regions(exe))
    for bad in (11, -12):
        chars = feeds[0]["chars"].copy()
        chars[1, 2] = bad
        with pytest.raises(rg.ExecutionError, match=f"Gather.*id {bad} is out of range"):
            exe.run(main, feed=dict(feeds[0], chars=chars), fetch_list=[loss])
    assert all(r.eager_reason is None for r in _regions(exe))


def _counted_graphs(built, feeds):
    """``_compare`` with a Dynamo backend that keeps each graph: (the executor, the graphs, the
    targets of the functions they call)."""
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    counting.is_dynamo_backend = True
    torch._dynamo.reset()
    exe = _compare(*built, feeds, compiler=counting)
    called = [str(node.target) for gm in graphs for node in gm.graph.nodes if node.op == "call_function"]
    return exe, graphs, called


def test_onednn_lstm_and_fused_adam_stay_inside_one_compiled_graph():
    """oneDNN's LSTM calls and ATen's multi-tensor Adam are opaque custom ops in the region's one
    graph (no graph break at the grad-mode switch the LSTM needs, none at its workspace's
    data-dependent size; the updates in the same region as the forward and backward); numbers as
    eager's."""
    exe = _executor()
    if exe.backend.onednn_lstm is None:
        pytest.skip("this torch has no oneDNN LSTM ops")
    exe, graphs, called = _counted_graphs(_lstm_lm(), _lstm_feeds(((7, 3), (7, 3), (7, 3))))
    assert sum("onednn_lstm_layer_backward" in t for t in called) == 1
    assert sum("onednn_lstm_layer." in t or t.endswith("onednn_lstm_layer") for t in called) == 1
    assert len(graphs) == len([r for r in _regions(exe) if r.calls > 1])     # one graph per compiled region
    if exe.backend.fused_adam is not None:
        assert sum("multi_adam" in t for t in called) == 1
        region = max(_regions(exe), key=lambda r: len(r.steps))
        assert {"LSTMSequence", "LSTMSequenceGrad", "FusedAdamUpdate"} <= {s.op.type for s in region.steps}


def test_scheduled_adamw_inside_a_compiled_region_matches_eager():
    """The multi-tensor Adam custom op with a scheduled learning rate (a Var read on the host inside
    the op) and decoupled weight decay: each step's loss and the final parameters as eager's."""
    adamw = rg.optim.AdamW(rg.optim.lr.step_decay(0.05, 2, 0.5), weight_decay=0.1)
    exe = _compare(*_mlp(rg.tanh, adamw), _mlp_feeds((5, 5, 5, 5, 5)))
    region = max(_regions(exe), key=lambda r: len(r.steps))
    assert "FusedAdamUpdate" in {s.op.type for s in region.steps} and region.calls >= 3


def test_max_pool_runs_atens_kernels_inside_a_compiled_graph():
    """Max pooling and its gradient are opaque custom ops in the CNN region's one graph (Inductor's
    CPU code for them is scalar); the first pool (4 channels) pools NCHW, the second (8 channels)
    through channels-last: losses and parameters as eager's."""
    exe, graphs, called = _counted_graphs(_cnn(), _cnn_feeds((4, 4, 4)))
    assert sum("retrograd.max_pool2d.default" in t for t in called) == 2
    assert sum("retrograd.max_pool2d_backward" in t for t in called) == 2
    assert len(graphs) == len([r for r in _regions(exe) if r.calls > 1])


@pytest.mark.parametrize("options", [dict(bidirectional=True), dict(forget_bias=1.0, bias=False)],
                         ids=["bidirectional", "forget_bias_no_bias"])
def test_onednn_lstm_variants_inside_a_compiled_region_match_eager(options):
    """The custom ops' reverse direction, and the forget bias folded into a zero bias by traced
    code: training steps as eager's (Adam, clipping)."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        chars = rg.data("chars", [-1, -1], dtype="int64")
        target = rg.data("target", [-1, -1], dtype="int64")
        emb = rg.layers.embedding(chars, 11, 6, name="emb")
        h_all, _, _, _ = rg.layers.lstm(emb, 8, name="lstm", **options)
        loss = rg.mean(rg.softmax_cross_entropy(rg.layers.fc(h_all, 11, name="head"), target))
        rg.optim.Adam(0.05, clip_norm=1.0).minimize(loss)
    exe = _compare(main, startup, loss, _lstm_feeds())
    region = max(_regions(exe), key=lambda r: len(r.steps))
    assert "LSTMSequence" in {s.op.type for s in region.steps}


def test_guards_skipped_only_for_seen_input_signatures():
    """On the CPU a region runs Dynamo's guards only for an input signature it has not seen (shape,
    strides, dtype...); sizes coming back, new sizes and a parameter that turns into a transposed
    view between runs all give eager's numbers."""
    feeds = _mlp_feeds((5, 5, 7, 5, 7, 9, 5))
    main, startup, loss = _mlp()
    want_exe = rg.Executor(backend="torch")
    want_exe.run(startup)
    exe = _executor(_aot_eager)
    exe.run(startup)
    for i, f in enumerate(feeds):
        if i == 4:                        # the same values, another layout: a new signature
            for e in (exe, want_exe):
                w = e.scope.get("fc1.w")
                e.scope.set("fc1.w", w.t().contiguous().t())
        got, = exe.run(main, feed=f, fetch_list=[loss])
        want, = want_exe.run(main, feed=f, fetch_list=[loss])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"run {i}")
    region = max(_regions(exe), key=lambda r: len(r.steps))
    assert region.eager_reason is None and len(region.function.compiled.seen) >= 3
