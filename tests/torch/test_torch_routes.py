"""Never slower than torch: a tuned layer's looprl plan is timed against torch's own call at each
tuned row count, and the row counts where torch was faster are computed by torch."""

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as functional  # noqa: E402
from torch import nn  # noqa: E402

import looprl  # noqa: E402
from looprl import dynamo  # noqa: E402
from looprl.measurement.timing import Timing  # noqa: E402
from looprl.torch import TORCH_FASTER, LinearKernels, Route, TunedLinear, route_table, stats, tune_module, tuned_layers  # noqa: E402
from looprl.torch.module import TORCH_EVERYWHERE  # noqa: E402
from looprl.torch.records import left_to_torch  # noqa: E402
from tests.policies import random_policy  # noqa: E402


@pytest.fixture(scope="module")
def options(tmp_path_factory):
    folder = random_policy(seed=3).save(tmp_path_factory.mktemp("policy") / "policy")
    # Each layer scheduled by the policy alone (measure=False): the subject is the routes, judged
    # by timing looprl's plan against torch's call whatever schedule the plan runs.
    return {"policy": folder, "budget_s": 0.1, "cache": str(tmp_path_factory.mktemp("cache") / "r.sqlite"), "progress": False,
            "measure": False}


def untuned_results(in_features, out_features, counts, bias=True):
    """TuneResults whose kernels run the untuned loop nest: scalar dot products, many times
    slower than torch's GEMM at every row count (a stand-in for a plan that lost)."""
    results = {}
    for rows in counts:
        problem = looprl.linear(rows, in_features, out_features, bias=bias)
        nest = looprl.initial_nest(problem)
        results[rows] = looprl.TuneResult(problem=problem, nest=nest, kernel=looprl.compile(nest), actions=(), gflops=1.0,
                                          initial_gflops=1.0, seconds=0.0, mode="policy")
    return results


def test_where_torch_is_faster_the_layer_runs_torch():
    torch.manual_seed(0)
    layer = nn.Linear(384, 384).eval()
    kernels = LinearKernels(384, 384, None, untuned_results(384, 384, [1, 16, 64]))
    routes = kernels.judge(layer.weight.detach(), layer.bias.detach())
    assert sorted(routes) == [1, 16, 64] and all(route.runs == "torch" for route in routes.values()), route_table([kernels])
    x = torch.randn(40, 384)
    with torch.no_grad():
        torch.testing.assert_close(kernels(x, layer.weight, layer.bias), functional.linear(x, layer.weight, layer.bias), rtol=0, atol=0)
    assert kernels.counted() == {TORCH_FASTER: 1}  # torch's own call computed it: bit for bit torch's answer


def test_rows_between_judged_counts_follow_their_neighbours():
    torch.manual_seed(1)
    layer = nn.Linear(24, 16).eval()
    # looprl won at 1 and 32 rows, torch at 8: rows 2..31 have 8 as a neighbour and run torch's call.
    routes = {1: Route(1, 1e-6, 2e-6), 8: Route(8, 3e-6, 2e-6), 32: Route(32, 1e-6, 2e-6)}
    kernels = LinearKernels(24, 16, None, untuned_results(24, 16, (1, 8, 32)), routes=routes)
    expected = {1: False, 2: True, 8: True, 20: True, 32: False, 33: False, 500: False}
    assert {rows: kernels.runs_torch(rows) for rows in expected} == expected
    with torch.no_grad():
        for rows in expected:
            x = torch.randn(rows, 24)
            torch.testing.assert_close(kernels(x, layer.weight, layer.bias), functional.linear(x, layer.weight, layer.bias),
                                       rtol=1e-5, atol=1e-5)
    assert kernels.counted() == {"looprl": 4, TORCH_FASTER: 3}


def test_tune_module_judges_each_shape_once_and_reports_the_routes(options, capsys):
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32), nn.Linear(32, 8)).eval()
    tuned = tune_module(model, torch.randn(4, 32), **dict(options, progress=True))
    err = capsys.readouterr().err
    assert "tuned linear 32->32 +relu for rows 1, 2, 4" in err and "looprl/torch" in err and "runs" in err
    layers = dict(tuned_layers(tuned))
    put_back = {name for name, why in left_to_torch(tuned).items() if why == TORCH_EVERYWHERE}  # torch's at every row count
    assert set(layers) | put_back == {"0", "2", "3"} and not set(layers) & put_back
    assert all(isinstance(tuned[int(name)], nn.Linear) for name in put_back)
    assert all(sorted(layer.kernels.routes) == [1, 2, 4] for layer in layers.values())
    if {"2", "3"} <= set(layers):
        assert layers["2"].kernels.routes is not layers["3"].kernels.routes  # two shapes, two judgements
    with torch.no_grad():
        for rows in (1, 3, 4, 9):
            x = torch.randn(rows, 32)
            torch.testing.assert_close(tuned(x), model(x), rtol=1e-5, atol=1e-5)
    counted = stats(tuned)
    assert counted["looprl_calls"] + counted["fallback_calls"] == 4 * len(layers)
    assert set(counted["fallbacks"]) <= {TORCH_FASTER}
    for name, layer in layers.items():
        routes = counted["layers"][name]["routes"]
        # each route as its times, rounds and who decided it say (the whole-model check, on a busy machine, may give torch a row count)
        assert sorted(routes) == [1, 2, 4]
        assert all(r["runs"] == Route(0, r["looprl_ms"], r["torch_ms"], r["decided_by"], r["wins"], r["rounds"]).runs
                   for r in routes.values())


def test_a_module_tuned_without_comparing_runs_looprl_everywhere(options):
    model = nn.Linear(16, 8).eval()
    tuned = tune_module(model, torch.randn(2, 16), **dict(options, compare_torch=False))
    assert isinstance(tuned, TunedLinear) and tuned.kernels.routes == {}
    with torch.no_grad():
        tuned(torch.randn(2, 16))
    assert stats(tuned)["looprl_calls"] == 1
    with pytest.raises(ValueError, match="compare_torch"):
        tune_module(model, torch.randn(2, 16), **dict(options, compare_torch="yes"))
    with pytest.raises(ValueError, match="row count"):
        tuned.kernels.judge(model.weight.detach(), model.bias.detach(), counts=[0])


def test_the_compile_backend_routes_a_layer_torch_is_faster_at(options, monkeypatch):
    torch.manual_seed(3)
    torch._dynamo.reset()  # earlier tests' compilations count towards Dynamo's recompile limit of nn.Module's code
    model = nn.Sequential(nn.Linear(40, 24)).eval()
    # The plan loses everywhere: torch keeps every call. (The judging itself is real: both timed.)
    monkeypatch.setattr(LinearKernels, "compute", lambda self, x, w, b: _slow(self, x, w, b))
    backend_options = {k: options[k] for k in ("policy", "budget_s", "cache", "measure")} | {"rest": "eager"}
    compiled = torch.compile(model, backend="looprl", options=backend_options)
    before = dynamo.stats()
    with torch.no_grad():
        x = torch.randn(6, 40)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    after = dynamo.stats()
    assert after["fallbacks"].get(TORCH_FASTER, 0) == before["fallbacks"].get(TORCH_FASTER, 0) + 1
    newest_linear = [layer for layer in after["layers"] if "routes" in layer][-1]  # (batched products have no routes)
    assert sorted(newest_linear["routes"]) == [1, 2, 4, 6] and all(route["runs"] == "torch" for route in newest_linear["routes"].values())
    with pytest.raises(Exception, match="compare_torch"):
        with torch.no_grad():
            torch.compile(nn.Linear(3, 3).eval(), backend="looprl", options={"compare_torch": 1})(torch.randn(2, 3))
    torch._dynamo.reset()


def _slow(kernels, x, weight, bias):
    """looprl's answer, computed a thousand times over (a plan that loses to torch by far)."""
    for _ in range(1000):
        out = functional.linear(x, weight, bias)
    return out


def test_where_the_whole_model_runs_slower_the_example_s_rows_go_to_torch(options, monkeypatch, capsys):
    """A layer is judged alone, its weights warm in the cache; a model's other layers compete for
    the cache. So the tuned model is also timed against the model on each example, and where it
    is slower the rows that example gave each layer are routed to torch. Here the per-layer
    judgement is made to say looprl wins while the kernels run the untuned nest (many times
    slower than torch): the model's timing must catch it."""

    def untuned_tune(problem, *args, **kwargs):  # the untuned nest of the very problem asked for (its epilogue included)
        nest = looprl.initial_nest(problem)
        return looprl.TuneResult(problem=problem, nest=nest, kernel=looprl.compile(nest), actions=(), gflops=1.0, initial_gflops=1.0,
                                 seconds=0.0, mode="policy")

    def looprl_always_wins(self, weight, bias, counts=None, **kwargs):
        self.routes = {count: Route(count, 1e-6, 1.0) for count in self.results}
        self._torch_rows = {}
        return self.routes

    monkeypatch.setattr("looprl.torch.layers.tune", untuned_tune)
    monkeypatch.setattr(LinearKernels, "judge", looprl_always_wins)
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256)).eval()
    example = torch.randn(32, 256)
    tuned = tune_module(model, example, **dict(options, progress=True))
    assert "routed to torch" in capsys.readouterr().err
    routes = stats(tuned)["layers"]["0"]["routes"]
    assert routes[32]["runs"] == "torch" and routes[32]["decided_by"] == "model"  # the example's rows
    assert routes[16]["runs"] == "looprl" and routes[16]["decided_by"] == "layer"  # rows no example gave: as judged
    with torch.no_grad():
        torch.testing.assert_close(tuned(example), model(example), rtol=0, atol=0)  # torch's own calls: bit for bit


def test_judging_draws_nothing_from_torch_s_global_generator(monkeypatch):
    from looprl.torch import duels as duels_module
    from looprl.torch import routes as routes_module

    monkeypatch.setattr(duels_module, "best_time", lambda repeat, budget_s: Timing(1.0, 1, 1))
    kernels = LinearKernels(24, 16, None, untuned_results(24, 16, [1, 2]))
    weight, bias = torch.randn(16, 24), torch.randn(16)
    state = torch.random.get_rng_state()
    kernels.judge(weight, bias)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_a_row_count_the_layer_gave_torch_keeps_its_reason_when_the_model_check_routes_it():
    """Issue 51 #16: route_to_torch marks "model" only the counts the layer's own timing had given to looprl."""
    kernels = LinearKernels(24, 16, None, untuned_results(24, 16, [1, 2, 4]),
                            routes={1: Route(1, 2e-6, 1e-6), 2: Route(2, 1e-6, 2e-6), 4: Route(4, 1e-6, 2e-6)})
    kernels.route_to_torch([1, 2])
    assert {count: (route.runs, route.decided_by) for count, route in kernels.routes.items()} == {
        1: ("torch", "layer"), 2: ("torch", "model"), 4: ("looprl", "layer")}
    assert (kernels.routes[1].looprl_s, kernels.routes[1].torch_s) == (2e-6, 1e-6)


def test_a_layer_torch_runs_at_every_row_count_is_put_back_as_it_was(options, monkeypatch):
    """A TunedLinear that would only pass its calls on to torch costs a route lookup per call:
    such a layer is the model's own nn.Linear again, named with its reason."""
    real_judge = LinearKernels.judge

    def torch_everywhere(self, weight, bias, counts=None, **kwargs):
        real_judge(self, weight, bias, counts, **kwargs)
        self.route_to_torch(list(self.results))
        return self.routes

    monkeypatch.setattr(LinearKernels, "judge", torch_everywhere)
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(32, 48), nn.Linear(48, 8)).eval()
    tuned = tune_module(model, torch.randn(4, 32), **options)
    assert type(tuned[0]) is nn.Linear and type(tuned[1]) is nn.Linear and dict(tuned_layers(tuned)) == {}
    assert left_to_torch(tuned) == {"0": TORCH_EVERYWHERE, "1": TORCH_EVERYWHERE}
    with torch.no_grad():
        x = torch.randn(4, 32)
        torch.testing.assert_close(tuned(x), model(x), rtol=0, atol=0)
    single = tune_module(nn.Linear(16, 8).eval(), torch.randn(2, 16), **options)  # a module that is itself the layer
    assert type(single) is nn.Linear and left_to_torch(single) == {"": TORCH_EVERYWHERE}
