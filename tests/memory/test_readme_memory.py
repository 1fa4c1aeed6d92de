"""The README's Memory example runs, and its checkpoints hold less than storing everything."""
from __future__ import annotations

import contextlib
import io
import pathlib
import re

import numpy as np

import retrograd as rg

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def _memory_example() -> str:
    text = README.read_text()
    section = text[text.index("## Memory\n"):]
    section = section[:section.index("\n## ", 5)]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_memory_example_runs_and_saves_memory():
    scope: dict = {}
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        exec(compile(_memory_example(), "README.md (Memory)", "exec"), scope)
    assert "recomputed" in printed.getvalue()
    exe, main = scope["exe"], scope["main"]
    assert any("recompute_of" in op.attrs for op in main.global_block().ops)
    peak = exe.last_stats.peak_bytes
    # The same model storing every activation, run on the same input.
    plain, startup = rg.Program(), rg.Program()
    with rg.program_guard(plain, startup):
        h = rg.data("x", [-1, 256])
        for i in range(32):
            h = rg.layers.fc(h, 256, act="tanh", name=f"fc{i}")
        loss = rg.mean(h * h)
        grads = [g for _, g in rg.append_backward(loss)]
    other = rg.Executor()
    other.run(startup)
    out = other.run(plain, feed={"x": scope["xb"]}, fetch_list=[loss] + grads)
    assert peak < 0.75 * other.last_stats.peak_bytes
    mine = exe.run(main, feed={"x": scope["xb"]}, fetch_list=[scope["loss"]] + [g for _, g in scope["params_grads"]])
    for a, b in zip(mine, out):
        np.testing.assert_array_equal(a, b)
