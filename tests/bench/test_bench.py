import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from looprl.cli.bench import main as bench_main
from looprl.target import Target


def bench(capsys, *arguments) -> str:
    """``looprl-bench arguments`` run in this process (its exit status 0): what it printed.
    In-process, each benchmark measures its host's peak and bandwidths once per test process
    (tests/conftest.py), where a fresh interpreter measured them again for every command (about
    nine of the ~16 CPU seconds of a ``--threads 1,2`` tune benchmark); ``python -m looprl.bench``
    itself is started by test_benchmark_rejects_bad_shapes."""
    capsys.readouterr()
    status = bench_main(list(arguments))
    captured = capsys.readouterr()
    assert status == 0, captured.err[-4000:]
    return captured.out


def refused(capsys, *arguments) -> str:
    """``looprl-bench arguments`` run in this process and refused (exit status 2, argparse's
    own refusals included): its stderr."""
    capsys.readouterr()
    try:
        status = bench_main(list(arguments))
    except SystemExit as exit_:
        status = exit_.code
    captured = capsys.readouterr()
    assert status == 2, captured.err[-4000:]
    return captured.err


@pytest.fixture(autouse=True)
def short_peaks(monkeypatch):
    """The benchmarks' peaks (the codegen benchmark's two on one thread and one on two, the tune
    benchmark's one per thread count, the layers benchmark's) are timed on 0.05 s each, not the
    0.5 s a reader's run gives them (0.5 CPU s each, a second for a two-thread team): what a
    peak is, is tests/measurement's; here, that the report holds one and its roofline uses it."""
    from looprl.bench import codegen, layers, tune_quality
    from looprl.ir.dtypes import FLOAT32
    from looprl.measurement.peak import measure_peak_gflops

    def short(target, budget_s=0.5, threads=1, dtype=FLOAT32):
        return measure_peak_gflops(target, min(budget_s, 0.05), threads, dtype)

    for module in (codegen, layers, tune_quality):
        monkeypatch.setattr(module, "measure_peak_gflops", short)


class _Kept:
    """A baseline child that a benchmark run uses and whose ``close`` (its ``with`` block's
    end included) leaves it running for the next run."""

    def __init__(self, child):
        self._child = child

    def __getattr__(self, name):
        return getattr(self._child, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def close(self):
        pass


@pytest.fixture(scope="module")
def kept_children():
    """``install(monkeypatch)``: numpy's and torch's baseline children (``numpy_child``,
    ``torch_child``) kept from one benchmark run of this module to the next, one per kind of
    child (numpy or torch, the OpenBLAS core type or kernels it is held to, its thread count,
    torch's float32 twins), started by the first run that asks and closed after the module's
    last test. Each child start imports looprl or torch again (~1.3 CPU s a numpy child, ~3.8
    a torch one on the Zen 3): the benchmarks here started seven numpy children and two torch
    ones, now three in all; what each run times and reports are still the children's answers.
    A child's start, failure and close are tested by tests/measurement/test_numpy_baseline.py,
    test_a_failed_baseline_child_is_one_line_and_the_other_figures_still_print and
    test_the_torch_baseline_of_a_narrower_isa_holds_torch_s_kernels_to_it."""
    from looprl.bench import peers
    from looprl.bench import torch_baseline
    from looprl.measurement import numpy_baseline

    real_numpy, real_torch = numpy_baseline.numpy_child, torch_baseline.torch_child
    children = {}

    def kept(kind, start, isa, threads, *options):
        key = (kind, numpy_baseline.coretype_for(isa), threads, *options)  # the same child for the same kernels
        if key not in children:
            children[key] = start()
        return _Kept(children[key])

    def numpy_child(isa=None, threads=1):
        return kept("numpy", lambda: real_numpy(isa, threads), isa, threads)

    def torch_child(isa=None, threads=1, float32=False):
        return kept("torch", lambda: real_torch(isa, threads, float32), isa, threads, float32)

    def install(monkeypatch):
        for module in (numpy_baseline, peers):
            monkeypatch.setattr(module, "numpy_child", numpy_child)
        monkeypatch.setattr(peers, "torch_child", torch_child)

    yield install
    for child in children.values():
        child.close()


def test_codegen_benchmark_runs_and_writes_json(tmp_path, capsys, monkeypatch, kept_children):
    """One run, one target (each one more measures its peak again): AVX2 code (every host this
    suite runs on executes it), on one thread and, where there are two cores, on two (its peaks
    on a short budget: :func:`short_peaks`; numpy's children kept: :func:`kept_children`)."""
    kept_children(monkeypatch)
    two_cores = len(os.sched_getaffinity(0)) >= 2
    path = tmp_path / "codegen.json"
    out = bench(capsys, "codegen", "--shapes", "32x48x16", "--budget", "0.05", "--compiles", "2", "--targets", "avx2",
                "--threads", "1,2" if two_cores else "1", "--json", str(path))
    assert "measured peak" in out and "32x48x16" in out
    report = json.loads(path.read_text())
    row = report["rows"][0]
    assert row["numpy_gflops"] > 0 and row["expert_gflops"] > 0 and row["untuned_gflops"] > 0
    assert report["compile"]["count"] == 2
    if two_cores:
        assert "expert@2" in out
        section = report["targets"][0]
        assert section["peak_gflops_t2"] > 0 and section["rows"][0]["expert_gflops_t2"] > 0


def test_the_codegen_benchmark_s_targets_are_the_default_then_each_narrower_one_the_host_runs():
    from looprl.bench.codegen import benchmark_targets
    from looprl.target import TARGET_NAMES

    default = Target.default()
    narrower = [Target.named(name) for name in TARGET_NAMES[TARGET_NAMES.index(default.isa) + 1:]]
    assert benchmark_targets() == [default] + [target for target in narrower if not target.missing_on_host()]
    assert benchmark_targets(["avx2", "host"]) == [Target.named("avx2"), default]


def test_benchmark_rejects_bad_shapes():
    result = subprocess.run(
        [sys.executable, "-m", "looprl.bench", "codegen", "--shapes", "32x48"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "bad shape" in result.stderr


def test_env_benchmark_reports_cold_and_warm_rates(tmp_path, capsys, monkeypatch):
    path = tmp_path / "env.json"
    monkeypatch.setenv("LOOPRL_CACHE_DIR", str(tmp_path / "cache"))
    bench(capsys, "env", "--steps", "6", "--budget-ms", "1", "--json", str(path))
    report = json.loads(path.read_text())
    assert [row["workload"] for row in report["rows"]] == ["mm64-256 train", "256x256x256"]
    for row in report["rows"]:
        assert row["structural_steps"] == 6 and row["new_states"] >= 1 and row["failures"] == 0
        assert row["cold_steps_per_s"] > 0 and row["warm_steps_per_s"] > 0 and row["mean_compile_ms"] > 0
    assert "--steps" in refused(capsys, "env", "--steps", "0")


def test_tune_benchmark_reports_times_and_ratios(tmp_path, capsys, monkeypatch, kept_children):
    path = tmp_path / "tune.json"
    monkeypatch.setenv("LOOPRL_CACHE_DIR", str(tmp_path / "cache"))
    kept_children(monkeypatch)
    out = bench(capsys, "tune", "--split", "test", "--limit", "2", "--budget", "0.01", "--tune-budget", "0.1",
                "--search", "0.1", "--json", str(path))
    assert "tune time: median" in out
    report = json.loads(path.read_text())
    summary = report["summary"]
    assert summary["problems"] == 2 and 0 < summary["tune_s_median"] <= summary["tune_s_p95"]
    assert summary["tuned_vs_numpy_geomean"] > 0 and summary["tuned_vs_untuned_geomean"] > 0
    assert "tuned/torch" in out and summary["tuned_vs_best_library_geomean"] <= summary["tuned_vs_numpy_geomean"]
    for row in report["rows"]:  # torch timed beside numpy: the best library is the better of the two
        assert row["torch_gflops"] > 0 and row["best_library_gflops"] == max(row["numpy_gflops"], row["torch_gflops"])
        assert set(row["torch_calls_gflops"]) == {"torch.matmul", "F.linear", "oneDNN packed"}
    assert all(row["tuned_gflops"] > 0 and row["search_gflops"] > 0 for row in report["rows"])
    assert summary["search_vs_numpy_geomean"] > 0 and summary["tuned_vs_search_geomean"] > 0
    # torch's child on the host's own ISA runs the host's kernels, held to nothing narrower (the
    # narrower ISA's child: test_the_torch_baseline_of_a_narrower_isa_holds_torch_s_kernels_to_it)
    if Target.default().isa == Target.host().isa == "avx512":
        assert "AVX512 kernels" in report["torch"] and "up to" not in report["torch"], report["torch"]


def test_tune_benchmark_summarises_per_model():
    import looprl
    from looprl.bench.tune_quality import _label, per_model

    rows = [
        {"model": "bert-base", "tune_s": 0.4, "tuned_gflops": 100.0, "numpy_gflops": 50.0, "untuned_gflops": 25.0, "best_library_gflops": 50.0},
        {"model": "bert-base", "tune_s": 0.6, "tuned_gflops": 100.0, "numpy_gflops": 200.0, "untuned_gflops": 100.0, "best_library_gflops": 200.0},
        {"model": "resnet-50", "tune_s": 0.5, "tuned_gflops": 90.0, "numpy_gflops": 90.0, "untuned_gflops": 30.0, "best_library_gflops": 90.0},
    ]
    bert, resnet = per_model(rows)
    assert (bert["model"], bert["problems"], resnet["problems"]) == ("bert-base", 2, 1)
    assert bert["tuned_vs_numpy_geomean"] == pytest.approx(1.0) and bert["tuned_vs_untuned_geomean"] == pytest.approx(2.0)
    assert (bert["tune_s_median"], bert["tune_s_max"]) == (0.5, 0.6)
    assert _label(looprl.contraction("bmk,bnk->bmn", b=12, m=128, n=96, k=64)) == "b12:128x96x64"
    assert _label(looprl.matmul(64, 32, 16)) == "64x32x16"


def test_layers_benchmark_compares_fused_numpy_and_torch(tmp_path, capsys, monkeypatch, kept_children):
    from tests.policies import random_policy

    kept_children(monkeypatch)

    policy = random_policy(seed=3).save(tmp_path / "policy")
    path = tmp_path / "layers.json"
    out = bench(capsys, "layers", "--layers", "12,16,24,gelu", "8,16,24,residual,nobias", "--budget", "0.01",
                "--tune-budget", "0.05", "--policy", str(policy), "--json", str(path))
    assert "geomean fused/best peer" in out and "fused/numpy" in out and "12x16->24" in out
    report = json.loads(path.read_text())
    assert [row["problem"] for row in report["rows"]] == [
        "mk,nk->mn:m=12,k=16,n=24;const=in1;epilogue=bias+gelu", "mk,nk->mn:m=8,k=16,n=24;const=in1;epilogue=residual"]
    for row in report["rows"]:
        assert row["fused_s"] > 0 and row["numpy_s"] > 0 and row["torch_s"] > 0
        # Issue 50 row 1: oneDNN's linear on a weight packed once is a peer too, and the headline
        # is the fused kernel against the fastest peer of the layer.
        assert row["onednn_s"] > 0
        peers = {"numpy": row["numpy_s"], "F.linear": row["torch_s"], "oneDNN": row["onednn_s"]}
        assert row["best_peer"] == min(peers, key=peers.get) and row["vs_best"] == pytest.approx(min(peers.values()) / row["fused_s"])
    assert report["summary"]["vs_best_geomean"] <= report["summary"]["vs_numpy_geomean"]
    assert "bad layer" in refused(capsys, "layers", "--layers", "12,16,gelu")


class StandInTorch:
    """A torch baseline child that starts no process: each call at 1 GFLOPS."""

    failure, label = None, "torch (a stand-in)"

    def time(self, problem, budget_s):
        return {"torch.matmul": 1.0, "F.linear": 1.0, "oneDNN packed": 1.0}

    def close(self):
        pass


def test_the_tune_benchmark_prints_one_and_two_thread_figures_side_by_side_and_leaves_the_untuned_nest_out_when_told(
        tmp_path, capsys, monkeypatch, kept_children):
    """One run for two options (each run starts numpy's and torch's child processes): the
    two-thread figures beside the one-thread ones where there are two cores (the codegen
    benchmark's two-thread columns: test_codegen_benchmark_runs_and_writes_json), and
    --no-untuned (one untuned call of a large layer takes minutes): the column says nan and
    every other figure is there. Every thread count is tuned before the peers time the problem
    (tuned right after the peers' children had timed it, two-thread teams lost their duels).

    torch's children are stand-ins here (a real one per thread count imported torch, ~1.7 CPU s
    each, and nothing here reads their figures): torch's real child is timed by
    test_tune_benchmark_reports_times_and_ratios."""
    from looprl.bench import peers, tune_quality

    two_cores = len(os.sched_getaffinity(0)) >= 2
    monkeypatch.setenv("LOOPRL_CACHE_DIR", str(tmp_path / "cache"))
    kept_children(monkeypatch)  # numpy's children (:func:`kept_children`)
    monkeypatch.setattr(peers, "torch_child", lambda isa, threads=1, **_: StandInTorch())
    events = []
    real_tune, real_timed_with = tune_quality.tune, tune_quality.Peers.timed_with
    monkeypatch.setattr(tune_quality, "tune", lambda *a, **k: events.append(("tune", k["threads"])) or real_tune(*a, **k))
    monkeypatch.setattr(tune_quality.Peers, "timed_with", lambda self, *a, **k: events.append(("timed", a[-1])) or real_timed_with(self, *a, **k))
    path = tmp_path / "tune.json"
    out = bench(capsys, "tune", "--problems", "48x64x32", "--budget", "0.01", "--tune-budget", "0.1", "--no-untuned",
                "--threads", "1,2" if two_cores else "1", "--neighbour", "bursty", "--json", str(path))
    counts = [1, 2] if two_cores else [1]
    tunes = [("tune", n) for n in counts]
    assert events[:len(counts)] == tunes and ("timed", 1) in events and max(events.index(t) for t in tunes) < events.index(("timed", 1))
    report = json.loads(path.read_text())
    row = report["rows"][0]
    assert math.isnan(row["untuned_gflops"]) and row["tuned_gflops"] > 0 and row["numpy_gflops"] > 0
    assert " nan " in out
    assert "--threads" in refused(capsys, "tune", "--problems", "8x8x8", "--threads", "1,x")
    if two_cores:
        assert "numpy@2" in out and "2 threads: geomean tuned@2/numpy@2" in out
        assert "tuned on 2 threads beside a bursty BLAS neighbour" in out
        assert row["tuned_gflops_t2"] > 0 and row["numpy_gflops_t2"] > 0 and row["serial_counterpart_gflops_t2"] > 0
        assert report["summary"]["threads"] == [1, 2] and report["summary"]["tuned_vs_numpy_geomean_t2"] > 0
    for key in ("neighbour", "neighbour_t2") if two_cores else ("neighbour",):  # tuned beside the neighbour, re-timed quiet
        beside = row[key]
        assert beside["quiet_gflops"] > 0 and beside["neighbour_gflops"] > 0
        assert beside["ratio"] == pytest.approx(beside["neighbour_gflops"] / beside["quiet_gflops"])
        assert report["summary"][key]["problems"] == 1


def test_a_neighbour_runs_blas_work_only_while_its_block_runs():
    from looprl.bench.neighbour import Neighbour

    with pytest.raises(ValueError, match="kind"):
        Neighbour("noisy")
    with pytest.raises(ValueError, match="threads"):
        Neighbour("steady", threads=0)
    with Neighbour("steady") as neighbour:
        process = neighbour.process
        assert process.poll() is None  # computing
        cpu = lambda: sum(int(v) for v in open(f"/proc/{process.pid}/stat").read().rsplit(")", 1)[1].split()[11:13])
        before = cpu()
        time.sleep(0.3)
        assert cpu() > before  # it uses the CPU (user + system clock ticks)
    assert process.poll() is not None and neighbour.process is None  # gone with the block
    with pytest.raises(KeyboardInterrupt):
        with Neighbour("bursty") as neighbour:
            process = neighbour.process
            raise KeyboardInterrupt
    assert process.poll() is not None


@pytest.mark.parametrize(
    "argv, message",
    [
        (["env", "--steps", "2", "--budget-ms", "inf"], "--budget-ms must be a positive, finite number of milliseconds, got inf"),
        (["env", "--steps", "0"], "--steps must be a positive integer, got 0"),
        (["codegen", "--shapes", "8x8x8", "--budget", "nan"], "--budget must be a positive, finite number of seconds, got nan"),
        (["codegen", "--shapes", "8x8x8", "--compiles", "-1"], "--compiles must be a non-negative integer, got -1"),
    ],
)
def test_benchmark_options_are_checked_before_any_work(argv, message, capsys):
    from looprl.cli.bench import main

    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == f"looprl-bench: error: {message}" and captured.out == ""


@pytest.mark.parametrize("name", ["mk,nk->mn:m=5,k=7,n=3;const=in1;epilogue=bias+gelu", "mk,kn->mn:m=4,k=6,n=5",
                                  "mk,kn->mn:m=3,k=4,n=2;epilogue=scale0.5+bias+silu+residual", "bmk,bnk->bmn:b=2,m=3,k=4,n=5",
                                  "bmk,bkn->bmn:b=2,m=3,k=4,n=5", "km,kn->mn:m=3,k=4,n=2"])
def test_the_torch_baseline_times_calls_that_compute_the_problem(name):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as functional

    from looprl.bench.torch_baseline import _calls
    from looprl.ir.problem import parse_problem

    problem = parse_problem(name)
    calls = _calls(problem, torch, functional)
    answers = [call() for call in calls.values()]
    assert len(answers) == ((3 if torch.backends.mkldnn.is_available() else 2) if problem.spec in ("mk,nk->mn", "mk,kn->mn") else 1)
    for answer in answers[1:]:  # torch.matmul, F.linear and oneDNN's packed linear agree
        torch.testing.assert_close(answer, answers[0], rtol=1e-5, atol=1e-5)
    # The reference: the same operands (drawn in the same order from the same seed), numpy's einsum, the epilogue by hand.
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.rand(*shape, generator=generator) * 2 - 1 for shape in problem.input_shapes)
    extra = {what: torch.rand(*shape, generator=generator) * 2 - 1 for what, shape in problem.epilogue_shapes}
    expected = torch.from_numpy(np.einsum(problem.spec, a.double().numpy(), b.double().numpy())) * problem.epilogue.scale
    if "bias" in extra:
        expected = expected + extra["bias"].double()
    activation = problem.epilogue.activation
    if activation == "gelu":
        expected = functional.gelu(expected)
    elif activation == "silu":
        expected = functional.silu(expected)
    if "residual" in extra:
        expected = expected + extra["residual"].double()
    torch.testing.assert_close(answers[0].double(), expected, rtol=1e-5, atol=1e-5)


def test_the_torch_baseline_of_a_narrower_isa_holds_torch_s_kernels_to_it():
    pytest.importorskip("torch")
    from looprl.bench.torch_baseline import torch_environment, torch_gflops
    from looprl.ir.problem import parse_problem

    host = Target.host().isa
    for isa in (host, None):  # the host's own kernels: nothing added
        assert torch_environment(isa).get("ONEDNN_MAX_CPU_ISA") == os.environ.get("ONEDNN_MAX_CPU_ISA")
    if host != "avx512":
        pytest.skip("needs an AVX-512 host to hold torch to AVX2")
    env = torch_environment("avx2")
    assert (env["ATEN_CPU_CAPABILITY"], env["ONEDNN_MAX_CPU_ISA"], env["MKL_ENABLE_INSTRUCTIONS"]) == ("avx2", "AVX2", "AVX2")
    figures, label = torch_gflops([parse_problem("8x16x16")], 0.002, isa="avx2")
    assert "AVX2 kernels" in label and "up to AVX2" in label and figures[0]["torch.matmul"] > 0
    # (a child on the host's ISA, its label "AVX512 kernels": test_tune_benchmark_reports_times_and_ratios)


def test_a_failed_baseline_child_is_one_line_and_the_other_figures_still_print(tmp_path, monkeypatch, capfd):
    """Issue 51 item 9: a torch child whose ``import torch`` raised OSError, or a numpy child
    killed, was a nested traceback / exit 1 / "numpy baseline process failed:" with nothing
    after it. Issue 50 row 5: the peers are timed after tuning, with the tuned kernel."""
    from looprl.bench import tune_quality
    from looprl.cli.bench import main
    from looprl.measurement import numpy_baseline

    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise OSError('libtorch_cpu.so: cannot open shared object file')\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    monkeypatch.setenv("PYTHONPATH", f"{fake.parent}{os.pathsep}{root}")
    killed = "import json, os, signal, sys; print(json.dumps({'label': 'numpy'}), flush=True); sys.stdin.readline(); os.kill(os.getpid(), signal.SIGKILL)"
    monkeypatch.setattr(numpy_baseline, "NUMPY_CHILD", ("-c", killed))
    events = []
    real_tune, real_timed_with = tune_quality.tune, tune_quality.Peers.timed_with
    monkeypatch.setattr(tune_quality, "tune", lambda *a, **k: events.append("tune") or real_tune(*a, **k))
    monkeypatch.setattr(tune_quality.Peers, "timed_with", lambda self, *a, **k: events.append("timed") or real_timed_with(self, *a, **k))
    path = tmp_path / "tune.json"
    status = main(["tune", "--problems", "32x32x32", "--budget", "0.002", "--tune-budget", "0.05", "--mode", "policy", "--json", str(path)])
    err = capfd.readouterr().err
    assert status == 0, err
    lines = err.strip().splitlines()
    assert len(lines) == 2 and "Traceback" not in err, err
    assert any("numpy baseline process was killed by SIGKILL" in line for line in lines), err
    assert any("torch baseline process failed: import torch failed: OSError: libtorch_cpu.so" in line for line in lines), err
    row = json.loads(path.read_text())["rows"][0]
    assert row["tuned_gflops"] > 0 and row["untuned_gflops"] > 0 and np.isnan(row["numpy_gflops"]) and np.isnan(row["torch_gflops"])
    assert events == ["tune", "timed"]  # the peers timed after tuning (the table goes to the out= bound at import: not checked here)


def test_the_peers_are_timed_in_turn_with_the_kernels_round_after_round(monkeypatch):
    """Issue 50 row 5: numpy and torch were timed once, before all tuning; now each round times
    the problem's kernels, then numpy, then torch, and each keeps its best."""
    from looprl.bench import peers as peers_module
    from looprl.bench import tune_quality
    from looprl.ir.problem import parse_problem

    order, figures = [], iter(range(1, 100))

    class Child:
        failure, label = None, "fake"

        def __init__(self, name):
            self.name = name

        def time(self, problem, budget_s):
            order.append(self.name)
            value = float(next(figures))
            return value if self.name == "numpy" else {"torch.matmul": value, "F.linear": None, "oneDNN packed": value / 2}

        def close(self):
            pass

    class Timing:
        gflops = 1.0

    monkeypatch.setattr(peers_module, "numpy_child", lambda isa, threads: Child("numpy"))
    monkeypatch.setattr(peers_module, "torch_child", lambda isa, threads: Child("torch"))
    monkeypatch.setattr(peers_module, "time_kernel", lambda kernel, budget_s, **kw: order.append(kernel) or Timing())
    peers = tune_quality.Peers(None, [1])
    best = peers.timed_with({"tuned": "K", "untuned": "U"}, parse_problem("8x8x8"), 0.01, 1)
    assert order == ["K", "U", "numpy", "torch"] * tune_quality.TIMING_ROUNDS
    rounds = tune_quality.TIMING_ROUNDS  # the children answer 1, 2, 3, ... in turn: the last round is the best
    assert best["numpy"] == 2 * rounds - 1 and best["torch"]["torch.matmul"] == 2 * rounds and best["torch"]["oneDNN packed"] == rounds
    assert best["torch"]["F.linear"] is None and best["tuned"] == 1.0
