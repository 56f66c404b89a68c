"""Training's inputs (issues 38 and 39): the agent YAML checked whole against one schema before
anything runs, a run folder's ``run.json`` checked as it is read, and nothing read or
unpickled from outside a run folder. No test here starts Ray or trains."""

import contextlib
import copy
import io
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from looprl.cli.train import main
from looprl.policy.numpy_policy import Policy
from looprl.train import run as training
from looprl.train.config import ALGORITHMS, load_agent
from looprl.train.demonstrations import starting_policy
from looprl.train.evaluate import resolve_policy
from looprl.train.run_folder import RunDirectory, RunState
from looprl.train.schema import ENV, SECTIONS, TRAINING, key_text, section_settings, validate_agent
from tests.policies import random_policy
from tests.train.test_train import tiny_agent

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = {path.name: yaml.safe_load(path.read_text()) for path in sorted((ROOT / "agents").glob("*.yaml"))}


def cli(*arguments) -> tuple[int, str]:
    """``looprl-train`` in this process: its exit status and what it wrote to stderr."""
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors):
        status = main([str(a) for a in arguments])
    return status, errors.getvalue()


def assert_refused(status: int, errors: str, *fragments: str) -> None:
    lines = errors.splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith("looprl-train: error: "), errors
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def write_yaml(path: Path, agent) -> Path:
    path.write_text(yaml.safe_dump(agent, sort_keys=False))
    return path


# -- the agent YAML: one schema, checked before anything is written ------------------------------


def test_every_shipped_agent_file_is_accepted_as_it_is():
    for name, agent in SHIPPED.items():
        validate_agent(agent, name)
    assert set(ALGORITHMS) <= {name.removesuffix(".yaml") for name in SHIPPED}


def test_the_env_section_takes_exactly_the_env_s_arguments():
    import inspect

    from looprl.env.loopnest_env import LoopNestEnv

    assert set(ENV.settings) == set(inspect.signature(LoopNestEnv).parameters)


def _set(agent: dict, path: tuple, value) -> dict:
    agent = copy.deepcopy(agent)
    parent = agent
    for key in path[:-1]:
        parent = parent.setdefault(key, {})
    parent[path[-1]] = value
    return agent


@pytest.mark.parametrize("path, value, key", [
    (("model", "fcnet_hiddens"), "big", "model.fcnet_hiddens"),
    (("env_runners", "num_env_runners"), "two", "env_runners.num_env_runners"),
    (("training", "no_such_key"), 1, "training.no_such_key"),
    (("training", "gamma"), float("nan"), "training.gamma"),
    (("training", "train_batch_size"), 0, "training.train_batch_size"),
    (("training", "replay_buffer_config", "capacity"), -5, "training.replay_buffer_config.capacity"),
    (("training", "lr"), float("inf"), "training.lr"),
    (("model", "fcnet_hiddens"), [256, "wide"], "model.fcnet_hiddens[1]"),
    (("run", "iterations"), 2.5, "run.iterations"),
])
def test_a_bad_agent_yaml_is_one_line_naming_the_key_and_writes_nothing(tmp_path, monkeypatch, path, value, key):
    """Issue 38 item 5: these were tracebacks (IndexError, TypeError, AssertionError,
    ZeroDivisionError) or an iteration trained on NaN, with agent.yaml and run.json left in --out."""
    monkeypatch.setattr(training, "start_algorithm", _no_ray)
    config = write_yaml(tmp_path / "bad.yaml", _set(tiny_agent("dqn", ":memory:"), path, value))
    out = tmp_path / "run"
    status, errors = cli("--config", config, "--out", out, "--iterations", "1")
    assert_refused(status, errors, str(config), key)
    assert not out.exists()


def _no_ray(*args, **kwargs):
    raise AssertionError("Ray was started for a run that should have been refused")


def test_a_refused_agent_yaml_never_imports_ray(tmp_path):
    config = write_yaml(tmp_path / "bad.yaml", _set(tiny_agent("dqn", ":memory:"), ("training", "gamma"), float("nan")))
    code = ("import sys; from looprl.cli.train import main; status = main(sys.argv[1:]);"
            "print('ray' in sys.modules, 'torch' in sys.modules); sys.exit(status)")
    result = subprocess.run([sys.executable, "-c", code, "--config", str(config), "--out", str(tmp_path / "run")],
                            capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert result.returncode == 2 and "training.gamma" in result.stderr, result.stderr
    assert result.stdout.split() == ["False", "False"]


def test_cross_key_rules_name_both_keys():
    dqn = load_agent("dqn")
    with pytest.raises(ValueError, match=r"training\.n_step.*for algorithm ppo"):
        validate_agent(_set(dqn, ("algorithm",), "ppo"))
    with pytest.raises(ValueError, match=r"demonstrations\.round_iterations .* demonstrations\.rounds"):
        validate_agent(_set(dqn, ("demonstrations",), {"rounds": 2}))
    ppo = load_agent("ppo")
    with pytest.raises(ValueError, match=r"training\.minibatch_size .* training\.train_batch_size_per_learner"):
        validate_agent(_set(ppo, ("training", "minibatch_size"), 10_000))
    with pytest.raises(ValueError, match=r"training\.epsilon"):
        validate_agent(_set(dqn, ("training", "epsilon"), [[10, 1.0], [20, 0.05]]))  # a schedule starts at 0


def test_the_manual_names_every_key_of_the_schema():
    manual = (ROOT / "docs" / "training.md").read_text()
    keys = {key for section in (*SECTIONS.values(), *TRAINING.values()) for key in section.settings}
    keys |= set(TRAINING["dqn"].settings["replay_buffer_config"].settings) | set(SECTIONS)
    assert not {key for key in keys if f"`{key}`" not in manual}


def test_section_defaults_fill_in_what_a_file_leaves_out():
    assert section_settings({}, "run") == {"iterations": 100, "checkpoint_every": 5, "validate_every": 25, "validation_problems": 64}
    assert section_settings({"run": {"iterations": 3}}, "run")["iterations"] == 3
    assert section_settings({}, "model")["fcnet_hiddens"] == [256, 256]


# -- fuzz: random mutations of the shipped agent files --------------------------------------------


def _key_paths(value, prefix=()) -> list[tuple]:
    """Every key path in a nested mapping (list items by index)."""
    paths = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        paths.append((*prefix, key))
        paths.extend(_key_paths(item, (*prefix, key)))
    return paths


def _dotted(path: tuple) -> str:
    """The key's dotted path as error messages write it, up to its last mapping key (a list
    item may be named by its list)."""
    keys = []
    for key in path:
        if isinstance(key, int):
            break
        keys.append(key_text(key))
    return ".".join(keys)


KNOWN_KEYS = sorted({key for section in (*SECTIONS.values(), *TRAINING.values()) for key in section.settings} | set(SECTIONS))
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-10, 600), st.integers(-(10**15), 10**15),
    st.floats(allow_nan=True, allow_infinity=True), TEXT,
    st.sampled_from(["relu", "auto", "dqn", "ppo", "avx2", "train", "normalized", "EpisodeReplayBuffer", "mm64-256"]),
    st.lists(st.integers(-5, 600), max_size=4), st.lists(st.lists(st.floats(0, 2), max_size=3), max_size=3),
    st.dictionaries(TEXT, st.integers(), max_size=2),
)


@st.composite
def mutated_agents(draw):
    """(shipped file, its agent with one key replaced, added or removed, the key's dotted path)."""
    name = draw(st.sampled_from(sorted(SHIPPED)))
    agent = copy.deepcopy(SHIPPED[name])
    paths = _key_paths(agent)
    action = draw(st.sampled_from(["replace", "add", "remove"]))
    if action == "add":
        parent = draw(st.sampled_from([()] + [p for p in paths if isinstance(_at(agent, p), dict)]))
        path = (*parent, draw(st.one_of(st.sampled_from(KNOWN_KEYS), TEXT.filter(bool))))
    else:
        path = draw(st.sampled_from(paths))
    container = _at(agent, path[:-1])
    if action == "remove":
        del container[path[-1]]
    else:
        container[path[-1]] = draw(VALUES)
    return name, agent, _dotted(path)


def _at(agent, path):
    for key in path:
        agent = agent[key]
    return agent


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_agents())
def test_fuzz_a_mutated_agent_file_is_accepted_or_refused_naming_the_key_and_then_nothing_is_written(case):
    name, agent, key = case
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary)
        config = folder / name  # written by libyaml's emitter where it is built (Python's took ~4 ms an example)
        config.write_text(yaml.dump(agent, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False))
        # What the command reads, by libyaml's parser where it is built (Python's took ~10 ms an
        # example; both build the same objects from the same resolvers)
        as_read = yaml.load(config.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        try:
            validate_agent(as_read, str(config))
        except ValueError as error:
            message = str(error)
            assert "\n" not in message and message.startswith(str(config)) and key in message, (key, message)
        else:
            return  # accepted: the run would start
        out = folder / "run"
        status, errors = cli("--config", config, "--out", out, "--iterations", "1")
        assert_refused(status, errors, key)
        assert not out.exists()


# -- run.json: checked as it is read --------------------------------------------------------------


def unstarted_run(folder: Path) -> RunDirectory:
    run = RunDirectory(folder)
    run.create(tiny_agent("dqn", ":memory:"), {"algo": "dqn", "seed": 0, "num_env_runners": 0})
    return run


@pytest.mark.parametrize("record, fragment", [
    ([1, 2, 3], "expected an object with 'arguments' and 'state'"),
    ({"arguments": {"algo": "dqn", "seed": 0}, "state": {"iteration": 0, "env_steps": 0, "elapsed_s": 0, "checkpoint": None, "x": 1}},
     "state.x"),
    ({"arguments": {"algo": "dqn", "seed": 0}, "state": {"iteration": -1, "env_steps": 0, "elapsed_s": 0, "checkpoint": None}},
     "state.iteration"),
    ({"arguments": {"algo": "dqn"}, "state": {"iteration": 0, "env_steps": 0, "elapsed_s": 0, "checkpoint": None}},
     "arguments.seed is required"),
])
def test_a_broken_run_json_is_one_line_naming_the_file(tmp_path, record, fragment):
    """Issue 38 item 6: these were TypeError tracebacks."""
    run = unstarted_run(tmp_path / "run")
    run.record_path.write_text(json.dumps(record))
    before = sorted(p.name for p in run.path.iterdir())
    status, errors = cli("--resume", "--out", run.path)
    assert_refused(status, errors, str(run.record_path), fragment)
    assert sorted(p.name for p in run.path.iterdir()) == before and json.loads(run.record_path.read_text()) == record


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(allow_nan=True, allow_infinity=True) | TEXT,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(TEXT, children, max_size=3),
    max_leaves=8,
)
STATE_KEYS = st.sampled_from(["iteration", "env_steps", "elapsed_s", "checkpoint", "extra"])
ARGUMENT_KEYS = st.sampled_from(["algo", "seed", "num_env_runners", "config", "init_from", "start_validation", "demonstration_round", "x"])
RECORDS = st.one_of(
    JSON,
    st.fixed_dictionaries({"arguments": st.dictionaries(ARGUMENT_KEYS, JSON, max_size=4),
                           "state": st.dictionaries(STATE_KEYS, JSON | st.sampled_from(["iter_000001", "../x", "/etc"]), max_size=5)}),
)


@pytest.fixture(scope="module")
def an_unstarted_run(tmp_path_factory) -> Path:
    """A run folder as :func:`unstarted_run` creates it, made once: each example of the fuzz below
    starts from a copy (creating one read the shipped agent file and wrote its YAML each time)."""
    return unstarted_run(tmp_path_factory.mktemp("unstarted") / "run").path


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record=RECORDS, not_utf8=st.booleans())
def test_fuzz_run_json_is_read_or_refused_in_one_line_naming_the_file(an_unstarted_run, record, not_utf8):
    with tempfile.TemporaryDirectory() as folder:
        run = RunDirectory(shutil.copytree(an_unstarted_run, Path(folder) / "run", symlinks=True))
        run.record_path.write_bytes(json.dumps(record).encode() + (b"\xff" if not_utf8 else b""))
        try:
            run.record()
        except ValueError as error:
            assert str(run.record_path) in str(error)
        else:
            return  # a well-formed record: resuming it would start the run
        status, errors = cli("--resume", "--out", run.path)
        assert_refused(status, errors, str(run.record_path))


# -- nothing read or unpickled from outside the run folder -----------------------------------------


class _Trap:
    """Unpickling it creates ``marker``: what a crafted replay buffer would do instead."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.fixture
def trap(tmp_path):
    """A folder outside the run that looks like an RLlib checkpoint with a crafted replay buffer."""
    elsewhere = tmp_path / "elsewhere" / "ckpt"
    elsewhere.mkdir(parents=True)
    (elsewhere / "rllib_checkpoint.json").write_text("{}")
    marker = tmp_path / "unpickled"
    (elsewhere / "replay_buffer.pkl").write_bytes(pickle.dumps(_Trap(marker)))
    pickle.loads((elsewhere / "replay_buffer.pkl").read_bytes())
    assert marker.exists()  # the trap works
    marker.unlink()
    return elsewhere, marker


def _checkpointed_run(folder: Path, checkpoint: str) -> RunDirectory:
    run = unstarted_run(folder)
    state, arguments = run.record()
    run.save_state(RunState(iteration=1, env_steps=20, elapsed_s=1.0, checkpoint=checkpoint), arguments)
    return run


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlinked checkpoint", "symlinked checkpoints folder", "symlinked buffer",
                                 "symlink inside the checkpoint"])
def test_resume_reads_no_checkpoint_from_outside_the_run_folder(tmp_path, trap, monkeypatch, how):
    """Issue 38 item 3: run.json's state.checkpoint "../../elsewhere/ckpt" loaded that folder
    and unpickled its replay_buffer.pkl."""
    elsewhere, marker = trap
    folder = tmp_path / "runs" / "run"
    if how == "dotdot":
        run = _checkpointed_run(folder, "../../elsewhere/ckpt")
    elif how == "absolute":
        run = _checkpointed_run(folder, str(elsewhere))
    else:
        run = _checkpointed_run(folder, "iter_000001")
        if how == "symlinked checkpoint":
            (run.checkpoints / "iter_000001").symlink_to(elsewhere, target_is_directory=True)
        elif how == "symlinked checkpoints folder":
            run.checkpoints.rmdir()
            (elsewhere.parent / "iter_000001").symlink_to(elsewhere, target_is_directory=True)
            run.checkpoints.symlink_to(elsewhere.parent, target_is_directory=True)
        elif how == "symlinked buffer":
            (run.checkpoints / "iter_000001").mkdir()
            (run.checkpoints / "iter_000001" / "replay_buffer.pkl").symlink_to(elsewhere / "replay_buffer.pkl")
        else:  # RLlib's own files: learner_group/ leading elsewhere
            (run.checkpoints / "iter_000001").mkdir()
            (run.checkpoints / "iter_000001" / "learner_group").symlink_to(elsewhere, target_is_directory=True)
    monkeypatch.setattr(training, "start_algorithm", _no_ray)
    status, errors = cli("--resume", "--out", run.path)
    assert_refused(status, errors, str(run.path))
    assert not marker.exists()

    class Algo:  # restore() checks again, whoever calls it
        local_replay_buffer = None

        def restore_from_path(self, path):
            raise AssertionError(f"restored {path}")

    state = RunState(checkpoint="../../elsewhere/ckpt" if how == "dotdot" else str(elsewhere) if how == "absolute" else "iter_000001")
    with pytest.raises(ValueError):
        run.restore(Algo(), state)
    assert not marker.exists()


def test_the_run_s_own_checkpoint_and_buffer_pass_the_check(tmp_path):
    run = _checkpointed_run(tmp_path / "run", "iter_000001")
    (run.checkpoints / "iter_000001").mkdir()
    (run.checkpoints / "iter_000001" / "replay_buffer.pkl").write_bytes(pickle.dumps({"buffer": 1}))
    assert run.checkpoint_folder("iter_000001") == run.checkpoints / "iter_000001"

    class Algo:
        restored = None

        class local_replay_buffer:  # noqa: N801 (RLlib's attribute name)
            state = None

            @classmethod
            def set_state(cls, state):
                cls.state = state

        def restore_from_path(self, path):
            Algo.restored = path

    run.restore(Algo(), run.record()[0])
    assert Algo.restored == str((run.checkpoints / "iter_000001").resolve()) and Algo.local_replay_buffer.state == {"buffer": 1}


def test_an_unstarted_run_restarts_from_its_own_copy_of_the_starting_policy(tmp_path, trap):
    elsewhere, marker = trap
    run = RunDirectory(tmp_path / "run")
    agent = tiny_agent("dqn", ":memory:")
    agent["model"]["fcnet_hiddens"] = [8]
    run.create(agent, {"algo": "dqn", "seed": 0, "num_env_runners": 0, "init_from": str(elsewhere)})
    options = training.TrainOptions(out=run.path, resume=True, validate_every=0)
    with pytest.raises(ValueError, match="holds no pretrained/ policy"):
        training.prepare(options)
    policy = random_policy(hidden=8)
    policy.save(run.path / "pretrained")
    plan = training.prepare(options)
    assert plan.starting and plan.initial_policy.metadata == Policy.load(run.path / "pretrained").metadata
    assert not marker.exists()


def test_pretrain_policy_and_evaluate_read_no_checkpoint_from_elsewhere(tmp_path, trap):
    elsewhere, marker = trap
    agent = tiny_agent("dqn", ":memory:")
    with pytest.raises(ValueError, match="no policy folder there"):
        starting_policy(str(elsewhere), agent)  # pretrain.policy names policy folders only
    run = _checkpointed_run(tmp_path / "run", "iter_000001")
    (run.checkpoints / "iter_000001").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(ValueError, match="leads out of the run folder"):
        resolve_policy(run.checkpoints / "iter_000001")
    with pytest.raises(ValueError, match="no policy at"):
        resolve_policy(elsewhere)  # a checkpoint outside a run folder's checkpoints/
    assert not marker.exists()


def _crafted_checkpoint(tmp_path: Path) -> tuple[RunDirectory, Path, Path]:
    """A copied run folder whose newest checkpoint holds a crafted RLlib module pickle."""
    run = _checkpointed_run(tmp_path / "copied" / "run", "iter_000001")
    checkpoint = run.checkpoints / "iter_000001"
    module = checkpoint / "learner_group" / "learner" / "rl_module" / "default_policy"
    module.mkdir(parents=True)
    (checkpoint / "rllib_checkpoint.json").write_text("{}")
    marker = tmp_path / "unpickled"
    (module / "class_and_ctor_args.pkl").write_bytes(pickle.dumps(_Trap(marker)))
    return run, checkpoint, marker


@pytest.mark.parametrize("flag", ["--evaluate", "--init-from"])
def test_a_checkpoint_is_read_only_through_its_export_never_unpickled(tmp_path, flag):
    """Issue 51 item 8: --evaluate RUN/checkpoints/iter_000001 unpickled its
    class_and_ctor_args.pkl (code ran), then failed with a raw AttributeError."""
    run, checkpoint, marker = _crafted_checkpoint(tmp_path)
    extra = ["--limit", "1"] if flag == "--evaluate" else ["--out", tmp_path / "new", "--iterations", "1"]
    status, errors = cli(flag, checkpoint, "--cache", ":memory:", *extra)
    assert_refused(status, errors, str(checkpoint), "never unpickles")
    assert not marker.exists() and not (tmp_path / "new").exists()
    # The policy exported into the checkpoint when it was saved is what is read (plain arrays).
    random_policy(hidden=8).save(checkpoint / "looprl_policy")
    assert resolve_policy(checkpoint).metadata == Policy.load(checkpoint / "looprl_policy").metadata
    assert not marker.exists()


@pytest.mark.parametrize("address", ["auto", "ray://10.255.255.1:10001"])
def test_an_unreachable_cluster_is_one_line_and_leaves_no_run_folder(tmp_path, monkeypatch, address):
    """Issue 51 item 15: --address auto with no cluster running left agent.yaml, run.json and
    checkpoints/ in --out. Ray's own init is replaced by one that fails as it does."""
    ray = pytest.importorskip("ray")

    def unreachable(*args, **kwargs):
        raise ConnectionError("Could not find any running Ray instance.")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", unreachable)
    monkeypatch.setattr(training, "start_algorithm", _no_ray)
    config = write_yaml(tmp_path / "agent.yaml", tiny_agent("dqn", ":memory:"))
    out = tmp_path / "run"
    status, errors = cli("--config", config, "--address", address, "--out", out, "--iterations", "1", "--validate-every", "0")
    assert_refused(status, errors, f"--address {address}", "cannot attach")
    assert not out.exists()


def test_shipping_a_run_that_never_validated_says_its_policy_was_not_compared_with_its_start(tmp_path):
    """Issue 51 item 7, the training path: a run that never validated shipped its newest
    snapshot as policy/ with nothing said, though the policy it started from may be faster."""
    from looprl.train.ship import ship

    run = unstarted_run(tmp_path / "run")
    random_policy(seed=1, hidden=8).save(run.path / "pretrained")
    random_policy(seed=2, hidden=8).save(run.path / "policy")
    warnings = []
    shipped = ship(run.path, tmp_path / "shipped", warn=warnings.append)
    record = Policy.load(shipped / "policy").metadata["training"]
    assert "never validated" in record["note"] and len(warnings) == 1 and "pretrained" in warnings[0]
    # A validated run ships its best snapshot (the starting policy competes in validation) without a warning.
    best = random_policy(seed=3, hidden=8)
    Policy(dict(best.metadata, validation={"speedup_geomean": 1.5, "iteration": 2, "env_steps": 40}), best.trunk, best.heads).save(
        run.path / "policy-best")
    ship(run.path, tmp_path / "again", warn=warnings.append)
    assert len(warnings) == 1
