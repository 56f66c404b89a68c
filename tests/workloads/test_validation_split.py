"""The validation split of models and models-called: the training models' linear layers at
row counts no split holds, derived (not stored), disjoint from train and test, and refused
for a dataset without one."""

import pytest

from looprl.workloads.datasets import VALIDATION_ROWS, dataset_entries, dataset_problems


def test_it_holds_the_training_models_layers_at_rows_no_split_holds():
    validation = dataset_entries("models", "validation")
    stored = {p.name for p in dataset_problems("models", "all")}
    assert validation and not stored & {e.problem.name for e in validation}
    assert {dict(e.sizes)["m"] for e in validation} == set(VALIDATION_ROWS)
    train_models = {e.model for e in dataset_entries("models", "train")}
    assert {e.model for e in validation} <= train_models  # never a test model's layer
    assert all(e.spec == "mk,kn->mn" and "conv" not in e.derivation and "validation" in e.derivation for e in validation)
    layers = {(dict(e.sizes)["k"], dict(e.sizes)["n"]) for e in validation}
    assert len(validation) == len(layers) * len(VALIDATION_ROWS)  # each layer once per row count
    every_row_count = {dict(e.sizes)["m"] for name in ("models", "models-called") for split in ("train", "test")
                       for e in dataset_entries(name, split)}
    assert not every_row_count & set(VALIDATION_ROWS)


def test_models_called_holds_them_as_a_model_calls_them_with_the_wide_decode_layers():
    called = dataset_problems("models-called", "validation")
    assert not {p.name for p in dataset_problems("models-called", "all")} & {p.name for p in called}
    assert all("in1" in p.constant for p in called)
    few = [p for p in called if p.size("m") <= 16]
    assert few and all(p.cold for p in few) and {p.spec for p in few} == {"mk,kn->mn", "mk,nk->mn"}
    assert not any(p.cold for p in called if p.size("m") > 16) and all(p.spec == "mk,kn->mn" for p in called if p.size("m") > 16)
    plain = {(p.size("k"), p.size("n")) for p in dataset_problems("models", "validation")}
    wide = {(p.size("k"), p.size("n")) for p in called} - plain
    assert wide and all(max(k, n) > 4096 for k, n in wide)  # the LM heads and MLPs too wide for models


@pytest.mark.parametrize("name", ["gemm-shapes", "mm64-256"])
def test_a_dataset_without_one_says_so(name):
    with pytest.raises(ValueError, match=f"{name}' has no validation split"):
        dataset_entries(name, "validation")


def test_no_agent_trains_on_it():
    from looprl.train.schema import validate_agent
    from tests.train.test_train import tiny_agent

    agent = tiny_agent("apex-dqn", ":memory:")
    agent["env"].update(dataset="models", split="validation")
    del agent["env"]["problems"]
    with pytest.raises(ValueError, match="split"):
        validate_agent(agent)
