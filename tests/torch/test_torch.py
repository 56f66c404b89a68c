"""looprl.torch: tuned kernels inside PyTorch modules, and every way a call falls back."""

import subprocess
import sys
import threading

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from looprl.torch import TunedLinear, tune_module, tuned_layers  # noqa: E402
from tests.policies import random_policy  # noqa: E402


@pytest.fixture(scope="module")
def options(tmp_path_factory):
    folder = random_policy(seed=3).save(tmp_path_factory.mktemp("policy") / "policy")
    # These tests are about looprl's kernels inside modules: every call they make is looprl's,
    # never routed to torch by timing (tests/torch/test_torch_routes.py tests the routes), and
    # each layer is scheduled by the policy alone (measure=False): what a search finds is not
    # their subject. The records test tunes measured (MEASURED).
    return {"policy": folder, "cache": str(tmp_path_factory.mktemp("cache") / "m.sqlite"), "compare_torch": False, "progress": False,
            "measure": False}


# Measured tuning in a private cache: records hold measured answers only.
MEASURED = {"measure": True, "budget_s": 0.1, "cache": ":memory:"}


def block(activation=None):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(24, 40), activation or nn.GELU(), nn.Linear(40, 24), nn.LayerNorm(24)).eval()


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation", [nn.ReLU(), nn.GELU(), nn.GELU(approximate="tanh"), nn.SiLU()], ids=repr)
def test_a_tuned_block_computes_what_the_block_computes(options, activation):
    module = block(activation)
    x = torch.randn(2, 7, 24)  # (batch, seq, features): 14 rows
    tuned = tune_module(module, x, **options)
    layers = dict(tuned_layers(tuned))
    # the activation fused into layer 0's kernels, run by the sequence; the activation module stays in its place
    assert set(layers) == {"0", "2"} and type(tuned[1]) is type(activation) and type(tuned).__name__ == "FusedSequential"
    assert sorted(layers["0"].results) == [1, 2, 4, 8, 14] and layers["0"].activation is not None  # powers of two up to 14, and 14
    assert isinstance(tuned[3], nn.LayerNorm) and isinstance(module[0], nn.Linear)  # the original is untouched
    assert tuned.state_dict().keys() == module.state_dict().keys()  # the original's parameters, under their names
    with torch.no_grad():
        close(tuned(x), module(x))
        close(tuned(x.transpose(0, 1).contiguous().transpose(0, 1)), module(x))  # non-contiguous
        close(tuned(x[:1]), module(x[:1]))  # 7 rows: blocks of 4, 2 and 1
    with torch.inference_mode():
        close(tuned(x), module(x))


def test_every_other_call_falls_back_to_the_original_layer(options):
    module = block()
    x = torch.randn(5, 24)
    tuned = tune_module(module, [x, torch.randn(3, 24)], **options)  # two shapes
    assert sorted(dict(tuned_layers(tuned))["0"].results) == [1, 2, 3, 4, 5]
    with pytest.raises(RuntimeError):  # float64 input: the original layer's own error
        tuned(x.double())
    with pytest.raises(RuntimeError):
        tuned(torch.randn(5, 23))
    # autograd: the kernels have no backward, the original layers do
    grad_input = x.clone().requires_grad_()
    tuned(grad_input).sum().backward()
    reference = x.clone().requires_grad_()
    module(reference).sum().backward()
    close(grad_input.grad, reference.grad)
    # new weights are bound on the next call
    with torch.no_grad():
        for layer in (tuned[0], module[0]):
            layer.weight.mul_(2.0)
        close(tuned(x), module(x))
    tuned[2].weight = nn.Parameter(module[2].weight.detach() * 0.5)
    module[2].weight = nn.Parameter(module[2].weight.detach() * 0.5)
    with torch.no_grad():
        close(tuned(x), module(x))


def test_other_layers_dtypes_and_shared_layers_are_left_alone(options):
    shared = nn.Linear(16, 16)
    module = nn.Sequential(shared, nn.ReLU(), shared).eval()
    tuned = tune_module(module, torch.randn(4, 16), **options)
    assert isinstance(tuned[1], nn.ReLU) and isinstance(tuned[0], TunedLinear)  # used twice: not fused
    assert tuned[0] is tuned[2] and tuned[0].activation is None
    y = torch.randn(4, 16)
    with torch.no_grad():
        close(tuned(y), module(y))
    no_bias = nn.Sequential(nn.Linear(16, 8, bias=False), nn.SiLU()).eval()
    tuned_no_bias = tune_module(no_bias, y, **options)
    assert tuned_no_bias[0].activation is not None and tuned_no_bias.state_dict().keys() == {"0.weight"}
    with torch.no_grad():
        close(tuned_no_bias(y), no_bias(y))
    double = nn.Sequential(nn.Linear(16, 16).double(), nn.ReLU()).eval()
    with pytest.warns(RuntimeWarning, match="tuned no layer"):
        assert tuned_layers(tune_module(double, torch.randn(4, 16, dtype=torch.float64), **options)) == []
    mixed = nn.Sequential(nn.Linear(16, 16), nn.ReLU()).eval()  # float32 weights, never called with float32
    assert tuned_layers(tune_module(mixed, [(torch.randn(4, 16),), (torch.randn(0, 16),)], **options)) != []


def test_a_module_that_is_a_linear_layer_is_replaced_whole(options):
    layer = nn.Linear(16, 24)
    x = torch.randn(4, 16)
    tuned = tune_module(layer, x, **options)
    assert isinstance(tuned, TunedLinear) and type(layer) is nn.Linear  # the given layer is untouched
    assert tuned.state_dict().keys() == layer.state_dict().keys()
    with torch.no_grad():
        close(tuned(x), layer(x))
    from looprl.torch import stats

    assert stats(tuned)["looprl_calls"] == 1
    no_linear = nn.Sequential(nn.ReLU())
    with pytest.warns(RuntimeWarning, match="tuned no layer"):  # nothing to tune, and said so
        copied = tune_module(no_linear, x, **options)
    assert copied is not no_linear and isinstance(copied[0], nn.ReLU)


def test_concurrent_calls(options):
    module = block()
    x = torch.randn(6, 24)
    tuned = tune_module(module, x, **options)
    with torch.no_grad():
        expected = module(x)
    failures = []

    def work():
        with torch.no_grad():
            for _ in range(50):
                if not torch.allclose(tuned(x), expected, rtol=1e-5, atol=1e-5):
                    failures.append(1)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_bad_arguments_are_value_errors(options):
    with pytest.raises(ValueError, match="torch.nn.Module"):
        tune_module(lambda x: x, torch.randn(2, 2), **options)
    with pytest.raises(ValueError, match="example_inputs"):
        tune_module(block(), [], **options)
    with pytest.raises(ValueError, match="example_inputs"):
        tune_module(block(), "x", **options)
    assert isinstance(TunedLinear, type)


@pytest.mark.parametrize("flag", ["fuse", "frozen", "compare_torch", "progress"])
@pytest.mark.parametrize("value", ["no", 1, 0, None])
def test_flags_must_be_bools_named_in_the_error(options, flag, value):
    """Issue 51 #13: ``fuse="no"`` was taken as true (a non-empty string)."""
    with pytest.raises(ValueError, match=f"^{flag} must be True or False, got {value!r}$"):
        tune_module(block(), torch.randn(2, 24), **dict(options, **{flag: value}))


@pytest.mark.parametrize("path", ["/proc/self/mem", "/dev/null", "/proc/self/status"])
def test_a_cache_path_sqlite_cannot_use_is_one_value_error_naming_it(options, path):
    """Issue 51 #13: ``cache="/proc/self/mem"`` gave a raw ``OSError`` (its first bytes cannot be read)."""
    with pytest.raises(ValueError, match=f"{path}") as refused:
        tune_module(block(), torch.randn(2, 24), **dict(options, cache=path))
    assert "\n" not in str(refused.value)


def test_importing_looprl_does_not_import_torch():
    code = "import sys, looprl; looprl.linear(2, 3, 4); assert 'torch' not in sys.modules, 'torch imported'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_stats_count_looprl_calls_and_fallbacks_by_reason(options):
    from looprl.torch import stats

    module = block()
    x = torch.randn(5, 24)
    tuned = tune_module(module, x, **options)
    assert stats(tuned)["looprl_calls"] == 0 and stats(tuned)["fallback_calls"] == 0
    with torch.no_grad():
        tuned(x)  # both linear layers: looprl
        tuned(torch.randn(7, 24))  # a row count not tuned: looprl, in row blocks (4 + 2 + 1)
        tuned(torch.randn(0, 24))  # empty: both fall back
    tuned(x.clone().requires_grad_())  # autograd: both fall back
    counted = stats(tuned)
    layers = len(tuned_layers(tuned))
    assert layers == 2
    assert counted["looprl_calls"] == 2 * layers and counted["fallback_calls"] == 2 * layers
    assert counted["fallbacks"] == {"empty input": layers, "autograd": layers}
    assert set(counted["layers"]) == {name for name, _ in tuned_layers(tuned)}
    assert all(entry["looprl_calls"] == 2 and entry["fallback_calls"] == 2 for entry in counted["layers"].values())
    assert stats(nn.Linear(3, 4)) == {"looprl_calls": 0, "fallback_calls": 0, "fallbacks": {}, "layers": {}, "left_to_torch": {}}


def test_a_row_plan_covers_every_row_once_at_the_least_measured_time():
    from looprl.torch import row_plan

    def covered(plan, rows):
        assert [start for start, _, _ in plan] == list(__import__("itertools").accumulate([0] + [n for _, n, _ in plan][:-1]))
        assert sum(length for _, length, _ in plan) == rows and all(length <= count for _, length, count in plan)

    weights_bound = {1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.5, 32: 2.2, 64: 4.0}  # seconds: reading the weights dominates
    plan = row_plan(5, weights_bound)
    assert plan == [(0, 5, 8)]  # one padded call, not 4 + 1 (two reads of the weights)
    covered(row_plan(100, weights_bound), 100)
    compute_bound = {count: float(count) for count in (1, 2, 4, 8, 16)}
    seven = row_plan(7, compute_bound)
    covered(seven, 7)
    assert sorted(length for _, length, _ in seven) == [1, 2, 4] and all(length == count for _, length, count in seven)  # padding would compute rows for nothing
    big = row_plan(1000, compute_bound)
    covered(big, 1000)
    assert all(count == 16 for _, _, count in big[:-1])
    assert row_plan(0, {1: 1.0}) == []
    with pytest.raises(ValueError, match="include 1"):
        row_plan(5, {2: 1.0, 4: 2.0})
    # Kernels of runtime rows: one call of the smallest count that covers a remainder, on its rows.
    every = frozenset(compute_bound)
    assert row_plan(7, compute_bound, every) == [(0, 7, 8)]  # not 4 + 2 + 1: three calls, three reads of the weights
    assert row_plan(5, weights_bound, frozenset(weights_bound)) == [(0, 5, 8)]
    assert row_plan(1, compute_bound, every) == [(0, 1, 1)]  # a larger kernel on one row is not cheaper than the one-row kernel
    assert row_plan(3, weights_bound, frozenset({1, 2})) == [(0, 3, 4)]  # the 4-row kernel is padded (it has no runtime rows)
    hundred = row_plan(100, {**compute_bound, 32: 32.0, 64: 64.0}, every | {32, 64})
    covered(hundred, 100)
    assert sorted((length, count) for _, length, count in hundred) == [(36, 64), (64, 64)]


def test_any_row_count_is_computed_by_kernels_in_row_plans(options):
    from looprl.torch import stats

    module = block()
    tuned = tune_module(module, torch.randn(4, 8, 24), max_rows=32, **options)
    assert sorted(dict(tuned_layers(tuned))["0"].results) == [1, 2, 4, 8, 16, 32]
    counts = [1, 3, 5, 16, 31, 37, 100]
    for rows in counts:
        x = torch.randn(rows, 24)
        with torch.no_grad():
            close(tuned(x), module(x))
            close(tuned(x.reshape(1, rows, 24)), module(x.reshape(1, rows, 24)))
    assert stats(tuned)["fallback_calls"] == 0 and stats(tuned)["looprl_calls"] == 2 * 2 * len(counts)
    layer = dict(tuned_layers(tuned))["0"].kernels
    assert layer.runtime_rows == {c for c, r in layer.results.items() if "in0" not in r.kernel.packed_inputs}
    assert layer.runtime_rows, "no tuned schedule took its rows at run time"


def test_a_remainder_of_rows_is_one_call_of_a_runtime_rows_kernel(options, monkeypatch):
    from looprl.backend.kernel import BoundKernel

    module = nn.Linear(24, 40).eval()
    tuned = tune_module(module, torch.randn(8, 24), max_rows=8, **options)
    if not {4, 8} <= tuned.kernels.runtime_rows:
        pytest.skip("a tuned schedule converts its input: no runtime rows for it")
    from looprl.torch.rows import InPlaceKernel

    calls = []
    for kind in (BoundKernel, InPlaceKernel):  # kernels bound to copies, and those reading the weight in place

        def recording(self, out, workspace, *free, rows=None, original=kind.address_call):
            calls.append((self.kernel.problem.size("m"), rows))
            original(self, out, workspace, *free, rows=rows)

        monkeypatch.setattr(kind, "address_call", recording)
    for rows in (5, 7, 3):
        calls.clear()
        x = torch.randn(rows, 24)
        with torch.no_grad():
            close(tuned(x), module(x))
        # One call per block of the layer's row plan, which its measured seconds decide (a remainder
        # is one call where it is fastest so; timed beside other work, 4 + 1 rows can win), each
        # runtime-rows kernel on exactly its block's rows (no padding).
        plan = tuned.kernels._plan_of(rows)[0]
        assert [count for count, _ in calls] == [count for _, _, count in plan]
        for (_, length, count), (_, called) in zip(plan, calls):
            if count in tuned.kernels.runtime_rows:
                assert called == length
    with pytest.raises(ValueError, match="max_rows"):
        tune_module(module, torch.randn(2, 24), max_rows=0, **options)


def test_a_tuned_module_s_records_load_without_tuning_on_the_same_cpu_and_tune_again_elsewhere(options, tmp_path):
    import json

    from looprl.torch import save_records
    from looprl.torch.records import tuned_names

    module = block()
    x = torch.randn(1, 24)  # one row of each layer: two problems, each tuned twice (measured tuning costs ~0.5 CPU s a problem)
    settings = dict(options, **MEASURED)  # one private cache for the whole module
    tuned = tune_module(module, x, **settings)
    assert all(r.mode == "measured" for _, layer in tuned_layers(tuned) for r in layer.results.values())
    path = tmp_path / "records.json"
    count = save_records(tuned, path)
    # one per problem remembered: a layer's twin, and its few-row problems searched in place as given
    assert count == len(tuned_names(r for _, layer in tuned_layers(tuned) for r in layer.results.values()))
    assert count == 2 * len({r.problem.name for _, layer in tuned_layers(tuned) for r in layer.results.values()})
    loaded = tune_module(module, x, records=path, **settings)  # a new private cache: only the file's answers
    for (_, before), (_, after) in zip(tuned_layers(tuned), tuned_layers(loaded)):
        assert all(result.mode == "remembered" for result in after.results.values())
        assert {rows: r.nest for rows, r in after.results.items()} == {rows: r.nest for rows, r in before.results.items()}
    with torch.no_grad():
        close(loaded(x), module(x))
    document = json.loads(path.read_text())
    for record in document["records"]:
        record["host"] = "another CPU|" + record["host"]
    path.write_text(json.dumps(document))
    elsewhere = tune_module(module, x, records=path, **settings)
    assert all(r.mode == "measured" for _, layer in tuned_layers(elsewhere) for r in layer.results.values())
    path.write_text("{}")
    with pytest.raises(ValueError, match="not a looprl-tuned-records file"):
        tune_module(module, x, records=path, **settings)
    with pytest.raises(ValueError, match="no such file"):
        tune_module(module, x, records=tmp_path / "missing.json", **settings)


def test_the_cache_exports_and_imports_tuned_answers_and_refuses_bad_records():
    import looprl
    from looprl.measurement.cache import MeasurementCache
    from looprl.measurement.schedule_record import ScheduleRecord

    source, destination = MeasurementCache(":memory:"), MeasurementCache(":memory:")
    problem = looprl.matmul(8, 16, 8)
    nest = looprl.initial_nest(problem).split(2, 8)
    source.put_tuned(ScheduleRecord(nest, 12.5, budget_s=0.4, tuner="tune-vX"))
    exported = source.export_tuned()
    assert len(exported) == 1 and exported[0]["schedule"] == nest.key and exported[0]["gflops"] == pytest.approx(12.5)
    assert source.export_tuned(["another problem"]) == []
    assert destination.import_tuned(exported) == 1
    known = destination.get_tuned(problem, tuner="tune-vX")
    assert (known.nest.key, known.gflops, known.budget_s) == (nest.key, pytest.approx(12.5), 0.4)
    for bad, what in (({**exported[0], "gflops": -1.0}, "positive"), ({**exported[0], "schedule": 3}, "schedule"), ("row", "not a dict")):
        with pytest.raises(ValueError, match=what):
            MeasurementCache(":memory:").import_tuned([exported[0], bad])
