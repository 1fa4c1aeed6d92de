"""passes.fuse_recurrent_cells on GRUs: step-by-step GRU recurrences (layers.gru, rg.recurrent with a GRU
cell) and their gradients become GRUSequence / GRUSequenceGrad where ``gru_dtypes`` allows. Checked
against the unrewritten program on NumPy (float64, GRUSequence's general kernels), through the
executor on torch CPU with the backend's capability faked (there is no vendor GRU on the CPU, so by
default torch CPU keeps the recurrence), and on CUDA where there is a GPU (cuDNN)."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg

D, H = 5, 4


def _op_types(program) -> list[str]:
    return [op.type for block in program.blocks for op in block.ops]


def _layer_program(dtype="float64", **gru_kwargs):
    """layers.gru over x, a loss reading h_all and h_last; gradients of x, every parameter and the given
    initial state. Returns (main, startup, fetch list)."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, D], dtype, stop_gradient=False)
        h0 = rg.data("h0", [-1, H], dtype, stop_gradient=False)
        states = {} if gru_kwargs.pop("zero_states", False) else {"h0": h0}
        h_all, h_last = rg.layers.gru(x, H, name="dec", **states, **gru_kwargs)
        loss = rg.sum(h_all * h_all) + rg.sum(rg.sin(h_last))
        wrt = [x] + list(main.all_parameters()) + ([h0] if states else [])
        grads = rg.gradients(loss, wrt)
    return main, startup, [loss, h_all, h_last] + grads


def _feed(dtype, steps=6, batch=3, seed=0):
    r = np.random.default_rng(seed)
    return {"x": r.standard_normal((steps, batch, D)).astype(dtype),
            "h0": r.standard_normal((batch, H)).astype(dtype)}


def _run(program, startup, fetch, feed, backend="numpy", params=None):
    """Results of ``program``; parameters from ``params`` (names -> arrays), else the startup's."""
    exe = rg.Executor(backend=backend)
    exe.run(startup)
    for name, value in (params or {}).items():
        exe.scope.set(name, exe.backend.from_numpy(value))
    return exe.run(program, feed={k: v for k, v in feed.items() if k in program.global_block().vars},
                   fetch_list=fetch), exe


def _params_of(exe, program) -> dict:
    return {p.name: rg.backends.to_numpy(exe.scope.get(p.name)) for p in program.all_parameters()}


def _assert_all_close(got, want, **tol):
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), err_msg=f"fetch {i}", **tol)


def _fused_count(program, keep=(), gru_dtypes=("float64",)) -> int:
    return rg.passes.fuse_recurrent_cells(program.clone(), keep=keep, dtypes=(), gru_dtypes=gru_dtypes)


# --- the pass itself, on NumPy in float64 (GRUSequence's general kernels) --------------------------

@pytest.mark.parametrize("kwargs, layers", [
    ({}, 1), ({"reverse": True}, 1), ({"bias": False}, 1), ({"zero_states": True}, 1),
    ({"bidirectional": True, "zero_states": True}, 2), ({"num_layers": 2, "zero_states": True}, 2),
    ({"num_layers": 2, "bidirectional": True, "bias": False, "zero_states": True}, 4)])
def test_rewritten_gru_layers_give_the_recurrences_numbers(kwargs, layers):
    main, startup, fetch = _layer_program("float64", **kwargs)
    feed = _feed("float64")
    want, exe = _run(main, startup, fetch, feed)
    fused = main.clone()
    assert rg.passes.fuse_recurrent_cells(fused, dtypes=(), gru_dtypes=("float64",)) == layers
    block0 = [op.type for op in fused.global_block().ops]
    assert block0.count("GRUSequence") == layers and block0.count("GRUSequenceGrad") == layers
    assert "RecurrentNetwork" not in block0 and "RecurrentNetworkGrad" not in block0 and "SeqLinear" not in block0
    assert "GRUSequence" not in _op_types(main)                      # the clone was rewritten, not main
    got, _ = _run(fused, startup, fetch, feed, params=_params_of(exe, main))
    _assert_all_close(got, want, rtol=1e-10, atol=1e-12)


def test_forward_only_gru_programs_are_fused_too():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, D], "float64")
        h_all, h_last = rg.layers.gru(x, H, name="dec", reverse=True)
    feed = {"x": _feed("float64")["x"]}
    want, exe = _run(main, startup, [h_all, h_last], feed)
    fused = main.clone()
    assert _fused_count(main) == 1
    assert rg.passes.fuse_recurrent_cells(fused, dtypes=(), gru_dtypes=("float64",)) == 1
    assert [op.type for op in fused.global_block().ops].count("GRUSequence") == 1
    got, _ = _run(fused, startup, [h_all, h_last], feed, params=_params_of(exe, main))
    _assert_all_close(got, want, rtol=1e-10, atol=1e-12)


def _recurrent_program(with_bias: bool):
    """A user's rg.recurrent with a GRU cell, with both biases or none."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, D], "float64", stop_gradient=False)
        h0 = rg.data("h0", [-1, H], "float64", stop_gradient=False)
        w_ih = rg.create_parameter("w_ih", [D, 3 * H], "float64")
        w_hh = rg.create_parameter("w_hh", [H, 3 * H], "float64")
        b_ih = rg.create_parameter("b_ih", [3 * H], "float64") if with_bias else None
        b_hh = rg.create_parameter("b_hh", [3 * H], "float64") if with_bias else None
        x_proj = rg.seq_linear(x, w_ih, b_ih)

        def step(xs, states):
            h_proj = rg.matmul(states[0], w_hh)
            return [rg.gru_unit(xs[0], h_proj + b_hh if with_bias else h_proj, states[0])]

        (h_all,), (h_last,) = rg.recurrent(step, [x_proj], [h0])
        loss = rg.sum(h_all * h_all) + rg.sum(rg.tanh(h_last))
        grads = rg.gradients(loss, [x, w_ih, w_hh, h0] + ([b_ih, b_hh] if with_bias else []))
    return main, startup, [loss, h_all, h_last] + grads


@pytest.mark.parametrize("with_bias", [True, False])
def test_recurrent_programs_with_a_gru_cell_are_rewritten(with_bias):
    main, startup, fetch = _recurrent_program(with_bias)
    feed = _feed("float64")
    want, exe = _run(main, startup, fetch, feed)
    fused = main.clone()
    assert rg.passes.fuse_recurrent_cells(fused, dtypes=(), gru_dtypes=("float64",)) == 1
    assert "GRUSequenceGrad" in _op_types(fused) and "RecurrentNetwork" not in _op_types(fused)
    got, _ = _run(fused, startup, fetch, feed, params=_params_of(exe, main))
    _assert_all_close(got, want, rtol=1e-10, atol=1e-12)


def _training_program(**gru_kwargs):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, D], "float64")
        h_all, h_last = rg.layers.gru(x, H, name="dec", **gru_kwargs)
        loss = rg.mean(h_all * h_all) + rg.mean(h_last)
        rg.optim.Adam(0.05).minimize(loss)
    return main, startup, loss


def test_adam_training_on_the_rewritten_program_matches_the_recurrence():
    main, startup, loss = _training_program(bidirectional=True)
    fused = main.clone()
    assert rg.passes.fuse_recurrent_cells(fused, dtypes=(), gru_dtypes=("float64",)) == 2
    feed = {"x": _feed("float64")["x"]}
    results, start = {}, {}
    for which, program in (("general", main), ("fused", fused)):
        exe = rg.Executor()
        exe.run(startup)
        for name, value in start.items():                     # both start from the same parameters
            exe.scope.set(name, exe.backend.from_numpy(value))
        start = start or _params_of(exe, main)
        losses = [float(exe.run(program, feed=feed, fetch_list=[loss])[0]) for _ in range(4)]
        results[which] = losses, _params_of(exe, main)
    np.testing.assert_allclose(results["fused"][0], results["general"][0], rtol=1e-10)
    assert results["general"][0][-1] < results["general"][0][0]           # it trained
    for name, value in results["general"][1].items():
        np.testing.assert_allclose(results["fused"][1][name], value, rtol=1e-9, atol=1e-12, err_msg=name)


# --- what keeps the general path -----------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [{"recompute": "steps"}, {"recompute": 4096}, {"fused": False}])
def test_what_needs_the_general_path_keeps_it_for_gru(kwargs):
    main, _, _ = _layer_program("float64", **kwargs)
    assert "RecurrentNetwork" in _op_types(main)
    assert _fused_count(main) == 0


def test_seq_lengths_keep_the_gru_recurrence():
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, -1, D], "float64")
        lengths = rg.data("lengths", [-1], "int64")
        h_all, _ = rg.layers.gru(x, H, seq_lengths=lengths, name="dec")
        rg.gradients(rg.sum(h_all), [main.global_block().var("dec.w_ih")])
    assert _fused_count(main) == 0


def test_step_outputs_other_steps_and_one_sided_biases_keep_the_recurrence():
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, -1, D], "float64")
        h0 = rg.data("h0", [-1, H], "float64")
        w_ih = rg.create_parameter("w_ih", [D, 3 * H], "float64")
        w_hh = rg.create_parameter("w_hh", [H, 3 * H], "float64")
        b = rg.create_parameter("b", [3 * H], "float64")

        def with_output(xs, st):
            h = rg.gru_unit(xs[0], rg.matmul(st[0], w_hh), st[0])
            return [h], [rg.tanh(h)]
        rg.recurrent(with_output, [rg.seq_linear(x, w_ih)], [h0])
        rg.recurrent(lambda xs, st: [rg.gru_unit(rg.tanh(xs[0]), rg.matmul(st[0], w_hh), st[0])],
                     [rg.seq_linear(x, w_ih)], [h0])
        # only the input bias, then only the hidden bias: GRUSequence takes both or neither
        rg.recurrent(lambda xs, st: [rg.gru_unit(xs[0], rg.matmul(st[0], w_hh), st[0])],
                     [rg.seq_linear(x, w_ih, b)], [h0])
        rg.recurrent(lambda xs, st: [rg.gru_unit(xs[0], rg.matmul(st[0], w_hh) + b, st[0])],
                     [rg.seq_linear(x, w_ih)], [h0])
    assert _fused_count(main) == 0


def test_gru_is_fused_only_in_its_own_dtypes():
    main, _, _ = _layer_program("float64")
    assert _fused_count(main) == 1
    assert _fused_count(main, gru_dtypes=("float32",)) == 0
    assert _fused_count(main, gru_dtypes=()) == 0
    assert rg.passes.fuse_recurrent_cells(main.clone(), dtypes=("float64",)) == 0   # the LSTM dtypes are not GRU's


def test_values_a_run_fetches_are_not_rewritten_away_for_gru():
    main, _, _ = _layer_program("float64")
    x_proj = next(op.outputs[0] for op in main.global_block().ops if op.type == "SeqLinear")
    saved = next(op.outputs[2] for op in main.global_block().ops if op.type == "RecurrentNetwork")
    assert _fused_count(main, keep={x_proj}) == 0
    assert _fused_count(main, keep={saved}) == 0
    assert _fused_count(main, keep={"dec.w_ih.grad", "dec.b_hh.grad"}) == 1


def test_layers_gru_fused_default_and_choices():
    assert "RecurrentNetwork" in _op_types(_layer_program("float64")[0])          # fused=None: the recurrence
    main, _, _ = _layer_program("float64", fused=True)
    assert "GRUSequence" in _op_types(main) and "RecurrentNetwork" not in _op_types(main)
    assert "SeqLinear" not in _op_types(main)            # the fused op projects x itself
    main, _, _ = _layer_program("float64", fused=False)
    rnn = next(op for op in main.global_block().ops if op.type == "RecurrentNetwork")
    assert rnn.attrs["fuse"] is False


# --- the executor -----------------------------------------------------------------------------------

@pytest.fixture
def torch_backend():
    pytest.importorskip("torch")
    return rg.backends.torch_backend.TorchBackend


@pytest.fixture
def gru_calls(monkeypatch, torch_backend):
    """How many times GRUSequence's (GRUSequenceGrad's) kernel ran on the torch backend."""
    calls = {"forward": 0, "backward": 0}
    for what in calls:
        original = getattr(torch_backend, f"fused_gru_{what}")

        def counted(self, *args, _original=original, _what=what):
            calls[_what] += 1
            return _original(self, *args)
        monkeypatch.setattr(torch_backend, f"fused_gru_{what}", counted)
    return calls


def _numpy_and_torch(dtype, **kwargs):
    main, startup, fetch = _layer_program(dtype, **kwargs)
    feed = _feed(dtype)
    want, exe = _run(main, startup, fetch, feed)
    version, types = main.version, _op_types(main)
    got, torch_exe = _run(main, startup, fetch, feed, backend="torch", params=_params_of(exe, main))
    assert main.version == version and _op_types(main) == types      # the user's program is unchanged
    return got, want, torch_exe


def test_torch_cpu_keeps_the_gru_recurrence(gru_calls):
    got, want, exe = _numpy_and_torch("float32")
    assert exe.backend.fused_gru_dtypes == ()
    assert gru_calls == {"forward": 0, "backward": 0}
    _assert_all_close(got, want, rtol=2e-4, atol=2e-5)


@pytest.mark.engine
@pytest.mark.parametrize("kwargs", [{}, {"reverse": True, "bias": False}])
def test_the_default_gru_layer_agrees_with_numpys_recurrence_on_every_backend(kwargs, backend):
    """The default layers.gru: the recurrence on NumPy; on each backend what that backend runs
    (GRUSequence with cuDNN on CUDA, the recurrence elsewhere), to float32 rounding."""
    main, startup, fetch = _layer_program("float32", **kwargs)
    feed = _feed("float32")
    want, exe = _run(main, startup, fetch, feed)
    other = backend.executor()
    other.run(startup)
    for name, value in _params_of(exe, main).items():
        other.scope.set(name, other.backend.from_numpy(value))
    atol = 1e-4 if backend.device == "cuda" else 2e-5
    _assert_all_close(other.run(main, feed=feed, fetch_list=fetch), want, rtol=2e-4, atol=atol)


def test_numpy_declares_no_fused_gru():
    assert rg.Executor().backend.fused_gru_dtypes == ()


@pytest.mark.parametrize("kwargs, layers", [({}, 1), ({"bidirectional": True, "zero_states": True}, 2),
                                            ({"num_layers": 2, "bias": False, "zero_states": True}, 2)])
def test_executor_fuses_gru_where_the_backend_declares_it(kwargs, layers, monkeypatch, torch_backend, gru_calls):
    """torch CPU with the capability faked: the executor's copy runs GRUSequence (its general kernels
    there), once per layer and direction, with the recurrence's numbers."""
    monkeypatch.setattr(torch_backend, "fused_gru_dtypes", ("float64",))
    got, want, exe = _numpy_and_torch("float64", **kwargs)
    assert gru_calls == {"forward": layers, "backward": layers}
    _assert_all_close(got, want, rtol=1e-10, atol=1e-12)
    got, want, exe = _numpy_and_torch("float64", fused=False, **kwargs)
    assert gru_calls == {"forward": layers, "backward": layers}        # fused=False: the recurrence
    _assert_all_close(got, want, rtol=1e-10, atol=1e-12)


def test_torch_cuda_runs_the_rewritten_gru(gru_calls, torch_backend):
    """CUDA declares the fused GRU where cuDNN's ops are there: results are the recurrence's."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU (torch.cuda.is_available() is False)")
    main, startup, fetch = _layer_program("float32", bidirectional=True, zero_states=True)
    feed = _feed("float32")
    want, exe = _run(main, startup, fetch, feed)
    cuda = rg.Executor(backend="torch", device="cuda")
    if cuda.backend.cudnn_gru is None:
        pytest.skip("this torch lacks cuDNN's RNN ops")
    assert cuda.backend.fused_gru_dtypes == ("float32", "float64")
    cuda.run(startup)
    for name, value in _params_of(exe, main).items():
        cuda.scope.set(name, cuda.backend.from_numpy(value))
    for _ in range(2):
        got = cuda.run(main, feed=feed, fetch_list=fetch)
        _assert_all_close(got, want, rtol=2e-4, atol=1e-4)
    assert gru_calls == {"forward": 4, "backward": 4}          # two directions, two runs
