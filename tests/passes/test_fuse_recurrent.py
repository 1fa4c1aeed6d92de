"""passes.fuse_recurrent_cells: step-by-step LSTM recurrences (layers.lstm, rg.recurrent with an LSTM
cell) and their gradients become LSTMSequence / LSTMSequenceGrad. Checked against the unrewritten
program on NumPy (float64, where LSTMSequence runs its general kernels), against torch.nn.LSTM in
float64, and through the executor: torch CPU runs oneDNN (counted) on its own copy of the program,
NumPy and onnxruntime run the recurrence as written; what must keep the general path keeps it.
GRU recurrences likewise become GRUSequence / GRUSequenceGrad where ``gru_dtypes`` allows (cuDNN on
CUDA; none on the CPU): checked on NumPy in float64 and through torch CPU with the capability faked."""
from __future__ import annotations

import importlib

import numpy as np
import pytest

import retrograd as rg
from retrograd.backends import torch_fused_rnn

pytestmark = pytest.mark.engine        # the backend fixture includes the onnxruntime engine

D, H = 5, 4


@pytest.fixture
def torch():
    """PyTorch, for the tests of the torch backend and the torch.nn.LSTM reference (skipped without it)."""
    return pytest.importorskip("torch")


def _op_types(program) -> list[str]:
    return [op.type for block in program.blocks for op in block.ops]


def _layer_program(dtype="float64", **lstm_kwargs):
    """layers.lstm over x, a loss reading h_all, h_last and c_last; gradients of x, every parameter and
    the given initial states. Returns (main, startup, fetch list, feed names)."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, D], dtype, stop_gradient=False)
        h0 = rg.data("h0", [-1, H], dtype, stop_gradient=False)
        c0 = rg.data("c0", [-1, H], dtype, stop_gradient=False)
        states = {} if lstm_kwargs.pop("zero_states", False) else {"h0": h0, "c0": c0}
        h_all, h_last, c_all, c_last = rg.layers.lstm(x, H, name="enc", forget_bias=0.5, **states, **lstm_kwargs)
        loss = rg.sum(h_all * h_all) + rg.sum(rg.sin(h_last)) + rg.sum(c_last * 3.0)
        params = [p for p in main.all_parameters()]
        wrt = [x] + params + ([h0, c0] if states else [])
        grads = rg.gradients(loss, wrt)
    return main, startup, [loss, h_all, h_last, c_last] + grads


def _feed(dtype, steps=6, batch=3, seed=0):
    r = np.random.default_rng(seed)
    return {"x": r.standard_normal((steps, batch, D)).astype(dtype),
            "h0": r.standard_normal((batch, H)).astype(dtype), "c0": r.standard_normal((batch, H)).astype(dtype)}


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


@pytest.fixture
def onednn_calls(monkeypatch, torch):
    """How many times oneDNN's fused forward and backward ran."""
    calls = {"forward": 0, "backward": 0}
    for what in calls:
        original = getattr(torch_fused_rnn.OneDNNLSTM, what)

        def counted(self, *args, _original=original, _what=what):
            calls[_what] += 1
            return _original(self, *args)
        monkeypatch.setattr(torch_fused_rnn.OneDNNLSTM, what, counted)
    return calls


# --- the pass itself, on NumPy in float64 (LSTMSequence's general kernels) -------------------------

@pytest.mark.parametrize("kwargs, layers", [
    ({}, 1), ({"reverse": True}, 1), ({"bias": False}, 1), ({"zero_states": True}, 1),
    ({"bidirectional": True, "zero_states": True}, 2), ({"num_layers": 2, "zero_states": True}, 2)])
def test_rewritten_layers_give_the_recurrences_numbers(kwargs, layers):
    main, startup, fetch = _layer_program("float64", **kwargs)
    _assert_rewrite_keeps_the_numbers(main, startup, fetch, "LSTMSequence", layers, dtypes=("float64",))


def _assert_rewrite_keeps_the_numbers(main, startup, fetch, fused_type: str, layers: int, **pass_kwargs):
    """The pass on a clone of ``main`` makes ``layers`` fused ops (and gradient ops), no recurrence is
    left, ``main`` is unchanged, and the clone gives ``main``'s numbers on NumPy in float64."""
    feed = _feed("float64")
    want, exe = _run(main, startup, fetch, feed)
    fused = main.clone()
    assert rg.passes.fuse_recurrent_cells(fused, **pass_kwargs) == layers
    block0 = [op.type for op in fused.global_block().ops]
    assert block0.count(fused_type) == layers and block0.count(f"{fused_type}Grad") == layers
    assert "RecurrentNetwork" not in block0 and "RecurrentNetworkGrad" not in block0 and "SeqLinear" not in block0
    assert fused_type not in _op_types(main)                         # the clone was rewritten, not main
    got, _ = _run(fused, startup, fetch, feed, params=_params_of(exe, main))
    _assert_all_close(got, want, rtol=1e-10, atol=1e-12)



@pytest.mark.parametrize("zero_states", [True, False])
def test_default_zero_states_become_one_value(zero_states):
    """Both default initial states are the same zeros, built twice by layers.lstm: the fused op reads
    one of them, so a run computes it once (five ops fewer); given states stay apart."""
    main, startup, fetch = _layer_program("float64", zero_states=zero_states)
    fused = main.clone()
    rg.passes.fuse_recurrent_cells(fused, dtypes=("float64",))
    for op in fused.global_block().ops:
        if op.type in ("LSTMSequence", "LSTMSequenceGrad"):
            h0, c0 = op.inputs[4:6]
            assert (h0 == c0) == zero_states, (op.type, h0, c0)
    feed = _feed("float64")
    want, exe = _run(main, startup, fetch, feed)
    got, _ = _run(fused, startup, fetch, feed, params=_params_of(exe, main))
    _assert_all_close(got, want, rtol=1e-10, atol=1e-12)

def test_forward_only_programs_are_fused_too():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, D], "float64")
        h_all, h_last, _, c_last = rg.layers.lstm(x, H, name="enc", reverse=True)
    feed = {"x": _feed("float64")["x"]}
    want, exe = _run(main, startup, [h_all, h_last, c_last], feed)
    fused = main.clone()
    assert rg.passes.fuse_recurrent_cells(fused, dtypes=("float64",)) == 1
    got, _ = _run(fused, startup, [h_all, h_last, c_last], feed, params=_params_of(exe, main))
    _assert_all_close(got, want, rtol=1e-10, atol=1e-12)


def _recurrent_program(step_form: str, states_order: str):
    """A user's rg.recurrent with an LSTM cell: ``h_gates`` or an explicit Add, states (h, c) or (c, h)."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, D], "float64", stop_gradient=False)
        h0 = rg.data("h0", [-1, H], "float64", stop_gradient=False)
        c0 = rg.data("c0", [-1, H], "float64", stop_gradient=False)
        w_ih = rg.create_parameter("w_ih", [D, 4 * H], "float64")
        w_hh = rg.create_parameter("w_hh", [H, 4 * H], "float64")
        b = rg.create_parameter("b", [4 * H], "float64")
        x_proj = rg.seq_linear(x, w_ih, b)

        def cell(x_t, h, c):
            if step_form == "h_gates":
                return rg.lstm_unit(x_t, c, 1.0, h_gates=rg.matmul(h, w_hh))
            return rg.lstm_unit(x_t + rg.matmul(h, w_hh), c, 1.0)

        if states_order == "hc":
            (h_all, c_all), (h_last, c_last) = rg.recurrent(
                lambda xs, st: list(cell(xs[0], st[0], st[1])), [x_proj], [h0, c0])
        else:
            (c_all, h_all), (c_last, h_last) = rg.recurrent(
                lambda xs, st: list(cell(xs[0], st[1], st[0]))[::-1], [x_proj], [c0, h0])
        loss = rg.sum(h_all * h_all) + rg.sum(h_last) + rg.sum(rg.tanh(c_last))
        grads = rg.gradients(loss, [x, w_ih, w_hh, b, h0, c0])
    return main, startup, [loss, h_all, h_last, c_last] + grads


@pytest.mark.parametrize("step_form", ["h_gates", "add"])
@pytest.mark.parametrize("states_order", ["hc", "ch"])
def test_recurrent_programs_with_an_lstm_cell_are_rewritten(step_form, states_order):
    main, startup, fetch = _recurrent_program(step_form, states_order)
    feed = _feed("float64")
    want, exe = _run(main, startup, fetch, feed)
    fused = main.clone()
    assert rg.passes.fuse_recurrent_cells(fused, dtypes=("float64",)) == 1
    got, _ = _run(fused, startup, fetch, feed, params=_params_of(exe, main))
    _assert_all_close(got, want, rtol=1e-10, atol=1e-12)


def _fused_count(program, keep=(), dtypes=("float64",), gru_dtypes=()) -> int:
    return rg.passes.fuse_recurrent_cells(program.clone(), keep=keep, dtypes=dtypes, gru_dtypes=gru_dtypes)


@pytest.mark.parametrize("kwargs", [{"recompute": "steps"}, {"recompute": 4096}, {"fused": False}])
def test_what_needs_the_general_path_keeps_it(kwargs):
    main, _, _ = _layer_program("float64", **kwargs)
    assert _fused_count(main) == 0


def test_seq_lengths_keep_the_general_path():
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, -1, D], "float64")
        lengths = rg.data("lengths", [-1], "int64")
        h_all, _, _, _ = rg.layers.lstm(x, H, seq_lengths=lengths, name="enc")
        rg.gradients(rg.sum(h_all), [main.global_block().var("enc.w_ih")])
    assert _fused_count(main) == 0


def test_step_outputs_and_other_cells_keep_the_general_path():
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, -1, D], "float64")
        h0 = rg.data("h0", [-1, H], "float64")
        w_ih = rg.create_parameter("w_ih", [D, 4 * H], "float64")
        w_hh = rg.create_parameter("w_hh", [H, 4 * H], "float64")
        x_proj = rg.seq_linear(x, w_ih)

        def with_output(xs, st):
            h, c = rg.lstm_unit(xs[0], st[1], h_gates=rg.matmul(st[0], w_hh))
            return [h, c], [rg.tanh(h)]
        rg.recurrent(with_output, [x_proj], [h0, h0])
        rg.recurrent(lambda xs, st: list(rg.lstm_unit(rg.tanh(xs[0]), st[1], h_gates=rg.matmul(st[0], w_hh))),
                     [x_proj], [h0, h0])
        rg.layers.gru(x, H, name="gru")
        rg.layers.milstm(x, H, name="mi")
    assert _fused_count(main) == 0


def test_a_gradient_through_every_cell_keeps_the_general_path():
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, -1, D], "float64")
        h_all, _, c_all, _ = rg.layers.lstm(x, H, name="enc")
        rg.gradients(rg.sum(h_all) + rg.sum(c_all), [main.global_block().var("enc.w_ih")])
    assert _fused_count(main) == 0


def test_values_a_run_fetches_are_not_rewritten_away():
    main, _, _ = _layer_program("float64")
    x_proj = next(op.outputs[0] for op in main.global_block().ops if op.type == "SeqLinear")
    saved = next(op.outputs[4] for op in main.global_block().ops if op.type == "RecurrentNetwork")
    assert _fused_count(main) == 1
    assert _fused_count(main, keep={x_proj}) == 0
    assert _fused_count(main, keep={saved}) == 0
    assert _fused_count(main, keep={"enc.w_ih.grad", "enc.h_all"}) == 1


def test_only_the_given_dtypes_are_fused():
    main, _, _ = _layer_program("float64")
    assert _fused_count(main, dtypes=("float32",)) == 0
    assert _fused_count(main, dtypes=()) == 0


# --- the executor: torch CPU fuses its own copy; NumPy and onnxruntime run the recurrence -------

@pytest.mark.parametrize("kwargs", [{}, {"bidirectional": True, "zero_states": True}])
def test_the_default_layer_agrees_with_numpys_recurrence_on_every_backend(kwargs, backend):
    """The default layers.lstm: the recurrence on NumPy; on each backend what that backend runs
    (oneDNN on torch CPU, the recurrence elsewhere), to float32 rounding."""
    main, startup, fetch = _layer_program("float32", **kwargs)
    _assert_agrees_with_numpy(backend, main, startup, fetch, _feed("float32"))


def _assert_agrees_with_numpy(backend, main, startup, fetch, feed):
    """``main`` on ``backend`` against NumPy from the same parameters, to float32 rounding."""
    feed = {k: v for k, v in feed.items() if k in main.global_block().vars}
    want, exe = _run(main, startup, fetch, feed)
    other = backend.executor()
    other.run(startup)
    for name, value in _params_of(exe, main).items():
        other.scope.set(name, other.backend.from_numpy(value))
    # cuDNN sums in another order than the host (3.2e-5 apart on an H200)
    atol = 1e-4 if backend.device == "cuda" else 2e-5
    _assert_all_close(other.run(main, feed=feed, fetch_list=fetch), want, rtol=2e-4, atol=atol)


def _general_and_torch(monkeypatch=None, dtype="float32", build=_layer_program, **kwargs):
    main, startup, fetch = build(dtype, **kwargs)
    feed = _feed(dtype)
    want, exe = _run(main, startup, fetch, feed)
    version, types = main.version, _op_types(main)
    got, torch_exe = _run(main, startup, fetch, feed, backend="torch", params=_params_of(exe, main))
    assert main.version == version and _op_types(main) == types      # the user's program is unchanged
    return got, want, torch_exe


@pytest.mark.parametrize("kwargs, layers", [({}, 1), ({"bidirectional": True, "zero_states": True}, 2),
                                            ({"num_layers": 2, "zero_states": True, "bias": False}, 2)])
def test_layers_lstm_runs_onednn_on_torch_cpu_by_default(kwargs, layers, onednn_calls):
    got, want, exe = _general_and_torch(**kwargs)
    assert exe.backend.fused_lstm_dtypes == ("float32",)
    assert onednn_calls == {"forward": layers, "backward": layers}
    _assert_all_close(got, want, rtol=2e-4, atol=2e-5)


def test_fused_false_and_float64_keep_the_recurrence_on_torch(onednn_calls):
    got, want, _ = _general_and_torch(fused=False)
    _assert_all_close(got, want, rtol=2e-4, atol=2e-5)
    got, want, _ = _general_and_torch(dtype="float64")
    _assert_all_close(got, want, rtol=1e-10, atol=1e-12)
    assert onednn_calls == {"forward": 0, "backward": 0}


def test_fused_true_still_builds_the_op_in_the_program():
    main, _, _ = _layer_program("float32", fused=True)
    assert "LSTMSequence" in _op_types(main) and "RecurrentNetwork" not in _op_types(main)


def test_without_onednn_torch_runs_the_recurrence(monkeypatch, onednn_calls):
    monkeypatch.setattr(rg.backends.torch_backend, "_has_onednn_lstm", lambda torch: False)
    got, want, exe = _general_and_torch()
    assert exe.backend.fused_lstm_dtypes == ()
    assert onednn_calls == {"forward": 0, "backward": 0}
    _assert_all_close(got, want, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("backend_name", ["numpy", "onnxruntime"])
def test_other_backends_run_the_program_as_written(backend_name, onednn_calls):
    if backend_name == "onnxruntime":
        pytest.importorskip("onnxruntime")
    main, startup, fetch = _layer_program("float32")
    feed = _feed("float32")
    want, exe = _run(main, startup, fetch, feed)
    assert exe.backend.fused_lstm_dtypes == ()
    got, _ = _run(main, startup, fetch, feed, backend=backend_name, params=_params_of(exe, main))
    _assert_all_close(got, want, rtol=2e-4, atol=2e-5)
    assert onednn_calls == {"forward": 0, "backward": 0}


def test_torch_cpu_training_steps_match_numpy_and_fetching_internals_keeps_the_recurrence(onednn_calls):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, D])
        h_all, _, _, _ = rg.layers.lstm(x, H, name="enc")
        loss = rg.mean(h_all * h_all)
        rg.optim.Adam(0.05).minimize(loss)
    x_proj = next(op.outputs[0] for op in main.global_block().ops if op.type == "SeqLinear")
    feed = {"x": _feed("float32")["x"]}
    results, start = {}, {}
    for backend_name in ("numpy", "torch"):
        exe = rg.Executor(backend=backend_name)
        exe.run(startup)
        for name, value in start.items():                    # torch starts from NumPy's parameters
            exe.scope.set(name, exe.backend.from_numpy(value))
        start = start or _params_of(exe, main)
        losses = [float(exe.run(main, feed=feed, fetch_list=[loss])[0]) for _ in range(3)]
        results[backend_name] = losses, _params_of(exe, main)
    np.testing.assert_allclose(results["torch"][0], results["numpy"][0], rtol=1e-5)
    for name, value in results["numpy"][1].items():
        np.testing.assert_allclose(results["torch"][1][name], value, rtol=1e-4, atol=1e-5, err_msg=name)
    assert onednn_calls == {"forward": 3, "backward": 3}
    exe.run(main, feed=feed, fetch_list=[loss, x_proj])       # x_proj fetched: this run keeps the recurrence
    assert onednn_calls == {"forward": 3, "backward": 3}


def test_fused_layer_matches_torch_nn_lstm_in_float64(torch):
    """The rewritten program (float64: LSTMSequence's general kernels) against torch.nn.LSTM."""
    main, startup, fetch = _plain_program()
    feed = _feed("float64")
    fused = main.clone()
    assert rg.passes.fuse_recurrent_cells(fused, dtypes=("float64",)) == 1
    got, exe = _run(fused, startup, fetch, feed)
    p = _params_of(exe, main)
    lstm = torch.nn.LSTM(D, H, dtype=torch.float64)
    with torch.no_grad():
        lstm.weight_ih_l0.copy_(torch.from_numpy(p["enc.w_ih"].T))
        lstm.weight_hh_l0.copy_(torch.from_numpy(p["enc.w_hh"].T))
        lstm.bias_ih_l0.copy_(torch.from_numpy(p["enc.b"]))
        lstm.bias_hh_l0.zero_()
    x = torch.from_numpy(feed["x"]).requires_grad_()
    h0, c0 = (torch.from_numpy(feed[k])[None].requires_grad_() for k in ("h0", "c0"))
    y, (h_n, c_n) = lstm(x, (h0, c0))
    loss = (y * y).sum() + h_n.sin().sum() + 3.0 * c_n.sum()
    loss.backward()
    want = [loss.detach(), y.detach(), h_n[0].detach(), c_n[0].detach(), x.grad, lstm.weight_ih_l0.grad.T,
            lstm.weight_hh_l0.grad.T, lstm.bias_ih_l0.grad, h0.grad[0], c0.grad[0]]
    _assert_all_close(got, [w.numpy() for w in want], rtol=1e-10, atol=1e-12)


def _plain_program():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, D], "float64", stop_gradient=False)
        h0 = rg.data("h0", [-1, H], "float64", stop_gradient=False)
        c0 = rg.data("c0", [-1, H], "float64", stop_gradient=False)
        h_all, h_last, _, c_last = rg.layers.lstm(x, H, h0=h0, c0=c0, name="enc")
        loss = rg.sum(h_all * h_all) + rg.sum(rg.sin(h_last)) + rg.sum(c_last * 3.0)
        block = main.global_block()
        grads = rg.gradients(loss, [x, block.var("enc.w_ih"), block.var("enc.w_hh"), block.var("enc.b"), h0, c0])
    return main, startup, [loss, h_all, h_last, c_last] + grads


@pytest.mark.parametrize("graphs", [False, True])
def test_torch_cuda_runs_the_fused_op(graphs, monkeypatch, torch):
    """CUDA declares the fused LSTM too (cuDNN where the backend has it, else LSTMSequence's general
    kernels on the GPU); results are the recurrence's, eagerly and replayed as a CUDA graph."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU (torch.cuda.is_available() is False)")
    main, startup, fetch = _layer_program("float32", bidirectional=True, zero_states=True)
    feed = _feed("float32")
    want, exe = _run(main, startup, fetch, feed)
    calls = []
    forward = rg.backends.torch_backend.TorchBackend.fused_lstm_forward

    def counted(self, *args):
        calls.append(args[0].shape)
        return forward(self, *args)
    monkeypatch.setattr(rg.backends.torch_backend.TorchBackend, "fused_lstm_forward", counted)
    cuda = rg.Executor(backend="torch", device="cuda", graphs=graphs)
    assert "float32" in cuda.backend.fused_lstm_dtypes      # (and float64 where cuDNN's ops are there)
    cuda.run(startup)
    for name, value in _params_of(exe, main).items():
        cuda.scope.set(name, cuda.backend.from_numpy(value))
    for _ in range(3):          # graphs: captured, then replayed
        got = cuda.run(main, feed=feed, fetch_list=fetch)
        _assert_all_close(got, want, rtol=2e-4, atol=1e-4)
    assert len(calls) >= 2      # both directions ran LSTMSequence


# --- GRU: the same pass with gru_dtypes (LSTM's dtypes are not GRU's) -------------------------

def _gru_program(dtype="float64", **gru_kwargs):
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


GRU_ONLY = {"dtypes": (), "gru_dtypes": ("float64",)}     # fuse GRUs (float64), no LSTMs


# the pass itself, on NumPy in float64 (GRUSequence's general kernels)

@pytest.mark.parametrize("kwargs, layers", [
    ({}, 1), ({"reverse": True}, 1), ({"bias": False}, 1), ({"zero_states": True}, 1),
    ({"bidirectional": True, "zero_states": True}, 2), ({"num_layers": 2, "zero_states": True}, 2),
    ({"num_layers": 2, "bidirectional": True, "bias": False, "zero_states": True}, 4)])
def test_rewritten_gru_layers_give_the_recurrences_numbers(kwargs, layers):
    main, startup, fetch = _gru_program("float64", **kwargs)
    _assert_rewrite_keeps_the_numbers(main, startup, fetch, "GRUSequence", layers, **GRU_ONLY)


def test_forward_only_gru_programs_are_fused_too():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, D], "float64")
        h_all, h_last = rg.layers.gru(x, H, name="dec", reverse=True)
    feed = {"x": _feed("float64")["x"]}
    want, exe = _run(main, startup, [h_all, h_last], feed)
    fused = main.clone()
    assert _fused_count(main, **GRU_ONLY) == 1
    assert rg.passes.fuse_recurrent_cells(fused, **GRU_ONLY) == 1
    assert [op.type for op in fused.global_block().ops].count("GRUSequence") == 1
    got, _ = _run(fused, startup, [h_all, h_last], feed, params=_params_of(exe, main))
    _assert_all_close(got, want, rtol=1e-10, atol=1e-12)


def _gru_recurrent_program(with_bias: bool):
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
    main, startup, fetch = _gru_recurrent_program(with_bias)
    feed = _feed("float64")
    want, exe = _run(main, startup, fetch, feed)
    fused = main.clone()
    assert rg.passes.fuse_recurrent_cells(fused, **GRU_ONLY) == 1
    assert "GRUSequenceGrad" in _op_types(fused) and "RecurrentNetwork" not in _op_types(fused)
    got, _ = _run(fused, startup, fetch, feed, params=_params_of(exe, main))
    _assert_all_close(got, want, rtol=1e-10, atol=1e-12)


def _gru_training_program(**gru_kwargs):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, D], "float64")
        h_all, h_last = rg.layers.gru(x, H, name="dec", **gru_kwargs)
        loss = rg.mean(h_all * h_all) + rg.mean(h_last)
        rg.optim.Adam(0.05).minimize(loss)
    return main, startup, loss


def test_adam_training_on_the_rewritten_program_matches_the_recurrence():
    main, startup, loss = _gru_training_program(bidirectional=True)
    fused = main.clone()
    assert rg.passes.fuse_recurrent_cells(fused, **GRU_ONLY) == 2
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


# what keeps the general path

@pytest.mark.parametrize("kwargs", [{"recompute": "steps"}, {"recompute": 4096}, {"fused": False}])
def test_what_needs_the_general_path_keeps_it_for_gru(kwargs):
    main, _, _ = _gru_program("float64", **kwargs)
    assert "RecurrentNetwork" in _op_types(main)
    assert _fused_count(main, **GRU_ONLY) == 0


def test_seq_lengths_keep_the_gru_recurrence():
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [-1, -1, D], "float64")
        lengths = rg.data("lengths", [-1], "int64")
        h_all, _ = rg.layers.gru(x, H, seq_lengths=lengths, name="dec")
        rg.gradients(rg.sum(h_all), [main.global_block().var("dec.w_ih")])
    assert _fused_count(main, **GRU_ONLY) == 0


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
    assert _fused_count(main, **GRU_ONLY) == 0


def test_gru_is_fused_only_in_its_own_dtypes():
    main, _, _ = _gru_program("float64")
    assert _fused_count(main, **GRU_ONLY) == 1
    assert _fused_count(main, dtypes=(), gru_dtypes=("float32",)) == 0
    assert _fused_count(main, dtypes=(), gru_dtypes=()) == 0
    assert _fused_count(main) == 0                        # the LSTM dtypes are not GRU's


def test_values_a_run_fetches_are_not_rewritten_away_for_gru():
    main, _, _ = _gru_program("float64")
    x_proj = next(op.outputs[0] for op in main.global_block().ops if op.type == "SeqLinear")
    saved = next(op.outputs[2] for op in main.global_block().ops if op.type == "RecurrentNetwork")
    assert _fused_count(main, **GRU_ONLY, keep={x_proj}) == 0
    assert _fused_count(main, **GRU_ONLY, keep={saved}) == 0
    assert _fused_count(main, **GRU_ONLY, keep={"dec.w_ih.grad", "dec.b_hh.grad"}) == 1


def test_layers_gru_fused_default_and_choices():
    assert "RecurrentNetwork" in _op_types(_gru_program("float64")[0])          # fused=None: the recurrence
    main, _, _ = _gru_program("float64", fused=True)
    assert "GRUSequence" in _op_types(main) and "RecurrentNetwork" not in _op_types(main)
    assert "SeqLinear" not in _op_types(main)            # the fused op projects x itself
    main, _, _ = _gru_program("float64", fused=False)
    rnn = next(op for op in main.global_block().ops if op.type == "RecurrentNetwork")
    assert rnn.attrs["fuse"] is False


# the executor

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


def test_torch_cpu_keeps_the_gru_recurrence(gru_calls):
    got, want, exe = _general_and_torch(build=_gru_program)
    assert exe.backend.fused_gru_dtypes == ()
    assert gru_calls == {"forward": 0, "backward": 0}
    _assert_all_close(got, want, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("kwargs", [{}, {"reverse": True, "bias": False}])
def test_the_default_gru_layer_agrees_with_numpys_recurrence_on_every_backend(kwargs, backend):
    """The default layers.gru: the recurrence on NumPy; on each backend what that backend runs
    (GRUSequence with cuDNN on CUDA, the recurrence elsewhere), to float32 rounding."""
    main, startup, fetch = _gru_program("float32", **kwargs)
    _assert_agrees_with_numpy(backend, main, startup, fetch, _feed("float32"))


def test_numpy_declares_no_fused_gru():
    assert rg.Executor().backend.fused_gru_dtypes == ()


@pytest.mark.parametrize("kwargs, layers", [({}, 1), ({"bidirectional": True, "zero_states": True}, 2),
                                            ({"num_layers": 2, "bias": False, "zero_states": True}, 2)])
def test_executor_fuses_gru_where_the_backend_declares_it(kwargs, layers, monkeypatch, torch_backend, gru_calls):
    """torch CPU with the capability faked: the executor's copy runs GRUSequence (its general kernels
    there), once per layer and direction, with the recurrence's numbers."""
    monkeypatch.setattr(torch_backend, "fused_gru_dtypes", ("float64",))
    got, want, exe = _general_and_torch(dtype="float64", build=_gru_program, **kwargs)
    assert gru_calls == {"forward": layers, "backward": layers}
    _assert_all_close(got, want, rtol=1e-10, atol=1e-12)
    got, want, exe = _general_and_torch(dtype="float64", build=_gru_program, fused=False, **kwargs)
    assert gru_calls == {"forward": layers, "backward": layers}        # fused=False: the recurrence
    _assert_all_close(got, want, rtol=1e-10, atol=1e-12)


def test_a_backend_declaring_only_a_fused_gru_fuses_gru(monkeypatch):
    """NumPy faked to declare a GRU kernel and no LSTM one: its executor still rewrites the GRU (and
    runs GRUSequence's general kernels, counted), with the recurrence's numbers."""
    module = importlib.import_module("retrograd.ops.recurrent.gru_sequence")     # (rg.ops.gru_sequence is the builder)
    calls, general = [], module.general_forward

    def counted(k, *args):
        calls.append(args[0].shape)
        return general(k, *args)
    main, startup, fetch = _gru_program("float64", bidirectional=True, zero_states=True)
    feed = _feed("float64")
    want, exe = _run(main, startup, fetch, feed)
    monkeypatch.setattr(module, "general_forward", counted)
    monkeypatch.setattr(rg.backends.base.Backend, "fused_gru_dtypes", ("float64",))
    got, exe = _run(main, startup, fetch, feed, params=_params_of(exe, main))
    assert exe.backend.fused_lstm_dtypes == () and len(calls) == 2
    _assert_all_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("graphs", [False, True])
def test_torch_cuda_runs_the_rewritten_gru(graphs, gru_calls, torch_backend):
    """CUDA declares the fused GRU where cuDNN's ops are there: results are the recurrence's, eagerly
    and replayed as a CUDA graph."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU (torch.cuda.is_available() is False)")
    main, startup, fetch = _gru_program("float32", bidirectional=True, zero_states=True)
    # a GRU program has no c0 (and zero states no h0): feed what it declares
    feed = {k: v for k, v in _feed("float32").items() if k in main.global_block().vars}
    want, exe = _run(main, startup, fetch, feed)
    cuda = rg.Executor(backend="torch", device="cuda", graphs=graphs)
    if cuda.backend.cudnn_gru is None:
        pytest.skip("this torch lacks cuDNN's RNN ops")
    assert cuda.backend.fused_gru_dtypes == ("float32", "float64")
    cuda.run(startup)
    for name, value in _params_of(exe, main).items():
        cuda.scope.set(name, cuda.backend.from_numpy(value))
    for _ in range(3):          # graphs: captured, then replayed
        got = cuda.run(main, feed=feed, fetch_list=fetch)
        _assert_all_close(got, want, rtol=2e-4, atol=1e-4)
    if graphs:                  # both directions ran GRUSequence (replays call no kernel)
        assert gru_calls["forward"] >= 2 and gru_calls["backward"] >= 2
    else:                       # two directions, three runs
        assert gru_calls == {"forward": 6, "backward": 6}
