"""Every code block of README.md and docs/**/*.md runs as written, and the site builds.

* A ```python block runs in a fresh namespace; one whose first line is ``# continues`` runs in
  the namespace of the page's previous Python block. A ``# requires: X, Y`` line among the first
  two skips the block, with the reason, when X is missing (a module name, or ``cuda``:
  ``torch.cuda.is_available()``, or ``mpiexec`` on the PATH).
* A ```text block right after a Python block is the output it prints: it is compared line by
  line (trailing spaces ignored).
* A ```bash block whose commands all start with ``retrograd `` runs each command through
  ``retrograd.cli.main`` (the ``retrograd`` script's entry point) in this process, unless its
  first line is ``# not run in CI: <why>`` (it then skips with that reason); other shell
  blocks (``pip install``, ``mpiexec``, ``mkdocs``) are not run here.
* The blocks of one page run in order in one temporary directory (a page may write a file that
  a later block reads), each under a time limit.
* ``mkdocs build --strict`` builds the site into a temporary directory when mkdocs is installed.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK_SECONDS = 120         # one block's limit: a hung block fails; the slowest takes ~10 s on a loaded 2-core machine
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[ \t]*$")


@dataclass
class Block:
    page: Path
    line: int               # 1-based line of the opening fence
    lang: str
    code: str
    output: str | None = None   # the ```text block that follows a python block
    index: int = 0          # position among the page's runnable blocks

    @property
    def id(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page
        return f"{page}:{self.line}"

    def header(self) -> list[str]:
        return [ln.strip() for ln in self.code.splitlines()[:2]]


def parse_blocks(page: Path) -> list[Block]:
    """The fenced blocks of one Markdown page, with their indentation removed."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or not m["lang"]:
            i += 1
            continue
        indent, body, j = len(m["indent"]), [], i + 1
        while j < len(lines) and lines[j].strip() != "```":
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        blocks.append(Block(page, i + 1, m["lang"], "\n".join(body) + "\n"))
        i = j + 1
    return blocks


def runnable(page: Path) -> list[Block]:
    """Python blocks (with the text block that follows, if any) and ``retrograd`` shell blocks."""
    out: list[Block] = []
    blocks = parse_blocks(page)
    for k, b in enumerate(blocks):
        if b.lang == "python":
            nxt = blocks[k + 1] if k + 1 < len(blocks) else None
            if nxt is not None and nxt.lang == "text":
                b.output = nxt.code
            out.append(b)
        elif b.lang in ("bash", "sh", "console") and _retrograd_commands(b) is not None:
            out.append(b)
    for n, b in enumerate(out):
        b.index = n
    return out


def _retrograd_commands(block: Block) -> list[list[str]] | None:
    """The argument lists of a shell block whose every command is ``retrograd ...``, else None."""
    commands = []
    for line in block.code.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if words[0] != "retrograd":
            return None
        commands.append(words[1:])
    return commands or None


def _missing(block: Block) -> str | None:
    """Why a block cannot run here (its ``# requires:`` line), or None."""
    for line in block.header():
        if line.startswith("# not run in CI:"):
            return line[2:]
        if not line.startswith("# requires:"):
            continue
        for need in (w.strip() for w in line.split(":", 1)[1].split(",")):
            if need == "cuda":
                torch_ok = importlib.util.find_spec("torch") is not None
                if not torch_ok or not __import__("torch").cuda.is_available():
                    return "needs a CUDA device (torch.cuda.is_available())"
            elif need == "mpiexec":
                if shutil.which("mpiexec") is None:
                    return "needs mpiexec on the PATH"
            elif importlib.util.find_spec(need) is None:
                return f"needs {need}"
    return None


@dataclass
class PageRun:
    """The state of one page's run: its directory, each block's outcome, the last namespace."""
    tmp: Path
    done: dict[int, tuple[str, str]] = field(default_factory=dict)   # index -> (status, detail)
    namespaces: dict[int, dict] = field(default_factory=dict)


_RUNS: dict[Path, PageRun] = {}


class BlockTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise BlockTimeout(f"the block ran longer than {BLOCK_SECONDS} s")


def _run_python(block: Block, run: PageRun) -> tuple[str, str]:
    continues = block.header()[:1] == ["# continues"]
    if continues:
        prev = block.index - 1
        if prev not in run.namespaces:
            return "skip", f"continues block {prev}, which did not run: {run.done.get(prev)}"
        namespace = run.namespaces[prev]
    else:
        namespace = {"__name__": "__docs__"}
    out = io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(BLOCK_SECONDS)
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(block.code, block.id, "exec"), namespace)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    run.namespaces[block.index] = namespace
    if block.output is not None:
        got = [ln.rstrip() for ln in out.getvalue().rstrip().splitlines()]
        want = [ln.rstrip() for ln in block.output.rstrip().splitlines()]
        if got != want:
            return "fail", ("printed output differs from the page's text block:\n--- page\n"
                            + "\n".join(want) + "\n--- printed\n" + "\n".join(got))
    return "ok", ""


def _run_shell(block: Block, run: PageRun) -> tuple[str, str]:
    """Each ``retrograd ...`` command through ``retrograd.cli.main`` in this process (what the
    installed ``retrograd`` script calls), with the block's time limit."""
    from retrograd.cli import main
    for args in _retrograd_commands(block):
        out = io.StringIO()
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(2 * BLOCK_SECONDS)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                status = main(args)
        except SystemExit as e:
            status = e.code
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
        if status not in (0, None):
            return "fail", f"retrograd {shlex.join(args)} exited {status}:\n{out.getvalue()[-3000:]}"
    return "ok", ""


def _run_upto(block: Block, tmp_root: Path) -> tuple[str, str]:
    """Run the page's blocks in order up to ``block`` (each once per test session)."""
    run = _RUNS.get(block.page)
    if run is None:
        run = _RUNS[block.page] = PageRun(Path(tempfile.mkdtemp(dir=tmp_root)))
    for b in runnable(block.page)[: block.index + 1]:
        if b.index in run.done:
            continue
        reason = _missing(b)
        if reason is not None:
            run.done[b.index] = ("skip", reason)
            continue
        cwd = os.getcwd()
        os.chdir(run.tmp)
        try:
            run.done[b.index] = _run_python(b, run) if b.lang == "python" else _run_shell(b, run)
        except BaseException as e:   # the block's own error is the test's failure  # noqa: BLE001
            if isinstance(e, KeyboardInterrupt):
                raise
            run.done[b.index] = ("fail", f"{type(e).__name__}: {e}")
        finally:
            os.chdir(cwd)
    return run.done[block.index]


ALL_BLOCKS = [b for page in PAGES for b in runnable(page)]


@pytest.fixture(scope="session")
def pages_tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("docs-pages")


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=[b.id for b in ALL_BLOCKS])
def test_block_runs(block, pages_tmp):
    status, detail = _run_upto(block, pages_tmp)
    if status == "skip":
        pytest.skip(detail)
    assert status == "ok", f"{block.id}: {detail}"


def test_every_python_block_is_collected():
    """Each ```python fence of the pages is one test (a fence the parser missed would go unrun)."""
    fences = sum(len(re.findall(r"^[ \t]*```python[ \t]*$", p.read_text(encoding="utf-8"), re.M))
                 for p in PAGES)
    assert fences == sum(b.lang == "python" for b in ALL_BLOCKS) > 0


def test_site_builds_strict(tmp_path):
    """``mkdocs build --strict`` (the [docs] extra): no warning, every page and docstring renders."""
    pytest.importorskip("mkdocs", reason='building the site needs mkdocs: pip install -e ".[docs]"')
    pytest.importorskip("mkdocstrings", reason='the API pages need mkdocstrings: pip install -e ".[docs]"')
    pytest.importorskip("material", reason='the theme needs mkdocs-material: pip install -e ".[docs]"')
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                           "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "layers" / "index.html").is_file()


def test_every_public_name_has_an_api_reference_entry():
    """Each function and class of ``rg.__all__`` and each public subpackage is rendered by a
    ``::: retrograd.<name>`` line of docs/reference/ (a new op needs a line on its family's page)."""
    import types

    import retrograd as rg
    text = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "docs" / "reference").glob("*.md"))
    entries = set(re.findall(r"^::: retrograd\.([\w.]+)", text, re.M))
    missing = [n for n in rg.__all__ if n not in entries
               and (isinstance(getattr(rg, n), (type, types.FunctionType, types.ModuleType)) or callable(getattr(rg, n)))]
    assert not missing, f"public names without an API reference entry (add `::: retrograd.<name>` to a page of docs/reference/): {missing}"


def test_readme_links_point_at_files():
    """The README's relative links (the docs pages, examples) name files of the repository."""
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text(encoding="utf-8"))
    assert links, "the README links to no page"
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_the_collector_continues_skips_and_checks_output(tmp_path):
    """The rules above on a page of its own: `# continues` shares the namespace, a wrong text
    block fails, `# requires:` skips with the reason, a failing `retrograd` command fails."""
    page = tmp_path / "page.md"
    page.write_text("\n".join([
        "```python", "a = 20", "print(a + 1)", "```", "", "```text", "21", "```", "",
        "```python", "# continues", "print(a * 2)", "```", "", "```text", "41", "```", "",
        "```python", "# requires: no_such_module_for_docs", "import no_such_module_for_docs", "```", "",
        "```bash", "retrograd show no-such-file.json", "```", "",
        "```bash", "pip install nothing-runs-here", "```", ""]), encoding="utf-8")
    blocks = runnable(page)
    assert [b.lang for b in blocks] == ["python", "python", "python", "bash"]
    outcomes = [_run_upto(b, tmp_path) for b in blocks]
    assert outcomes[0] == ("ok", "")
    assert outcomes[1][0] == "fail" and "--- printed\n40" in outcomes[1][1]
    assert outcomes[2] == ("skip", "needs no_such_module_for_docs")
    assert outcomes[3][0] == "fail" and "no-such-file.json" in outcomes[3][1]
