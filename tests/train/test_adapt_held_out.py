"""What an adaptation is judged on and trained with: the validation split of the policy's own
datasets (never a test split), in its dtype, and their training splits."""

import pytest

from looprl.policy.loading import load_policy
from looprl.train.adapt import adaptation_agent, held_out_problems_for, held_out_split, policy_datasets
from looprl.train.validation import training_groups
from looprl.workloads.datasets import dataset_problems
from looprl.target import Target


@pytest.mark.parametrize("folder, dataset, dtype", [
    ("checkpoints/clone-plans/policy", "models", "float32"),
    ("checkpoints/clone-called/policy", "models-called", "float32"),
    ("checkpoints/clone-called-bf16/policy", "models-called", "bfloat16"),
])
def test_a_policy_is_judged_on_the_validation_split_of_its_own_datasets(folder, dataset, dtype):
    from looprl.resources import shipped_path

    policy = load_policy(shipped_path(*folder.split("/")), "avx512")
    assert held_out_split(policy_datasets(policy)) == dataset
    held_out = held_out_problems_for(8, policy)
    assert len(held_out) == 8 and {p.dtype for p in held_out} == {dtype}
    tests = {p.name for name in ("models", "models-called") for p in dataset_problems(name, "test")}
    assert not tests & {p.with_dtype("float32").name for p in held_out}
    validation = {p.name for p in dataset_problems(dataset, "validation")}
    assert {p.with_dtype("float32").name for p in held_out} <= validation
    agent = adaptation_agent(policy, Target.named("avx512"))
    assert agent["env"]["dataset"] == list(policy_datasets(policy))
    assert {p.dtype for group in training_groups(agent) for p in group} == {dtype}
    with pytest.raises(ValueError, match=f"at most {len(validation)}"):
        held_out_problems_for(len(validation) + 1, policy)


def test_a_policy_whose_file_names_no_known_dataset_adapts_on_the_general_ones():
    from dataclasses import replace

    shipped = load_policy("default", "avx512")

    def trained_on(problems):  # the shipped policy as if its file named these training problems
        return replace(shipped, metadata={**shipped.metadata, "training_problems": problems})

    assert policy_datasets(trained_on(["64x64x64"])) == ("models", "gemm-shapes", "mm64-256")  # its own problems: no dataset
    assert policy_datasets(trained_on({"dataset": ["no-such-dataset"]})) == ("models", "gemm-shapes", "mm64-256")
    assert policy_datasets(trained_on({"dataset": "gemm-shapes"})) == ("gemm-shapes",)
    assert held_out_split(("gemm-shapes",)) == "models"  # no validation split of its own
    assert held_out_split(("models", "models-called")) == "models-called"  # the more specific
