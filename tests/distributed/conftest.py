"""The ``mpiexec`` fixture: run a script of ``scripts/`` on several ranks, bounded by a timeout."""
from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "scripts"
TIMEOUT_S = 60


def _launch(script: str, *args: str, n: int = 2, via_mpi4py: bool = True) -> subprocess.CompletedProcess:
    """``mpiexec -n n python [-m mpi4py] scripts/<script>.py args`` (``script`` "-m": ``-m args``);
    the whole launch is killed (and the test failed) when it runs past the timeout, so a hanging
    rank cannot stall the suite. ``python -m mpi4py`` makes an uncaught exception on one rank
    abort them all."""
    runner = [sys.executable, "-m", "mpi4py"] if via_mpi4py else [sys.executable]
    target = ["-m"] if script == "-m" else [str(SCRIPTS / f"{script}.py")]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    command = ["mpiexec", "-n", str(n), *runner, *target, *args]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(command)} did not finish in {TIMEOUT_S} s (a rank hangs)\n{out}\n{err}")
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


@pytest.fixture
def mpiexec():
    """The launcher function; the test is skipped where MPI is not installed."""
    if shutil.which("mpiexec") is None or importlib.util.find_spec("mpi4py") is None:
        pytest.skip('needs mpiexec and mpi4py: pip install "retrograd[mpi]"')
    return _launch


@pytest.fixture
def load_script():
    """Import ``scripts/<name>.py`` as a module (its builders serve as the one-process reference)."""
    def load(name: str):
        spec = importlib.util.spec_from_file_location(f"rg_mpi_script_{name}", SCRIPTS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return load
