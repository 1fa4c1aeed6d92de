"""Contract: DESIGN.md "Milestone 2" -- backends and devices, ONNX export and the onnxruntime engine.

Each test runs a snippet of that section as it is written there (names, signatures, return
types, errors), on NumPy and on ``backend="torch", device="cpu"``; torch on "cuda" and CuPy
run where a GPU is present and are skipped with the reason elsewhere. References are the
NumPy executor (which tests/contract/test_quickstart.py checks against NumPy written by
hand) and onnxruntime. The rest of the section (data parallelism, the memory budget, error
locations, the ``retrograd`` command) is in test_milestone2_scale.py.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import retrograd as rg

XB = np.random.default_rng(0).standard_normal((6, 8)).astype("float32")
LABELS = np.array([0, 1, 2, 3, 0, 1])

DEVICE_BACKENDS = [
    pytest.param(("numpy", None), id="numpy"),
    pytest.param(("torch", "cpu"), id="torch-cpu"),
    pytest.param(("torch", "cuda"), id="torch-cuda"),
    pytest.param(("cupy", None), id="cupy"),
]


@pytest.fixture(params=DEVICE_BACKENDS)
def kind(request):
    """(backend, device) as given to ``rg.Executor``; skipped with the reason where unavailable."""
    backend, device = request.param
    try:
        rg.Executor(backend=backend, device=device)
    except rg.BackendError as exc:
        pytest.skip(f"{backend} {device or ''} unavailable here: {exc}")
    return request.param


def _classifier(optimizer=None, dropout=0.0):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 8])
        labels = rg.data("labels", [-1], dtype="int64")
        h = rg.layers.fc(x, 16, act="tanh", name="fc1")
        if dropout:
            h = rg.dropout(h, dropout)
        logits = rg.layers.fc(h, 4, name="logits")
        loss = rg.mean(rg.softmax_cross_entropy(logits, labels))
        if optimizer is not None:
            optimizer.minimize(loss)
    return main, startup, h, logits, loss


def _host(value) -> np.ndarray:
    return rg.backends.to_numpy(value)


def _is_backend_array(exe, value) -> bool:
    return exe.backend.owns(value) and not isinstance(value, (np.ndarray, np.generic)) or (
        exe.backend.name == "numpy" and isinstance(value, (np.ndarray, np.generic)))


# --- Backends and devices ------------------------------------------------------------------------

def test_executor_snippet_runs_on_every_backend_and_agrees_with_numpy(kind):
    backend, device = kind
    main, startup, h, logits, loss = _classifier(rg.optim.Adam(1e-2), dropout=0.25)
    feed = {"x": XB, "labels": LABELS}
    ref = rg.Executor()
    ref.run(startup)
    exe = rg.Executor(backend=backend, device=device)
    exe.run(startup)                                     # parameters are created on the device
    w = exe.scope.get("fc1.w")
    assert _is_backend_array(exe, w)
    if backend == "torch":
        import torch
        assert isinstance(w, torch.Tensor) and w.device.type == (device or "cpu").split(":")[0]
    # keyed draws: the same initial values on every backend
    np.testing.assert_array_equal(_host(w), _host(ref.scope.get("fc1.w")))
    for step in range(3):
        loss_v, h_v = exe.run(main, feed=feed, fetch_list=[loss, h])                  # NumPy out
        want, h_want = ref.run(main, feed=feed, fetch_list=[loss, h])
        assert isinstance(loss_v, (np.ndarray, np.generic)) and isinstance(h_v, np.ndarray)
        np.testing.assert_allclose(loss_v, want, rtol=1e-5, err_msg=f"step {step}")
        # dropout masks match: the same elements are zero
        np.testing.assert_array_equal(h_v == 0, h_want == 0)
        np.testing.assert_allclose(h_v, h_want, rtol=1e-5, atol=1e-6)
    loss_t, = exe.run(main, feed=feed, fetch_list=[loss], return_numpy=False)         # backend array
    assert _is_backend_array(exe, loss_t)
    want, = ref.run(main, feed=feed, fetch_list=[loss])
    np.testing.assert_allclose(_host(loss_t), want, rtol=1e-5)
    for name in ("fc1.w", "fc1.b", "logits.w", "logits.w.moment1"):
        np.testing.assert_allclose(_host(exe.scope.get(name)), ref.scope.get(name), rtol=1e-5, atol=1e-6)


def test_torch_cpu_return_numpy_false_gives_a_torch_tensor():
    torch = pytest.importorskip("torch")
    main, startup, _, logits, loss = _classifier()
    exe = rg.Executor(backend="torch", device="cpu")
    exe.run(startup)
    loss_t, logits_t = exe.run(main, feed={"x": XB, "labels": LABELS}, fetch_list=[loss, logits],
                               return_numpy=False)
    assert isinstance(loss_t, torch.Tensor) and isinstance(logits_t, torch.Tensor)
    assert logits_t.device == torch.device("cpu") and tuple(logits_t.shape) == (6, 4)
    loss_v, = exe.run(main, feed={"x": XB, "labels": LABELS}, fetch_list=[loss])
    assert isinstance(loss_v, np.ndarray)
    np.testing.assert_allclose(loss_t.numpy(), loss_v, rtol=1e-6)


def test_feeds_may_be_backend_arrays_and_scope_takes_numpy_or_backend_arrays(kind):
    backend, device = kind
    main, startup, _, logits, _ = _classifier()
    exe = rg.Executor(backend=backend, device=device)
    exe.run(startup)
    on_device = exe.backend.from_numpy(XB)
    got_np, = exe.run(main, feed={"x": XB}, fetch_list=[logits])
    got_dev, = exe.run(main, feed={"x": on_device}, fetch_list=[logits])
    np.testing.assert_array_equal(got_np, got_dev)
    # scope.set with NumPy: stored as the backend's array, used by the next run
    w = np.full((8, 16), 0.05, dtype="float32")
    exe.scope.set("fc1.w", w)
    assert _is_backend_array(exe, exe.scope.get("fc1.w"))
    b1, w2, b2 = (_host(exe.scope.get(n)).astype(np.float64) for n in ("fc1.b", "logits.w", "logits.b"))
    want = np.tanh(XB.astype(np.float64) @ w + b1) @ w2 + b2
    got, = exe.run(main, feed={"x": XB}, fetch_list=[logits])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # scope.set with the backend's array
    exe.scope.set("fc1.w", exe.backend.from_numpy(2 * w))
    want = np.tanh(XB.astype(np.float64) @ (2 * w) + b1) @ w2 + b2
    got, = exe.run(main, feed={"x": XB}, fetch_list=[logits])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_torch_device_cuda_1_is_parsed_as_the_second_gpu(monkeypatch):
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() >= 2:
        exe = rg.Executor(backend="torch", device="cuda:1")
        assert exe.backend.device == "cuda:1"
        exe.scope.set("w", np.ones(3, "float32"))
        assert exe.scope.get("w").device == torch.device("cuda", 1)
        return
    if torch.cuda.is_available():       # one GPU: "cuda:1" names a device that is not there
        with pytest.raises(rg.BackendError, match=r"cuda:1"):
            rg.Executor(backend="torch", device="cuda:1")
        return
    # No GPU: pretend two are visible, so the spelling is parsed (no tensor is made).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    exe = rg.Executor(backend="torch", device="cuda:1")
    assert exe.backend.name == "torch" and exe.backend.device == "cuda:1"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(rg.BackendError, match=r"cuda:1.*1 CUDA device"):
        rg.Executor(backend="torch", device="cuda:1")


def test_torch_cuda_without_a_gpu_is_a_backend_error():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present: torch-cuda runs in the tests above")
    with pytest.raises(rg.BackendError) as info:
        rg.Executor(backend="torch", device="cuda")
    assert isinstance(info.value, rg.RetrogradError)


def test_save_params_and_load_params_work_across_backends(kind, tmp_path):
    backend, device = kind
    main, startup, _, logits, loss = _classifier(rg.optim.Adam(1e-2))
    feed = {"x": XB, "labels": LABELS}
    exe = rg.Executor(backend=backend, device=device)
    exe.run(startup)
    exe.run(main, feed=feed, fetch_list=[loss])
    rg.save_params(exe.scope, tmp_path / "dev.npz", main)
    ref = rg.Executor()
    ref.run(startup)
    ref.run(main, feed=feed, fetch_list=[loss])
    rg.save_params(ref.scope, tmp_path / "host.npz", main)
    dev, host = rg.read_params(tmp_path / "dev.npz"), rg.read_params(tmp_path / "host.npz")
    assert sorted(dev) == sorted(host)                      # the files are the same
    for name in host:
        assert dev[name].dtype == host[name].dtype and dev[name].shape == host[name].shape
        np.testing.assert_allclose(dev[name], host[name], rtol=1e-5, atol=1e-7, err_msg=name)
    # a file written by NumPy loads on the device (and the reverse), and training goes on alike
    fresh = rg.Executor(backend=backend, device=device)
    rg.load_params(fresh.scope, tmp_path / "host.npz")
    assert _is_backend_array(fresh, fresh.scope.get("fc1.w"))
    back = rg.Executor()
    rg.load_params(back.scope, tmp_path / "dev.npz")
    a, = fresh.run(main, feed=feed, fetch_list=[loss])
    b, = back.run(main, feed=feed, fetch_list=[loss])
    c, = ref.run(main, feed=feed, fetch_list=[loss])
    np.testing.assert_allclose(a, c, rtol=1e-5)
    np.testing.assert_allclose(b, c, rtol=1e-5)


def test_peak_bytes_counts_device_memory_on_every_backend(kind):
    backend, device = kind
    main, startup, _, logits, loss = _classifier(rg.optim.SGD(0.1))
    peaks = []
    for exe in (rg.Executor(), rg.Executor(backend=backend, device=device)):
        exe.run(startup)
        exe.run(main, feed={"x": XB, "labels": LABELS}, fetch_list=[loss])
        peaks.append(exe.last_stats.peak_bytes)
    assert isinstance(peaks[1], int)
    # at least the feeds and the four parameters were on the device at once
    params = 4 * (8 * 16 + 16 + 16 * 4 + 4)
    assert peaks[1] >= XB.nbytes + LABELS.nbytes + params
    assert peaks[1] == peaks[0]


MISSING_LIBRARY = textwrap.dedent("""
    import sys
    for name in ("torch", "cupy", "onnx", "onnxruntime", "mpi4py"):
        sys.modules[name] = None              # "import name" raises ImportError from here on
    import numpy as np
    import retrograd as rg                    # the base install: NumPy (and rich) only
    for backend, extra in (("torch", "torch"), ("cupy", "cupy"), ("onnxruntime", "onnx")):
        try:
            rg.Executor(backend=backend)
        except rg.BackendError as exc:
            assert isinstance(exc, rg.RetrogradError)
            assert f'retrograd[{extra}]' in str(exc), str(exc)
            print("ok", backend)
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        y = rg.layers.fc(rg.data("x", [-1, 3]), 2, name="fc")
    try:
        rg.onnx.export(main, "never.onnx", fetch_list=[y])
    except rg.BackendError as exc:
        assert 'retrograd[onnx]' in str(exc), str(exc)
        print("ok export")
    assert rg.distributed.rank() == 0 and rg.distributed.world_size() == 1   # no MPI: one process
    exe = rg.Executor()
    exe.run(startup)
    print("ok numpy", exe.run(main, feed={"x": np.ones((1, 3))}, fetch_list=[y])[0].shape)
""")


def test_a_missing_library_raises_backend_error_naming_the_pip_extra(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "MPI_"))}
    done = subprocess.run([sys.executable, "-c", MISSING_LIBRARY], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n") == ["ok torch", "ok cupy", "ok onnxruntime", "ok export",
                                       "ok numpy (1, 2)", ""], done.stdout
    assert not (tmp_path / "never.onnx").exists()


@pytest.fixture
def numpy_only_op():
    """``PutAlong``: an op whose kernel calls a NumPy-only function (``put_along_axis``)."""
    from retrograd.ops.core.registry import OPS, OpDef

    def kernel(k, x, idx):
        out = k.xp.asarray(x, copy=True)
        k.xp.put_along_axis(out, idx, 0.0, axis=1)
        return out
    OPS["PutAlong"] = OpDef("PutAlong", kernel, lambda ins, attrs: [(ins[0].shape, ins[0].dtype)],
                            inputs=("x", "idx"), outputs=("y",))
    yield "PutAlong"
    del OPS["PutAlong"]


def test_an_op_a_backend_cannot_run_names_the_op_and_the_backend(numpy_only_op):
    pytest.importorskip("torch")
    from retrograd.ops.core.registry import append_op
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [2, 3])
        idx = rg.data("idx", [2, 1], dtype="int64")
        y = append_op(numpy_only_op, [x, idx])[0]
    feed = {"x": np.ones((2, 3), "float32"), "idx": np.array([[0], [2]])}
    got, = rg.Executor().run(main, feed=feed, fetch_list=[y])
    np.testing.assert_array_equal(got, [[0, 1, 1], [1, 1, 0]])
    with pytest.raises(rg.BackendError) as info:
        rg.Executor(backend="torch", device="cpu").run(main, feed=feed, fetch_list=[y])
    assert "PutAlong" in str(info.value) and 'backend "torch"' in str(info.value)


def test_an_op_without_an_onnx_form_names_the_op_and_the_onnxruntime_backend():
    pytest.importorskip("onnxruntime")
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 8])
        loss = rg.mean(rg.layers.fc(x, 2, name="fc") ** 2)
        rg.distributed.DataParallel(rg.optim.SGD(0.1)).minimize(loss)   # AllReduce: no ONNX form
    exe = rg.Executor(backend="onnxruntime")
    rg.Executor().run(startup, scope=exe.scope)
    with pytest.raises(rg.BackendError) as info:
        exe.run(main, feed={"x": XB}, fetch_list=[loss])
    assert "AllReduce" in str(info.value) and "onnxruntime" in str(info.value)


@pytest.mark.parametrize("xp_name", ["numpy", "array_api_strict", "torch"])
def test_executor_xp_keeps_working(xp_name):
    xp = pytest.importorskip(xp_name)
    main, startup, _, logits, loss = _classifier(rg.optim.SGD(0.1))
    feed = {"x": XB, "labels": LABELS}
    ref = rg.Executor()
    ref.run(startup)
    exe = rg.Executor(xp=xp)
    exe.run(startup)
    for _ in range(2):
        got, = exe.run(main, feed=feed, fetch_list=[loss])
        want, = ref.run(main, feed=feed, fetch_list=[loss])
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)


def test_optional_extras_name_what_the_contract_says():
    tomllib = pytest.importorskip("tomllib")
    from pathlib import Path
    meta = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]

    def names(reqs):
        return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in reqs}
    base = names(meta["dependencies"])
    assert {"numpy", "rich"} <= base
    assert not base & {"torch", "cupy", "onnx", "onnxruntime", "mpi4py", "mpich"}   # all optional
    extras = meta["optional-dependencies"]
    assert names(extras["torch"]) == {"torch"}
    assert any(n.startswith("cupy") for n in names(extras["cupy"]))
    assert names(extras["onnx"]) == {"onnx", "onnxruntime"}
    assert "mpi4py" in names(extras["mpi"]) and len(names(extras["mpi"])) == 2     # and an MPI from PyPI
    everything = " ".join(extras["all"])           # "retrograd[torch,onnx,mpi]" or the packages
    assert all(k in everything for k in ("torch", "onnx", "mpi")) and "cupy" not in everything   # no GPU


# --- ONNX ----------------------------------------------------------------------------------------

def test_onnx_export_snippet_verbatim(tmp_path, monkeypatch):
    onnx = pytest.importorskip("onnx")
    import onnx.numpy_helper
    onnxruntime = pytest.importorskip("onnxruntime")
    monkeypatch.chdir(tmp_path)
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 8])
        logits = rg.layers.fc(rg.layers.fc(x, 16, act="tanh", name="fc1"), 4, name="logits")
    assert logits.name == "logits"          # fc names its output after the layer
    exe = rg.Executor()
    exe.run(startup)
    xb = XB

    model = rg.onnx.export(main, "model.onnx", fetch_list=[logits], scope=exe.scope)
    sess = onnxruntime.InferenceSession("model.onnx")
    logits_v, = sess.run(["logits"], {"x": xb})       # inputs are the feeds, outputs the fetches, by name

    assert isinstance(model, onnx.ModelProto)
    assert onnx.load("model.onnx").graph == model.graph
    assert [i.name for i in sess.get_inputs()] == ["x"]
    assert {t.name for t in model.graph.initializer} == {"fc1.w", "fc1.b", "logits.w", "logits.b"}
    for t in model.graph.initializer:                 # holding exe.scope's values
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(t), exe.scope.get(t.name))
    want, = exe.run(main, feed={"x": xb}, fetch_list=[logits])
    np.testing.assert_allclose(logits_v, want, rtol=1e-5, atol=1e-6)
    # without a scope the parameters are inputs of the same names
    bare = rg.onnx.export(main, None, fetch_list=[logits])
    assert {i.name for i in bare.graph.input} == {"x", "fc1.w", "fc1.b", "logits.w", "logits.b"}
    # the default opset is one stock onnxruntime accepts (the session above was built)
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 17


def test_onnx_export_opset_argument(tmp_path):
    pytest.importorskip("onnxruntime")
    main, startup, _, logits, _ = _classifier()
    exe = rg.Executor()
    exe.run(startup)
    model = rg.onnx.export(main, tmp_path / "m17.onnx", fetch_list=[logits], scope=exe.scope, opset=17)
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [17]


def test_onnx_training_program_exports_and_outputs_every_persistable_it_writes(tmp_path):
    onnxruntime = pytest.importorskip("onnxruntime")
    main, startup, _, logits, loss = _classifier(rg.optim.Adam(1e-2))
    exe = rg.Executor()
    exe.run(startup)
    model = rg.onnx.export(main, tmp_path / "train.onnx", fetch_list=[loss])
    written = {n for op in main.global_block().ops for n in op.outputs
               if main.global_block().vars[n].persistable}
    assert {"fc1.w", "fc1.w.moment1", "fc1.w.step", "logits.b"} <= written
    outputs = {o.name for o in model.graph.output}
    assert {n + ".new" for n in written} <= outputs and loss.name in outputs
    state = {v.name: np.asarray(exe.scope.get(v.name)) for v in main.list_vars() if v.persistable}
    sess = onnxruntime.InferenceSession(str(tmp_path / "train.onnx"))
    feed = {"x": XB, "labels": LABELS}
    for step in range(3):
        names = [o.name for o in sess.get_outputs()]
        outs = dict(zip(names, sess.run(None, {**feed, **state})))
        state = {name: outs[name + ".new"] if name in written else value for name, value in state.items()}
        want, = exe.run(main, feed=feed, fetch_list=[loss])
        np.testing.assert_allclose(outs[loss.name], want, rtol=1e-5, err_msg=f"step {step}")
    for name in written:
        np.testing.assert_allclose(state[name], exe.scope.get(name), rtol=1e-5, atol=1e-7, err_msg=name)


def test_onnx_if_stays_if_and_loops_become_loops_that_run_zero_times(tmp_path):
    onnxruntime = pytest.importorskip("onnxruntime")
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3])
        n = rg.data("n", [], dtype="int64")
        x.stop_gradient = False
        i0 = rg.constant(0, dtype="int64")
        _, y = rg.while_loop(lambda i, v: i < n, lambda i, v: [i + 1, rg.tanh(v) * 2.0], [i0, x])
        z = rg.cond(rg.sum(y) > 0.0, lambda: y * 3.0, lambda: -y)
        loss = rg.sum(z * z)
        dx, = rg.gradients(loss, [x])
    model = rg.onnx.export(main, tmp_path / "cf.onnx", fetch_list=[z, dx])
    types = {node.op_type for node in model.graph.node}
    assert "If" in types and "Loop" in types and "While" not in types
    sess = onnxruntime.InferenceSession(str(tmp_path / "cf.onnx"))
    exe = rg.Executor()
    xb = XB[:2, :3]
    for trips in (0, 1, 3):
        feed = {"x": xb, "n": np.array(trips)}
        got = sess.run([z.name, dx.name], feed)
        want = exe.run(main, feed=feed, fetch_list=[z, dx])
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=f"{trips} iterations")


def test_onnx_recurrent_layers_and_their_gradients_run_for_zero_steps(tmp_path):
    onnxruntime = pytest.importorskip("onnxruntime")
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, 8])                     # [T, N, 8]
        x.stop_gradient = False
        h_all, h_last, _, _ = rg.layers.lstm(x, 16, name="lstm")
        loss = rg.sum(h_all * h_all) + rg.sum(h_last)
        dx, dw = rg.gradients(loss, [x, main.global_block().var("lstm.w_hh")])
    exe = rg.Executor()
    exe.run(startup)
    rg.onnx.export(main, tmp_path / "lstm.onnx", fetch_list=[h_all, h_last, dx, dw], scope=exe.scope)
    sess = onnxruntime.InferenceSession(str(tmp_path / "lstm.onnx"))
    for T in (0, 1, 4):
        xb = np.random.default_rng(T).standard_normal((T, 3, 8)).astype("float32")
        got = sess.run([v.name for v in (h_all, h_last, dx, dw)], {"x": xb})
        want = exe.run(main, feed={"x": xb}, fetch_list=[h_all, h_last, dx, dw])
        for g, w in zip(got, want):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=f"T={T}")


def test_onnxruntime_executor_runs_training_with_the_ordinary_run_api():
    pytest.importorskip("onnxruntime")
    main, startup, h, logits, loss = _classifier(rg.optim.Adam(1e-2), dropout=0.25)
    feed = {"x": XB, "labels": LABELS}
    ref = rg.Executor()
    ref.run(startup)
    exe = rg.Executor(backend="onnxruntime")
    exe.run(startup)
    for step in range(3):
        got = exe.run(main, feed=feed, fetch_list=[loss, h])
        want = ref.run(main, feed=feed, fetch_list=[loss, h])
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, err_msg=f"step {step}")
        np.testing.assert_array_equal(got[1] == 0, want[1] == 0)     # the same dropout masks
    for name in ("fc1.w", "logits.b", "logits.w.moment2", "fc1.b.step"):   # state stays in exe.scope
        np.testing.assert_allclose(np.asarray(exe.scope.get(name)), ref.scope.get(name),
                                   rtol=1e-5, atol=1e-7, err_msg=name)
    got, = exe.run(main, feed=feed, fetch_list=[logits])
    assert isinstance(got, np.ndarray) and got.shape == (6, 4)
    assert exe.last_stats.peak_bytes > 0


def test_onnxruntime_executor_saves_and_loads_the_same_parameter_files(tmp_path):
    pytest.importorskip("onnxruntime")
    main, startup, _, logits, loss = _classifier(rg.optim.Adam(1e-2))
    feed = {"x": XB, "labels": LABELS}
    exe = rg.Executor(backend="onnxruntime")
    exe.run(startup)
    exe.run(main, feed=feed, fetch_list=[loss])
    rg.save_params(exe.scope, tmp_path / "ort.npz", main)
    host = rg.Executor()
    rg.load_params(host.scope, tmp_path / "ort.npz", main)
    back = rg.Executor(backend="onnxruntime")
    rg.load_params(back.scope, tmp_path / "ort.npz", main)
    a, = host.run(main, feed=feed, fetch_list=[loss])
    b, = back.run(main, feed=feed, fetch_list=[loss])
    c, = exe.run(main, feed=feed, fetch_list=[loss])
    np.testing.assert_allclose(a, c, rtol=1e-5)
    np.testing.assert_allclose(b, c, rtol=1e-5)
