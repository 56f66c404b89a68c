import json

import pytest

import looprl
from looprl.env.datasets import (
    build_dataset,
    dataset_path,
    dataset_problems,
    load_dataset,
    write_dataset,
)


def test_stored_file_matches_the_generator():
    stored = json.loads(dataset_path("mm64-256").read_text())
    assert stored == build_dataset("mm64-256")
    assert load_dataset("mm64-256") == stored


def test_split_sizes_disjoint_and_complete():
    train = dataset_problems("mm64-256", "train")
    test = dataset_problems("mm64-256", "test")
    assert (len(train), len(test)) == (1757, 440)
    assert not set(train) & set(test)
    values = range(64, 257, 16)
    assert {(p.size("m"), p.size("n"), p.size("k")) for p in train + test} == {(m, n, k) for m in values for n in values for k in values}
    assert dataset_problems("mm64-256", "all") == train + test


def test_dimensions_are_named_explicitly(tmp_path):
    path = write_dataset("mm64-256", tmp_path / "copy.json")
    first = json.loads(path.read_text())["train"][0]
    assert set(first) == {"m", "n", "k"}
    problem = dataset_problems("mm64-256")[0]
    assert problem == looprl.matmul(m=first["m"], n=first["n"], k=first["k"])


def test_unknown_names_are_rejected():
    with pytest.raises(ValueError, match="unknown dataset"):
        dataset_problems("mm1-2")
    with pytest.raises(ValueError, match="unknown split"):
        dataset_problems("mm64-256", "dev")
