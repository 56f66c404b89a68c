import json
import math

import pytest

import looprl
from looprl.workloads.datasets import (
    build_dataset,
    dataset_entries,
    dataset_names,
    dataset_path,
    dataset_problems,
    load_dataset,
    write_dataset,
)


@pytest.mark.parametrize("name", dataset_names())
def test_stored_file_matches_the_generator(name):
    stored = json.loads(dataset_path(name).read_text())
    assert stored == build_dataset(name)
    assert load_dataset(name) == stored


@pytest.mark.parametrize("name", dataset_names())
def test_writing_reproduces_the_stored_bytes(name, tmp_path):
    assert write_dataset(name, tmp_path / "copy.json").read_bytes() == dataset_path(name).read_bytes()


@pytest.mark.parametrize(("name", "values", "sizes"), [
    ("mm64-256", range(64, 257, 16), (1757, 440)),
    ("mm384-1024", range(384, 1025, 128), (172, 44)),
])
def test_split_sizes_disjoint_and_complete(name, values, sizes):
    train = dataset_problems(name, "train")
    test = dataset_problems(name, "test")
    assert (len(train), len(test)) == sizes
    assert not set(train) & set(test)
    assert {(p.size("m"), p.size("n"), p.size("k")) for p in train + test} == {(m, n, k) for m in values for n in values for k in values}
    assert dataset_problems(name, "all") == train + test


def test_the_datasets_are_known_by_name():
    assert dataset_names() == ["gemm-shapes", "mm384-1024", "mm64-256", "models", "models-called"]


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


def test_gemm_shapes_cover_real_layer_variety_without_the_models_test_shapes():
    train, test = dataset_problems("gemm-shapes", "train"), dataset_problems("gemm-shapes", "test")
    assert (len(train), len(test)) == (480, 120) and not set(train) & set(test)
    held_out = set(dataset_problems("models", "test"))
    assert not (set(train) | set(test)) & held_out
    everything = train + test
    assert all(math.prod(p.size(d) for d in p.dims) <= 2 ** 26 for p in everything)
    assert any(p.size("m") <= 4 for p in everything) and any(p.size("m") >= 2048 for p in everything)
    assert any(p.size("n") % 8 for p in everything) and any("b" in p.dims for p in everything)


def test_models_called_holds_the_linear_layers_as_a_model_calls_them():
    from looprl import defaults

    for split in ("train", "test"):
        called = dataset_problems("models-called", split)
        from looprl.workloads.architectures import excluded_entries

        models = set(load_dataset("models")[f"{split}_models"])
        wide = [e.entry.problem for e in excluded_entries() if e.entry.model in models]  # decode layers too wide for models
        layers = {(p.size("m"), p.size("k"), p.size("n")) for p in list(dataset_problems("models", split)) + wide
                  if p.spec == "mk,kn->mn"}
        assert called and all(p.constant == ("in1",) for p in called)
        for p in called:
            few = p.size("m") <= defaults.COLD_ROWS
            assert p.cold == few, p.name  # decode rows cold, the rest warm
            assert (p.size("m"), p.size("k"), p.size("n")) in layers
        twins = {(p.size("m"), p.size("k"), p.size("n")) for p in called if p.spec == "mk,kn->mn"}
        stored = {(p.size("m"), p.size("k"), p.size("n")) for p in called if p.spec == "mk,nk->mn"}
        assert stored == {shape for shape in twins if shape[0] <= defaults.COLD_ROWS} and stored
    convolutions = {e.sizes for e in dataset_entries("models", "all") if "conv" in (e.derivation or "")}
    assert convolutions and not convolutions & {e.sizes for e in dataset_entries("models-called", "all")}
