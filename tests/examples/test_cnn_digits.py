"""examples/cnn_digits.py: a short run reaches the README's held-out accuracy (>= 97%)."""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

pytest.importorskip("sklearn", reason="examples/cnn_digits.py needs scikit-learn (pip install 'retrograd[examples]')")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cnn_digits.py"


def _load():
    spec = importlib.util.spec_from_file_location("example_cnn_digits", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cnn_digits_reaches_97_percent_held_out():
    result = _load().main(steps=250, log_every=0)
    assert result["test_accuracy"] >= 0.97, result


def test_held_out_images_are_not_trained_on():
    x_train, y_train, x_test, y_test = _load().load_split(seed=0)
    assert len(y_train) + len(y_test) == 1797 and len(y_test) == 359
    train_rows = {row.tobytes() for row in x_train}
    overlap = sum(row.tobytes() in train_rows for row in x_test)
    assert overlap < 0.05 * len(y_test)          # only the dataset's own duplicate images


def test_cnn_digits_trains_on_the_torch_backend():
    pytest.importorskip("torch")
    result = _load().main(steps=20, log_every=0, backend="torch")
    assert math.isfinite(result["loss"]) and result["test_accuracy"] > 0.5
