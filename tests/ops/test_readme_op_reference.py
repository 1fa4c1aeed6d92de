"""The README's "Op reference" example builds and runs as written."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

import retrograd as rg


def _example() -> str:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Op reference", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_op_reference_example_runs():
    main, startup = rg.Program(random_seed=1), rg.Program()
    with rg.program_guard(main, startup):
        ns = {"rg": rg, "x": rg.data("x", [-1, 8]), "scores": rg.data("scores", [-1, 6]),
              "logits": rg.data("logits", [-1, 10])}
        exec(compile(_example(), "README.md", "exec"), ns)
    exe = rg.Executor()
    exe.run(startup)
    r = np.random.default_rng(0)
    feed = {"x": r.standard_normal((4, 8), dtype="float32"), "scores": r.standard_normal((4, 6), dtype="float32"),
            "logits": r.standard_normal((4, 10), dtype="float32")}
    names = ["h", "best", "top", "ids", "log_z", "noise", "next_char"]
    got = dict(zip(names, exe.run(main, feed=feed, fetch_list=[ns[n] for n in names])))
    np.testing.assert_allclose(got["best"], feed["scores"].max(1))
    np.testing.assert_array_equal(got["ids"], np.argsort(-feed["logits"], 1, kind="stable")[:, :5])
    assert got["h"].shape == got["noise"].shape == (4, 64)
    assert got["next_char"].shape == (4,) and got["next_char"].max() < 10
