"""The loss curve as an image (PNG, SVG, PDF), for ``retrograd train --plot-file``.

Needs matplotlib, the optional extra ``retrograd[plot]``; the text curve of
``termplot.py`` needs nothing.

Example::

    save_loss_curve("loss.png", [4.5, 3.9, 3.1, 2.6], held_out={4: 2.8})
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

INSTALL_HINT = 'pip install "retrograd[plot]"'
FORMATS = (".png", ".svg", ".pdf")


def available() -> bool:
    """Whether matplotlib can be imported (without importing it)."""
    return importlib.util.find_spec("matplotlib") is not None


def save_loss_curve(path: str | Path, losses: list[float], held_out: dict[int, float] | None = None,
                    first_step: int = 1) -> Path:
    """Draw the training loss per step (and held-out losses as points) into ``path``."""
    import matplotlib
    matplotlib.use("Agg")           # files only: no display needed
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4), dpi=120)
    try:
        steps = range(first_step, first_step + len(losses))
        axes.plot(steps, losses, linewidth=0.8, label="training loss")
        if held_out:
            axes.plot(list(held_out), list(held_out.values()), "o-", markersize=3, label="held-out loss")
        axes.set_xlabel("step")
        axes.set_ylabel("loss (nats per character)")
        axes.grid(alpha=0.3)
        axes.legend()
        figure.tight_layout()
        figure.savefig(path)
    finally:
        plt.close(figure)
    return Path(path)
