"""Corrupt or incompatible policy files: always a ValueError naming the file, never anything else."""

import copy
import json
import zipfile

import numpy as np
import pytest

from looprl.policy.loading import load_policy
from looprl.policy.numpy_policy import Policy, check_metadata
from tests.policies import random_policy

OBSERVATION = np.random.default_rng(7).random((10, 20), dtype=np.float32)


@pytest.fixture
def folder(tmp_path):
    return random_policy().save(tmp_path / "policy")


def rejected(folder, file_name, *fragments) -> str:
    """Load ``folder``; it must fail with a ValueError naming ``folder/file_name`` (and ``fragments``)."""
    with pytest.raises(ValueError) as caught:
        Policy.load(folder)
    message = str(caught.value)
    assert str(folder / file_name) in message
    for fragment in fragments:
        assert fragment in message
    return message


def write_metadata(folder, metadata) -> None:
    (folder / "policy.json").write_text(json.dumps(metadata), encoding="utf-8")


def read_metadata(folder) -> dict:
    return json.loads((folder / "policy.json").read_text(encoding="utf-8"))


def write_arrays(folder, **changes) -> None:
    """Rewrite policy.npz with some arrays replaced (None removes one)."""
    with np.load(folder / "policy.npz") as archive:
        arrays = {name: archive[name] for name in archive.files}
    for name, value in changes.items():
        if value is None:
            arrays.pop(name)
        else:
            arrays[name] = value
    np.savez(folder / "policy.npz", **arrays)


# -- the weights file ---------------------------------------------------------------------------
def test_truncated_or_bit_flipped_weights_fail_cleanly_or_load_unchanged(folder):
    """Cut or damage policy.npz at many offsets: a ValueError naming the file, or (a byte that
    no reader checks, e.g. a timestamp) a policy identical to the saved one."""
    data = (folder / "policy.npz").read_bytes()
    expected = random_policy().scores(OBSERVATION)
    offsets = sorted(set(range(0, len(data), 5)) | set(range(len(data) - 64, len(data))))
    truncations = [data[:offset] for offset in offsets]
    flips = [data[:offset] + bytes([data[offset] ^ 0x55]) + data[offset + 1:] for offset in offsets]
    loaded = 0
    for blob in truncations + flips:
        (folder / "policy.npz").write_bytes(blob)
        try:
            policy = Policy.load(folder)
        except ValueError as error:
            assert str(folder / "policy.npz") in str(error)
        else:
            loaded += 1
            np.testing.assert_array_equal(policy.scores(OBSERVATION), expected)
    assert loaded < len(flips) // 2  # most damage is detected


def test_empty_weights_file(folder):
    (folder / "policy.npz").write_bytes(b"")
    rejected(folder, "policy.npz", "unreadable policy weights")


def test_weights_file_that_is_an_empty_archive_or_a_single_npy(folder):
    np.savez(folder / "policy.npz")
    rejected(folder, "policy.npz", "lack array")
    with open(folder / "policy.npz", "wb") as handle:
        np.save(handle, np.zeros(3, np.float32))
    rejected(folder, "policy.npz", "not an .npz archive")


def test_bad_crc_inside_an_array(folder):
    """A flipped byte inside a stored array's data (not its header) is caught by the zip CRC."""
    path = folder / "policy.npz"
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("trunk.0.weight.npy")
    assert info.compress_type == zipfile.ZIP_STORED
    data = bytearray(path.read_bytes())
    local_header = 30 + int.from_bytes(data[info.header_offset + 26:info.header_offset + 28], "little") \
        + int.from_bytes(data[info.header_offset + 28:info.header_offset + 30], "little")
    data[info.header_offset + local_header + info.file_size // 2] ^= 0x01  # mid-data: well past the .npy header
    path.write_bytes(bytes(data))
    rejected(folder, "policy.npz", "CRC")


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf, 1e300])
def test_non_finite_weights(folder, value):
    weight = np.ones((8, 200), dtype=np.float64)
    weight[3, 5] = value  # 1e300 overflows float32
    write_arrays(folder, **{"trunk.0.weight": weight})
    rejected(folder, "policy.npz", "'trunk.0.weight'", "NaN or infinite")


@pytest.mark.parametrize("name, array, fragment", [
    ("trunk.0.weight", np.ones(1600, np.float32), "expected 2 dimensions"),
    ("trunk.0.bias", np.ones((8, 1), np.float32), "expected 1 dimensions"),
    ("logits.0.weight", np.ones((7, 8, 1), np.float32), "expected 2 dimensions"),
    ("trunk.0.weight", np.full((8, 200), "x"), "not numeric"),
    ("trunk.0.bias", None, "lack array 'trunk.0.bias'"),
])
def test_arrays_of_the_wrong_kind(folder, name, array, fragment):
    write_arrays(folder, **{name: array})
    rejected(folder, "policy.npz", fragment)


@pytest.mark.parametrize("changes, fragment", [
    ({"trunk.0.weight": np.zeros((8, 100), np.float32)}, "do not chain at network.trunk[0]"),
    ({"trunk.0.bias": np.zeros(9, np.float32)}, "do not chain at network.trunk[0]"),
    ({"logits.0.weight": np.zeros((7, 9), np.float32)}, "do not chain at network.heads.logits[0]"),
    ({"logits.0.weight": np.zeros((6, 8), np.float32), "logits.0.bias": np.zeros(6, np.float32)}, "6 outputs for 7 actions"),
])
def test_layer_shapes_must_chain_and_match_the_actions(folder, changes, fragment):
    write_arrays(folder, **changes)
    rejected(folder, "policy.npz", fragment)


# -- the metadata file --------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["[]", "[1, 2]", "3", "2.5", '"policy"', "null", "true"])
def test_metadata_that_is_not_an_object(folder, text):
    (folder / "policy.json").write_text(text, encoding="utf-8")
    rejected(folder, "policy.json", "expected a JSON object")


@pytest.mark.parametrize("content", [b"{", b"", b"\xff\xfe{}", b'{"format": }'])
def test_metadata_that_is_not_json(folder, content):
    (folder / "policy.json").write_bytes(content)
    rejected(folder, "policy.json", "unreadable policy metadata")


def _delete(*keys):
    def change(metadata):
        container = metadata
        for key in keys[:-1]:
            container = container[key]
        del container[keys[-1]]
    return change


def _set(value, *keys):
    def change(metadata):
        container = metadata
        for key in keys[:-1]:
            container = container[key]
        container[keys[-1]] = value
    return change


MISSING = [
    ("format",), ("format_version",), ("observation_shape",), ("action_names",), ("split_factors",),
    ("episode_length",), ("observation",), ("network",), ("network", "trunk"), ("network", "heads"),
    ("network", "greedy"), ("network", "trunk", 0, "weight"), ("network", "trunk", 0, "bias"),
    ("network", "trunk", 0, "activation"), ("network", "heads", "logits", 0, "activation"),
]


@pytest.mark.parametrize("keys", MISSING, ids=lambda keys: ".".join(map(str, keys)))
def test_missing_metadata_keys(folder, keys):
    metadata = read_metadata(folder)
    _delete(*keys)(metadata)
    write_metadata(folder, metadata)
    message = rejected(folder, "policy.json")
    assert str(keys[-1]) in message or "not a looprl-policy" in message


WRONG = {
    "format_version is a string": (_set("1", "format_version"), "not a looprl-policy"),
    "format_version is true": (_set(True, "format_version"), "not a looprl-policy"),
    "observation_shape has strings": (_set(["10", 20], "observation_shape"), "observation_shape"),
    "observation_shape has one number": (_set([10], "observation_shape"), "observation_shape"),
    "observation_shape is a number": (_set(200, "observation_shape"), "observation_shape"),
    "observation_shape has a zero": (_set([0, 20], "observation_shape"), "observation_shape"),
    "observation_shape has a float": (_set([10.0, 20], "observation_shape"), "observation_shape"),
    "action_names is a string": (_set("up", "action_names"), "action_names"),
    "action_names has a number": (_set(["up", 3], "action_names"), "action_names"),
    "action_names repeat": (_set(["up", "up"], "action_names"), "action_names"),
    "split_factors is a number": (_set(4, "split_factors"), "split_factors"),
    "split_factors has strings": (_set(["4", "8"], "split_factors"), "split_factors"),
    "episode_length is a string": (_set("10", "episode_length"), "episode_length"),
    "episode_length is negative": (_set(-1, "episode_length"), "episode_length"),
    "episode_length is NaN": (_set(float("nan"), "episode_length"), "episode_length"),
    "observation unknown": (_set("pixels", "observation"), "observation"),
    "network is a list": (_set([], "network"), "network must be an object"),
    "trunk is a number": (_set(3, "network", "trunk"), "network.trunk"),
    "trunk layer is a string": (_set(["trunk.0.weight"], "network", "trunk"), "network.trunk[0]"),
    "layer weight is a number": (_set(3, "network", "trunk", 0, "weight"), "network.trunk[0].weight"),
    "activation unknown": (_set("gelu", "network", "trunk", 0, "activation"), "unknown activation"),
    "heads is a list": (_set([], "network", "heads"), "network.heads"),
    "heads is empty": (_set({}, "network", "heads"), "network.heads"),
    "head has no layers": (_set([], "network", "heads", "logits"), "network.heads.logits"),
    "head layer is a list": (_set([[1]], "network", "heads", "logits"), "network.heads.logits[0]"),
    "greedy is a list": (_set(["logits"], "network", "greedy"), "network.greedy"),
    "greedy names no head": (_set("q_values", "network", "greedy"), "network.greedy"),
}


@pytest.mark.parametrize("name", WRONG)
def test_wrong_metadata_types(folder, name):
    change, fragment = WRONG[name]
    metadata = read_metadata(folder)
    change(metadata)
    write_metadata(folder, metadata)
    rejected(folder, "policy.json", fragment)


def test_check_metadata_and_from_arrays_without_files():
    good = random_policy()
    check_metadata(good.metadata)
    broken = copy.deepcopy(good.metadata)
    broken["network"]["trunk"][0] = "relu"
    with pytest.raises(ValueError, match="policy metadata: network.trunk\\[0\\] must be an object"):
        Policy.from_arrays(broken, {})


def test_load_policy_names_the_file_and_refuses_other_types(folder):
    metadata = read_metadata(folder)
    metadata["split_factors"] = [4, 8, 17]
    write_metadata(folder, metadata)
    with pytest.raises(ValueError, match="incompatible action set"):
        load_policy(folder)
    (folder / "policy.npz").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(ValueError, match="policy.npz"):
        load_policy(folder)
    with pytest.raises(ValueError, match="policy must be"):
        load_policy(3)


@pytest.mark.parametrize("where", ["checkpoints/apex-dqn/policy", "checkpoints/ppo/policy"])
def test_shipped_policies_still_load(where):
    from looprl.resources import shipped_path

    path = shipped_path(*where.split("/"))
    if not path.exists():
        pytest.skip(f"{where} is not shipped in this checkout")
    assert load_policy(path).scores(OBSERVATION).shape == (7,)


# -- headers before data: a small file cannot make loading decompress huge arrays -----------------
@pytest.fixture
def arrays_read(monkeypatch):
    """The names of the .npy members whose data was read (decompressed) since the fixture began."""
    read = []
    real_read_array = np.lib.format.read_array

    def spy(handle, *args, **kwargs):
        read.append(getattr(handle, "name", "?"))
        return real_read_array(handle, *args, **kwargs)

    monkeypatch.setattr(np.lib.format, "read_array", spy)
    return read


def test_array_shapes_are_checked_from_the_headers_before_any_data_is_read(folder, arrays_read):
    """The defect: a 4 MB .npz holding a 256 x 4,000,000 array took 8.7 GB and 30 s to refuse.
    Here a wrongly shaped (8, 40000) array: refused from its header, no array's data read."""
    write_arrays(folder, **{"trunk.0.weight": np.zeros((8, 40_000), np.float32)})
    arrays_read.clear()
    rejected(folder, "policy.npz", "do not chain at network.trunk[0]", "(8, 40000)")
    assert arrays_read == []
    write_arrays(folder, **{"trunk.0.weight": np.zeros((8, 200), np.float32), "trunk.0.bias": np.full((8, 1), "x")})
    arrays_read.clear()
    rejected(folder, "policy.npz", "'trunk.0.bias'", "not numeric")
    assert arrays_read == []


def test_a_network_past_the_size_limit_is_refused_from_its_headers(folder, arrays_read, monkeypatch):
    from looprl.policy import numpy_policy

    expected = random_policy().scores(OBSERVATION)
    np.testing.assert_array_equal(Policy.load(folder).scores(OBSERVATION), expected)
    assert arrays_read  # a good file is read, and only then
    arrays_read.clear()
    monkeypatch.setattr(numpy_policy, "MAX_POLICY_PARAMETERS", 100)
    rejected(folder, "policy.npz", "more than a policy may (100)")
    assert arrays_read == []


def test_only_the_arrays_the_metadata_names_are_read(folder, arrays_read):
    write_arrays(folder, **{"unused.extra": np.zeros((4, 4), np.float32)})
    arrays_read.clear()
    Policy.load(folder)
    assert arrays_read and not any("unused.extra" in name for name in arrays_read)
