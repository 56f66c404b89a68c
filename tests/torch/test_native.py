"""The native linear operator (looprl.torch.native): the backend's graphs call looprl's kernels
without Python once a row count's plan is known, compute what the Python operator computes bit
for bit, and hand every call it cannot run as planned to the Python operator, which decides as
before."""

import gc
import threading
import warnings

import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch import nn  # noqa: E402

from tests.fresh_interpreter import fresh_interpreter_checks  # noqa: E402
from tests.policies import random_policy  # noqa: E402

IN, HIDDEN, OUT = 24, 40, 16


@pytest.fixture(scope="module", autouse=True)
def native_built():
    """The native operator, built (or found built): a host without a C++ compiler runs every
    call through the Python operator, which the other tests cover."""
    from looprl.torch import native

    if native.library() is None:
        pytest.skip(f"the native operator is not available here: {native.unavailable()}")


@pytest.fixture(scope="module")
def options(tmp_path_factory):
    folder = random_policy(seed=11).save(tmp_path_factory.mktemp("policy") / "policy")
    cache = tmp_path_factory.mktemp("cache") / "native.sqlite"  # one cache: both compiles below get the same answers, so the same kernels
    return {"policy": str(folder), "budget_s": 0.05, "cache": str(cache), "compare_torch": False, "measure": False, "rest": "eager",
            "max_rows": 8}


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.GELU(approximate="tanh"), nn.Linear(HIDDEN, OUT, bias=False)).eval()


def compiled(options, native: bool, monkeypatch):
    """The model compiled by the backend under Inductor's freezing (bound once, as the recipe),
    with the native operator on or off, and its looprl layers."""
    import torch._inductor.config as inductor_config
    from looprl import dynamo

    monkeypatch.setenv("LOOPRL_NATIVE", "1" if native else "0")
    before = set(dynamo._layers.keys())
    module = model()
    function = torch.compile(module, backend="looprl", dynamic=True, options=options)
    with inductor_config.patch(freezing=True), torch.no_grad():
        function(torch.randn(2, IN))  # compiled here, for any row count (not 1: Dynamo specialises 0 and 1)
    layers = [dynamo._layers[index] for index in sorted(set(dynamo._layers.keys()) - before)]
    monkeypatch.delenv("LOOPRL_NATIVE")
    return module, function, layers


@pytest.fixture(scope="module")
def pair(options):
    """The model compiled twice, with the native operator and without (the Python one)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        with_native = compiled(options, True, monkeypatch)
        with_python = compiled(options, False, monkeypatch)
    return with_native, with_python


def counting_python_calls(monkeypatch) -> list:
    """Count the calls that reach :class:`LinearKernels` (the Python operator's path)."""
    from looprl.torch.routes import LinearKernels

    calls = []
    original = LinearKernels.__call__

    def counted(self, *args, **kwargs):
        calls.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(LinearKernels, "__call__", counted)
    return calls


def test_the_backend_puts_the_native_operator_in_its_graphs_and_python_sees_a_row_count_once(pair, monkeypatch):
    (module, function, layers), (_, _, python_layers) = pair
    assert len(layers) == 2 and all(layer.native is not None for layer in layers)
    assert all(layer.native is None for layer in python_layers)  # LOOPRL_NATIVE=0: the Python operator, as before
    python_calls = counting_python_calls(monkeypatch)
    with torch.no_grad():
        for rows in (3, 5, 8, 19):
            x = torch.randn(rows, IN)
            torch.testing.assert_close(function(x), module(x), rtol=1e-5, atol=1e-5)
        first = len(python_calls)
        assert first == 2 * 4  # each layer learns each row count from the Python operator
        counts = [layer.counted().get("looprl", 0) for layer in layers]
        for rows in (3, 5, 8, 19):
            x = torch.randn(rows, IN)
            torch.testing.assert_close(function(x), module(x), rtol=1e-5, atol=1e-5)
    planned = sum(rows in layer.native._kept for layer in layers for rows in (3, 5, 8, 19))
    assert planned >= 4  # the runtime-rows kernels' plans at least
    assert len(python_calls) - first == 2 * 4 - planned  # a row count with a plan never reaches Python again
    # every call counted as looprl's, the native operator's too
    assert [layer.counted().get("looprl", 0) - count for layer, count in zip(layers, counts)] == [4, 4]


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 70), batch=st.sampled_from([(), (1,), (3,)]))
def test_native_calls_compute_what_the_python_operator_computes_bit_for_bit(pair, rows, batch):
    (module, function, _), (_, python_function, _) = pair
    x = torch.randn(*batch, rows, IN)
    with torch.no_grad():
        for _ in range(2):  # the first call of a row count is the Python operator's, the second the native one's
            native, python = function(x), python_function(x)
            assert torch.equal(native, python)
            torch.testing.assert_close(native, module(x), rtol=1e-5, atol=1e-5)


def layer_and_index(pair):
    from looprl import dynamo

    (module, _, layers), _ = pair
    first = layers[0]
    index = next(i for i, layer in dynamo._layers.items() if layer is first)
    return module[0], first, index


def test_calls_the_native_operator_cannot_run_as_planned_are_the_python_operator_s(pair):
    from looprl.torch.routes import AUTOCAST

    linear, layer, index = layer_and_index(pair)
    operator = torch.ops.looprl_native.linear.default
    weight, bias = linear.weight, linear.bias
    with torch.no_grad():
        operator(torch.randn(3, IN), weight, bias, index)  # 3 rows learnt
        before = layer.counted()
        strided = torch.randn(IN, 3).t()  # not contiguous
        torch.testing.assert_close(operator(strided, weight, bias, index), layer.fallback(strided, weight, bias), rtol=1e-5, atol=1e-5)
        wide = torch.randn(3, IN, dtype=torch.float64)
        assert operator(wide, weight.double(), bias.double(), index).dtype == torch.float64  # torch's, the parameters' dtype as given
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert operator(torch.randn(3, IN), weight, bias, index).dtype == torch.bfloat16  # autocast's, as torch's call
    with torch.enable_grad():
        x = torch.randn(3, IN, requires_grad=True)
        y = operator(x, weight, bias, index)
    after = layer.counted()
    assert after.get(AUTOCAST, 0) - before.get(AUTOCAST, 0) == 1
    assert after.get("autograd", 0) - before.get("autograd", 0) == 1
    assert after.get("input not a float32 CPU tensor", 0) - before.get("input not a float32 CPU tensor", 0) == 1
    assert after["looprl"] - before["looprl"] == 1  # the strided input: the Python operator's kernels on a contiguous copy
    torch.testing.assert_close(y, layer.fallback(x, weight, bias), rtol=1e-5, atol=1e-5)


def test_a_frozen_layer_given_another_weight_tensor_computes_with_that_tensor(pair):
    linear, layer, index = layer_and_index(pair)
    operator = torch.ops.looprl_native.linear.default
    x = torch.randn(4, IN)
    with torch.no_grad():
        operator(x, linear.weight, linear.bias, index)
        operator(x, linear.weight, linear.bias, index)
        other = torch.randn_like(linear.weight)
        want = layer.fallback(x, other, linear.bias)  # the layer's GELU included
        torch.testing.assert_close(operator(x, other, linear.bias, index), want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(operator(x, other, linear.bias, index), want, rtol=1e-5, atol=1e-5)


def test_rows_given_to_torch_after_a_plan_was_made_are_torch_s(pair):
    from looprl.torch.routes import TORCH_FASTER

    linear, layer, index = layer_and_index(pair)
    operator = torch.ops.looprl_native.linear.default
    x = torch.randn(6, IN)
    with torch.no_grad():
        operator(x, linear.weight, linear.bias, index)
        operator(x, linear.weight, linear.bias, index)
        routes = dict(layer.routes)
        try:
            layer.route_to_torch([6])
            before = layer.counted().get(TORCH_FASTER, 0)
            assert torch.equal(operator(x, linear.weight, linear.bias, index), layer.fallback(x, linear.weight, linear.bias))
            assert layer.counted().get(TORCH_FASTER, 0) == before + 1
        finally:
            layer.routes = routes
            layer._torch_rows = {}
            layer.native.clear()


def test_rows_routed_to_torch_on_a_layer_without_activation_are_torch_s_call_made_without_python(pair, monkeypatch):
    """The first routed call of a row count is the Python operator's, which has the native
    operator make torch's call (aten::linear) for those rows from then on: the same bits, each
    call counted as routed to torch, Python never entered; the layer with an activation (GELU
    fused) keeps its routed calls in Python, whose torch call applies it."""
    from looprl import dynamo
    from looprl.torch.routes import TORCH_FASTER

    (module, _, layers), _ = pair
    plain, fused = layers[1], layers[0]
    assert plain.activation is None and fused.activation is not None
    indices = {id(layer): i for i, layer in dynamo._layers.items()}
    operator = torch.ops.looprl_native.linear.default
    python_calls = counting_python_calls(monkeypatch)
    routes = {layer: dict(layer.routes) for layer in layers}
    try:
        for layer in layers:
            layer.route_to_torch([5])
        with torch.no_grad():
            for layer, linear in ((plain, module[2]), (fused, module[0])):
                x = torch.randn(5, linear.in_features)
                before = layer.counted().get(TORCH_FASTER, 0)
                reached = len(python_calls)
                expected = layer.fallback(x, linear.weight, linear.bias)
                for _ in range(4):
                    assert torch.equal(operator(x, linear.weight, linear.bias, indices[id(layer)]), expected)
                assert layer.counted().get(TORCH_FASTER, 0) - before == 4
                assert len(python_calls) - reached == (1 if layer is plain else 4)
        assert 5 in plain.native.planned and 5 not in fused.native.planned
    finally:
        for layer in layers:
            layer.routes = routes[layer]
            layer._torch_rows = {}
            layer.native.clear()


def test_a_freed_graph_s_native_calls_routed_to_torch_stay_in_the_totals(options, monkeypatch):
    from looprl import dynamo
    from looprl.torch.routes import TORCH_FASTER

    _, function, layers = compiled(options, True, monkeypatch)
    layers[1].route_to_torch([2])
    before = dynamo.stats()["fallbacks"].get(TORCH_FASTER, 0)
    with torch.no_grad():
        for _ in range(3):
            function(torch.randn(2, IN))  # the second layer's first call routed by Python, the others by the native operator
    del function, layers
    torch._dynamo.reset()
    gc.collect()
    assert dynamo.stats()["fallbacks"].get(TORCH_FASTER, 0) == before + 3


def test_threads_calling_at_once_each_get_their_answer(pair):
    (module, function, _), _ = pair
    inputs = [torch.randn(rows, IN) for rows in (1, 3, 7)]
    with torch.no_grad():
        expected = [module(x) for x in inputs]
    failures = []

    def work(x, want):
        with torch.no_grad():
            for _ in range(200):
                if not torch.allclose(function(x), want, rtol=1e-5, atol=1e-5):
                    failures.append(x.shape)
                    return

    threads = [threading.Thread(target=work, args=pair_) for pair_ in zip(inputs, expected)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


def test_a_freed_graph_s_native_calls_stay_in_the_totals(options, monkeypatch):
    from looprl import dynamo

    _, function, layers = compiled(options, True, monkeypatch)
    before = dynamo.stats()["looprl_calls"]  # this graph's first call among them
    with torch.no_grad():
        for _ in range(3):
            function(torch.randn(2, IN))  # the first a Python call per layer, the others native, none counted yet
    del function, layers
    torch._dynamo.reset()
    gc.collect()
    assert dynamo.stats()["looprl_calls"] == before + 6


def test_the_switch_and_a_failed_build(monkeypatch, tmp_path):
    from looprl.torch import native

    monkeypatch.setenv("LOOPRL_NATIVE", "yes")
    with pytest.raises(ValueError, match="LOOPRL_NATIVE"):
        native.enabled()
    monkeypatch.setenv("LOOPRL_NATIVE", "0")
    assert native.library() is None and native.unavailable() == "LOOPRL_NATIVE=0"
    monkeypatch.setenv("LOOPRL_NATIVE", "1")
    monkeypatch.setenv("CXX", "false")  # a "compiler" that fails
    monkeypatch.setenv("LOOPRL_NATIVE_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match="building native_linear.cpp failed"):
        native.build()
    monkeypatch.setattr(native, "_state", {})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert native.library() is None
    assert "building native_linear.cpp failed" in native.unavailable()
    assert any("native linear operator is not available" in str(w.message) for w in caught)
    assert list(tmp_path.glob("*.so")) == []


def test_a_team_s_kernels_run_natively_where_looprl_does_not_place_teams(monkeypatch):
    """A two-thread kernel (parallel over the columns, rows given at run time) in a plan: where
    looprl does not place its teams (torch's OpenMP runtime, as in a process that loaded torch
    first), the native operator calls it with its thread count, as the Python operator would."""
    import looprl
    from looprl import dynamo
    from looprl.backend import placement
    from looprl.ir.layers import linear
    from looprl.torch.routes import LinearKernels

    monkeypatch.setattr(placement, "places_teams", lambda: False)
    results = {}
    for rows in (1, 64):
        problem = linear(rows, 40, 256, bias=True)
        nest = looprl.initial_nest(problem)
        if rows == 64:
            nest = nest.split(2, 64).swap(1).swap(0).parallel(0)  # n/64 (parallel), m, k, n
            assert nest.compute[0].parallel
        results[rows] = looprl.TuneResult(problem=problem, nest=nest, kernel=looprl.compile(nest, threads=2), gflops=1.0, mode="policy",
                                          threads=2)
    kernels = LinearKernels(40, 256, None, results, frozen=True)
    owned = []
    index = dynamo._register(dynamo._layers, kernels, owned)
    operator = dynamo._linear_operator(kernels, index)
    assert operator is torch.ops.looprl_native.linear.default
    python_calls = counting_python_calls(monkeypatch)
    layer = nn.Linear(40, 256)
    with torch.no_grad():
        x = torch.randn(50, 40)
        answers = [operator(x, layer.weight, layer.bias, index) for _ in range(3)]
        torch.testing.assert_close(answers[0], layer(x), rtol=1e-5, atol=1e-5)
    assert all(torch.equal(answer, answers[0]) for answer in answers)
    assert len(python_calls) == 1 and 50 in kernels.native._kept  # the second and third calls: the team, natively
    assert kernels.counted()["looprl"] == 3


def test_a_child_forked_from_a_thread_that_ran_a_team_natively_does_not_hang():
    """libgomp's pool does not survive fork. A thread that ran a team's kernel only through the
    native operator never told Python so; the native library's probe does (threads'
    after-fork check), so the child's call refuses instead of waiting forever. (In a fresh
    interpreter: tests/fresh_interpreter.py.)"""
    from looprl.backend.threads import available_cores

    if available_cores() < 2:
        pytest.skip("needs two cores")
    outcome = fresh_interpreter_checks()["forked child"]
    assert outcome["error"] is None, outcome["error"]
    assert outcome["printed"].strip() == "0"


def test_a_tuned_module_s_layers_call_the_native_operator_too(options, monkeypatch):
    """tune_module's TunedLinear: after the first call of a row count, its calls go straight to
    the kernels (frozen or not, where the plan reads the weight in place or, frozen, from
    copies); they compute what the Python path computes; a weight edited in place is read as it
    is now; copies and unpickled layers make entries of their own."""
    import copy
    import io

    from looprl.torch import tune_module

    tuning = {key: options[key] for key in ("policy", "budget_s", "cache", "compare_torch", "measure")}
    module = model()
    example = torch.randn(3, IN)
    for frozen in (True, False):
        with torch.no_grad():
            tuned = tune_module(module, (example,), frozen=frozen, progress=False, **tuning)
            monkeypatch.setenv("LOOPRL_NATIVE", "0")
            python_only = copy.deepcopy(tuned)  # its layers ask for no native entry
            python_only(example)
            monkeypatch.setenv("LOOPRL_NATIVE", "1")
            layers = [layer for layer in tuned.modules() if type(layer).__name__ == "TunedLinear"]
            python_calls = counting_python_calls(monkeypatch)
            for _ in range(3):
                x = torch.randn(3, IN)
                assert torch.equal(tuned(x), python_only(x))
            planned = [3 in layer.kernels.native.planned for layer in layers]
            own = [kernels for kernels in python_calls if any(kernels is layer.kernels for layer in layers)]
            assert len(own) == 3 * len(layers) - 2 * sum(planned)  # planned rows: the first call only
            assert all(planned)  # the example's own row count: no padded block; copies bound once, or compared on each call
            monkeypatch.undo()
        copied = copy.deepcopy(tuned)
        buffer = io.BytesIO()
        torch.save(tuned, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        with torch.no_grad():
            x = torch.randn(3, IN)
            for twin in (copied, loaded):
                twin(x)
                assert torch.equal(twin(x), python_only(x))
            if not frozen:  # the weights followed: an edit in place is seen, native or not, and the plan made again
                for _ in range(2):
                    tuned[0].weight.add_(0.5)
                    python_only[0].weight.add_(0.5)
                    python_calls = counting_python_calls(monkeypatch)
                    for _ in range(3):
                        assert torch.equal(tuned(x), python_only(x))
                    first = [kernels for kernels in python_calls if kernels is layers[0].kernels]
                    # with copies, the call that saw the edit bound again and the next two ran natively; a
                    # plan that reads the weight in place (which kernel tune picks is timing's) reads the edit natively
                    bound_to_copies = bool(layers[0].kernels._plan_of(3)[2])
                    assert len(first) == (1 if bound_to_copies else 0), (bound_to_copies, len(first))
                    monkeypatch.undo()
                torch.testing.assert_close(tuned[0](x), nn.functional.linear(x, tuned[0].weight, tuned[0].bias), rtol=1e-5, atol=1e-5)
