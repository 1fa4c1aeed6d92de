"""The `retrograd` command: the main paths as a user runs them (`python -m retrograd` in a
subprocess), error cases through `retrograd.cli.main.main` in this process (same output, faster)."""
from __future__ import annotations

import contextlib
import io
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import retrograd as rg
from retrograd.ir.program import Op, Program


def retrograd(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "retrograd", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=120)


def in_process(*args: str) -> subprocess.CompletedProcess:
    """The same command run by ``retrograd.cli.main.main`` in this process: faster, same output."""
    from retrograd.cli.main import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:   # argparse's usage errors and --help
            code = exc.code
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def _assert_one_line_error(done: subprocess.CompletedProcess, *fragments: str) -> None:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, Program]:
    main, startup = Program(), Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 8])
        w = rg.create_parameter("fc1.w", [8, 16])
        loss = rg.mean(rg.tanh(rg.matmul(x, w)))
        rg.append_backward(loss)
    path = tmp_path / "model.json"
    path.write_text(main.to_json())
    return path, main


def test_help_lists_the_commands():
    done = retrograd("--help")
    assert done.returncode == 0
    for command in ("train", "show", "graph"):
        assert command in done.stdout


def test_unknown_option_is_a_usage_error(capsys):
    done = retrograd("--frobnicate")
    assert done.returncode == 2
    assert "usage:" in done.stderr and "--frobnicate" in done.stderr and "Traceback" not in done.stderr
    from retrograd.cli.main import main
    for args in (["show", "x.json", "--frobnicate"], ["graph"], ["graph", "a.json", "-o"]):
        with pytest.raises(SystemExit) as info:
            main(args)
        assert info.value.code == 2
        assert "usage:" in capsys.readouterr().err


def test_show_prints_the_saved_program(saved):
    path, main = saved
    done = retrograd("show", str(path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip("\n") == str(main)
    assert "fc1.w.grad: float32[8, 16] = MatMul(" in done.stdout


def test_show_of_a_missing_file(tmp_path):
    _assert_one_line_error(in_process("show", str(tmp_path / "nope.json")), "nope.json", "no such file")


@pytest.mark.parametrize("text, fragment", [
    ("{", "malformed"),
    ('{"format": "retrograd.program", "version": 1}', "missing field"),
    ("\xff\xfe not text", ""),
])
def test_show_of_a_bad_file(tmp_path, text, fragment):
    path = tmp_path / "bad.json"
    path.write_bytes(text.encode("latin-1"))
    run = retrograd if fragment == "malformed" else in_process   # one real process is enough
    _assert_one_line_error(run("show", str(path)), "bad.json", fragment)


def test_show_of_a_program_the_verifier_rejects(tmp_path):
    program = Program()
    g = program.global_block()
    g.create_var("x", [2], is_data=True)
    g.create_var("y", [2])
    g.append_op(Op("Teleport", ["x"], ["y"]))
    path = tmp_path / "bad.json"
    path.write_text(program.to_json())
    _assert_one_line_error(in_process("show", str(path)), "op #0 Teleport", "not registered")


def test_graph_writes_dot(saved, tmp_path):
    path, main = saved
    out = tmp_path / "model.dot"
    done = retrograd("graph", str(path), "-o", str(out))
    assert done.returncode == 0, done.stderr
    dot = out.read_text()
    assert dot.startswith("digraph program {") and dot.rstrip().endswith("}")
    assert dot.count("{") == dot.count("}")
    for op in main.global_block().ops:
        assert f'label="{op.type}"' in dot
    assert '"b0:fc1.w" -> "b0.op0";' in dot
    assert in_process("graph", str(path)).stdout == dot   # no -o: DOT on stdout


def test_graph_nests_sub_blocks_in_clusters(tmp_path, call_block):
    from retrograd.cli.main import program_to_dot
    program = Program()
    g = program.global_block()
    g.create_var("x", [2], is_data=True)
    g.create_var("y", [2])
    body = program.create_block(g)
    body.create_var("a", [2])
    body.create_var("b", [2])
    body.append_op(Op("Exp", ["a"], ["b"]))
    g.append_op(Op("CallBlock", ["x"], ["y"], {"body": body, "binds": ["a"], "results": ["b"]}))
    dot = program_to_dot(program)
    assert "subgraph cluster_b1 {" in dot
    assert '"b0.op0" -> "b1.anchor"' in dot and '"b1:a" -> "b1.op0";' in dot


def test_graph_to_an_image(saved, tmp_path):
    path, _ = saved
    out = tmp_path / "model.svg"
    done = in_process("graph", str(path), "-o", str(out))
    if shutil.which("dot") is None:
        _assert_one_line_error(done, "dot", "model.dot")
    else:
        assert done.returncode == 0, done.stderr
        assert "<svg" in out.read_text()


def test_graph_with_an_unknown_output_type(saved, tmp_path):
    path, _ = saved
    _assert_one_line_error(in_process("graph", str(path), "-o", str(tmp_path / "g.xyz")), ".xyz")


def test_train_is_a_command_with_its_own_help():
    # The job itself is tested in tests/test_train_cli.py; here only that the command is wired.
    done = retrograd("train", "--help")
    assert done.returncode == 0, done.stderr
    assert "usage: retrograd train" in done.stdout


def test_quickstart_example_trains(capsys):
    example = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"
    final_loss = runpy.run_path(str(example), run_name="quickstart")["main"](steps=100)
    losses = [float(line.split("loss")[1]) for line in capsys.readouterr().out.splitlines()
              if line.startswith("step")]
    assert losses[-1] == pytest.approx(final_loss, abs=1e-4) and final_loss < losses[0] / 2


def test_readme_example_runs(capsys):
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert blocks, "README has no python example"
    exec(compile(blocks[0], "README.md", "exec"), {"__name__": "readme"})
    assert "block 0:" in capsys.readouterr().out


def test_main_is_callable_in_process(saved, capsys):
    from retrograd.cli.main import main
    path, program = saved
    assert main(["show", str(path)]) == 0
    assert capsys.readouterr().out.rstrip("\n") == str(program)


def test_show_locations_names_the_line_that_built_each_op(saved):
    path, _ = saved
    done = in_process("show", "--locations", str(path))
    assert done.returncode == 0, done.stderr
    matmul = next(line for line in done.stdout.splitlines() if "= MatMul(x, fc1.w)" in line)
    assert re.search(r"# .*test_cli\.py:\d+$", matmul), matmul
    assert "test_cli.py" not in in_process("show", str(path)).stdout


def test_broken_pipe_ends_quietly(tmp_path):
    """`retrograd show big.json | head -1`: no traceback, no error line, status 0."""
    main = Program()
    with rg.program_guard(main, Program()):
        x = rg.data("x", [-1, 8])
        for _ in range(3000):            # far more text than a pipe buffers
            x = rg.tanh(x)
    path = tmp_path / "big.json"
    path.write_text(main.to_json())
    proc = subprocess.Popen([sys.executable, "-m", "retrograd", "show", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"block 0:\n"
    proc.stdout.close()                  # what `head` does once it has its lines
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and err == ""


# --- issue 30 ------------------------------------------------------------------------------------

def test_argparse_errors_print_the_message_first_then_a_help_hint():
    done = retrograd("train", "--hiden", "32")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines[0] == "retrograd train: error: unrecognized arguments: --hiden 32", done.stderr
    assert len(lines) == 2 and "retrograd train --help" in lines[1], done.stderr
    done = in_process("train", "--steps", "ten")
    assert done.returncode == 2
    assert done.stderr.splitlines()[0] == "retrograd train: error: argument --steps: 'ten' is not an integer"


def test_show_and_graph_accept_a_model_file_holding_its_program(tmp_path):
    main, startup = Program(), Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 4])
        w = rg.create_parameter("w", [4, 2])
        loss = rg.mean(rg.tanh(x @ w))
        rg.optim.SGD(0.1).minimize(loss)
    exe = rg.Executor()
    exe.run(startup)
    path = tmp_path / "m.npz"
    rg.save_params(exe.scope, path, main, with_program=True)
    done = in_process("show", str(path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == main.to_string().strip()
    assert sorted(rg.read_params(path)) == ["w"]              # the program is not a parameter
    dot = in_process("graph", str(path))
    assert dot.returncode == 0 and dot.stdout.startswith("digraph program {") and '"b0:w"' in dot.stdout
    bare = tmp_path / "bare.npz"
    rg.save_params(exe.scope, bare, main)
    _assert_one_line_error(in_process("show", str(bare)), "bare.npz", "without a program")


def test_ctrl_c_during_start_up_is_one_line(monkeypatch):
    from retrograd.cli import train

    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(train, "read_params", interrupted)
    done = in_process("train", "--resume", "m.npz")
    assert done.returncode == 130
    assert done.stderr.strip() == "retrograd train: interrupted", done.stderr
