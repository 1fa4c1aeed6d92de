"""``retrograd train`` under ``mpiexec -n 2``: batches sharded, rank 0 alone prints and saves, --resume.

The reference is the same command in one process (run here): with the
global batch unchanged, both must end with the same parameters.
"""
from __future__ import annotations

import json

import numpy as np

import retrograd as rg
from retrograd.cli.main import main as cli_main

SMALL = ["--hidden", "16", "--embed", "8", "--seq-len", "16", "--batch", "8", "--sample-len", "5",
         "--no-plot", "--log-every", "1"]


def assert_same_params(path_a, path_b):
    """The values two files hold, the same (the training program each also holds differs: two
    ranks' averages their gradients with AllReduce ops)."""
    a, b = rg.read_params(path_a), rg.read_params(path_b)
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6, err_msg=name)


def logged_losses(path) -> list[float]:
    return [json.loads(line)["loss"] for line in path.read_text().splitlines()]


def test_two_ranks_train_and_resume_as_one_process(mpiexec, tmp_path, capsys):
    two, one = tmp_path / "two", tmp_path / "one"
    done = mpiexec("-m", "retrograd", "train", "--steps", "3", *SMALL, "--save", f"{two}.npz",
                   "--log", f"{two}.jsonl")
    assert done.returncode == 0, done.stderr
    assert "on 2 MPI ranks (4 windows each)" in done.stdout
    assert done.stdout.count("saved parameters") == 1 and done.stdout.count("step      3") == 1
    assert cli_main(["train", "--steps", "3", *SMALL, "--save", f"{one}.npz", "--log", f"{one}.jsonl"]) == 0
    assert_same_params(f"{two}.npz", f"{one}.npz")
    # The logged loss is the whole batch's (the mean of the ranks'), written once.
    np.testing.assert_allclose(logged_losses(two.with_suffix(".jsonl")), logged_losses(one.with_suffix(".jsonl")),
                               rtol=1e-5)

    done = mpiexec("-m", "retrograd", "train", "--steps", "2", *SMALL, "--resume", f"{two}.npz",
                   "--save", f"{two}-resumed.npz")
    assert done.returncode == 0, done.stderr
    assert "resuming" in done.stdout and done.stdout.count("saved parameters") == 1
    assert cli_main(["train", "--steps", "2", *SMALL, "--resume", f"{one}.npz",
                     "--save", f"{one}-resumed.npz"]) == 0
    assert_same_params(f"{two}-resumed.npz", f"{one}-resumed.npz")
    assert int(np.load(f"{two}-resumed.npz")["train.step"][0]) == 5
    capsys.readouterr()


def test_a_batch_that_does_not_split_over_the_ranks_stops_every_rank(mpiexec, tmp_path):
    done = mpiexec("-m", "retrograd", "train", "--steps", "2", *SMALL, "--batch", "7",
                   "--save", str(tmp_path / "m.npz"))
    assert done.returncode != 0
    assert "--batch 7 does not split evenly over 2 MPI ranks; use a multiple of 2" in done.stderr
    assert not (tmp_path / "m.npz").exists()
