"""Executor(backend=, device=): feeds, scope, fetches, errors, engines, on every backend."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd.backends import get_backend, to_numpy
from retrograd.backends.numpy_backend import NumpyBackend
from retrograd.ops.core.registry import OPS, OpDef


def _tanh_program():
    main, startup = rg.Program(random_seed=1), rg.Program(random_seed=1)
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 3])
        w = rg.create_parameter("w", [3, 2])
        y = rg.tanh(rg.matmul(x, w))
    return main, startup, y


XB = np.random.default_rng(0).standard_normal((4, 3)).astype("float32")


def test_fetches_are_numpy_by_default_and_backend_arrays_on_request(backend):
    main, startup, y = _tanh_program()
    exe = backend.executor()
    exe.run(startup)
    host, = exe.run(main, feed={"x": XB}, fetch_list=[y])
    dev, = exe.run(main, feed={"x": XB}, fetch_list=[y], return_numpy=False)
    assert isinstance(host, np.ndarray)
    assert exe.backend.owns(dev) and exe.backend.device_of(dev) == exe.backend.device
    w = to_numpy(exe.scope.get("w"))
    np.testing.assert_allclose(host, np.tanh(XB @ w), rtol=1e-6)
    np.testing.assert_array_equal(to_numpy(dev), host)


def test_scope_holds_backend_arrays_and_set_takes_numpy_or_backend_arrays(backend):
    main, startup, y = _tanh_program()
    exe = backend.executor()
    exe.run(startup)
    assert exe.backend.owns(exe.scope.get("w"))
    exe.scope.set("w", np.ones((3, 2), "float32"))
    assert exe.backend.owns(exe.scope.get("w"))
    out, = exe.run(main, feed={"x": XB}, fetch_list=[y])
    np.testing.assert_allclose(out, np.tanh(XB @ np.ones((3, 2), "float32")), rtol=1e-6)
    exe.scope.set("w", exe.backend.from_numpy(np.full((3, 2), 0.5, "float32")))
    out, = exe.run(main, feed={"x": XB}, fetch_list=[y])
    np.testing.assert_allclose(out, np.tanh(XB @ np.full((3, 2), 0.5, "float32")), rtol=1e-6)


def test_a_float64_scope_value_is_cast_once_on_the_device(backend):
    main, startup, y = _tanh_program()
    exe = backend.executor()
    exe.run(startup)
    exe.scope.set("w", exe.backend.from_numpy(np.ones((3, 2))))          # float64 on the device
    exe.run(main, feed={"x": XB}, fetch_list=[y])
    assert to_numpy(exe.scope.get("w")).dtype == np.float32


def test_feeds_of_the_backend_are_used_as_they_are(backend):
    main, startup, y = _tanh_program()
    exe = backend.executor()
    exe.run(startup)
    fed = exe.backend.from_numpy(XB)
    out, = exe.run(main, feed={"x": fed}, fetch_list=[y])
    want, = exe.run(main, feed={"x": XB}, fetch_list=[y])
    np.testing.assert_array_equal(out, want)
    as64, = exe.run(main, feed={"x": exe.backend.from_numpy(XB.astype("float64"))}, fetch_list=[y])
    np.testing.assert_array_equal(as64, want)                           # same-kind cast on the device
    with pytest.raises(rg.FeedError, match=r"feed 'x' has shape \[4\]"):
        exe.run(main, feed={"x": exe.backend.from_numpy(XB[:, 0])}, fetch_list=[y])


def test_an_array_of_another_library_is_a_feed_and_backend_error():
    torch = pytest.importorskip("torch")
    main, startup, y = _tanh_program()
    exe = rg.Executor()
    exe.run(startup)
    with pytest.raises(rg.FeedError, match=r"feed 'x' is a torch.Tensor; backend \"numpy\""):
        exe.run(main, feed={"x": torch.from_numpy(XB)}, fetch_list=[y])
    with pytest.raises(rg.BackendError):
        exe.run(main, feed={"x": torch.from_numpy(XB)}, fetch_list=[y])


def test_a_feed_on_another_device_is_refused_naming_both():
    """A tensor on the 'meta' device stands in for one on another GPU: same library, other device."""
    torch = pytest.importorskip("torch")
    main, startup, y = _tanh_program()
    exe = rg.Executor(backend="torch", device="cpu")
    exe.run(startup)
    elsewhere = torch.empty((4, 3), dtype=torch.float32, device="meta")
    with pytest.raises(rg.BackendError, match=r"feed 'x' is on device meta, the executor runs on cpu"):
        exe.run(main, feed={"x": elsewhere}, fetch_list=[y])
    exe.scope.set("w", torch.empty((3, 2), device="meta"))
    with pytest.raises(rg.FeedError, match=r"scope value 'w' is on device meta"):
        exe.run(main, feed={"x": XB}, fetch_list=[y])


@pytest.fixture
def numpy_only_op():
    """``Unravel``: a kernel that calls a NumPy-only function (``ravel_multi_index``)."""
    def kernel(k, x):
        return k.xp.ravel_multi_index((x, x), (3, 4))
    OPS["Unravel"] = OpDef("Unravel", kernel, lambda ins, attrs: [(ins[0].shape, ins[0].dtype)],
                           inputs=("x",), outputs=("y",))
    yield "Unravel"
    del OPS["Unravel"]


def test_an_op_the_backend_cannot_run_names_the_op_and_backend(numpy_only_op):
    pytest.importorskip("torch")
    from retrograd.ops.core.registry import append_op
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        ids = rg.data("ids", [-1], "int64")
        out = append_op(numpy_only_op, [ids], {})[0]
    feed = {"ids": np.array([1, 2])}
    got, = rg.Executor().run(main, feed=feed, fetch_list=[out])
    np.testing.assert_array_equal(got, [5, 10])
    with pytest.raises(rg.BackendError, match=r'Unravel.*cannot run on backend "torch" \(device cpu\)'):
        rg.Executor(backend="torch").run(main, feed=feed, fetch_list=[out])


def test_peak_bytes_agree_across_backends(backend):
    main, startup, y = _tanh_program()
    with rg.program_guard(main, startup):
        rg.append_backward(rg.mean(y * y))
    peaks = []
    for exe in (rg.Executor(), backend.executor()):
        exe.run(startup)
        exe.run(main, feed={"x": XB}, fetch_list=[y])
        peaks.append(exe.last_stats.peak_bytes)
    assert peaks[0] == peaks[1] > XB.nbytes


def test_a_backend_with_an_engine_runs_whole_programs_through_it():
    calls = []

    class RecordingEngine:
        """An engine stand-in (the onnxruntime engine's interface): records what run hands it."""

        def __init__(self, executor):
            self.executor = executor

        def run(self, program, feed, fetch_list, scope, return_numpy):
            calls.append((self.executor, program, feed, fetch_list, scope, return_numpy))
            return ["ran"]

    class EngineBackend(NumpyBackend):
        name = "recording"
        engine = RecordingEngine

    exe = rg.Executor(backend=EngineBackend())
    main, _, y = _tanh_program()
    assert exe.run(main, feed={"x": XB}, fetch_list=[y], return_numpy=False) == ["ran"]
    assert calls == [(exe, main, {"x": XB}, [y], None, False)]


def test_get_backend_gives_a_fresh_backend_each_time():
    a, b = get_backend("numpy"), get_backend("numpy")
    assert a is not b and a.xp is b.xp is np
