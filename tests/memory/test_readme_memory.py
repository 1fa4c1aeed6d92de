"""The README's Memory example runs, and its checkpoints hold less than storing everything."""
from __future__ import annotations

import contextlib
import io
import pathlib
import re

import numpy as np

import retrograd as rg

README = pathlib.Path(__file__).resolve().parents[2] / "docs" / "concepts" / "memory.md"


def _memory_example() -> str:
    return re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)   # the page's first


def test_readme_memory_example_runs_within_its_budget():
    scope: dict = {}
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        exec(compile(_memory_example(), "README.md (Memory)", "exec"), scope)
    assert f"against a budget of {24 << 20:,} B" in printed.getvalue()
    exe, main = scope["exe"], scope["main"]
    assert any("recompute_of" in op.attrs for op in main.global_block().ops)
    peak = exe.last_stats.peak_bytes
    assert peak <= 24 << 20
    # The same training step storing every activation, from the same parameters.
    plain, startup = rg.Program(), rg.Program()
    with rg.program_guard(plain, startup):
        h = rg.data("x", [-1, 256])
        for i in range(32):
            h = rg.layers.fc(h, 256, act="tanh", name=f"fc{i}")
        loss = rg.mean(h * h)
        rg.optim.SGD(0.1).minimize(loss)
    other = rg.Executor()
    for var in plain.all_parameters():
        other.scope.set(var.name, np.array(exe.scope.get(var.name)))
    mine = exe.run(main, feed={"x": scope["xb"]}, fetch_list=[scope["loss"]])
    ref = other.run(plain, feed={"x": scope["xb"]}, fetch_list=[loss])
    assert peak < 0.6 * other.last_stats.peak_bytes
    np.testing.assert_array_equal(mine[0], ref[0])
    for var in plain.all_parameters():         # the same update
        np.testing.assert_array_equal(exe.scope.get(var.name), other.scope.get(var.name))
