"""GPU benchmark and check (issue 22): retrograd on torch CUDA, eager and as CUDA graphs, beside PyTorch.

One run, one process, medians over rounds in which the implementations
alternate (the order reversed every other round); ratios are medians of
per-round ratios. Measured:

a. **LSTM forward + backward** (and **GRU**, ``layers.gru(..., fused=True)`` against
   ``torch.nn.GRU``, at the first two sizes) at (T, N, H) = (50, 32, 128), (50, 64, 512),
   (1000, 16, 256) (``benchmarks/rnn.py``'s sizes, D = H, float32, loss
   ``sum(h_all)``, gradients of x and every parameter): retrograd
   ``layers.lstm(..., fused=True)`` (one ``LSTMSequence`` op: cuDNN) on
   ``Executor(backend="torch", device="cuda")`` eagerly and with
   ``graphs=True``, against ``torch.nn.LSTM`` (cuDNN) with autograd and the same
   function through ``torch.compile`` (dynamo leaves ``nn.LSTM`` to eager: a
   graph break, so that row shows what compile adds around it). Results are
   checked against ``torch.nn.LSTM`` first, and the cuDNN kernel is checked to
   be the one that ran.
b. **Training steps**: the default ``retrograd train`` LSTM step (as
   ``retrograd train --backend torch --device cuda`` builds it: the LSTM fused)
   and the transformer of ``examples/gpt_chars.py``: retrograd eager and
   ``graphs=True`` against PyTorch eager and ``torch.compile`` (builders from
   ``benchmarks/backends.py`` and ``benchmarks/train_transformer.py``);
   steps/s and ratios. A graph that was not replayed says why.

float32 runs at IEEE precision everywhere (TF32 off for cuBLAS and cuDNN)
unless ``--tf32``. ``torch.compile`` is skipped (with the reason) when it
fails or takes longer than ``--compile-limit`` seconds, and when the run is
past its ``--budget`` (seconds).

Run::

    python benchmarks/gpu.py --out gpu.md               # the full run (about 4 min on an H100)
    python benchmarks/gpu.py --quick --out gpu.md       # about 1 min: one LSTM size, no torch.compile
    python benchmarks/gpu.py --device cpu --quick       # smoke run of the script without a GPU
"""
from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import sys
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import backends as bk  # noqa: E402  (puts the repository on sys.path; one thread for BLAS)
import numpy as np  # noqa: E402

from retrograd.models import charlm  # noqa: E402
from retrograd.backends import torch_cudnn_rnn, torch_fused_rnn  # noqa: E402

CONFIGS = [(50, 32, 128), (50, 64, 512), (1000, 16, 256)]
QUICK_CONFIGS = [(50, 32, 128)]
EAGER, GRAPHS = "retrograd eager", "retrograd graphs"
NN, COMPILED = "torch.nn.LSTM (autograd)", "torch.compile"
PT_EAGER, PT_COMPILED = "PyTorch eager", "PyTorch torch.compile"


def say(*parts) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *parts, flush=True)


class Run:
    """The run's options, clock, collected rows and notes; writes the markdown after each section."""

    def __init__(self, args):
        self.args = args
        self.started = time.monotonic()
        self.sections: list[str] = []
        self.notes: list[str] = []

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def left(self) -> float:
        return self.args.budget - self.elapsed()

    def gpu(self) -> bool:
        return self.args.device.startswith("cuda")

    def note(self, text: str) -> None:
        say("note:", text)
        self.notes.append(text)

    def markdown(self) -> str:
        a = self.args
        head = ["## GPU (issue 22)", "",
                "retrograd on torch CUDA (`Executor(backend=\"torch\", device=\"cuda\")`, eager and "
                "`graphs=True`) beside PyTorch eager and `torch.compile` on the same device, in one process: "
                "medians over alternating rounds; `x` columns are medians of per-round ratios: of times in the "
                "LSTM table (below 1.0: faster than the reference), of steps/s in the training table "
                "(above 1.0: faster).", "",
                f"Command: `python benchmarks/gpu.py {' '.join(sys.argv[1:])}`  ",
                f"Machine: {machine(a.device)}  ",
                f"Precision: float32, {'TF32 allowed' if a.tf32 else 'IEEE (TF32 off for cuBLAS and cuDNN)'}; "
                f"run took {self.elapsed():.0f} s.", ""]
        notes = ["### Checks and notes", ""] + [f"* {n}" for n in self.notes] + [""]
        return "\n".join(head + self.sections + notes) + "\n"

    def flush(self) -> None:
        text = self.markdown()
        if self.args.out:
            Path(self.args.out).write_text(text)


# --- timing --------------------------------------------------------------------------------------

def alternate(runs: dict[str, Callable[[], object]], rounds: int, inner: int, run: Run) -> dict[str, list[float]]:
    """Seconds per call of each function: ``rounds`` rounds of ``inner`` calls each, the order of the
    functions reversed every other round (stops early, after 3 rounds, when the budget is spent)."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            started = time.perf_counter()
            for _ in range(inner):
                runs[name]()
            times[name].append((time.perf_counter() - started) / inner)
        if r >= 2 and run.left() < 0:
            run.note(f"timing stopped after {r + 1} of {rounds} rounds (budget spent)")
            break
    return times


def ratio(times: dict[str, list[float]], name: str, reference: str) -> float | None:
    if reference not in times or name not in times:
        return None
    return statistics.median(a / b for a, b in zip(times[name], times[reference]))


def _x(value) -> str:
    return "n/a" if value is None else f"{value:.2f}"


@contextmanager
def time_limit(seconds: float):
    """Raise TimeoutError in the main thread after ``seconds`` (SIGALRM; no limit where absent)."""
    if not hasattr(signal, "SIGALRM") or seconds <= 0:
        yield
        return

    def expire(*_):
        raise TimeoutError(f"over {seconds:.0f} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def compiled_or_none(label: str, build: Callable[[], Callable], first_calls: Callable[[Callable], None],
                     run: Run):
    """``build()``'s function after its first calls compiled it, or None (with a note) when torch.compile
    is off, fails, or takes longer than the limit."""
    if run.args.quick or run.args.no_compile:
        run.note(f"{label}: torch.compile not measured ({'--quick' if run.args.quick else '--no-compile'})")
        return None
    limit = min(run.args.compile_limit, run.left())
    if limit < 20:
        run.note(f"{label}: torch.compile skipped ({run.left():.0f} s of the budget left)")
        return None
    started = time.perf_counter()
    try:
        with time_limit(limit):
            fn = build()
            first_calls(fn)
    except Exception as exc:  # noqa: BLE001 -- any failure: report it, measure the others
        run.note(f"{label}: torch.compile skipped after {time.perf_counter() - started:.0f} s: "
                 f"{type(exc).__name__}: {_one_line(exc)}")
        return None
    run.note(f"{label}: torch.compile's first calls (compilation) took {time.perf_counter() - started:.1f} s")
    return fn


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] + ("..." if len(text) > 300 else "")


def check_close(label: str, got: tuple, want: tuple, run: Run) -> None:
    """Note whether ``got`` equals ``want`` (``backends.check_close``: 2e-3 of each result's largest entry)."""
    try:
        bk.check_close(label, got, want)
    except SystemExit as exc:
        run.note(f"CHECK FAILED: {exc}")
    else:
        run.note(f"{label}: results equal the torch.nn module's (max error under 2e-3 of the largest entry)")


# --- which kernel ran, whether a graph replayed ---------------------------------------------------

@contextmanager
def counting_vendor_calls():
    """{'cudnn': n, 'onednn': n}: calls of the fused LSTM kernels' forward and backward inside."""
    counts = {"cudnn": 0, "onednn": 0}
    patched = []
    for key, cls in (("cudnn", torch_cudnn_rnn.CuDNNLSTM), ("onednn", torch_fused_rnn.OneDNNLSTM)):
        for name in ("forward", "backward"):
            original = getattr(cls, name)

            def counted(self, *a, _o=original, _k=key):
                counts[_k] += 1
                return _o(self, *a)
            setattr(cls, name, counted)
            patched.append((cls, name, original))
    try:
        yield counts
    finally:
        for cls, name, original in patched:
            setattr(cls, name, original)


def graph_state(exe) -> str:
    graphs = getattr(exe, "graphs", None)
    if graphs is None:
        return "eager"
    if graphs.last_replayed:
        return "replayed as one CUDA graph"
    reasons = sorted({e.uncapturable for e in graphs.entries.values() if e.uncapturable})
    return "NOT replayed" + (f" ({'; '.join(reasons)})" if reasons else "")


# --- a. LSTM forward + backward --------------------------------------------------------------------

def compiled_lstm(problem: dict, device: str):
    """(build, first_calls) of torch.nn.LSTM forward + autograd backward through torch.compile."""
    import torch

    def build():
        module, x = bk.torch_lstm_module(problem, device)
        params = [x, module.weight_ih_l0, module.weight_hh_l0, module.bias_ih_l0]

        @torch.compile
        def loss_of(inp):
            return module(inp)[0].sum()

        def fn():
            loss = loss_of(x)
            grads = torch.autograd.grad(loss, params)
            bk._sync(device)
            return loss, grads
        return fn

    def first_calls(fn):
        for _ in range(3):
            fn()
    return build, first_calls


def bench_lstm(config, run: Run) -> list[dict]:
    device, gpu = run.args.device, run.gpu()
    problem = bk.lstm_problem(*config)
    label = "LSTM (T={}, N={}, H={})".format(*config)
    say(f"{label}: building")
    with counting_vendor_calls() as counts:
        eager, eager_results = bk.retrograd_lstm(problem, "torch", device, fused=True)
        got = eager_results()
    kernel = "cuDNN" if counts["cudnn"] else "oneDNN" if counts["onednn"] else "the general kernels"
    run.note(f"{label}: the fused op ran {kernel} (cuDNN calls {counts['cudnn']}, oneDNN calls {counts['onednn']})")
    nn_run, nn_results = bk.torch_lstm(problem, device)
    want = nn_results()
    check_close(f"{label}, retrograd eager", got, want, run)
    runs = {EAGER: eager, NN: nn_run}
    if gpu:
        graphs, graph_results = bk.retrograd_lstm(problem, "torch", device, graphs=True, fused=True)
        for _ in range(4):                  # two warm-up runs, the capture, a replay
            got = graph_results()
        check_close(f"{label}, retrograd graphs", got, want, run)
        run.note(f"{label}: retrograd graphs {graph_state(graphs.executor)}")
        runs[GRAPHS] = graphs
    build, first_calls = compiled_lstm(problem, device)
    compiled = compiled_or_none(label, build, first_calls, run)
    if compiled is not None:
        loss, (gx, gw_ih, gw_hh, gb) = compiled()
        got = tuple(t.detach().cpu().numpy() for t in (loss, gx, gw_ih.T, gw_hh.T, gb))
        check_close(f"{label}, torch.compile", got, want, run)
        runs[COMPILED] = compiled
    for fn in runs.values():
        fn()                                # warm
    rounds, inner = (5, 3) if run.args.quick else (10, 5 if config[0] < 1000 else 2)
    say(f"{label}: timing {', '.join(runs)}")
    times = alternate(runs, rounds, inner, run)
    return [{"what": label, "impl": name, "ms": 1e3 * statistics.median(ts), "x_nn": ratio(times, name, NN),
             "x_eager": ratio(times, name, EAGER)} for name, ts in times.items()]


def lstm_section(run: Run) -> None:
    rows = []
    for config in run.args.configs or (QUICK_CONFIGS if run.args.quick else CONFIGS):
        try:
            rows += bench_lstm(config, run)
        except Exception as exc:  # noqa: BLE001
            run.note(f"LSTM {config}: FAILED: {type(exc).__name__}: {_one_line(exc)}")
            traceback.print_exc()
        say(f"LSTM {config} done at {run.elapsed():.0f} s")
    lines = ["### LSTM forward + backward", "",
             "`layers.lstm(..., fused=True)` (one `LSTMSequence` op, cuDNN) vs `torch.nn.LSTM` (cuDNN) + autograd; "
             "D = H, float32, loss `sum(h_all)`, gradients of x and all parameters.", "",
             "| workload | implementation | ms | x torch.nn.LSTM | x retrograd eager |", "|---|---|---:|---:|---:|"]
    lines += [f"| {r['what']} | {r['impl']} | {r['ms']:.3f} | {_x(r['x_nn'])} | {_x(r['x_eager'])} |" for r in rows]
    run.sections.append("\n".join(lines) + "\n")


# --- a2. GRU forward + backward (GRUSequence: cuDNN's GRU) -----------------------------------------

def _gru_problem(t_len: int, n: int, h: int) -> dict:
    rng = np.random.default_rng(1)
    bound = 1.0 / np.sqrt(h)
    shapes = {"x": (t_len, n, h), "w_ih": (h, 3 * h), "w_hh": (h, 3 * h), "b_ih": (3 * h,), "b_hh": (3 * h,)}
    return {k: (rng.standard_normal(s) if k == "x" else rng.uniform(-bound, bound, s)).astype("float32")
            for k, s in shapes.items()}


def retrograd_gru(problem: dict, device: str, graphs: bool):
    """(run, results) of ``layers.gru(..., fused=True)`` forward + backward."""
    import retrograd as rg
    h = problem["w_hh"].shape[0]
    main, startup = rg.Program(), rg.Program()
    names = ("w_ih", "w_hh", "b_ih", "b_hh")
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, -1, h], stop_gradient=False)
        h_all, _ = rg.layers.gru(x, h, name="gru", fused=True)
        loss = rg.sum(h_all)
        grads = rg.gradients(loss, [x] + [main.global_block().var(f"gru.{k}") for k in names])
    exe = rg.Executor(backend="torch", device=device, graphs=graphs)
    exe.run(startup)
    for k in names:
        exe.scope.set(f"gru.{k}", problem[k])
    feed = {"x": exe.backend.from_numpy(problem["x"])}

    def run():
        values = exe.run(main, feed=feed, fetch_list=[loss] + grads, return_numpy=False)
        bk._sync(device)
        return values
    run.executor = exe
    return run, lambda: tuple(exe.backend.to_numpy(v) for v in run())


def torch_gru(problem: dict, device: str):
    import torch
    h = problem["w_hh"].shape[0]
    module = torch.nn.GRU(h, h).to(device)
    with torch.no_grad():
        for ours, theirs in (("w_ih", "weight_ih_l0"), ("w_hh", "weight_hh_l0")):
            getattr(module, theirs).copy_(torch.from_numpy(problem[ours].T))
        module.bias_ih_l0.copy_(torch.from_numpy(problem["b_ih"]))
        module.bias_hh_l0.copy_(torch.from_numpy(problem["b_hh"]))
    x = torch.from_numpy(problem["x"]).to(device).requires_grad_(True)
    params = [x, module.weight_ih_l0, module.weight_hh_l0, module.bias_ih_l0, module.bias_hh_l0]

    def run():
        loss = module(x)[0].sum()
        grads = torch.autograd.grad(loss, params)
        bk._sync(device)
        return loss, grads

    def results():
        loss, (gx, gw_ih, gw_hh, gb_ih, gb_hh) = run()
        return tuple(t.detach().cpu().numpy() for t in (loss, gx, gw_ih.T, gw_hh.T, gb_ih, gb_hh))
    return run, results


def gru_section(run: Run) -> None:
    rows = []
    for config in run.args.configs or (QUICK_CONFIGS if run.args.quick else CONFIGS[:2]):
        label = "GRU (T={}, N={}, H={})".format(*config)
        try:
            problem, device = _gru_problem(*config), run.args.device
            eager, eager_results = retrograd_gru(problem, device, graphs=False)
            nn_run, nn_results = torch_gru(problem, device)
            want = nn_results()
            check_close(f"{label}, retrograd eager", eager_results(), want, run)
            runs = {EAGER: eager, "torch.nn.GRU (autograd)": nn_run}
            if run.gpu():
                graphs, graph_results = retrograd_gru(problem, device, graphs=True)
                for _ in range(4):
                    got = graph_results()
                check_close(f"{label}, retrograd graphs", got, want, run)
                run.note(f"{label}: retrograd graphs {graph_state(graphs.executor)}")
                runs[GRAPHS] = graphs
            for fn in runs.values():
                fn()
            times = alternate(runs, *((5, 3) if run.args.quick else (10, 5)), run)
            rows += [{"what": label, "impl": name, "ms": 1e3 * statistics.median(ts),
                      "x_nn": ratio(times, name, "torch.nn.GRU (autograd)")} for name, ts in times.items()]
        except Exception as exc:  # noqa: BLE001
            run.note(f"{label}: FAILED: {type(exc).__name__}: {_one_line(exc)}")
            traceback.print_exc()
        say(f"{label} done at {run.elapsed():.0f} s")
    lines = ["### GRU forward + backward", "",
             "`layers.gru(..., fused=True)` (one `GRUSequence` op, cuDNN on CUDA) vs `torch.nn.GRU` + autograd; "
             "D = H, float32, loss `sum(h_all)`, gradients of x and all parameters.", "",
             "| workload | implementation | ms | x torch.nn.GRU |", "|---|---|---:|---:|"]
    lines += [f"| {r['what']} | {r['impl']} | {r['ms']:.3f} | {_x(r['x_nn'])} |" for r in rows]
    run.sections.append("\n".join(lines) + "\n")


# --- b. training steps -----------------------------------------------------------------------------

def _check_losses(label: str, got: list[float], want: list[float], run: Run, rtol: float = 1e-3) -> None:
    if np.allclose(got, want, rtol=rtol):
        run.note(f"{label}: first losses {', '.join(f'{v:.4f}' for v in got)} equal the reference's")
    else:
        run.note(f"{label}: first losses {got} DIFFER from the reference's {want}")


def _train_rows(model: str, steps: dict[str, Callable[[int], float]], run: Run, first_step: int) -> list[dict]:
    per_round = 3 if run.args.quick else 10
    rounds = 3 if run.args.quick else 6
    counter = iter(range(first_step, 10**9))
    runs = {name: (lambda s=s: [s(next(counter)) for _ in range(per_round)]) for name, s in steps.items()}
    say(f"{model}: timing {', '.join(runs)}")
    times = alternate(runs, rounds, 1, run)
    rows = []
    for name, ts in times.items():
        ms = 1e3 * statistics.median(ts) / per_round
        rows.append({"what": model, "impl": name, "ms": ms, "steps_s": 1e3 / ms,
                     "x_eager": ratio(times, PT_EAGER, name), "x_compiled": ratio(times, PT_COMPILED, name)})
    return rows


def lstm_training(run: Run) -> list[dict]:
    device, model = run.args.device, "LSTM training step (default `retrograd train`)"
    corpus, _ = charlm.split_corpus(charlm.load_corpus()[0])
    say(f"{model}: building")
    reference = bk.retrograd_step(corpus, "numpy", None)
    want = [reference(i) for i in range(3)]
    steps: dict[str, Callable[[int], float]] = {}
    with counting_vendor_calls() as counts:
        eager = bk.retrograd_step(corpus, "torch", device, fused=True)
        _check_losses(f"{model}, retrograd eager", [eager(i) for i in range(3)], want, run)
    run.note(f"{model}: fused LSTM kernel calls in 3 steps: cuDNN {counts['cudnn']}, oneDNN {counts['onednn']}")
    steps[EAGER] = eager
    if run.gpu():
        graphs = bk.retrograd_step(corpus, "torch", device, graphs=True, fused=True)
        _check_losses(f"{model}, retrograd graphs", [graphs(i) for i in range(4)][:3], want, run)
        graphs(4)
        run.note(f"{model}: retrograd graphs {graph_state(graphs.executor)}")
        steps[GRAPHS] = graphs
    steps[PT_EAGER] = bk.torch_step(corpus, device)
    compiled = compiled_or_none(model, lambda: bk.torch_step(corpus, device, compile=True),
                                lambda s: [s(i) for i in range(3)], run)
    if compiled is not None:
        steps[PT_COMPILED] = compiled
    for s in steps.values():
        s(5)                                 # warm
    return _train_rows(model, steps, run, 6)


def transformer_training(run: Run) -> list[dict]:
    import train_transformer as tt
    device, model = run.args.device, "transformer training step (`examples/gpt_chars.py`)"
    g = tt.gpt_module()
    if g is None:
        run.note(f"{model}: skipped, this checkout has no examples/gpt_chars.py")
        return []
    corpus, _ = charlm.split_corpus(charlm.load_corpus()[0])
    batch, lr, total = 32, 3e-3, 1000
    say(f"{model}: building")
    steps: dict[str, Callable[[int], float]] = {}
    eager = tt.retrograd_stepper(g, corpus, "torch", batch, lr, total, device=device)
    want = [eager(i) for i in range(3)]
    steps[EAGER] = eager
    if run.gpu():
        graphs = tt.retrograd_stepper(g, corpus, "torch", batch, lr, total, device=device, graphs=True)
        _check_losses(f"{model}, retrograd graphs vs eager", [graphs(i) for i in range(4)][:3], want, run)
        graphs(4)
        run.note(f"{model}: retrograd graphs {graph_state(graphs.executor)}")
        steps[GRAPHS] = graphs
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    steps[PT_EAGER] = tt.torch_stepper(g, corpus, batch, lr, threads, device=device)
    compiled = compiled_or_none(model, lambda: tt.torch_stepper(g, corpus, batch, lr, threads, device=device,
                                                                compile=True),
                                lambda s: [s(i) for i in range(3)], run)
    if compiled is not None:
        steps[PT_COMPILED] = compiled
    for s in steps.values():
        s(5)
    return _train_rows(model, steps, run, 6)


def training_section(run: Run, which: list[str]) -> None:
    rows = []
    for name, bench in (("train", lstm_training), ("transformer", transformer_training)):
        if name not in which:
            continue
        try:
            rows += bench(run)
        except Exception as exc:  # noqa: BLE001
            run.note(f"{name} step: FAILED: {type(exc).__name__}: {_one_line(exc)}")
            traceback.print_exc()
        say(f"{name} step done at {run.elapsed():.0f} s")
        run.flush()
    lines = ["### Training steps", "",
             "One optimizer step per call (host batch, forward, backward, update, the loss read back), "
             "same sizes on both sides; retrograd builds the LSTM fused (cuDNN). `x PyTorch` columns: "
             "PyTorch's time / this row's time, i.e. above 1.0 = more steps/s than PyTorch.", "",
             "| workload | implementation | ms/step | steps/s | x PyTorch eager | x PyTorch compile |",
             "|---|---|---:|---:|---:|---:|"]
    lines += [f"| {r['what']} | {r['impl']} | {r['ms']:.2f} | {r['steps_s']:.1f} | {_x(r['x_eager'])} | "
              f"{_x(r['x_compiled'])} |" for r in rows]
    run.sections.append("\n".join(lines) + "\n")


# --- the run -----------------------------------------------------------------------------------------

def machine(device: str) -> str:
    import torch
    gpu = torch.cuda.get_device_name() if device.startswith("cuda") else "no GPU used"
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    return (f"{gpu}; {platform.processor() or platform.machine()}, {os.cpu_count()} cores (load {load}); "
            f"PyTorch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {cudnn}; Python "
            f"{platform.python_version()}")


def _configs(text: str) -> list[tuple[int, int, int]]:
    try:
        out = [tuple(int(n) for n in part.lower().split("x")) for part in text.split(",") if part.strip()]
    except ValueError:
        out = []
    if not out or any(len(c) != 3 or min(c) < 1 for c in out):
        raise argparse.ArgumentTypeError(f"sizes are T x N x H, e.g. 50x32x128, not {text!r}")
    return out


def set_precision(tf32: bool) -> None:
    """TF32 for cuBLAS and cuDNN on or off for everyone (torch's legacy flags, set together)."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the markdown section here (also printed)")
    parser.add_argument("--quick", action="store_true", help="one LSTM size, short rounds, no torch.compile")
    parser.add_argument("--device", default="cuda", help='"cuda" (default) or "cpu" (a smoke run of the script)')
    parser.add_argument("--sections", default="lstm,gru,train,transformer",
                        help="comma-separated subset of lstm,gru,train,transformer")
    parser.add_argument("--configs", type=_configs, default=None, metavar="TxNxH[,...]",
                        help="LSTM sizes instead of the three standard ones, e.g. 50x32x128,100x8x64")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds: past it, compiles are skipped and timing stops early "
                             "(default 220, --quick 60)")
    parser.add_argument("--compile-limit", type=float, default=60.0, help="seconds per torch.compile")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--tf32", action="store_true", help="allow TF32 in cuBLAS and cuDNN (default: IEEE)")
    args = parser.parse_args(argv)
    if args.budget is None:
        args.budget = 60.0 if args.quick else 220.0
    import torch
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("gpu.py: no CUDA GPU here (use --device cpu for a smoke run)")
    set_precision(args.tf32)
    run = Run(args)
    which = [s.strip() for s in args.sections.split(",") if s.strip()]
    say(f"start: {machine(args.device)}")
    if "lstm" in which:
        lstm_section(run)
        run.flush()
    if "gru" in which:
        gru_section(run)
        run.flush()
    if "train" in which or "transformer" in which:
        training_section(run, which)
    try:
        run.note(f"torch's cuDNN RNN float32 precision after the run: {torch.backends.cudnn.rnn.fp32_precision}")
    except Exception as exc:  # noqa: BLE001
        run.note(f"torch's cuDNN RNN precision could not be read: {exc}")
    run.flush()
    print(run.markdown(), flush=True)
    say(f"done in {run.elapsed():.0f} s" + (f"; wrote {args.out}" if args.out else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
