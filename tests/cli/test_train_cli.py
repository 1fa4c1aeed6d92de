"""`retrograd train` run as a user runs it (a subprocess), at small sizes."""
from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import retrograd as rg
from retrograd.cli import train
from retrograd.models.generation import generate_text

SMALL = ["--hidden", "32", "--embed", "16", "--seq-len", "16", "--batch", "8", "--sample-len", "40",
         "--backend", "numpy"]
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
    (["--model", "rnn"], "--model"),
    (["--optimizer", "lion"], "--optimizer"),
    (["--lr-schedule", "linear"], "--lr-schedule"),
    (["--warmup", "-1"], "--warmup"),
    (["--weight-decay", "-0.1"], "--weight-decay"),
    (["--heads", "0"], "--heads"),
    (["--text"], "--text"),
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
    # issue 30: one short line naming the option, not a list of every array's shape
    line = _one_line_error(done, "it was trained with --hidden 32, not 48", "leave --hidden out")
    assert len(line) < 250, line
    done = retrograd_train(*SMALL, "--model", "gru", "--steps", "2", "--resume", str(saved_small),
                           "--save", str(saved_small))
    _one_line_error(done, "holds a lstm model and this run builds gru", "--model lstm")
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
                                         ("64k", 65536), ("8M", 8 * 2**20), ("1g", 2**30),
                                         ("96K", 96 * 1024), ("2MB", 2 * 2**20)])
def test_parse_recompute(text, value):
    assert train.parse_recompute(text) == value


# --- the training job: log, held-out loss, checkpoints, interruption, divergence, sampling ---

def _read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_held_out_text_is_never_trained_on():
    corpus, _ = train.load_corpus()
    training, held_out = train.split_corpus(corpus)
    assert len(held_out) == len(corpus) // 10 and len(training) + len(held_out) == len(corpus)
    np.testing.assert_array_equal(held_out, corpus[len(training):])
    # a training window and its targets never reach past the training part: draw positions
    positions = np.arange(len(training))
    reached = max(int(train.batch_at(positions, step, 64, 32, seed=0)[1].max()) for step in range(300))
    assert 0.99 * len(training) < reached < len(training)
    batches = train.held_out_batches(held_out, 16, 4, count=3)
    assert len(batches) == 3 and batches[0][0].shape == (16, 4)
    np.testing.assert_array_equal(batches[1][0][1:], batches[1][1][:-1])


def _torch_held_out_loss(params: dict, batches) -> float:
    """The LSTM language model's mean cross-entropy written in PyTorch (gate order i, f, g, o)."""
    torch = pytest.importorskip("torch")
    t = {k: torch.from_numpy(np.asarray(v)) for k, v in params.items()}
    hidden = t["lstm0.w_hh"].shape[0]
    lstm = torch.nn.LSTM(t["embed.w"].shape[1], hidden)
    with torch.no_grad():
        lstm.weight_ih_l0.copy_(t["lstm0.w_ih"].T)
        lstm.weight_hh_l0.copy_(t["lstm0.w_hh"].T)
        lstm.bias_ih_l0.copy_(t["lstm0.b"])
        lstm.bias_hh_l0.zero_()
        losses = []
        for xs, ys in batches:
            h, _ = lstm(t["embed.w"][torch.from_numpy(xs)])
            logits = h.reshape(-1, hidden) @ t["out.w"] + t["out.b"]
            losses.append(float(torch.nn.functional.cross_entropy(logits, torch.from_numpy(ys).reshape(-1))))
    return float(np.mean(losses))


def test_log_has_a_json_line_per_step_and_held_out_losses(tmp_path):
    log, saved = tmp_path / "run.jsonl", tmp_path / "m.npz"
    done = retrograd_train(*SMALL, "--steps", "6", "--log-every", "3", "--log", str(log),
                           "--save", str(saved))
    assert done.returncode == 0, done.stderr
    records = _read_log(log)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    printed = _losses(done.stdout)
    for r in records:
        assert r["peak_bytes"] > 0 and r["chars_per_s"] > 0 and math.isfinite(r["loss"])
        assert ("val_loss" in r) == (r["step"] in (3, 6))
        if r["step"] in printed:
            assert abs(printed[r["step"]] - r["loss"]) < 1e-4
    # The held-out loss is the loss of the step's parameters on the held-out windows.
    corpus, _ = train.load_corpus()
    batches = train.held_out_batches(train.split_corpus(corpus)[1], 16, 8)
    expected = _torch_held_out_loss(rg.read_params(saved), batches)
    assert abs(records[-1]["val_loss"] - expected) < 1e-4
    # A resumed run appends to the log.
    done = retrograd_train(*SMALL, "--steps", "2", "--resume", str(saved), "--save", str(saved),
                           "--log", str(log))
    assert done.returncode == 0, done.stderr
    assert [r["step"] for r in _read_log(log)] == [1, 2, 3, 4, 5, 6, 7, 8]


def test_save_every_writes_checkpoints(tmp_path):
    saved = tmp_path / "m.npz"
    done = retrograd_train(*SMALL, "--steps", "7", "--save-every", "3", "--save", str(saved),
                           "--no-plot")
    assert done.returncode == 0, done.stderr
    assert rg.read_params(saved)["train.step"].tolist() == [7]
    assert "training loss" not in done.stdout


def test_ctrl_c_keeps_the_last_checkpoint_and_names_its_step(tmp_path):
    saved = tmp_path / "m.npz"
    proc = subprocess.Popen([sys.executable, "-m", "retrograd", "train", *SMALL, "--steps", "100000",
                             "--save-every", "4", "--save", str(saved)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not saved.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    time.sleep(0.3)                       # land somewhere between checkpoints
    proc.send_signal(signal.SIGINT)
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 130, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    match = re.fullmatch(r"retrograd train: interrupted at step (\d+); (.+) holds step (\d+) "
                         r"\(the last checkpoint\)", lines[0])
    assert match, lines[0]
    stopped, held = int(match[1]), int(match[3])
    assert match[2] == str(saved) and held % 4 == 0 and 4 <= held <= stopped
    assert rg.read_params(saved)["train.step"].tolist() == [held]


def test_interrupted_before_any_checkpoint_leaves_the_file_alone(tmp_path, saved_small):
    before = saved_small.read_bytes()
    proc = subprocess.Popen([sys.executable, "-m", "retrograd", "train", *SMALL, "--steps", "100000",
                             "--log-every", "1", "--save", str(saved_small)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    while not proc.stdout.readline().startswith("step "):
        pass
    proc.send_signal(signal.SIGINT)
    err = proc.stderr.read()
    proc.stdout.read()
    assert proc.wait(timeout=60) == 130, err
    assert f"nothing was saved ({saved_small} is unchanged)" in err
    assert saved_small.read_bytes() == before


def test_divergence_stops_and_saves_nothing_over_a_good_file(saved_small):
    """lr 1e9: step 1's loss is fine, but the parameters it leaves are not; no checkpoint of them."""
    done = _unchanged_after(saved_small, lambda: retrograd_train(
        *SMALL, "--steps", "20", "--lr", "1e9", "--save-every", "1", "--save", str(saved_small)))
    line = _one_line_error(done, "the held-out loss diverged at step 1", "up from 4.5",
                           "lower --lr", f"nothing was saved ({saved_small} is unchanged)")
    assert line.startswith("retrograd train: error:")


def test_divergence_keeps_the_last_good_checkpoint(tmp_path):
    """Healthy steps are checkpointed; once the loss runs away the file keeps the last good step."""
    saved = tmp_path / "m.npz"
    done = retrograd_train(*SMALL, "--steps", "60", "--optimizer", "sgd", "--lr", "30",
                           "--clip-norm", "0", "--save-every", "1", "--save", str(saved))
    line = _one_line_error(done, "diverged at step", "lower --lr", f"{saved} holds step")
    held = int(re.search(r"holds step (\d+)", line)[1])
    bad = int(re.search(r"diverged at step (\d+)", line)[1])
    assert held == bad - 1
    assert rg.read_params(saved)["train.step"].tolist() == [held]


def test_sample_prints_text_from_a_saved_model(saved_small):
    done = subprocess.run([sys.executable, "-m", "retrograd", "sample", str(saved_small),
                           "--length", "25", "--prompt", "import "], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("import ") and len(done.stdout) == len("import ") + 25 + 1
    # the same text the generation program gives in this process from the same parameters and seed
    exe = rg.Executor()
    for name, value in rg.read_params(saved_small).items():
        exe.scope.set(name, value)
    cfg = train.ModelConfig(hidden=32, embed=16)
    assert done.stdout == generate_text(exe, cfg, "import ", 25, 0.8, 0) + "\n"


def test_sample_of_files_that_are_not_models(tmp_path):
    text = tmp_path / "notes.npz"
    text.write_text("not an archive")
    other = tmp_path / "other.npz"
    np.savez(other, w=np.ones(3, np.float32))
    for path, fragment in [(text, "is not a readable parameter file"),
                           (other, "is not a model saved by `retrograd train`"),
                           (tmp_path / "missing.npz", "does not exist")]:
        done = subprocess.run([sys.executable, "-m", "retrograd", "sample", str(path)],
                              capture_output=True, text=True, timeout=120)
        line = _one_line_error(done, str(path), fragment)
        assert "pickle" not in line


def test_config_is_read_from_the_parameter_names():
    params = {"embed.w": np.zeros((96, 8)), "gru0.w_hh": np.zeros((5, 15)), "gru1.w_hh": np.zeros((5, 15))}
    assert train_config(params) == train.ModelConfig(model="gru", hidden=5, layers=2, embed=8)


def train_config(params):
    from retrograd.models.charlm import config_from_params
    return config_from_params(params, "f.npz")


def test_loss_curve_is_drawn_from_the_losses():
    from retrograd.cli.termplot import loss_curve
    text = loss_curve([4.0, 3.0, 2.0, 1.0], {2: 4.0}, first_step=1, width=4, height=4)
    assert text.splitlines()[:6] == [
        "  4.000 |*o",
        "        | *",
        "        |  *",
        "  1.000 |   *",
        "        +----",
        "         step 1 4"]
    # held-out points land on their step's column; long runs are averaged per column
    text = loss_curve([5.0] * 50 + [1.0] * 50, {100: 3.0}, width=10, height=3)
    assert text.splitlines()[:3] == ["  5.000 |*****", "        |         o", "  1.000 |     *****"]


@pytest.mark.parametrize("other", ["torch", "onnxruntime"])
def test_backend_torch_trains_like_numpy_and_files_load_on_either(tmp_path, other):
    """`--backend torch --device cpu` (or the onnxruntime engine): the same losses as NumPy
    (float32) and the same file format."""
    pytest.importorskip(other)
    runs = {}
    for backend in ("numpy", other):
        log, saved = tmp_path / f"{backend}.jsonl", tmp_path / f"{backend}.npz"
        done = retrograd_train(*SMALL, "--steps", "4", "--log", str(log), "--save", str(saved),
                               "--backend", backend, "--device", "cpu", "--no-plot")
        assert done.returncode == 0, done.stderr
        assert f"backend {backend} on cpu" in done.stdout
        runs[backend] = ([r["loss"] for r in _read_log(log)], rg.read_params(saved))
    np.testing.assert_allclose(runs[other][0], runs["numpy"][0], rtol=1e-5)
    for name, value in runs["numpy"][1].items():
        np.testing.assert_allclose(runs[other][1][name], value, rtol=1e-4, atol=1e-6, err_msg=name)
    done = retrograd_train(*SMALL, "--steps", "1", "--resume", str(tmp_path / f"{other}.npz"),
                           "--save", str(tmp_path / "again.npz"), "--no-plot")
    assert done.returncode == 0, done.stderr


def test_unavailable_backend_is_one_line_naming_the_fix():
    done = retrograd_train(*SMALL, "--steps", "1", "--backend", "torch", "--device", "tpu")
    if importlib.util.find_spec("torch") is None:
        # Without the extra the first thing missing is PyTorch itself.
        _one_line_error(done, 'backend "torch" needs PyTorch', 'pip install "retrograd[torch]"')
    else:
        _one_line_error(done, 'backend "torch" has no device', "cuda")


def test_plot_file_without_matplotlib_fails_before_training(tmp_path):
    if importlib.util.find_spec("matplotlib") is not None:
        pytest.skip("matplotlib is installed; the image is checked by test_plot_file_draws_an_image")
    done = retrograd_train(*SMALL, "--steps", "2", "--plot-file", str(tmp_path / "loss.png"),
                           "--save", str(tmp_path / "m.npz"))
    _one_line_error(done, "--plot-file needs matplotlib", 'pip install "retrograd[plot]"')
    assert not (tmp_path / "m.npz").exists()


def test_plot_file_draws_an_image(tmp_path):
    pytest.importorskip("matplotlib")
    image = tmp_path / "loss.png"
    done = retrograd_train(*SMALL, "--steps", "4", "--plot-file", str(image), "--save", str(tmp_path / "m.npz"))
    assert done.returncode == 0, done.stderr
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"drew the loss curve into {image}" in done.stdout


def test_graphs_without_torch_on_a_gpu_is_one_line_naming_what_is_needed():
    done = retrograd_train(*SMALL, "--steps", "1", "--graphs")
    _one_line_error(done, "graphs=True", 'needs a CUDA device of backend "torch"')


# --- issue 23: your text, the new flags, resume and log bugs ------------------------------------

STORY = "Once upon a time, a fox met a crow. " * 40 + "The end.\n"     # 1,449 characters
NOTES = "# notes\n\nfoxes and crows: élan, naïve.\n" * 20


def _text_files(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "more").mkdir()
    story, notes = tmp_path / "story.txt", tmp_path / "more" / "notes.md"
    story.write_text(STORY, encoding="utf-8")
    notes.write_text(NOTES, encoding="utf-8")
    return story, notes


def test_text_trains_on_your_files_and_samples_their_alphabet(tmp_path):
    story, notes = _text_files(tmp_path)
    path = tmp_path / "m.npz"
    done = retrograd_train(*SMALL, "--steps", "6", "--text", str(story), "--text", str(tmp_path / "more" / "*.md"),
                           "--save", str(path))
    assert done.returncode == 0, done.stderr
    header = done.stdout.splitlines()[1]
    total = len(STORY) + len(NOTES)
    held = int(total * 0.1)
    assert header == (f"corpus: {story} ({len(STORY):,} characters), {notes} ({len(NOTES):,} characters): "
                      f"{total - held:,} characters to train on, {held:,} held out; vocabulary "
                      f"{len(set(STORY + NOTES))} characters + 1 unknown")
    alphabet = set(STORY + NOTES) | {"\ufffd"}
    sample = done.stdout.split("sample:\n", 1)[1].rstrip("\n")
    assert sample.startswith("Once") and set(sample) <= alphabet and len(sample) == 4 + 40
    stored = rg.read_params(path)
    assert stored["embed.w"].shape == (len(alphabet), 16)
    # `retrograd sample` reads the vocabulary and the prompt from the file
    sampled = subprocess.run([sys.executable, "-m", "retrograd", "sample", str(path), "--length", "50"],
                             capture_output=True, text=True, timeout=120)
    assert sampled.returncode == 0, sampled.stderr
    text = sampled.stdout.rstrip("\n")
    assert text.startswith("Once") and len(text) == 54 and set(text) <= alphabet
    again = subprocess.run([sys.executable, "-m", "retrograd", "sample", str(path), "--length", "20",
                            "--prompt", "élan"], capture_output=True, text=True, timeout=120)
    assert again.stdout.startswith("élan") and set(again.stdout.rstrip("\n")) <= alphabet


def test_text_vocabulary_goes_into_the_exported_model(tmp_path):
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    story, _ = _text_files(tmp_path)
    path = tmp_path / "m.npz"
    done = retrograd_train(*SMALL, "--steps", "2", "--text", str(story), "--save", str(path))
    assert done.returncode == 0, done.stderr
    exported = subprocess.run([sys.executable, "-m", "retrograd", "export", str(path)], capture_output=True,
                              text=True, timeout=120)
    assert exported.returncode == 0, exported.stderr
    meta = ort.InferenceSession(str(path.with_suffix(".onnx"))).get_modelmeta().custom_metadata_map
    vocab = "".join(sorted(set(STORY))) + "\ufffd"
    assert meta["vocab"] == vocab and meta["unknown"] == str(len(vocab) - 1)


@pytest.mark.parametrize("make, fragment", [
    (lambda d: d / "missing.txt", "missing.txt: no such file"),
    (lambda d: d / "nothing-*.txt", "nothing-*.txt: no file matches"),
    (lambda d: d, "is a directory"),
    (lambda d: _write(d / "latin1.txt", "café".encode("latin-1")), "latin1.txt is not UTF-8 text (byte 3"),
    (lambda d: _write(d / "empty.txt", b""), "the files hold no text"),
])
def test_text_that_cannot_be_read_is_one_line(tmp_path, make, fragment):
    done = retrograd_train(*SMALL, "--steps", "1", "--text", str(make(tmp_path)),
                           "--save", str(tmp_path / "m.npz"))
    _one_line_error(done, "--text", fragment)
    assert not (tmp_path / "m.npz").exists()


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_seq_len_longer_than_the_held_out_text_is_one_line_not_an_index_error(tmp_path):
    """Issue 23: --seq-len 80000 (>= the 76,413 held-out characters) ended in an IndexError from
    held_out_batches; a text too short for --seq-len stops the same way."""
    done = retrograd_train("--seq-len", "80000", "--steps", "1", "--save", str(tmp_path / "m.npz"))
    line = _one_line_error(done, "--seq-len 80000 is longer than the held-out text")
    assert "IndexError" not in line
    story, _ = _text_files(tmp_path)
    done = retrograd_train("--seq-len", "200", "--text", str(story), "--save", str(tmp_path / "m.npz"))
    _one_line_error(done, "--seq-len 200 is longer than the held-out text (144 characters)",
                    "--seq-len 143 or less")


def test_resume_with_another_optimizer_is_refused_and_the_file_kept(saved_small):
    """Issue 23: resuming an Adam checkpoint with --optimizer sgd rewrote it without the moments."""
    done = _unchanged_after(saved_small, lambda: retrograd_train(
        *SMALL, "--steps", "2", "--optimizer", "sgd", "--resume", str(saved_small), "--save", str(saved_small)))
    _one_line_error(done, "was trained with --optimizer adam", "--optimizer adam")


def test_resume_of_an_older_file_infers_its_optimizer(tmp_path, saved_small):
    """Files saved before the run record: the optimizer is read from the state they hold."""
    older = tmp_path / "older.npz"
    np.savez(older, **{k: v for k, v in rg.read_params(saved_small).items() if k != "train.record"})
    done = retrograd_train(*SMALL, "--steps", "1", "--optimizer", "momentum", "--resume", str(older),
                           "--save", str(tmp_path / "new.npz"))
    _one_line_error(done, "was trained with --optimizer adam")


def test_resume_with_another_vocabulary_is_refused(tmp_path, saved_small):
    story, _ = _text_files(tmp_path)
    done = _unchanged_after(saved_small, lambda: retrograd_train(
        *SMALL, "--steps", "2", "--text", str(story), "--resume", str(saved_small), "--save", str(saved_small)))
    # issue 30: the file records its text; --text given again must name the same files
    _one_line_error(done, "it was trained on the built-in corpus, not on --text", "leave --text out")


def test_resumed_log_continues_from_the_checkpoint_step(tmp_path):
    """Issue 23: a run interrupted at step 8 with its checkpoint at step 6 logged steps 7-8, and the
    resumed run appended 7-8 again; now the log goes on from the checkpoint's step, once each."""
    path, log = tmp_path / "m.npz", tmp_path / "m.jsonl"
    done = retrograd_train(*SMALL, "--steps", "6", "--save", str(path), "--log", str(log))
    assert done.returncode == 0, done.stderr
    with open(log, "a", encoding="utf-8") as file:     # what the interrupted steps 7, 8 had logged
        file.write('{"step": 7, "loss": 9.0}\n{"step": 8, "loss": 9.0}\n{"step": 9, "lo')
    done = retrograd_train(*SMALL, "--steps", "4", "--resume", str(path), "--save", str(path),
                           "--log", str(log))
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 11))
    assert all(r["loss"] != 9.0 for r in records)


def test_optimizer_flags_train_or_name_what_is_missing(tmp_path):
    done = retrograd_train(*SMALL, "--steps", "3", "--optimizer", "momentum", "--lr", "0.05",
                           "--weight-decay", "0.01", "--log-every", "1", "--save", str(tmp_path / "m.npz"))
    assert done.returncode == 0, done.stderr
    assert "momentum lr 0.05" in done.stdout and len(_losses(done.stdout)) == 3
    stored = rg.read_params(tmp_path / "m.npz")
    assert any(k.endswith(".velocity") for k in stored)
    for name, cls in [("adamw", "AdamW"), ("rmsprop", "RMSProp"), ("adagrad", "Adagrad")]:
        done = retrograd_train(*SMALL, "--steps", "2", "--optimizer", name, "--save", str(tmp_path / "o.npz"))
        if hasattr(rg.optim, cls):
            assert done.returncode == 0, done.stderr
        else:
            _one_line_error(done, f"--optimizer {name} is not available yet", f"rg.optim.{cls}")


@pytest.mark.parametrize("flags, function", [(["--lr-schedule", "cosine", "--warmup", "2"], "cosine"),
                                             (["--lr-schedule", "step"], "step_decay"),
                                             (["--warmup", "2"], "linear_warmup")])
def test_lr_schedule_flags_train_or_name_what_is_missing(tmp_path, flags, function):
    done = retrograd_train(*SMALL, "--steps", "4", *flags, "--save", str(tmp_path / "m.npz"))
    if hasattr(getattr(rg.optim, "lr", None), function):
        assert done.returncode == 0, done.stderr
    else:
        _one_line_error(done, "is not available yet", f"rg.optim.lr.{function}")


@pytest.mark.parametrize("flags, fragment", [
    (["--lr-schedule", "step", "--warmup", "2"], "--warmup works with --lr-schedule constant or cosine"),
    (["--lr-schedule", "cosine", "--warmup", "4"], "--warmup 4 is not below the run's 4 steps"),
])
def test_lr_schedule_values_that_cannot_work_are_one_line(tmp_path, flags, fragment):
    _one_line_error(retrograd_train(*SMALL, "--steps", "4", *flags, "--save", str(tmp_path / "m.npz")),
                    fragment)


def test_check_finite_stops_at_the_op_that_made_nan(tmp_path, saved_small):
    done = _unchanged_after(saved_small, lambda: retrograd_train(
        *SMALL, "--steps", "3", "--lr", "1e38", "--check-finite", "--save", str(saved_small)))
    line = _one_line_error(done, "charlm.py:", "produced", "inputs:", "is unchanged")
    assert re.search(r"op #\d+ \w+ in block \d+ produced (NaN|Inf)", line), line


def test_transformer_trains_samples_past_its_window_and_resumes_as_one(tmp_path):
    path = tmp_path / "t.npz"
    done = retrograd_train("--model", "transformer", "--layers", "2", "--heads", "2", "--hidden", "16",
                           "--seq-len", "8", "--batch", "4", "--steps", "4", "--sample-len", "30",
                           "--save", str(path))
    assert done.returncode == 0, done.stderr
    sample = done.stdout.split("sample:\n", 1)[1].rstrip("\n")
    assert sample.startswith("def ") and len(sample) == 34          # 34 characters from 8 positions
    stored = rg.read_params(path)
    assert stored["pos.w"].shape == (8, 16) and "block1.ln1.w" in stored
    sampled = subprocess.run([sys.executable, "-m", "retrograd", "sample", str(path), "--length", "30"],
                             capture_output=True, text=True, timeout=120)
    assert sampled.returncode == 0, sampled.stderr
    assert sampled.stdout.rstrip("\n") == sample                    # the same program, the same seed
    again = retrograd_train("--model", "lstm", "--hidden", "16", "--seq-len", "8", "--batch", "4", "--steps", "2",
                            "--resume", str(path), "--save", str(tmp_path / "other.npz"))
    _one_line_error(again, "holds a transformer model")


def test_backend_auto_is_the_default_and_names_what_it_chose(tmp_path):
    """Issue 22: `--backend auto` (the default) takes the fastest installed backend and says which
    in the header; it is torch where installed, else the onnxruntime engine, else NumPy (the order
    measured in benchmarks/results/training-step.md)."""
    import importlib.util
    small = [a for a in SMALL if a not in ("--backend", "numpy")]
    done = retrograd_train(*small, "--steps", "2", "--no-plot", "--save", str(tmp_path / "m.npz"))
    assert done.returncode == 0, done.stderr
    have = [name for name, module in (("torch", "torch"), ("onnxruntime", "onnxruntime"))
            if importlib.util.find_spec(module) is not None]
    expected = have[0] if have else "numpy"
    assert f"backend {expected}" in done.stdout


def test_backend_auto_keeps_the_engine_out_of_a_recompute_budget():
    import argparse
    from retrograd.cli.train import choose_backend
    args = argparse.Namespace(backend="auto", device=None, graphs=False, recompute=200_000)
    assert choose_backend(args) in ("torch", "numpy")
    assert choose_backend(argparse.Namespace(backend="numpy", device=None, graphs=False, recompute=None)) == "numpy"


TRANSFORMER = ["--model", "transformer", "--layers", "2", "--heads", "2", "--hidden", "16", "--seq-len", "32",
               "--batch", "4", "--steps", "3", "--sample-len", "4", "--backend", "numpy", "--no-plot",
               "--log-every", "1"]


def _log_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_transformer_recompute_bytes_is_the_whole_step_budget(tmp_path):
    """Issue 24: `--recompute BYTES` bounds a transformer's whole training step (the
    memory_budget of minimize, at the run's [seq_len, batch] windows): the measured peak of
    every step is within it and the losses are store-all's; a budget below what fits is named
    in one line and the least budget that fits is used, within which the run then stays."""
    runs = {}
    for name, budget in (("store", "none"), ("budget", "450000"), ("least", "100K")):
        log = tmp_path / f"{name}.jsonl"
        done = retrograd_train(*TRANSFORMER, "--recompute", budget, "--log", str(log),
                               "--save", str(tmp_path / f"{name}.npz"))
        assert done.returncode == 0, done.stderr
        runs[name] = (done.stdout, _log_records(log))
    store_peak = runs["store"][1][0]["peak_bytes"]
    assert store_peak > 450_000                      # the budget is below storing everything
    assert all(r["peak_bytes"] <= 450_000 for r in runs["budget"][1])
    named = re.search(r"--recompute 102,400 bytes cannot hold one training step of the transformer at "
                      r"these sizes; using the least budget that fits, ([\d,]+) bytes", runs["least"][0])
    assert named is not None, runs["least"][0]
    least = int(named.group(1).replace(",", ""))
    assert 102_400 < least < store_peak
    assert all(r["peak_bytes"] <= least for r in runs["least"][1])
    for name in ("budget", "least"):
        np.testing.assert_allclose([r["loss"] for r in runs[name][1]], [r["loss"] for r in runs["store"][1]],
                                   rtol=1e-5)


# --- issue 30: the first ten minutes, safe and fast ----------------------------------------------

def test_header_names_the_thread_count(tmp_path):
    done = retrograd_train(*SMALL, "--steps", "1", "--threads", "2", "--no-plot",
                           "--save", str(tmp_path / "m.npz"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].endswith("backend numpy, 2 threads"), done.stdout.splitlines()[0]
    done = retrograd_train(*SMALL, "--steps", "1", "--no-plot", "--save", str(tmp_path / "m.npz"))
    assert done.stdout.splitlines()[0].endswith("backend numpy, 1 thread"), done.stdout.splitlines()[0]


@pytest.mark.parametrize("backend", ["numpy", "torch", "onnxruntime"])
def test_check_finite_passes_the_default_run_and_its_sampling(tmp_path, backend):
    """Issue 30: every `--check-finite` run failed at the sampler's top-k mask (a deliberate -inf)."""
    pytest.importorskip({"numpy": "numpy", "torch": "torch", "onnxruntime": "onnxruntime"}[backend])
    small = [a for a in SMALL if a not in ("--backend", "numpy")]
    done = retrograd_train(*small, "--backend", backend, "--steps", "2", "--check-finite", "--no-plot",
                           "--save", str(tmp_path / "m.npz"))
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split("sample:\n", 1)[1].rstrip("\n")) == 4 + 40


def test_check_finite_passes_the_transformer_with_its_causal_mask(tmp_path):
    done = retrograd_train("--model", "transformer", "--layers", "1", "--heads", "2", "--hidden", "16",
                           "--seq-len", "8", "--batch", "4", "--steps", "2", "--sample-len", "12",
                           "--backend", "numpy", "--check-finite", "--no-plot",
                           "--save", str(tmp_path / "t.npz"))
    assert done.returncode == 0, done.stderr


def test_a_run_without_save_never_replaces_a_model_it_did_not_make(tmp_path):
    """Issue 30: every run wrote retrograd-lstm.npz, replacing a 600-step model without a word."""
    first = retrograd_train(*SMALL, "--steps", "2", "--no-plot", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    kept = (tmp_path / "retrograd-lstm.npz").read_bytes()
    second = retrograd_train(*SMALL, "--steps", "1", "--no-plot", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert (tmp_path / "retrograd-lstm.npz").read_bytes() == kept
    assert ("retrograd-lstm.npz exists and this run did not make it; saving to retrograd-lstm-2.npz"
            in second.stdout.splitlines()[0])
    assert "saved parameters and optimizer state to retrograd-lstm-2.npz" in second.stdout
    assert rg.read_params(tmp_path / "retrograd-lstm-2.npz")["train.step"].tolist() == [1]
    third = retrograd_train(*SMALL, "--steps", "1", "--no-plot", "--overwrite", cwd=tmp_path)
    assert third.returncode == 0, third.stderr
    assert rg.read_params(tmp_path / "retrograd-lstm.npz")["train.step"].tolist() == [1]
    assert not (tmp_path / "retrograd-lstm-3.npz").exists()


def test_stale_temporary_files_of_the_model_are_removed_at_start(tmp_path):
    stale = tmp_path / ".m.npz.999999999.0badf00d.tmp"        # a killed save's, of a process long gone
    stale.write_bytes(b"\0" * 1024)
    other = tmp_path / ".other.npz.999999999.0badf00d.tmp"     # another file's: not ours to remove
    other.write_bytes(b"\0")
    done = retrograd_train(*SMALL, "--steps", "30", "--no-plot", "--save", str(tmp_path / "m.npz"),
                           "--log-every", "1")
    assert done.returncode == 0, done.stderr
    assert not stale.exists() and other.exists()


def test_resume_reads_the_options_from_the_file(tmp_path):
    """Issue 30: `--resume` made you repeat every option; now the file says them."""
    story, notes = _text_files(tmp_path)
    path = tmp_path / "m.npz"
    done = retrograd_train(*SMALL, "--hidden", "24", "--optimizer", "momentum", "--lr", "0.05",
                           "--text", str(story), str(notes), "--steps", "3", "--save", str(path))
    assert done.returncode == 0, done.stderr
    again = retrograd_train("--resume", str(path), "--steps", "2", "--sample-len", "5", "--no-plot",
                            "--backend", "numpy", "--log-every", "1")
    assert again.returncode == 0, again.stderr
    head = again.stdout.splitlines()[0]
    assert ("lstm, 1 x 24 hidden, momentum lr 0.05, batch 8 x 16 chars, 2 steps resuming "
            f"{path} at step 3, to step 5") in head, head
    assert sorted(_losses(again.stdout)) == [4, 5]
    assert rg.read_params(path)["train.step"].tolist() == [5]          # saved back into the file it loaded


def test_resume_option_given_again_must_agree_one_line(tmp_path, saved_small):
    done = _unchanged_after(saved_small, lambda: retrograd_train(
        "--resume", str(saved_small), "--hidden", "64", "--steps", "1"))
    line = _one_line_error(done, "cannot resume from", "--hidden 32, not 64", "leave --hidden out")
    assert len(line) < 250, line
    done = retrograd_train("--resume", str(saved_small), "--lr", "0.5", "--steps", "1")
    _one_line_error(done, "--lr 0.003, not 0.5")


def test_resume_steps_count_from_the_checkpoint_and_cosine_keeps_its_length(tmp_path, monkeypatch, capsys):
    """`--steps N` on a resume is N more steps; the cosine schedule is the first run's (read from
    the file), not stretched to the resumed run's end: an 8-step cosine run stopped after its
    step-4 checkpoint and resumed for 4 more steps equals the straight 8-step run."""
    from retrograd.cli.main import main
    straight, part = tmp_path / "straight.npz", tmp_path / "part.npz"
    cosine = ["--lr-schedule", "cosine", "--log-every", "1", "--no-plot"]
    done = retrograd_train(*SMALL, *cosine, "--steps", "8", "--save", str(straight))
    assert done.returncode == 0, done.stderr
    real_step = train.Job.run_step

    def ctrl_c_at_step_5(job, step):
        if step == 4:                   # (0-based: the fifth step)
            raise KeyboardInterrupt
        return real_step(job, step)
    monkeypatch.setattr(train.Job, "run_step", ctrl_c_at_step_5)
    assert main(["train", *SMALL, *cosine, "--steps", "8", "--save-every", "4", "--save", str(part)]) == 130
    monkeypatch.undo()
    assert rg.read_params(part)["train.step"].tolist() == [4]
    resumed = retrograd_train("--resume", str(part), "--steps", "4", "--backend", "numpy", "--no-plot",
                              "--sample-len", "5", "--log-every", "1")
    assert resumed.returncode == 0, resumed.stderr
    head = resumed.stdout.splitlines()[0]
    assert "4 steps resuming" in head and "to step 8; cosine schedule over steps 1-8" in head, head
    assert _losses(resumed.stdout) == {s: v for s, v in _losses(done.stdout).items() if s > 4}
    a, b = rg.read_params(part), rg.read_params(straight)
    assert sorted(a) == sorted(b)
    for name in b:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_text_takes_several_paths_after_one_flag_and_a_glob_matching_nothing_says_so(tmp_path):
    story, notes = _text_files(tmp_path)
    path = tmp_path / "m.npz"
    done = retrograd_train(*SMALL, "--steps", "1", "--no-plot", "--text", str(story), str(notes),
                           "--save", str(path))
    assert done.returncode == 0, done.stderr
    assert f"{story} ({len(STORY):,} characters), {notes}" in done.stdout
    _one_line_error(retrograd_train(*SMALL, "--steps", "1", "--text", str(tmp_path / "none" / "*.txt"),
                                    "--save", str(path)), "*.txt: no file matches")
    _one_line_error(retrograd_train(*SMALL, "--steps", "1", "--text", str(tmp_path / "absent.txt"),
                                    "--save", str(path)), "absent.txt: no such file")


def test_train_saves_its_program_for_show_and_graph(tmp_path, saved_small):
    shown = subprocess.run([sys.executable, "-m", "retrograd", "show", str(saved_small)], capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "param lstm0.w_hh: float32[32, 128]" in shown.stdout and "Adam" in shown.stdout
    dot = tmp_path / "g.dot"
    drawn = subprocess.run([sys.executable, "-m", "retrograd", "graph", str(saved_small), "-o", str(dot)],
                           capture_output=True, text=True, timeout=120)
    assert drawn.returncode == 0, drawn.stderr
    assert dot.read_text().startswith("digraph program {")
