"""A loss curve drawn with text, for the end of ``retrograd train`` (no plotting library needed).

Example::

    print(loss_curve([4.5, 3.9, 3.1, 2.6, 2.2], held_out={5: 2.4}))
"""
from __future__ import annotations

import math

WIDTH, HEIGHT = 60, 10


def loss_curve(losses: list[float], held_out: dict[int, float] | None = None, first_step: int = 1,
               width: int = WIDTH, height: int = HEIGHT) -> str:
    """Training loss per step as ``*`` (the mean of the steps each column covers) and held-out
    losses (``{step: loss}``) as ``o``, over a loss axis and a step axis.
    """
    held_out = held_out or {}
    if not losses:
        return ""
    width = min(width, len(losses))
    columns = [_column_mean(losses, c, width) for c in range(width)]
    values = columns + list(held_out.values())
    low, high = min(values), max(values)
    if high - low < 1e-9:
        high = low + 1.0
    grid = [[" "] * width for _ in range(height)]
    for c, value in enumerate(columns):
        grid[_row(value, low, high, height)][c] = "*"
    last_step = first_step + len(losses) - 1
    for step, value in held_out.items():
        c = round((step - first_step) / max(1, last_step - first_step) * (width - 1))
        grid[_row(value, low, high, height)][min(max(c, 0), width - 1)] = "o"
    labels = [f"{high:7.3f} |", *([" " * 7 + " |"] * (height - 2)), f"{low:7.3f} |"]
    lines = [label + "".join(row).rstrip() for label, row in zip(labels, grid)]
    lines.append(" " * 8 + "+" + "-" * width)
    left, right = f"step {first_step}", f"{last_step}"
    lines.append(" " * 9 + left + right.rjust(max(len(right) + 1, width - len(left))))
    legend = "* training loss (mean per column)" + ("   o held-out loss" if held_out else "")
    return "\n".join(lines + [" " * 9 + legend])


def _column_mean(losses: list[float], column: int, width: int) -> float:
    start = column * len(losses) // width
    end = max(start + 1, (column + 1) * len(losses) // width)
    part = losses[start:end]
    return math.fsum(part) / len(part)


def _row(value: float, low: float, high: float, height: int) -> int:
    """Grid row of ``value``: row 0 is the top (``high``)."""
    return height - 1 - round((value - low) / (high - low) * (height - 1))
