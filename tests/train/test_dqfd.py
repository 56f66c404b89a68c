"""DQfD fine-tuning: the large-margin loss, the demonstrations file, expert iteration's choice
of demonstration, and a DQN learner that trains with both losses."""

import json
import math

import numpy as np
import pytest

from looprl.actions import ActionSet, State, replay
from looprl.ir.nest import initial_nest
from looprl.ir.problem import matmul
from looprl.measurement.evaluator import Evaluator
from looprl.measurement.schedule_record import ScheduleRecord
from looprl.tune import measured as tuner
from looprl.target import Target
from looprl.train import demonstrations as demos
from looprl.train.config import validate_agent
from looprl.train.demonstrations import load_demonstrations, save_demonstrations
from looprl.train.expert_iteration import rounds
from looprl.train.schema import section_settings

torch = pytest.importorskip("torch")


def test_margin_loss_is_zero_only_when_the_demonstrated_action_leads_by_the_margin():
    from looprl.train.dqfd import margin_loss  # here, not at the top: it imports RLlib (~1.6 CPU s in each collecting worker)

    q = torch.tensor([[1.0, 0.5, 0.2], [1.0, 0.98, 0.0], [0.0, 1.0, 0.0]])
    actions = torch.tensor([0, 0, 0])
    per_row = [0.0, (0.98 + 0.05) - 1.0, (1.0 + 0.05) - 0.0]
    assert margin_loss(q, actions, 0.05).item() == pytest.approx(sum(per_row) / 3)
    assert margin_loss(q[:1], actions[:1], 0.05).item() == 0.0
    # The gradient raises the demonstrated action and lowers the one that beats it.
    q = q.clone().requires_grad_(True)
    margin_loss(q, actions, 0.05).backward()
    assert q.grad[2, 0] < 0 < q.grad[2, 1]


def test_demonstrations_file_round_trips_and_bad_files_are_named(tmp_path):
    path = tmp_path / "demonstrations.npz"
    observations = np.arange(2 * 10 * 20, dtype=np.float32).reshape(2, 10, 20)
    save_demonstrations(path, observations, np.array([3, 1]))
    x, y = load_demonstrations(path, action_count=4)
    assert x.shape == (2, 200) and y.tolist() == [3, 1]
    with pytest.raises(ValueError, match="outside 0..1"):
        load_demonstrations(path, action_count=2)
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="unreadable demonstrations .*bad.npz"):
        load_demonstrations(tmp_path / "bad.npz")


@pytest.mark.parametrize(("settings", "message"), [
    ({"margin": 0}, "margin must be a positive"), ({"weight": -1}, "weight must be a non-negative"),
    ({"batch_size": True}, "batch_size must be a positive integer"),
])
def test_loss_settings_are_checked(settings, message):
    with pytest.raises(ValueError, match=f"demonstrations.{message}"):
        validate_agent({"algorithm": "dqn", "demonstrations": settings})


def _found(problem, action_set, actions, gflops):
    """What a measured search returns: the schedule its path reaches, the path, its speed."""
    state = State(initial_nest(problem), 0)
    for name in actions:
        if name in action_set.names:
            state = action_set.apply(state, action_set.index(name)) or state
    return tuner.Answer(ScheduleRecord(state.nest, gflops, tuple(actions), budget_s=0.5), "measured", 1.0, 1.0, 1, 0.0, None)


@pytest.mark.parametrize(("names", "gflops", "taken"), [
    (("down", "down", "split_8"), 1e9, True),        # faster, in the action set, fits the episode
    (("down", "down", "split_8"), 1e-9, False),      # slower than the planner's tile
    (("down", "split_5"), 1e9, False),               # an action the agent does not have
    (("down", "up") * 6, 1e9, False),                # leaves no step to stay in a 12-action episode
])
def test_expert_demonstration_takes_the_search_only_when_it_is_faster_and_replayable(monkeypatch, names, gflops, taken):
    problem = matmul(m=32, n=32, k=32)
    actions = ActionSet.for_target(Target.resolve("avx2"), (4, 8, 16), 10)
    evaluator = Evaluator(":memory:", 0.001, target="avx2", samples=1)
    monkeypatch.setattr(tuner, "measured_search", lambda *args: _found(problem, actions, names, gflops))
    demo, from_search = demos.expert_demonstration(problem, actions, evaluator, 12, policy=object(), search_budget_s=0.5)
    assert from_search == taken
    if taken:
        assert demo.actions == tuple(actions.as_index(n) for n in names) and demo.gflops == gflops
        assert all(t.valid for t in replay(actions, State(initial_nest(problem), 0), math.nan, demo.actions))
    else:
        assert demo == demos.demonstrate(problem, actions, evaluator, 12)
    # Without a search budget the planner's tile is the demonstration.
    assert demos.expert_demonstration(problem, actions, evaluator, 12, policy=object(), search_budget_s=0)[1] is False


def test_a_searched_path_is_replayed_without_its_no_ops_and_must_reach_the_searched_schedule():
    problem = matmul(m=32, n=32, k=32)
    actions = ActionSet.for_target(Target.resolve("avx2"), (4, 8, 16), 10)
    root = initial_nest(problem)
    # "up" at the first loop does nothing: left out of the demonstration.
    found = _found(problem, actions, ("up", "down", "split_8"), 1.0)
    assert demos.replayed_path(problem, actions, found.actions, 12, found.nest.key) == (actions.index("down"), actions.index("split_8"))
    # A path that does not reach the schedule the search measured is no demonstration.
    assert demos.replayed_path(problem, actions, ("down",), 12, found.nest.key) is None
    assert demos.replayed_path(problem, actions, (), 12, root.key) == ()
    assert demos.replayed_path(problem, actions, ("split_5",), 12, root.key) is None


def test_a_tune_expert_takes_tunes_own_budget(monkeypatch):
    problem = matmul(m=32, n=32, k=32)
    actions = ActionSet.for_target(Target.resolve("avx2"), (4, 8, 16), 10)
    evaluator = Evaluator(":memory:", 0.001, target="avx2", samples=1)
    budgets = []

    def search(policy, problem_, evaluator_, steps, budget_s, threads, started):
        budgets.append((budget_s, threads))
        return _found(problem, actions, ("down", "down", "split_8"), 1e9)

    monkeypatch.setattr(tuner, "measured_search", search)
    assert demos.expert_demonstration(problem, actions, evaluator, 12, policy=object(), search_budget_s=None)[1] is True
    assert budgets == [(None, 1)]  # None: tune's scaled budget, one thread


@pytest.mark.parametrize(("pretrain", "message"), [
    ({"policy": "checkpoints/apex-dqn-models/policy", "expert": "tune"}, "cannot go with pretrain.expert: tune"),
    ({"rounds": 2}, "pretrain.rounds is for pretrain.expert: tune"),
    ({"expert": "planner", "expert_policy": "x"}, "pretrain.expert_policy is for pretrain.expert: tune"),
    ({"expert": "search"}, "pretrain.expert must be one of"),
])
def test_pretrain_expert_settings_are_checked(pretrain, message):
    with pytest.raises(ValueError, match=message):
        validate_agent({"algorithm": "dqn", "pretrain": pretrain})


def test_a_dqfd_learner_trains_with_the_margin_loss_and_reports_agreement(ray_session, tmp_path):
    from looprl.train.learners import build_config
    from tests.train.test_train import tiny_agent

    agent = tiny_agent("apex-dqn", str(tmp_path / "cache.sqlite"))
    agent["demonstrations"] = {"margin": 0.05, "weight": 1.0, "batch_size": 8}
    rng = np.random.default_rng(0)
    path = tmp_path / "demonstrations.npz"
    save_demonstrations(path, rng.random((40, 10, 20), dtype=np.float32), rng.integers(0, 7, 40))
    with pytest.raises(ValueError, match="no demonstrations file"):
        build_config(agent, seed=1, num_env_runners=0)
    built = build_config(agent, seed=1, num_env_runners=0, demonstrations=path).build_algo()
    try:
        agreements = [built.train()["learners"]["default_policy"].get("demonstration_agreement") for _ in range(3)]
    finally:
        built.stop()
    measured = [a for a in agreements if a is not None]
    assert measured and all(0.0 <= a <= 1.0 for a in measured)
    assert not math.isnan(measured[-1])


def test_demonstrations_need_dqn():
    from looprl.train.config import load_agent

    agent = load_agent("ppo")
    agent["demonstrations"] = {"margin": 0.05}
    with pytest.raises(ValueError, match="'demonstrations' section needs algorithm dqn"):
        validate_agent(agent)


@pytest.mark.slow
def test_a_dqfd_run_gathers_demonstrations_repeats_expert_iteration_and_ships_an_honest_record(ray_session, tmp_path, capsys):
    """A run with pretrain and demonstrations sections, end to end: the clone it starts from,
    the expert iteration's rounds, the record shipped (the command line run in this process, on
    the process's Ray; a run with a pretrain section alone is this run without the demonstrations)."""
    import json

    import yaml

    from looprl.policy.numpy_policy import Policy
    from looprl.train.ship import ship
    from tests.train.test_train import tiny_agent, train_here

    agent = tiny_agent("dqn", str(tmp_path / "cache.sqlite"))
    agent["pretrain"] = {"problems_per_dataset": 2, "epochs": 20}
    agent["demonstrations"] = {"problems_per_dataset": 2, "search_budget_s": 0.05, "rounds": 2, "round_iterations": 1, "batch_size": 8}
    config = tmp_path / "dqfd.yaml"
    config.write_text(yaml.safe_dump(agent))
    run = tmp_path / "run"
    out = train_here(capsys, "--algo", "dqn", "--config", str(config), "--iterations", "2", "--out", str(run), "--num-env-runners", "0",
                       "--validate-every", "1", "--validation-problems", "2")
    assert "[demonstrations] 2/2 problems" in out and "round 2 of expert iteration" in out and "[iter 2/2]" in out
    # The pretrain section: the run starts from its clone, which competes in validation (RL keeps it
    # unless a snapshot validates better). A run with a pretrain section alone takes the same
    # path without the demonstrations (looprl/train/run.py: execute).
    assert "[clone]" in out and "validation of the starting policy" in out
    assert Policy.load(run / "pretrained").metadata["pretrained"]["problems"] == 2
    best = Policy.load(run / "policy-best").metadata["validation"]
    assert best["iteration"] in (0, 1, 2) and best["speedup_geomean"] > 0
    summary = json.loads((run / "demonstrations.json").read_text())
    assert [r["round"] for r in summary["rounds"]] == [1, 2] and all(r["pairs"] >= 2 for r in summary["rounds"])
    x, y = load_demonstrations(run / "demonstrations.npz")
    assert len(y) == summary["rounds"][-1]["pairs"]
    assert (run / "pretrained" / "policy.json").exists() and (run / "demonstrations-clone" / "policy.json").exists()
    arguments = json.loads((run / "run.json").read_text())["arguments"]
    assert arguments["demonstration_round"] == 2 and arguments["start_validation"] > 0
    assert arguments["init_from"] == str(run / "pretrained")
    import csv

    rows = list(csv.DictReader((run / "metrics.csv").open()))
    assert [int(r["iteration"]) for r in rows] == [1, 2] and 0 <= float(rows[-1]["demonstration_agreement"]) <= 1

    shipped = ship(run, tmp_path / "shipped", config=str(config))
    assert not (shipped / "checkpoints").exists() and (shipped / "pretrained" / "policy.json").exists()
    record = Policy.load(shipped / "policy").metadata["training"]
    assert record["started_from"] == arguments["init_from"] and record["starting_validation"] == arguments["start_validation"]
    # the record lists the rounds the shipped snapshot was trained with: round 2 starts after iteration 1
    assert record["rl_iterations"] in (0, 1, 2)
    used = [r["round"] for r in record["demonstrations"]["rounds"]]
    assert used == ([1, 2] if record["rl_iterations"] == 2 else [1])
    assert ("later_rounds" in record["demonstrations"]) == (used == [1])
    assert record["reproduce"].startswith(f"python -m looprl.train --config {config}")

    clone = ship(run, tmp_path / "clone", config=str(config), snapshot="pretrained")  # the starting clone instead
    import numpy as np

    shipped_weights, start_weights = np.load(clone / "policy" / "policy.npz"), np.load(run / "pretrained" / "policy.npz")
    assert sorted(shipped_weights.files) == sorted(start_weights.files)
    assert all(np.array_equal(shipped_weights[k], start_weights[k]) for k in start_weights.files)
    clone_record = Policy.load(clone / "policy").metadata["training"]
    assert clone_record["rl_iterations"] == 0 and "no RL" in clone_record["algorithm"] and clone_record["demonstrations"]["problems"] == 2
    with pytest.raises(ValueError, match="snapshot must be one of"):
        ship(run, tmp_path / "other", snapshot="newest")


def test_rounds_and_settings_are_checked():
    assert rounds({}) == (1, None)
    assert rounds({"demonstrations": {"rounds": 3, "round_iterations": 40}}) == (3, 40)
    assert section_settings({"demonstrations": {"margin": 0.1}}, "demonstrations")["problems_per_dataset"] == 200
    for section, message in [({"rounds": 2}, "round_iterations must be a positive integer"),
                             ({"rounds": 0}, "rounds must be a positive integer"),
                             ({"search_budget_s": -1}, "search_budget_s must be a non-negative"),
                             ({"margin": 0.05, "epochs": 3}, "unknown settings \\['epochs'\\]")]:
        with pytest.raises(ValueError, match=message):
            validate_agent({"algorithm": "dqn", "demonstrations": section})


def test_summary_rounds_reads_both_layouts_of_demonstrations_json():
    assert demos.summary_rounds({"settings": {"rounds": 2}, "rounds": [{"round": 1, "pairs": 3}]}) == [{"round": 1, "pairs": 3}]
    assert demos.summary_rounds({"problems": 4, "pairs": 9, "settings": {}}) == [{"round": 1, "problems": 4, "pairs": 9}]


def test_validation_and_demonstrations_draw_each_training_dataset_equally():
    from looprl.train.validation import spread_over_datasets
    from looprl.workloads.datasets import dataset_problems

    agent = {"env": {"dataset": ["models", "mm64-256", "gemm-shapes"], "split": "train"}}
    problems = spread_over_datasets(agent, 4)
    for name in ("models", "mm64-256", "gemm-shapes"):
        assert len(set(problems) & set(dataset_problems(name, "train"))) == 4
    assert spread_over_datasets({"env": {"problems": ["16x16x16", "8x8x8"]}}, 5) == [matmul(16, 16, 16), matmul(8, 8, 8)]


def test_demonstrations_are_kept_as_found_and_an_interrupted_gathering_goes_on(monkeypatch, tmp_path):
    agent = {"algorithm": "dqn", "env": {"problems": ["32x32x32", "48x40x24", "16x64x32"], "cache": ":memory:",
                                         "split_factors": [4, 8, 16], "episode_length": 12}}
    problems = [matmul(m=32, n=32, k=32), matmul(m=48, n=40, k=24), matmul(m=16, n=64, k=32)]
    calls = []
    real = demos.expert_demonstration

    def counted(problem, *args):
        calls.append(problem.name)
        if len(calls) == 3 and interrupt:
            raise KeyboardInterrupt
        return real(problem, *args)

    monkeypatch.setattr(demos, "expert_demonstration", counted)
    progress = tmp_path / "progress.json"
    interrupt = True
    with pytest.raises(KeyboardInterrupt):
        demos.expert_demonstrations(agent, problems, progress=progress, log=lambda *_: None)
    assert len(json.loads(progress.read_text())["demonstrations"]) == 2
    interrupt, calls[:] = False, []
    found, summary = demos.expert_demonstrations(agent, problems, progress=progress, log=lambda *_: None)
    assert calls == [problems[2].name]  # only the problem the interruption cut off
    assert [d.problem for d in found] == problems and summary["problems"] == 3
    progress.write_text("{not json")
    with pytest.raises(ValueError, match="unreadable demonstrations in progress"):
        demos.expert_demonstrations(agent, problems, progress=progress, log=lambda *_: None)


def test_pretraining_with_tune_as_the_expert_clones_its_answers_round_after_round(tmp_path):
    from looprl.policy.numpy_policy import Policy

    agent = {"algorithm": "dqn", "env": {"problems": ["32x32x32", "48x40x24"], "cache": ":memory:", "target": "avx2",
                                         "split_factors": [4, 8, 16, 6, 24], "episode_length": 16, "layouts": True},
             "model": {"fcnet_hiddens": [32]},
             "pretrain": {"expert": "tune", "expert_policy": "checkpoints/apex-dqn-dqfd-avx2/policy", "rounds": 2,
                          "problems_per_dataset": 2, "epochs": 30}}
    run = tmp_path / "run"  # does not exist yet: pretraining makes it
    policy = demos.pretrain_policy(agent, log=lambda *_: None, run_path=run)
    assert isinstance(policy, Policy) and policy.metadata["episode_length"] == 16
    record = policy.metadata["pretrained"]
    assert [r["round"] for r in record["rounds"]] == [1, 2] and record["expert_policy"] == "checkpoints/apex-dqn-dqfd-avx2/policy"
    summary = json.loads((run / "demonstrations.json").read_text())
    assert summary["rounds"] == record["rounds"]
    x, y = load_demonstrations(run / "demonstrations.npz")
    assert len(y) == record["rounds"][-1]["pairs"]
    for number in (1, 2):
        found = json.loads((run / f"pretrain-round{number}.json").read_text())["demonstrations"]
        assert [d["problem"] for d in found] == ["mk,kn->mn:m=32,k=32,n=32", "mk,kn->mn:m=48,k=24,n=40"]


def test_a_later_round_keeps_each_problems_faster_demonstration(monkeypatch):
    agent = {"algorithm": "dqn", "env": {"problems": ["32x32x32"], "cache": ":memory:", "split_factors": [4, 8, 16]}}
    problems = [matmul(m=32, n=32, k=32), matmul(m=48, n=40, k=24)]
    earlier = [demos.Demonstration(problems[0], (1,), 50.0, 10.0), demos.Demonstration(problems[1], (1,), 5.0, 10.0)]
    monkeypatch.setattr(demos, "expert_demonstration", lambda problem, *args: (demos.Demonstration(problem, (1, 1), 20.0, 10.0), True))
    found, summary = demos.expert_demonstrations(agent, problems, earlier=earlier, log=lambda *_: None)
    assert [d.gflops for d in found] == [50.0, 20.0] and summary["earlier_kept"] == 1
    with pytest.raises(ValueError, match="other problems"):
        demos.expert_demonstrations(agent, problems[:1], earlier=earlier, log=lambda *_: None)
