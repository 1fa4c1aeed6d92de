"""`retrograd train` run as a user runs it (a subprocess), at small sizes."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import retrograd as rg
from retrograd import train

SMALL = ["--hidden", "32", "--embed", "16", "--seq-len", "16", "--batch", "8", "--sample-len", "40"]
STEP_LINE = re.compile(r"^step\s+(\d+)\s+loss\s+([0-9.]+)", re.M)


def retrograd_train(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "retrograd", "train", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300)


def _losses(stdout: str) -> dict[int, float]:
    return {int(s): float(v) for s, v in STEP_LINE.findall(stdout)}


def _one_line_error(done: subprocess.CompletedProcess, *fragments: str) -> str:
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def test_training_lowers_the_loss_saves_and_samples(tmp_path):
    path = tmp_path / "lm.npz"
    done = retrograd_train(*SMALL, "--steps", "40", "--lr", "0.01", "--log-every", "4",
                           "--save", str(path))
    assert done.returncode == 0, done.stderr
    losses = _losses(done.stdout)
    assert sorted(losses) == list(range(4, 41, 4))
    # Uniform guessing over the 96-character vocabulary costs ln 96 = 4.56 nats.
    assert losses[4] > 4.0
    assert np.mean([losses[36], losses[40]]) < losses[4] - 0.8
    assert f"saved parameters and optimizer state to {path}" in done.stdout
    assert "chars/s" in done.stdout and "MB" in done.stdout
    sample = done.stdout.split("sample:\n", 1)[1]
    assert sample.startswith("def ") and len(sample.rstrip("\n")) >= 40
    stored = rg.read_params(path)
    assert stored["train.step"].tolist() == [40]
    assert stored["embed.w"].shape == (len(train.VOCAB), 16)
    assert "lstm0.w_hh" in stored and any(k.endswith(".moment2") for k in stored)


def test_resume_continues_exactly(tmp_path):
    half, resumed, straight = tmp_path / "half.npz", tmp_path / "resumed.npz", tmp_path / "straight.npz"
    runs = [("--steps", "6", "--save", str(half)),
            ("--steps", "6", "--resume", str(half), "--save", str(resumed)),
            ("--steps", "12", "--save", str(straight))]
    outputs = []
    for extra in runs:
        done = retrograd_train(*SMALL, "--log-every", "1", *extra)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    assert "resuming" in outputs[1] and "at step 6" in outputs[1]
    assert sorted(_losses(outputs[1])) == list(range(7, 13))
    assert {**_losses(outputs[0]), **_losses(outputs[1])} == _losses(outputs[2])
    a, b = rg.read_params(resumed), rg.read_params(straight)
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.parametrize("args, fragment", [
    (["--hiden", "32"], "unrecognized arguments: --hiden"),
    (["--lr", "-1"], "--lr"),
    (["--model", "transformer"], "--model"),
    (["--recompute", "lots"], "--recompute"),
    (["--steps", "ten"], "--steps"),
])
def test_bad_options_are_usage_errors(args, fragment):
    done = retrograd_train(*args)
    assert done.returncode == 2
    assert "usage:" in done.stderr and fragment in done.stderr and "Traceback" not in done.stderr


@pytest.fixture(scope="module")
def saved_small(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("saved") / "small.npz"
    done = retrograd_train(*SMALL, "--steps", "2", "--save", str(path))
    assert done.returncode == 0, done.stderr
    return path


def _unchanged_after(path: Path, run) -> subprocess.CompletedProcess:
    before = path.read_bytes()
    done = run()
    assert path.read_bytes() == before
    return done


def test_missing_resume_file(tmp_path, saved_small):
    done = _unchanged_after(saved_small, lambda: retrograd_train(
        *SMALL, "--steps", "2", "--resume", str(tmp_path / "nope.npz"), "--save", str(saved_small)))
    _one_line_error(done, "nope.npz", "does not exist")


def test_corrupt_resume_file(tmp_path, saved_small):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(saved_small.read_bytes()[:100])
    done = _unchanged_after(saved_small, lambda: retrograd_train(
        *SMALL, "--steps", "2", "--resume", str(bad), "--save", str(saved_small)))
    _one_line_error(done, "bad.npz", "not a readable parameter file")


def test_resume_file_of_another_model(saved_small):
    done = _unchanged_after(saved_small, lambda: retrograd_train(
        *SMALL[:-2], "--hidden", "48", "--steps", "2", "--resume", str(saved_small),
        "--save", str(saved_small)))
    line = _one_line_error(done, "lstm0.w_hh", "[32, 128] in the file, expected [48, 192]", "--hidden")
    done = retrograd_train(*SMALL, "--model", "gru", "--steps", "2", "--resume", str(saved_small),
                           "--save", str(saved_small))
    _one_line_error(done, "missing 'gru0.", "--model")
    assert line.startswith("retrograd train: error:")


def test_learning_rate_that_diverges_stops_without_saving(saved_small):
    done = _unchanged_after(saved_small, lambda: retrograd_train(
        *SMALL, "--steps", "20", "--lr", "1e38", "--save", str(saved_small)))
    _one_line_error(done, "loss became nan", "lower --lr")


@pytest.mark.parametrize("target, fragment", [("no/x.npz", "does not exist"), (".", "is a directory")])
def test_unusable_save_path_fails_before_training(tmp_path, target, fragment):
    done = retrograd_train(*SMALL, "--steps", "2", "--save", str(tmp_path / target))
    _one_line_error(done, fragment, "--save")
    assert "step" not in done.stdout


def test_batches_are_deterministic_windows_of_the_corpus():
    corpus, files = train.load_corpus()
    assert len(corpus) >= train.MIN_CORPUS_CHARS and files[0] == "textwrap.py"
    xs, ys = train.batch_at(corpus, 3, 10, 4, seed=1)
    again, _ = train.batch_at(corpus, 3, 10, 4, seed=1)
    other, _ = train.batch_at(corpus, 4, 10, 4, seed=1)
    np.testing.assert_array_equal(xs, again)
    assert not np.array_equal(xs, other)
    assert xs.shape == (10, 4)
    np.testing.assert_array_equal(xs[1:], ys[:-1])      # targets are the next characters
    assert train.decode(train.encode("def f(x):\n\treturn é")) == "def f(x):\n?return ?"


@pytest.mark.parametrize("text, value", [("none", None), ("steps", "steps"), ("4096", 4096),
                                         ("64k", 65536), ("8M", 8 * 2**20), ("1g", 2**30)])
def test_parse_recompute(text, value):
    assert train.parse_recompute(text) == value
