"""Data parallelism over MPI: ranks launched with ``mpiexec -n 2`` from the test.

The scripts in ``scripts/`` run on the ranks; ``python -m mpi4py`` makes an
uncaught exception on one rank abort them all, and every launch is bounded by
a timeout, so a hang fails the test instead of stalling the suite.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import retrograd as rg

SCRIPTS = Path(__file__).parent / "scripts"
TIMEOUT_S = 60

needs_mpi = pytest.mark.skipif(
    shutil.which("mpiexec") is None or importlib.util.find_spec("mpi4py") is None,
    reason='needs mpiexec and mpi4py: pip install "retrograd[mpi]"')


def mpiexec(args: list[str], n: int = 2, via_mpi4py: bool = True) -> subprocess.CompletedProcess:
    """Run ``python [-m mpi4py] args`` on ``n`` ranks; kill the whole launch on timeout."""
    runner = [sys.executable, "-m", "mpi4py"] if via_mpi4py else [sys.executable]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    proc = subprocess.Popen(["mpiexec", "-n", str(n), *runner, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"mpiexec did not finish in {TIMEOUT_S} s (a rank hangs)\n{out}\n{err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"rg_mpi_{name}", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs_mpi
def test_two_ranks_on_half_batches_match_one_process_on_whole_batches(tmp_path):
    prefix = str(tmp_path / "dp")
    done = mpiexec([str(SCRIPTS / "adam_shards.py"), prefix])
    assert done.returncode == 0, done.stderr

    script = load_script("adam_shards")
    main, startup, loss, grad_norm = script.build(lambda opt: opt, seed=1)   # rank 0's seed
    exe = rg.Executor()
    exe.run(startup)
    norms = [exe.run(main, feed=feed, fetch_list=[grad_norm])[0] for feed in script.batches()]
    assert max(norms) > 0.5            # clipping acts, so it must see the averaged gradients
    expected = dict(grad_norms=np.array(norms), **script.persistables(exe, main))
    assert int(expected["fc1.w.step"][0]) == script.STEPS
    for rank in range(2):
        got = dict(np.load(f"{prefix}.rank{rank}.npz"))
        assert sorted(got) == sorted(expected)
        for name, value in expected.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-7, err_msg=f"rank {rank}: {name}")


@needs_mpi
@pytest.mark.parametrize("via_mpi4py", [True, False], ids=["python-m-mpi4py", "plain-python"])
def test_a_failing_rank_stops_every_rank_with_its_message(via_mpi4py):
    done = mpiexec([str(SCRIPTS / "one_rank_fails.py")], via_mpi4py=via_mpi4py)
    assert done.returncode != 0
    assert "FeedError" in done.stderr and "feed 'x' has shape [4, 5]" in done.stderr
    assert "should not have" not in done.stdout


@needs_mpi
def test_mismatched_programs_fail_on_every_rank_naming_the_parameter_before_a_step():
    done = mpiexec([str(SCRIPTS / "mismatched_ranks.py")])
    assert done.returncode == 0, done.stderr
    lines = sorted(line for line in done.stdout.splitlines() if "refused" in line)
    assert [line.split()[1] for line in lines] == ["0", "1"], done.stdout
    for line in lines:
        assert "ProgramError" in line
        assert "'hidden.w' is float32[6, 8] on rank 0 but float32[6, 9] on rank 1" in line
    assert "trained" not in done.stdout


def test_missing_mpi4py_under_a_launcher_is_a_backend_error_naming_the_extra():
    code = ("import sys; sys.modules['mpi4py'] = None\n"
            "import retrograd as rg\n"
            "try:\n    rg.distributed.world_size()\n"
            "except rg.BackendError as exc:\n    print('BackendError:', exc)\n")
    env = dict(os.environ, PMI_SIZE="2")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("BackendError:")
    assert 'pip install "retrograd[mpi]"' in done.stdout and "2 ranks" in done.stdout
