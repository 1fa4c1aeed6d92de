"""Who the ranks are: one process without a launcher; a BackendError when mpi4py is missing under one."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

import retrograd as rg


def test_one_process_is_rank_0_of_1_and_its_shard_is_the_whole_batch():
    assert (rg.distributed.rank(), rg.distributed.world_size()) == (0, 1)
    batch = np.arange(12).reshape(6, 2)
    assert np.array_equal(rg.distributed.shard(batch), batch)


def test_shards_are_equal_contiguous_blocks_in_rank_order(mpiexec):
    done = mpiexec("print_shards")
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == ["rank 0 of 2: [0, 1, 2] | FeedError: cannot split 5",
                                                "rank 1 of 2: [3, 4, 5] | FeedError: cannot split 5"]


def test_missing_mpi4py_under_a_launcher_is_a_backend_error_naming_the_extra():
    code = ("import sys; sys.modules['mpi4py'] = None\n"
            "import retrograd as rg\n"
            "try:\n    rg.distributed.world_size()\n"
            "except rg.BackendError as exc:\n    print('BackendError:', exc)\n")
    env = dict(os.environ, PMI_SIZE="2")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("BackendError:")
    assert 'pip install "retrograd[mpi]"' in done.stdout and "2 ranks" in done.stdout


def test_a_launcher_whose_size_mpi_does_not_see_is_a_backend_error(mpiexec):
    # PMI_SIZE=3 without a process manager: MPI starts as a singleton of size 1, so the processes
    # would each train alone; the first use of the ranks says so (import still works).
    code = ("import retrograd as rg\n"
            "try:\n    rg.distributed.rank()\n"
            "except rg.BackendError as exc:\n    print('BackendError:', exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PMI_SIZE="3"), timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("BackendError: the launcher started 3 processes but MPI sees 1")
