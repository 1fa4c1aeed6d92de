"""The "Ops" page's first example (docs/concepts/ops.md) builds and runs as written."""
from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import numpy as np


def _example() -> str:
    page = (Path(__file__).resolve().parents[2] / "docs" / "concepts" / "ops.md").read_text()
    return re.search(r"```python\n(.*?)```", page, re.S).group(1)


def test_op_reference_example_runs():
    ns: dict = {"__name__": "docs"}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(_example(), "docs/concepts/ops.md", "exec"), ns)
    exe, main, feed = ns["exe"], ns["main"], ns["feed"]
    names = ["h", "best", "top", "ids", "log_z", "noise", "next_char"]
    got = dict(zip(names, exe.run(main, feed=feed, fetch_list=[ns[n] for n in names])))
    np.testing.assert_allclose(got["best"], feed["scores"].max(1))
    np.testing.assert_array_equal(got["ids"], np.argsort(-feed["logits"], 1, kind="stable")[:, :5])
    assert got["h"].shape == got["noise"].shape == (4, 64)
    assert got["next_char"].shape == (4,) and got["next_char"].max() < 10
