"""Executor(threads=...) caps BLAS threads while a run computes and gives the old setting back."""
import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

import retrograd as rg
from retrograd.runtime.threads import BlasThreads


def _blas_threads() -> list[int]:
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


needs_blas = pytest.mark.skipif(not _blas_threads(), reason="no BLAS library threadpoolctl can control")


@needs_blas
def test_limit_applies_inside_and_restores_after():
    with threadpool_limits(limits=2, user_api="blas"):
        blas = BlasThreads(1)
        with blas.limit():
            assert set(_blas_threads()) == {1}
        assert set(_blas_threads()) == {2}


@needs_blas
def test_executor_runs_under_its_thread_limit_and_restores(monkeypatch):
    seen = []
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [4, 4])
        out = rg.matmul(x, x)
    exe = rg.Executor(threads=1)
    real_execute = exe.execute

    def execute(plan, env):            # observe the setting while the plan's kernels run
        seen.append(set(_blas_threads()))
        return real_execute(plan, env)

    monkeypatch.setattr(exe, "execute", execute)
    with threadpool_limits(limits=2, user_api="blas"):
        value, = exe.run(main, feed={"x": np.eye(4, dtype=np.float32) * 2}, fetch_list=[out])
        assert set(_blas_threads()) == {2}
    assert seen == [{1}]
    np.testing.assert_array_equal(value, np.eye(4) * 4)


def test_default_is_one_thread_and_bad_values_are_refused():
    assert rg.Executor().blas.threads == 1
    assert rg.Executor(threads=3).blas.threads == 3
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(rg.ProgramError, match="threads must be a positive int"):
            rg.Executor(threads=bad)
