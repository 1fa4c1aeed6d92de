"""The README's Attention and transformer layers example runs as printed."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

README = "\n".join(p.read_text() for p in sorted((Path(__file__).resolve().parents[2] / "docs").rglob("*.md")))   # docs/ (moved from the README)


def test_readme_attention_example_runs_and_its_test_program_is_deterministic():
    block = next(b for b in re.findall(r"```python\n(.*?)```", README, re.S)
                 if "rg.layers.transformer_block(h" in b)
    env: dict = {"__name__": "readme"}
    exec(compile(block, "README.md", "exec"), env)
    assert np.isfinite(env["loss_v"])
    exe, test_program, feed = env["exe"], env["test_program"], env["feed"]
    first, = exe.run(test_program, feed=feed, fetch_list=[env["loss"]])
    second, = exe.run(test_program, feed=feed, fetch_list=[env["loss"]])
    assert first == second                          # no dropout, no parameter update
