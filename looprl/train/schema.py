"""The agent YAML's schema: every section, every key, its type, range and allowed values.

An agent configuration (``agents/<algo>.yaml``, ``--config``, a run folder's ``agent.yaml``)
is checked here, whole, before anything runs: :func:`validate_agent` refuses a value of the
wrong type, a number out of its range (NaN and infinities included), a value that is not one
of a key's choices and a key the schema does not know, each as a ``ValueError`` naming the
key by its dotted path (``training.gamma``, ``env_runners.num_env_runners``,
``model.fcnet_hiddens[0]``). Nothing here imports Ray: checking a file costs milliseconds.

The sections:

``algorithm`` (required) and ``apex``
    RLlib's algorithm (dqn, ppo, impala, appo); ``apex: true`` (DQN only) gives each env runner
    its own fixed epsilon.
``env``
    :class:`~looprl.env.loopnest_env.LoopNestEnv`'s arguments, with the env's own defaults.
``model``, ``env_runners``, ``learners``, ``training``, ``reporting``
    passed to RLlib (``DefaultModelConfig`` and the config methods of the same names), with
    RLlib's defaults. ``training`` takes the keys of the agent's algorithm only.
``run``, ``pretrain``, ``demonstrations``
    looprl's own: the run's length and intervals, the policy a run starts from, and DQfD's
    demonstrations; their defaults are here (:func:`section_settings`).

The rules are values (:class:`Integer`, :class:`Number`, :class:`Choice`, ...), so the same
toolkit checks a run folder's ``run.json`` (:mod:`looprl.train.run_folder`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from looprl.actions.action_set import MAX_FACTOR, MIN_FACTOR
from looprl.env.loopnest_env import OBSERVATION_KINDS, ORDERS
from looprl.env.reward_model import REWARDS
from looprl.ir.dtypes import DTYPES
from looprl.target import TARGET_CHOICES
from looprl.workloads.datasets import SPLITS

RLLIB_ALGORITHMS = ("dqn", "ppo", "impala", "appo")
_SHOWN_CHARACTERS = 60  # a refused value is quoted up to this length


def shown(value: Any) -> str:
    """``value`` as an error message quotes it: its repr, on one line, shortened."""
    text = " ".join(repr(value).split())
    return text if len(text) <= _SHOWN_CHARACTERS else text[: _SHOWN_CHARACTERS - 3] + "..."


class Rule:
    """What one value must be. ``check(value, path)`` raises a ValueError that names ``path``
    (the key's dotted path) and says what the value must be."""

    def describe(self) -> str:
        raise NotImplementedError

    def accepts(self, value: Any) -> bool:
        raise NotImplementedError

    def check(self, value: Any, path: str) -> None:
        if not self.accepts(value):
            raise ValueError(f"{path} must be {self.describe()}, got {shown(value)}")


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Integer(Rule):
    """An int (not a bool) in ``least..most`` (None: unbounded on that side)."""

    least: int | None = 0
    most: int | None = None

    def describe(self) -> str:
        if self.most is not None:
            return f"an integer in {self.least}..{self.most}"
        return {None: "an integer", 0: "a non-negative integer", 1: "a positive integer"}.get(self.least, f"an integer >= {self.least}")

    def accepts(self, value: Any) -> bool:
        return (_is_integer(value) and (self.least is None or value >= self.least)
                and (self.most is None or value <= self.most))


@dataclass(frozen=True)
class Number(Rule):
    """A finite int or float (not a bool) between ``low`` and ``high`` (None: unbounded),
    each bound included unless ``low_open`` / ``high_open``."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def describe(self) -> str:
        if self.high is None and self.low == 0:
            return "a positive number" if self.low_open else "a non-negative number"
        if self.low is None and self.high is None:
            return "a finite number"
        left = "(" if self.low_open or self.low is None else "["
        right = ")" if self.high_open or self.high is None else "]"
        low = "-inf" if self.low is None else f"{self.low:g}"
        high = "inf" if self.high is None else f"{self.high:g}"
        return f"a number in {left}{low}, {high}{right}"

    def accepts(self, value: Any) -> bool:
        if not _is_real(value) or not math.isfinite(value):
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return self.high is None or not (value > self.high or (self.high_open and value == self.high))


@dataclass(frozen=True)
class Boolean(Rule):
    def describe(self) -> str:
        return "true or false"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, bool)


@dataclass(frozen=True)
class Choice(Rule):
    """One of ``values`` (compared with their type: ``1`` is not ``true``)."""

    values: tuple

    def describe(self) -> str:
        return "one of " + ", ".join("null" if v is None else str(v) for v in self.values)

    def accepts(self, value: Any) -> bool:
        return any(type(value) is type(choice) and value == choice for choice in self.values)


@dataclass(frozen=True)
class Text(Rule):
    """A non-empty string."""

    def describe(self) -> str:
        return "a non-empty string"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str) and bool(value.strip())


@dataclass(frozen=True)
class Null(Rule):
    def describe(self) -> str:
        return "null"

    def accepts(self, value: Any) -> bool:
        return value is None


@dataclass(frozen=True)
class AnyOf(Rule):
    """A value that one of ``rules`` accepts."""

    rules: tuple[Rule, ...]

    def describe(self) -> str:
        return " or ".join(rule.describe() for rule in self.rules)

    def accepts(self, value: Any) -> bool:
        return any(rule.accepts(value) for rule in self.rules)


def optional(rule: Rule) -> Rule:
    """``rule`` or null."""
    return AnyOf((Null(), rule))


@dataclass(frozen=True)
class ListOf(Rule):
    """A list of at least ``least`` items, each one ``item`` accepts (and all different when ``distinct``)."""

    item: Rule
    least: int = 1
    distinct: bool = False

    def describe(self) -> str:
        size = {0: "a list", 1: "a non-empty list"}.get(self.least, f"a list of at least {self.least} items")
        return f"{size}{', all different' if self.distinct else ''}, each {self.item.describe()}"

    def accepts(self, value: Any) -> bool:
        return self._shape_ok(value) and all(self.item.accepts(v) for v in value)

    def _shape_ok(self, value: Any) -> bool:
        if not isinstance(value, list) or len(value) < self.least:
            return False
        return not self.distinct or len({shown(v) for v in value}) == len(value)

    def check(self, value: Any, path: str) -> None:
        if not isinstance(value, list) or len(value) < self.least:
            raise ValueError(f"{path} must be {self.describe()}, got {shown(value)}")
        for index, item in enumerate(value):
            self.item.check(item, f"{path}[{index}]")
        if not self._shape_ok(value):
            raise ValueError(f"{path} must be {self.describe()}, got {shown(value)}")


@dataclass(frozen=True)
class Schedule(Rule):
    """RLlib's piecewise-linear schedule: ``[[0, value], [timestep, value], ...]``, at least two
    points, timesteps from 0 and never decreasing, each value ``value`` accepts."""

    value: Rule

    def describe(self) -> str:
        return f"a schedule [[0, value], [timestep, value], ...] (non-decreasing timesteps from 0, each value {self.value.describe()})"

    def accepts(self, value: Any) -> bool:
        if not isinstance(value, list) or len(value) < 2:
            return False
        if not all(isinstance(point, list) and len(point) == 2 and Integer(0).accepts(point[0]) and self.value.accepts(point[1])
                   for point in value):
            return False
        steps = [point[0] for point in value]
        return steps[0] == 0 and steps == sorted(steps)


@dataclass(frozen=True)
class Section(Rule):
    """A mapping of settings: ``settings`` names each key's rule; ``defaults`` the values that
    a missing key stands for where looprl itself reads the section (RLlib's sections have
    none here: RLlib fills them in); ``required`` keys must be present."""

    settings: Mapping[str, Rule]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    required: tuple[str, ...] = ()

    def describe(self) -> str:
        return "a mapping of settings"

    def accepts(self, value: Any) -> bool:
        try:
            self.check(value, "value")
        except ValueError:
            return False
        return True

    def check(self, value: Any, path: str) -> None:
        """``path``: the section's dotted path ("" for a file's top level)."""
        if not isinstance(value, dict):
            raise ValueError(f"{path or 'the file'} must be a mapping, got {shown(value)}")
        unknown = sorted(str(key) for key in value if key not in self.settings)
        if unknown:
            paths = ", ".join(_key_path(path, key) for key in unknown)
            raise ValueError(f"unknown settings {unknown} ({paths}); expected {', '.join(self.settings)}")
        for key in self.required:
            if key not in value:
                raise ValueError(f"{_key_path(path, key)} is required: {self.settings[key].describe()}")
        for key, item in value.items():
            self.settings[key].check(item, _key_path(path, key))


def _key_path(section: str, key: Any) -> str:
    return f"{section}.{key_text(key)}" if section else key_text(key)


def key_text(key: Any) -> str:
    """A key as a dotted path writes it: its characters that do not print (a control
    character, a line break) escaped, so that a message stays one readable line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(key))


POSITIVE = Integer(1)
COUNT = Integer(0)
POSITIVE_NUMBER = Number(0, low_open=True)
NON_NEGATIVE_NUMBER = Number(0)
FRACTION = Number(0, 1)
NAMES = AnyOf((Text(), ListOf(Text())))

ENV = Section({
    "dataset": NAMES,
    "split": Choice(tuple(split for split in SPLITS if split != "validation")),  # what no policy may learn from
    "problems": ListOf(Text()),
    "order": Choice(ORDERS),
    "split_factors": ListOf(Integer(MIN_FACTOR, MAX_FACTOR), distinct=True),
    "max_loops": POSITIVE,
    "episode_length": POSITIVE,
    "observation": Choice(OBSERVATION_KINDS),
    "measure_budget_s": POSITIVE_NUMBER,
    "cache": optional(Text()),
    "peak": optional(POSITIVE_NUMBER),
    "render_mode": Choice((None, "ansi")),
    "target": Choice((None, *TARGET_CHOICES)),
    "measure_samples": POSITIVE,
    "reward": Choice(REWARDS),
    "model": optional(Text()),
    "measure_fraction": FRACTION,
    "refit_every": POSITIVE,
    "layouts": Boolean(),
    "threads": POSITIVE,
    "plans": AnyOf((Boolean(), ListOf(Text(), distinct=True))),  # true: every plan of the target; or plan names
    "dtype": Choice((None, *DTYPES)),
})

# The activations RLlib's torch MLPs know that the numpy policy export reads back.
ACTIVATIONS = ("relu", "tanh", "elu", "silu", "swish", "linear")
MODEL = Section({
    "fcnet_hiddens": ListOf(POSITIVE),
    "fcnet_activation": Choice(ACTIVATIONS),
    "vf_share_layers": Boolean(),
}, defaults={"fcnet_hiddens": [256, 256]})  # RLlib's default, which the clone and warm start must match

ENV_RUNNERS = Section({
    "num_env_runners": COUNT,
    "rollout_fragment_length": AnyOf((POSITIVE, Choice(("auto",)))),
    "num_cpus_per_env_runner": POSITIVE_NUMBER,
    "sample_timeout_s": optional(POSITIVE_NUMBER),
})

LEARNERS = Section({
    "num_learners": COUNT,
    "num_aggregator_actors_per_learner": COUNT,
    "num_gpus_per_learner": NON_NEGATIVE_NUMBER,
})

REPORTING = Section({
    "min_sample_timesteps_per_iteration": COUNT,
    "min_train_timesteps_per_iteration": COUNT,
    "min_time_s_per_iteration": optional(NON_NEGATIVE_NUMBER),
    "metrics_num_episodes_for_smoothing": POSITIVE,
})

_COMMON_TRAINING = {
    "lr": POSITIVE_NUMBER,
    "gamma": FRACTION,
    "grad_clip": optional(POSITIVE_NUMBER),
    "train_batch_size": POSITIVE,
    "train_batch_size_per_learner": optional(POSITIVE),
    "num_epochs": POSITIVE,
    "minibatch_size": optional(POSITIVE),
}
REPLAY_BUFFER_TYPES = ("PrioritizedEpisodeReplayBuffer", "EpisodeReplayBuffer")
_DQN_TRAINING = {
    "n_step": POSITIVE,
    "double_q": Boolean(),
    "dueling": Boolean(),
    "target_network_update_freq": POSITIVE,
    "tau": FRACTION,
    "num_steps_sampled_before_learning_starts": COUNT,
    "store_buffer_in_checkpoints": Boolean(),
    "training_intensity": optional(POSITIVE_NUMBER),
    "adam_epsilon": POSITIVE_NUMBER,
    "epsilon": Schedule(FRACTION),
    "replay_buffer_config": Section({
        "type": Choice(REPLAY_BUFFER_TYPES),
        "capacity": POSITIVE,
        "alpha": NON_NEGATIVE_NUMBER,
        "beta": NON_NEGATIVE_NUMBER,
    }),
}
_ACTOR_CRITIC_LOSS = {"vf_loss_coeff": NON_NEGATIVE_NUMBER, "entropy_coeff": NON_NEGATIVE_NUMBER}
_CLIPPED_SURROGATE = {
    "lambda_": FRACTION,
    "clip_param": POSITIVE_NUMBER,
    "use_kl_loss": Boolean(),
    "kl_coeff": NON_NEGATIVE_NUMBER,
    "kl_target": POSITIVE_NUMBER,
}
_PPO_TRAINING = {**_ACTOR_CRITIC_LOSS, **_CLIPPED_SURROGATE, "vf_clip_param": POSITIVE_NUMBER, "use_gae": Boolean(), "use_critic": Boolean()}
_IMPALA_TRAINING = {**_ACTOR_CRITIC_LOSS, "vtrace": Boolean()}
_APPO_TRAINING = {**_IMPALA_TRAINING, **_CLIPPED_SURROGATE, "target_network_update_freq": POSITIVE, "tau": FRACTION}
TRAINING = {
    "dqn": Section({**_COMMON_TRAINING, **_DQN_TRAINING}),
    "ppo": Section({**_COMMON_TRAINING, **_PPO_TRAINING}),
    "impala": Section({**_COMMON_TRAINING, **_IMPALA_TRAINING}),
    "appo": Section({**_COMMON_TRAINING, **_APPO_TRAINING}),
}

RUN = Section({
    "iterations": POSITIVE,
    "checkpoint_every": POSITIVE,
    "validate_every": COUNT,
    "validation_problems": POSITIVE,
}, defaults={"iterations": 100, "checkpoint_every": 5, "validate_every": 25, "validation_problems": 64})

PRETRAIN = Section({
    "problems_per_dataset": POSITIVE,
    "epochs": POSITIVE,
    "lr": POSITIVE_NUMBER,
    "margin": POSITIVE_NUMBER,
    "policy": optional(Text()),
    "expert": Choice(("planner", "tune")),
    "expert_policy": optional(Text()),
    "rounds": POSITIVE,
}, defaults={"problems_per_dataset": 300, "epochs": 200, "lr": 1e-3, "margin": 0.05, "policy": None, "expert": "planner",
             "expert_policy": None, "rounds": 1})

DEMONSTRATIONS = Section({
    "problems_per_dataset": POSITIVE,
    "search_budget_s": NON_NEGATIVE_NUMBER,
    "rounds": POSITIVE,
    "round_iterations": optional(POSITIVE),
    "margin": POSITIVE_NUMBER,
    "weight": NON_NEGATIVE_NUMBER,
    "batch_size": POSITIVE,
}, defaults={"problems_per_dataset": 200, "search_budget_s": 0.5, "rounds": 1, "round_iterations": None,
             "margin": 0.05, "weight": 1.0, "batch_size": 64})
# What the DQfD learner reads of the demonstrations section (the rest is expert iteration's).
LOSS_SETTINGS = ("margin", "weight", "batch_size")

SECTIONS: dict[str, Section] = {
    "env": ENV, "model": MODEL, "env_runners": ENV_RUNNERS, "learners": LEARNERS, "reporting": REPORTING,
    "run": RUN, "pretrain": PRETRAIN, "demonstrations": DEMONSTRATIONS,
}
TOP_LEVEL = ("algorithm", "apex", "env", "model", "env_runners", "learners", "training", "reporting", "run", "pretrain", "demonstrations")


def check_agent(agent: Any) -> None:
    """Raise a ValueError naming the first key of ``agent`` that the schema refuses."""
    if not isinstance(agent, dict):
        raise ValueError(f"expected a mapping of sections, got {shown(agent)}")
    unknown = sorted(str(key) for key in agent if key not in TOP_LEVEL)
    if unknown:
        raise ValueError(f"unknown sections {unknown} ({', '.join(map(key_text, unknown))}); expected {', '.join(TOP_LEVEL)}")
    if "algorithm" not in agent:
        raise ValueError(f"algorithm is required: one of {', '.join(RLLIB_ALGORITHMS)}")
    Choice(RLLIB_ALGORITHMS).check(agent["algorithm"], "algorithm")
    algorithm = agent["algorithm"]
    Boolean().check(agent.get("apex", False), "apex")
    if agent.get("apex") and algorithm != "dqn":
        raise ValueError(f"apex: true needs algorithm dqn, not algorithm {algorithm}")
    for name, section in SECTIONS.items():
        if name in agent:
            section.check(agent[name], name)
    if "training" in agent:
        try:
            TRAINING[algorithm].check(agent["training"], "training")
        except ValueError as error:
            raise ValueError(f"{error} (for algorithm {algorithm})") from None
    _check_across_keys(agent)


def _check_across_keys(agent: dict) -> None:
    """The rules that tie one key to another."""
    algorithm = agent["algorithm"]
    if "demonstrations" in agent and algorithm != "dqn":
        raise ValueError(f"demonstrations: a 'demonstrations' section needs algorithm dqn (its margin loss acts on Q-values), "
                         f"not algorithm {algorithm}")
    demonstrations = section_settings(agent, "demonstrations")
    if demonstrations["rounds"] > 1 and demonstrations["round_iterations"] is None:
        raise ValueError(f"demonstrations.round_iterations must be a positive integer when demonstrations.rounds > 1 "
                         f"(rounds: {demonstrations['rounds']}), got None")
    pretrain = agent.get("pretrain") or {}
    if pretrain.get("policy") is not None and pretrain.get("expert", "planner") != "planner":
        raise ValueError("pretrain.policy names the policy to start from as it is: it cannot go with pretrain.expert: "
                         f"{pretrain['expert']} (which clones a new one)")
    for key in ("expert_policy", "rounds"):
        if key in pretrain and pretrain.get("expert", "planner") != "tune":
            raise ValueError(f"pretrain.{key} is for pretrain.expert: tune (expert iteration with measured tune), "
                             f"not expert: {pretrain.get('expert', 'planner')}")
    training = agent.get("training", {})
    minibatch, batch = training.get("minibatch_size"), training.get("train_batch_size_per_learner")
    if algorithm == "ppo" and minibatch is not None and batch is not None and minibatch > batch:
        raise ValueError(f"training.minibatch_size ({minibatch}) must be at most training.train_batch_size_per_learner ({batch})")


def validate_agent(agent: Any, where: str = "agent configuration") -> dict[str, Any]:
    """A copy of ``agent`` once the schema accepts all of it; else a ValueError that starts
    with ``where`` (the file) and names the key."""
    try:
        check_agent(agent)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    return copy.deepcopy(agent)


def section_settings(agent: dict[str, Any], name: str) -> dict[str, Any]:
    """Section ``name`` of a validated agent, its missing keys filled in with the schema's
    defaults (empty or absent: all defaults)."""
    section = SECTIONS[name]
    return {**copy.deepcopy(dict(section.defaults)), **copy.deepcopy(agent.get(name) or {})}
