"""keep_freed_memory: after Executor(), a step's freed arrays are reused without page faults (glibc)."""
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="tunes glibc's malloc only")

# 20 runs of a program whose step allocates and frees arrays of 4 MiB: page faults counted by the OS
SCRIPT = """
import resource, sys
import numpy as np
import retrograd as rg
from retrograd.runtime import malloc
main, startup = rg.Program(), rg.Program()
with rg.program_guard(main, startup):
    x = rg.data("x", [-1, 1024], "float32")
    y = rg.mean(rg.tanh(x * 2.0) + x)
exe = rg.Executor()
xb = np.ones((1024, 1024), np.float32)
exe.run(main, feed={"x": xb}, fetch_list=[y])
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    exe.run(main, feed={"x": xb}, fetch_list=[y])
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20
print(malloc.keep_freed_memory(), faults)
"""


def _run(**env) -> tuple[bool, float]:
    clean = {k: v for k, v in os.environ.items() if k not in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                                                             "GLIBC_TUNABLES", "RETROGRAD_MALLOC")}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env={**clean, **env}, capture_output=True, text=True,
                         check=True).stdout.split()
    return out[0] == "True", float(out[1])


def test_freed_step_arrays_are_reused_without_page_faults():
    tuned, faults = _run()
    default, default_faults = _run(RETROGRAD_MALLOC="default")
    assert tuned and not default
    # untuned: the 4 MiB temporaries come back as fresh pages (~1,500 faults per run here);
    # tuned: reused heap memory
    assert default_faults > 500
    assert faults < 50


def test_the_users_own_malloc_settings_win():
    tuned, _ = _run(MALLOC_TRIM_THRESHOLD_="1000000")
    assert not tuned
