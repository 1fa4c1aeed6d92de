"""Executor(threads=...) is one thread count for every library a run uses (BLAS, OpenMP, torch's
intra-op and inter-op pools, onnxruntime's sessions), applied while a run computes and given back
afterwards (issue 30: torch's OpenMP pool made the default `retrograd train` ~9x slower)."""
import subprocess
import sys

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

import retrograd as rg
from retrograd.runtime.threads import DEFAULT_THREADS, ThreadLimit


def _native_threads(api: str) -> list[int]:
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == api]


needs_blas = pytest.mark.skipif(not _native_threads("blas"), reason="no BLAS library threadpoolctl can control")


def _square_program():
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [4, 4])
        out = rg.matmul(x, x)
    return main, out


def _observe(exe, monkeypatch, probe) -> list:
    """What ``probe()`` returns while ``exe``'s plan kernels run."""
    seen = []
    real_execute = exe.execute

    def execute(plan, env):
        seen.append(probe())
        return real_execute(plan, env)

    monkeypatch.setattr(exe, "execute", execute)
    return seen


@needs_blas
def test_limit_applies_inside_and_restores_after():
    with threadpool_limits(limits=2, user_api="blas"):
        with ThreadLimit(1).limit():
            assert set(_native_threads("blas")) == {1}
        assert set(_native_threads("blas")) == {2}


@needs_blas
def test_executor_runs_under_its_thread_limit_and_restores(monkeypatch):
    main, out = _square_program()
    exe = rg.Executor(threads=1)
    seen = _observe(exe, monkeypatch, lambda: set(_native_threads("blas")))
    with threadpool_limits(limits=2, user_api="blas"):
        value, = exe.run(main, feed={"x": np.eye(4, dtype=np.float32) * 2}, fetch_list=[out])
        assert set(_native_threads("blas")) == {2}
    assert seen == [{1}]
    np.testing.assert_array_equal(value, np.eye(4) * 4)


def test_threads_limit_openmp_too_not_blas_only(monkeypatch):
    pytest.importorskip("torch")                 # torch brings a libgomp threadpoolctl sees as openmp
    if not _native_threads("openmp"):
        pytest.skip("no OpenMP library threadpoolctl can control")
    main, out = _square_program()
    exe = rg.Executor(threads=1)
    seen = _observe(exe, monkeypatch, lambda: set(_native_threads("openmp")))
    with threadpool_limits(limits=2, user_api="openmp"):
        exe.run(main, feed={"x": np.ones((4, 4), np.float32)}, fetch_list=[out])
        assert set(_native_threads("openmp")) == {2}
    assert seen == [{1}]


def test_threads_limit_torch_intra_op_pool_while_running(monkeypatch):
    torch = pytest.importorskip("torch")
    main, out = _square_program()
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        exe = rg.Executor(backend="torch", threads=1)
        seen = _observe(exe, monkeypatch, torch.get_num_threads)
        value, = exe.run(main, feed={"x": np.eye(4, dtype=np.float32) * 3}, fetch_list=[out])
        assert seen == [1]
        assert torch.get_num_threads() == 2          # given back after the run
        np.testing.assert_array_equal(value, np.eye(4) * 9)
    finally:
        torch.set_num_threads(before)


def test_torch_inter_op_threads_set_once_and_later_counts_do_not_raise():
    pytest.importorskip("torch")
    # A fresh process: torch takes its inter-op count only before any inter-op work.
    script = ("import retrograd as rg, torch\n"
              "rg.Executor(backend='torch', threads=1)\n"
              "print(torch.get_num_interop_threads())\n"
              "torch.jit.wait(torch.jit.fork(torch.add, torch.ones(1), 1))\n"
              "exe = rg.Executor(backend='torch', threads=3)   # too late for the inter-op pool: no error\n"
              "print(torch.get_num_interop_threads(), exe.threads)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "1", "3"]


def test_onnxruntime_sessions_use_the_executor_threads():
    pytest.importorskip("onnxruntime")
    from retrograd.onnx.engine import session_options
    exe = rg.Executor(backend="onnxruntime", threads=3)
    assert exe._engine.threads == 3
    options = session_options(exe._engine.threads)
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (3, 3)
    main, out = _square_program()
    value, = exe.run(main, feed={"x": np.eye(4, dtype=np.float32) * 2}, fetch_list=[out])
    np.testing.assert_array_equal(value, np.eye(4) * 4)


def test_default_is_one_thread_and_bad_values_are_refused():
    assert DEFAULT_THREADS == 1
    assert rg.Executor().threads == 1
    assert rg.Executor(threads=3).threads == 3
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(rg.ProgramError, match="threads must be a positive int"):
            rg.Executor(threads=bad)


def test_executor_repr_names_backend_device_threads_and_check_finite():
    assert repr(rg.Executor(threads=2, check_finite=True)) == \
        'Executor(backend="numpy", device="cpu", threads=2, check_finite=True)'
    assert repr(rg.Executor()) == 'Executor(backend="numpy", device="cpu", threads=1, check_finite=False)'
