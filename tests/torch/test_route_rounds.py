"""Issue 60, item 3: a route is judged in interleaved rounds until looprl and torch are told
apart (a sign test on the rounds looprl wins by the margin, at most ROUTE_MAX_ROUNDS rounds;
undecided, torch's). Every timer here is scripted: no wall-clock time is asserted."""

import itertools
import pickle

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import looprl  # noqa: E402
from looprl.measurement.timing import Timing  # noqa: E402
from looprl.torch import TORCH_FASTER, LinearKernels, Route, TunedLinear, route_table, stats, tune_module, tuned_layers  # noqa: E402
from looprl.torch import duels as duels_module  # noqa: E402
from looprl.torch import routes as routes_module  # noqa: E402
from looprl.torch.routes import ROUTE_CONFIDENCE, ROUTE_MARGIN, ROUTE_MAX_ROUNDS, binomial_tail, faster, interleaved_duels  # noqa: E402


def test_the_defaults_are_those_the_docstring_states():
    assert (ROUTE_MARGIN, ROUTE_CONFIDENCE, ROUTE_MAX_ROUNDS) == (0.05, 0.95, 15)


def test_the_binomial_tail():
    assert binomial_tail(5, 5) == 1 / 32 and binomial_tail(0, 7) == 1.0
    assert binomial_tail(12, 15) == pytest.approx(576 / 32768) and binomial_tail(11, 15) == pytest.approx(1941 / 32768)


@pytest.mark.parametrize("wins, rounds, verdict", [
    (5, 5, True),  # five of five: 1/32 <= 0.05
    (4, 4, None),  # 1/16: not yet sure, and it still could be
    (1, 1, None),
    (0, 1, None),
    (4, 5, None),  # one loss: it may still win enough of the 15
    (7, 8, True),  # one loss in 8: 9/256
    (6, 7, None),  # one loss in 7: 8/128 is not enough yet
    (9, 11, True),  # two losses in 11
    (10, 13, True),  # three losses in 13
    (1, 4, None),  # three losses: 12 of 15 is still within reach
    (0, 4, False),  # four losses: even winning the 11 rounds left gives 11 of 15 (p = 0.059)
    (8, 12, False),
    (12, 15, True),
    (11, 15, False),  # at the cap: not sure, so torch's
])
def test_the_rule_decides_as_the_sign_test_says(wins, rounds, verdict):
    assert faster(wins, rounds) is verdict


def test_a_smaller_cap_decides_what_a_larger_one_leaves_open():
    assert faster(4, 5, max_rounds=5) is False and faster(4, 5) is None
    assert faster(0, 1, max_rounds=1) is False


def scripted_seconds(script: dict, calls: list):
    """``seconds(function, args, budget_s)`` that answers from ``script`` (name -> the seconds of
    each of its rounds, in turn) and records the order of the calls."""

    def seconds(function, args, budget_s):
        calls.append(function)
        return script[function].pop(0)

    return seconds


def test_rounds_go_on_until_each_pair_is_decided_interleaved():
    script = {"clear looprl": [1.0] * 5, "clear torch": [1.2] * 5,  # looprl 20% faster: 5 rounds
              "tie looprl": [1.0] * 4, "tie torch": [1.0] * 4,  # a tie: 4 losses, then it cannot be shown
              "best-of looprl": [1.0] + [1.3] * 4, "best-of torch": [1.1] * 5,  # best 1.0 against 1.1, but one round of five won
              "late looprl": [1.2] * 3 + [1.0] * 10, "late torch": [1.1] * 13}  # 3 losses, then 10 wins: sure at round 13
    calls = []
    pairs = [((f"{name} looprl", ()), (f"{name} torch", ())) for name in ("clear", "tie", "best-of", "late")]
    duels = interleaved_duels(pairs, 0.001, ROUTE_MARGIN, seconds=scripted_seconds(script, calls))
    assert [(duel.wins, duel.rounds) for duel in duels] == [(5, 5), (0, 4), (1, 5), (10, 13)]
    assert [faster(duel.wins, duel.rounds, duel.rounds) for duel in duels] == [True, False, False, True]
    assert [duel.shown_faster(ROUTE_MARGIN) for duel in duels] == [True, False, False, True]
    assert (duels[2].challenger_s, duels[2].incumbent_s) == (1.0, 1.1)  # each side's best over its rounds
    every = [name for pair in pairs for name in (pair[0][0], pair[1][0])]
    assert calls[:8] == every and calls[8:16] == every  # a round: each open pair's two calls one after the other, in turn
    assert calls[32:38] == every[:2] + every[4:]  # round 5: the tie is closed
    assert calls[38:] == every[6:] * 8  # rounds 6 to 13: only the late pair is open
    assert all(not left for left in script.values())  # nothing timed past its decision


def test_a_quiet_moment_of_torch_s_is_not_outvoted_by_rounds_a_busy_machine_slowed():
    """Noise only adds time, and a busy machine slows torch's threaded call far more than a
    one-thread kernel: looprl wins 7 rounds of 8, but torch's best shows it is the faster."""
    script = {"looprl": [1.0] * 8, "torch": [1.2, 0.5, 1.2, 1.2, 1.2, 1.2, 1.2, 1.2]}
    duel, = interleaved_duels([(("looprl", ()), ("torch", ()))], 0.001, ROUTE_MARGIN, seconds=scripted_seconds(script, []))
    assert (duel.wins, duel.rounds) == (7, 8) and faster(7, 8) is True
    assert (duel.challenger_s, duel.incumbent_s) == (1.0, 0.5) and not duel.shown_faster(ROUTE_MARGIN)
    assert Route(1, duel.challenger_s, duel.incumbent_s, wins=duel.wins, rounds=duel.rounds).runs == "torch"


def test_a_nan_is_no_win_and_the_cap_bounds_the_rounds():
    script = {"looprl": [float("nan")] * 3, "torch": [1.0] * 3}
    duel, = interleaved_duels([(("looprl", ()), ("torch", ()))], 0.001, 0.05, max_rounds=3, seconds=scripted_seconds(script, []))
    assert (duel.wins, duel.rounds) == (0, 1)  # with 3 rounds at most, one loss already rules looprl out
    with pytest.raises(ValueError, match="rounds"):
        interleaved_duels([], 0.001, 0.05, max_rounds=0)
    with pytest.raises(ValueError, match="confidence"):
        interleaved_duels([], 0.001, 0.05, confidence=1.0)
    with pytest.raises(ValueError, match="margin"):
        interleaved_duels([], 0.001, -0.1)


def untuned_results(in_features, out_features, counts):
    results = {}
    for rows in counts:
        problem = looprl.linear(rows, in_features, out_features, bias=True)
        nest = looprl.initial_nest(problem)
        results[rows] = looprl.TuneResult(problem=problem, nest=nest, kernel=looprl.compile(nest), actions=(), gflops=1.0,
                                          initial_gflops=1.0, seconds=0.0, mode="policy")
    return results


def test_judge_keeps_looprl_only_where_it_wins_its_rounds(monkeypatch):
    """Through LinearKernels.judge, with torch's best_time scripted per call and round: the
    best-of rule of three rounds would have given 4 rows to looprl (best 1.00 against 1.06)."""
    kernels = LinearKernels(24, 16, None, untuned_results(24, 16, [1, 2, 4]))
    script = {1: ([1.00] * 5, [1.30] * 5),  # clearly faster: looprl's in 5 rounds
              2: ([1.00] * 4, [1.04] * 4),  # 4% faster: within the margin, no round won
              4: ([1.00, 1.30, 1.20, 1.20, 1.20, 1.20], [1.06, 1.10, 1.50, 1.10, 1.10, 1.10])}  # best 1.00 against 1.06; 2 of 6 won
    seen = []

    def scripted(repeat, budget_s):
        function, args = repeat.__defaults__  # the call being timed, as best_seconds binds it
        side = "looprl" if function.__name__ == "compute" else "torch"
        count = args[0].shape[0]
        round_number = sum(1 for s in seen if s == (count, side))
        seen.append((count, side))
        return Timing(script[count][side == "torch"][round_number], 1, 1)

    monkeypatch.setattr(duels_module, "best_time", scripted)
    judged = kernels.judge(torch.randn(16, 24), torch.randn(16))
    assert {count: (route.runs, route.wins, route.rounds) for count, route in judged.items()} == {
        1: ("looprl", 5, 5), 2: ("torch", 0, 4), 4: ("torch", 2, 6)}
    assert (judged[4].looprl_s, judged[4].torch_s) == (1.00, 1.06)
    assert seen[:6] == [(1, "looprl"), (1, "torch"), (2, "looprl"), (2, "torch"), (4, "looprl"), (4, "torch")]
    assert " 5/5 " in route_table([kernels]) and " 2/6 " in route_table([kernels])
    with pytest.raises(ValueError, match="rounds"):
        kernels.judge(torch.randn(16, 24), torch.randn(16), rounds=0)


def test_a_route_is_looprl_s_only_where_both_its_rounds_and_its_best_times_say_so():
    assert Route(1, 1.0, 2.0, wins=11, rounds=15).runs == "torch"  # twice as fast at best, but not sure
    assert Route(1, 1.0, 1.2, wins=5, rounds=5).runs == "looprl"
    assert Route(1, 1.0, 1.04, wins=5, rounds=5).runs == "torch"  # sure in rounds, but torch's best is within the margin
    assert Route(1, 1.0, 1.2, "model", wins=5, rounds=5).runs == "torch"
    assert Route(1, float("nan"), 1.0, wins=5, rounds=5).runs == "torch"
    assert Route(1, 1.0, 1.0 + ROUTE_MARGIN).runs == "looprl" and Route(1, 1.0, 1.04).runs == "torch"  # given only its times


def test_a_route_pickled_before_the_rounds_reads_as_given_by_its_times():
    old = Route.__new__(Route)
    for name, value in {"rows": 1, "looprl_s": 1.0, "torch_s": 2.0, "decided_by": "layer"}.items():
        object.__setattr__(old, name, value)  # the fields an older looprl pickled
    restored = pickle.loads(pickle.dumps(old))
    assert (restored.wins, restored.rounds, restored.runs) == (None, None, "looprl")


def test_the_model_check_keeps_looprl_only_where_the_tuned_model_is_shown_faster(monkeypatch):
    """The layers win their own rounds; the whole tuned model then ties with the model on the
    first example (it wins every other round: not shown faster, so that example's rows go to
    torch) and is 10% faster on the second (every round)."""
    from looprl.torch.module import MODEL_MARGIN

    assert 0 < MODEL_MARGIN <= 0.02
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(24, 32), nn.ReLU(), nn.Linear(32, 16)).eval()
    examples = [torch.randn(4, 24), torch.randn(1, 24)]
    ahead = 1.0 + 2 * MODEL_MARGIN
    whole = {(4, "model"): itertools.cycle([ahead, 1.0]), (4, "tuned"): itertools.repeat(1.0),
             (1, "model"): itertools.repeat(1.0), (1, "tuned"): itertools.repeat(0.9)}
    rounds = {}

    def scripted(repeat, budget_s):
        function, args = repeat.__defaults__
        if not isinstance(function, nn.Module):  # a layer's judgement: looprl's call twice as fast as torch's
            return Timing(1.0 if function.__name__ in ("compute", "looprl_call") else 2.0, 1, 1)
        side = "tuned" if any(isinstance(module, TunedLinear) for module in function.modules()) else "model"
        rounds[args[0].shape[0], side] = rounds.get((args[0].shape[0], side), 0) + 1
        return Timing(next(whole[args[0].shape[0], side]), 1, 1)

    monkeypatch.setattr(duels_module, "best_time", scripted)
    tuned = tune_module(model, examples, measure=False, progress=False, cache=":memory:")
    routes = stats(tuned)["layers"]["0"]["routes"]
    assert routes[4]["runs"] == "torch" and routes[4]["decided_by"] == "model"  # the tie: the first example's rows
    assert routes[1]["runs"] == "looprl" and routes[1]["decided_by"] == "layer"  # shown faster on the second example
    first = dict(tuned_layers(tuned))["0"].kernels
    assert first.runs_torch(3) and not first.runs_torch(2) and not first.runs_torch(1)  # 3 rows: next to 4, torch's
    assert rounds[1, "tuned"] == rounds[1, "model"] == 5  # decided in 5 rounds
    assert rounds[4, "tuned"] == 8 + 3  # 4 wins and 4 losses decide it; then 3 rounds to report the routed model


def test_a_row_count_routed_to_torch_is_torch_s_call_whatever_else_holds():
    """Looked up before the other checks: the call is torch's (the original's answer, or its
    error), counted as routed to torch; a row count looprl keeps still goes through them."""
    import torch.nn.functional as functional

    torch.manual_seed(6)
    layer = nn.Linear(24, 16).eval()
    kernels = LinearKernels(24, 16, None, untuned_results(24, 16, [1, 2, 4]),
                            routes={1: Route(1, 1e-6, 2e-6), 2: Route(2, 2e-6, 1e-6), 4: Route(4, 2e-6, 1e-6)})
    x = torch.randn(3, 24)
    with torch.no_grad():
        torch.testing.assert_close(kernels(x, layer.weight, layer.bias), functional.linear(x, layer.weight, layer.bias), rtol=0, atol=0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert kernels(x, layer.weight, layer.bias).dtype == torch.bfloat16
        with pytest.raises(RuntimeError):  # a float64 input: torch's own error, as the original layer raises it
            kernels(x.double(), layer.weight, layer.bias)
        one = torch.randn(1, 24)
        torch.testing.assert_close(kernels(one, layer.weight, layer.bias), functional.linear(one, layer.weight, layer.bias),
                                   rtol=1e-5, atol=1e-5)
    assert kernels.counted() == {TORCH_FASTER: 3, "looprl": 1}
