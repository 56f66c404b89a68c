"""A trained policy as plain data: the network's weights in a numpy ``.npz`` and JSON metadata.

``Policy.load(path)`` needs neither Ray nor torch and never unpickles anything, so a policy
loads in milliseconds and is safe to read from anywhere. The network is a feed-forward
stack described in the metadata::

    "network": {
      "trunk": [{"weight": "trunk.0.weight", "bias": "trunk.0.bias", "activation": "relu"}, ...],
      "heads": {"advantages": [{"weight": ..., "bias": ..., "activation": "linear"}], ...},
      "greedy": "advantages"
    }

Optional metadata: ``target`` (the :class:`~looprl.Target` the policy was trained for, as
``Target.to_dict()``) and ``host_cpu`` (the CPU model it was trained on). A policy file
without them (older exports) is still loaded; its target is then unknown (None).

The observation is flattened, run through the trunk and then through the head named by
``greedy``; the greedy action is the argmax of that head's output (Q-values or advantages for
DQN, logits for PPO/IMPALA/APPO), optionally restricted to the valid actions.
"""

from __future__ import annotations

import contextlib
import json
import math
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from looprl.env.observation import observation
from looprl.ir.plans import Plan
from looprl.target import Target

POLICY_FORMAT = "looprl-policy"
POLICY_FORMAT_VERSION = 1
JSON_NAME, WEIGHTS_NAME = "policy.json", "policy.npz"
# The most parameters a policy file may hold: far above any network looprl trains (the shipped
# ones have ~120,000), low enough that loading one never takes much memory.
MAX_POLICY_PARAMETERS = 2**26

_ACTIVATIONS = {
    "linear": lambda x: x,
    "relu": lambda x: np.maximum(x, 0.0),
    "tanh": np.tanh,
    "swish": lambda x: x / (1.0 + np.exp(-x)),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
    "elu": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0.0))),
}


@dataclass(frozen=True)
class Dense:
    weight: np.ndarray  # (out, in), as torch stores it
    bias: np.ndarray  # (out,)
    activation: str

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return _ACTIVATIONS[self.activation](x @ self.weight.T + self.bias)


@dataclass(frozen=True)
class Policy:
    """A greedy policy for LoopNest-v0 observations; see the module docstring."""

    metadata: dict[str, Any]
    trunk: tuple[Dense, ...]
    heads: dict[str, tuple[Dense, ...]] = field(repr=False)

    # -- loading -------------------------------------------------------------------------
    @staticmethod
    def load(path: str | Path) -> "Policy":
        """Read a policy folder (``policy.json`` + ``policy.npz``) or either file of it.

        A missing, corrupt or inconsistent file is a ValueError naming that file."""
        path = Path(path)
        folder = path if path.is_dir() else path.parent
        json_path, weights_path = folder / JSON_NAME, folder / WEIGHTS_NAME
        if not json_path.exists() or not weights_path.exists():
            raise ValueError(f"no policy at {path}: expected {JSON_NAME} and {WEIGHTS_NAME} in {folder}")
        try:
            metadata = json.loads(json_path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as error:  # ValueError: bad JSON or bad UTF-8
            raise ValueError(f"unreadable policy metadata {json_path}: {error}") from error
        check_metadata(metadata, str(json_path))
        arrays = read_weights(weights_path, metadata)
        return Policy.from_arrays(metadata, arrays, metadata_source=str(json_path), weights_source=str(weights_path))

    @staticmethod
    def from_arrays(
        metadata: dict[str, Any],
        arrays: dict[str, np.ndarray],
        *,
        metadata_source: str = "policy metadata",
        weights_source: str = "policy weights",
    ) -> "Policy":
        """A policy from its metadata and named arrays, both checked; errors name
        ``metadata_source`` or ``weights_source`` (the files, when loading)."""
        check_metadata(metadata, metadata_source)
        network = metadata["network"]
        shapes = {}

        def layers(specs: list[dict[str, str]], where: str) -> tuple[Dense, ...]:
            built = []
            for position, spec in enumerate(specs):
                layer = f"{where}[{position}]"
                weight = _layer_array(arrays, spec["weight"], 2, f"{layer}.weight", weights_source)
                bias = _layer_array(arrays, spec["bias"], 1, f"{layer}.bias", weights_source)
                shapes[spec["weight"]], shapes[spec["bias"]] = weight.shape, bias.shape
                built.append(Dense(weight, bias, spec["activation"]))
            return tuple(built)

        trunk = layers(network["trunk"], "network.trunk")
        heads = {name: layers(specs, f"network.heads.{name}") for name, specs in network["heads"].items()}
        check_network_shapes(metadata, shapes, weights_source)
        return Policy(metadata, trunk, heads)

    def save(self, folder: str | Path) -> Path:
        """Write ``policy.json`` and ``policy.npz`` into ``folder`` (atomically per file)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        arrays = {}
        network = self.metadata["network"]
        for spec, layer in zip(network["trunk"], self.trunk):
            arrays[spec["weight"]], arrays[spec["bias"]] = layer.weight, layer.bias
        for name, specs in network["heads"].items():
            for spec, layer in zip(specs, self.heads[name]):
                arrays[spec["weight"]], arrays[spec["bias"]] = layer.weight, layer.bias
        temporary = folder / (WEIGHTS_NAME + ".tmp.npz")
        np.savez(temporary, **arrays)
        temporary.replace(folder / WEIGHTS_NAME)
        text = folder / (JSON_NAME + ".tmp")
        text.write_text(json.dumps(self.metadata, indent=1) + "\n", encoding="utf-8")
        text.replace(folder / JSON_NAME)
        return folder

    def with_random_weights(self, seed: int = 0) -> "Policy":
        """The same network and metadata with freshly initialised weights (uniform in
        +-1/sqrt(fan_in), torch's default for linear layers): the control of an ablation that
        asks how much of a result the trained weights carry."""
        rng = np.random.default_rng(seed)

        def fresh(layers: tuple[Dense, ...]) -> tuple[Dense, ...]:
            result = []
            for layer in layers:
                bound = 1.0 / math.sqrt(layer.weight.shape[1])
                weight = rng.uniform(-bound, bound, layer.weight.shape).astype(layer.weight.dtype)
                bias = rng.uniform(-bound, bound, layer.bias.shape).astype(layer.bias.dtype)
                result.append(Dense(weight, bias, layer.activation))
            return tuple(result)

        metadata = dict(self.metadata, random_weights_seed=int(seed))
        return Policy(metadata, fresh(self.trunk), {name: fresh(layers) for name, layers in self.heads.items()})

    # -- acting ------------------------------------------------------------------------------
    @property
    def observation_shape(self) -> tuple[int, int]:
        return tuple(self.metadata["observation_shape"])

    @property
    def action_names(self) -> tuple[str, ...]:
        return tuple(self.metadata["action_names"])

    @property
    def observation_kind(self) -> str:
        """``"raw"`` or ``"normalized"``: the observations the policy was trained on."""
        return self.metadata["observation"]

    def observe(self, nest, cursor: int, max_loops: int) -> np.ndarray:
        """The observation of the state ``nest`` with the cursor on loop ``cursor`` (of an action
        set of ``max_loops`` loops at most) as this policy was trained to read it
        (:attr:`observation_kind`: :func:`~looprl.env.observation.observation`)."""
        return observation(nest, cursor, max_loops, self.observation_kind == "normalized")

    @property
    def target(self) -> Target | None:
        """The target the policy was trained for, or None if its file does not say."""
        described = self.metadata.get("target")
        return None if described is None else Target.from_dict(described)

    @property
    def env_kwargs(self) -> dict[str, Any]:
        """The ``LoopNest-v0`` keyword arguments of the env this policy acts in, from its
        metadata: ``gym.make("LoopNest-v0", **policy.env_kwargs)`` gives observations of the
        policy's kind and shape and the policy's actions, in its order. Also the problems it
        was trained on (``dataset``/``split`` or ``problems``, and their ``dtype`` where one was set) and its target's ISA (the
        named target, so the env's code runs on any host with that ISA; a policy without a
        target: the host's) when its file records them. Override any of them by keyword
        after the unpacking (``problems=...``, ``cache=...``, ``target=...``)."""
        meta = self.metadata
        kwargs: dict[str, Any] = {
            "split_factors": list(meta["split_factors"]),
            "max_loops": self.observation_shape[0],
            "episode_length": meta["episode_length"],
            "observation": self.observation_kind,
            "layouts": bool(meta.get("layouts", False)),
        }
        if meta.get("parallel"):  # the parallel action exists with threads > 1; older files may not say how many
            kwargs["threads"] = meta.get("threads", 2)
        if meta.get("plans"):
            kwargs["plans"] = list(meta["plans"])
        trained_on = meta.get("training_problems")
        if isinstance(trained_on, dict) and "dataset" in trained_on:
            kwargs["dataset"] = trained_on["dataset"]
            kwargs["split"] = trained_on.get("split", "train")
        elif isinstance(trained_on, list) and trained_on:
            kwargs["problems"] = list(trained_on)
        if meta.get("dtype") is not None:
            kwargs["dtype"] = meta["dtype"]
        if self.target is not None:
            kwargs["target"] = self.target.isa
        return kwargs

    def check_observation(self, observation: np.ndarray) -> None:
        """ValueError if ``observation`` (one, or a batch) is visibly of the other kind than
        the policy's: both kinds have the same shape, and a policy fed the wrong one would
        silently act on garbage. Column 1 is a loop's trip count: an integer >= 1 in a raw
        observation, ``log2(1 + n) / 8`` in a normalized one (an integer only for n = 255 or
        65535), and 0 on the padding rows; so a raw observation has only integer trip counts
        and a normalized one almost never does."""
        obs = np.asarray(observation)
        trips = obs[..., 1].ravel()
        trips = trips[trips != 0]
        if trips.size == 0:
            return
        looks_raw = bool(np.all(trips == np.round(trips)))
        if looks_raw and self.observation_kind == "normalized" and np.any(trips > 2):
            raise ValueError(
                "this policy takes normalized observations but was given raw ones (integer trip counts); "
                "make the env with observation='normalized' (LoopNest-v0's default is 'raw')"
            )
        if not looks_raw and self.observation_kind == "raw":
            raise ValueError("this policy takes raw observations but was given normalized ones; make the env with observation='raw'")

    def scores(self, observation: np.ndarray) -> np.ndarray:
        """The greedy head's output (Q-values, advantages or logits) for one observation
        ``(max_loops, 20)`` or a batch ``(B, max_loops, 20)``."""
        obs = np.asarray(observation, dtype=np.float32)
        batched = obs.ndim == len(self.observation_shape) + 1
        if obs.shape[-len(self.observation_shape):] != self.observation_shape:
            raise ValueError(f"observation shape {obs.shape} does not match the policy's {self.observation_shape}")
        self.check_observation(obs)
        x = obs.reshape(obs.shape[0] if batched else 1, -1)
        for layer in self.trunk:
            x = layer(x)
        for layer in self.heads[self.metadata["network"]["greedy"]]:
            x = layer(x)
        return x if batched else x[0]

    def act(self, observation: np.ndarray, mask: np.ndarray | None = None) -> int:
        """The greedy action; with ``mask`` (1 = valid) only valid actions are considered."""
        scores = self.scores(observation)
        if scores.ndim != 1:
            raise ValueError("act() takes one observation; use scores() for a batch")
        if mask is not None:
            mask = np.asarray(mask)
            if mask.shape != scores.shape:
                raise ValueError(f"mask shape {mask.shape} does not match {scores.shape[0]} actions")
            if not mask.any():
                raise ValueError("mask allows no action")
            scores = np.where(mask.astype(bool), scores, -np.inf)
        return int(np.argmax(scores))



def check_network_shapes(metadata: dict[str, Any], shapes: dict[str, tuple[int, ...]], where: str = "policy weights") -> None:
    """That the arrays' ``shapes`` (by name; weights 2-D, biases 1-D) make the network the
    (checked) ``metadata`` declares: each layer takes the width the one before gives (the
    flattened observation first), and the greedy head gives one output per action; else a
    ValueError starting with ``where``."""
    network = metadata["network"]
    width = int(math.prod(metadata["observation_shape"]))
    for position, spec in enumerate(network["trunk"]):
        width = _chain(shapes[spec["weight"]], shapes[spec["bias"]], width, f"network.trunk[{position}]", where)
    outputs = {}
    for name, specs in network["heads"].items():
        inner = width
        for position, spec in enumerate(specs):
            inner = _chain(shapes[spec["weight"]], shapes[spec["bias"]], inner, f"network.heads.{name}[{position}]", where)
        outputs[name] = inner
    greedy, actions = network["greedy"], len(metadata["action_names"])
    if outputs[greedy] != actions:
        raise ValueError(f"{where}: the greedy head {greedy!r} has {outputs[greedy]} outputs for {actions} actions")


def _chain(weight: tuple[int, ...], bias: tuple[int, ...], width: int, name: str, where: str) -> int:
    """The output width of a layer of these shapes after an input of ``width``; a ValueError if it does not fit."""
    rows, columns = weight
    if columns != width or tuple(bias) != (rows,):
        raise ValueError(f"{where}: layer shapes do not chain at {name}: weight {tuple(weight)} and bias {tuple(bias)} after width {width}")
    return rows


# -- checking files ----------------------------------------------------------------------------
_REQUIRED_KEYS = ("observation_shape", "action_names", "split_factors", "episode_length", "observation", "network")
_OBSERVATIONS = ("raw", "normalized")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_positive_int_list(value: Any) -> bool:
    return isinstance(value, list) and all(_is_int(item) and item > 0 for item in value)


def _kind(value: Any) -> str:
    """The JSON name of a value's type, for messages."""
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def check_metadata(metadata: Any, where: str = "policy metadata") -> None:
    """Check the structure and types of a policy's metadata (not its arrays); a ValueError
    starting with ``where`` names the first problem."""

    def fail(problem: str) -> NoReturn:
        raise ValueError(f"{where}: {problem}")

    if not isinstance(metadata, dict):
        fail(f"expected a JSON object, got {_kind(metadata)}")
    version = metadata.get("format_version")
    if metadata.get("format") != POLICY_FORMAT or not _is_int(version) or version != POLICY_FORMAT_VERSION:
        fail(f"not a {POLICY_FORMAT} v{POLICY_FORMAT_VERSION} file (format {metadata.get('format')!r}, format_version {version!r})")
    for key in _REQUIRED_KEYS:
        if key not in metadata:
            fail(f"missing key {key!r}")
    shape = metadata["observation_shape"]
    if not _is_positive_int_list(shape) or len(shape) != 2:
        fail(f"observation_shape must be two positive integers, got {shape!r}")
    names = metadata["action_names"]
    if not isinstance(names, list) or not names or not all(isinstance(name, str) and name for name in names):
        fail(f"action_names must be a non-empty list of names, got {names!r}")
    if len(set(names)) != len(names):
        fail(f"action_names repeat a name: {names!r}")
    plans = metadata.get("plans", [])
    if not isinstance(plans, list) or not all(Plan.parse(plan) is not None for plan in plans):
        fail(f"plans must be a list of plan names (plan_...), got {plans!r}")
    if plans and names[-len(plans):] != plans:
        fail(f"the plan actions must end action_names in the order of plans: {plans!r}")
    factors = metadata["split_factors"]
    if not _is_positive_int_list(factors) or not factors:
        fail(f"split_factors must be a non-empty list of positive integers, got {factors!r}")
    length = metadata["episode_length"]
    if not _is_int(length) or length < 1:
        fail(f"episode_length must be a positive integer, got {length!r}")
    if metadata["observation"] not in _OBSERVATIONS:
        fail(f"observation must be one of {', '.join(_OBSERVATIONS)}, got {metadata['observation']!r}")
    network = metadata["network"]
    if not isinstance(network, dict):
        fail(f"network must be an object, got {_kind(network)}")
    for key in ("trunk", "heads", "greedy"):
        if key not in network:
            fail(f"missing key 'network.{key}'")
    _check_layers(network["trunk"], "network.trunk", fail, allow_empty=True)
    heads = network["heads"]
    if not isinstance(heads, dict) or not heads:
        fail(f"network.heads must be a non-empty object, got {heads!r}")
    for name, specs in heads.items():
        if not isinstance(name, str):
            fail(f"network.heads: head names must be strings, got {name!r}")
        _check_layers(specs, f"network.heads.{name}", fail, allow_empty=False)
    greedy = network["greedy"]
    if not isinstance(greedy, str) or greedy not in heads:
        fail(f"network.greedy must name one of the heads {sorted(heads)}, got {greedy!r}")
    if metadata.get("target") is not None:
        try:
            Target.from_dict(metadata["target"])
        except ValueError as error:
            fail(f"target: {error}")
    if "host_cpu" in metadata and not isinstance(metadata["host_cpu"], str):
        fail(f"host_cpu must be a string, got {_kind(metadata['host_cpu'])}")


def _check_layers(specs: Any, where: str, fail, allow_empty: bool) -> None:
    if not isinstance(specs, list) or not (specs or allow_empty):
        fail(f"{where} must be a {'' if allow_empty else 'non-empty '}list of layers, got {specs!r}")
    for position, spec in enumerate(specs):
        layer = f"{where}[{position}]"
        if not isinstance(spec, dict):
            fail(f"{layer} must be an object with weight, bias and activation, got {_kind(spec)}")
        for key in ("weight", "bias", "activation"):
            if key not in spec:
                fail(f"{layer} has no {key!r}")
            if not isinstance(spec[key], str):
                fail(f"{layer}.{key} must be a string, got {_kind(spec[key])}")
        if spec["activation"] not in _ACTIVATIONS:
            fail(f"{layer}: unknown activation {spec['activation']!r} (known: {', '.join(_ACTIVATIONS)})")


def _declared_arrays(metadata: dict[str, Any]) -> dict[str, tuple[int, str]]:
    """The arrays the (checked) metadata names: name -> (dimensions, first role), in order."""
    network = metadata["network"]
    declared: dict[str, tuple[int, str]] = {}
    for where, specs in [("network.trunk", network["trunk"])] + [(f"network.heads.{n}", s) for n, s in network["heads"].items()]:
        for position, spec in enumerate(specs):
            declared.setdefault(spec["weight"], (2, f"{where}[{position}].weight"))
            declared.setdefault(spec["bias"], (1, f"{where}[{position}].bias"))
    return declared


def _check_array_kind(name: str, dtype: np.dtype, shape: tuple[int, ...], ndim: int, role: str, where: str) -> None:
    """That array ``name`` (for ``role``) is numeric and ``ndim``-dimensional."""
    if dtype.kind not in "iuf":
        raise ValueError(f"{where}: array {name!r} (for {role}) is not numeric (dtype {dtype})")
    if len(shape) != ndim:
        raise ValueError(f"{where}: array {name!r} (for {role}) has shape {tuple(shape)}; expected {ndim} dimensions")


def _layer_array(arrays: dict[str, Any], name: str, ndim: int, role: str, where: str) -> np.ndarray:
    """The array ``name`` for ``role`` (e.g. ``network.trunk[0].weight``), checked to be finite,
    numeric and ``ndim``-dimensional, as float32."""
    if name not in arrays:
        raise ValueError(f"{where}: policy weights lack array {name!r} (for {role})")
    array = np.asarray(arrays[name])
    _check_array_kind(name, array.dtype, array.shape, ndim, role, where)
    with np.errstate(all="ignore"):  # values beyond float32 become inf, refused just below
        array = array.astype(np.float32)
    if not np.isfinite(array).all():
        raise ValueError(f"{where}: array {name!r} (for {role}) holds NaN or infinite values")
    return array


@contextlib.contextmanager
def _unreadable(path: Path, what: str = ""):
    """Any exception inside becomes a ValueError naming the weights file: a damaged file makes
    numpy and zipfile raise almost anything (BadZipFile, zlib.error, EOFError, OSError,
    ValueError, SyntaxError from a .npy header, a bad CRC, ...), and all mean the same."""
    try:
        yield
    except Exception as error:
        raise ValueError(f"unreadable policy weights {path}: {what}{type(error).__name__}: {error}") from error


def _npy_header(handle) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype in the header of a .npy stream, reading nothing past it."""
    version = np.lib.format.read_magic(handle)
    readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    if version not in readers:
        raise ValueError(f".npy format version {version} (expected 1.0 or 2.0)")
    shape, _, dtype = readers[version](handle)
    return tuple(shape), dtype


def read_weights(path: Path, metadata: dict[str, Any]) -> dict[str, np.ndarray]:
    """The arrays that the (checked) ``metadata`` names, from the policy's ``.npz``, never
    unpickling. Every array's .npy header is read first, and the kinds, dimensions and
    shapes checked against the network the metadata declares (and the total against
    :data:`MAX_POLICY_PARAMETERS`) before any array data is decompressed: a small file that
    claims huge arrays fails at once. Any problem is a ValueError naming ``path``."""
    where = str(path)
    declared = _declared_arrays(metadata)
    with _unreadable(path, "not an .npz archive: "):
        archive = zipfile.ZipFile(path)
    with archive:
        with _unreadable(path):
            members = set(archive.namelist())
        shapes = {}
        for name, (ndim, role) in declared.items():
            if name + ".npy" not in members:
                raise ValueError(f"{where}: policy weights lack array {name!r} (for {role})")
            with _unreadable(path, f"array {name!r}: "), archive.open(name + ".npy") as handle:
                shape, dtype = _npy_header(handle)
            if dtype.hasobject:
                raise ValueError(f"unreadable policy weights {path}: array {name!r} holds Python objects, which only pickle could read")
            _check_array_kind(name, dtype, shape, ndim, role, where)
            shapes[name] = shape
        check_network_shapes(metadata, shapes, where)
        parameters = sum(math.prod(shape) for shape in shapes.values())
        if parameters > MAX_POLICY_PARAMETERS:
            raise ValueError(f"{where}: the arrays hold {parameters} parameters, more than a policy may ({MAX_POLICY_PARAMETERS})")
        arrays = {}
        for name in declared:
            with _unreadable(path, f"array {name!r}: "), archive.open(name + ".npy") as handle:
                arrays[name] = np.lib.format.read_array(handle, allow_pickle=False)
    return arrays
