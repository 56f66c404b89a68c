"""torch's float32 call as a peer of bfloat16 problems (``looprl-bench tune --torch-float32``):
what a user calls where torch's bfloat16 is slow, timed beside torch's bfloat16 calls."""

import argparse

import pytest

from looprl.bench import torch_baseline, tune_quality
from looprl.ir.problem import parse_problem

torch = pytest.importorskip("torch")
functional = pytest.importorskip("torch.nn.functional")

BF16_LINEAR = "mk,nk->mn:m=2,k=64,n=32;const=in1;dtype=bfloat16"


def test_a_bfloat16_problem_s_calls_include_float32_twins_only_when_asked():
    problem = parse_problem(BF16_LINEAR)
    plain = torch_baseline._all_calls(problem, torch, functional, float32=False)
    both = torch_baseline._all_calls(problem, torch, functional, float32=True)
    assert set(plain) <= set(torch_baseline.CALLS)
    twins = {name for name in both if name.endswith(torch_baseline.FLOAT32_SUFFIX)}
    assert twins == {name + torch_baseline.FLOAT32_SUFFIX for name in torch_baseline._calls(problem.with_dtype("float32"), torch, functional)}
    with torch.no_grad():
        for name, call in both.items():
            assert call().dtype == (torch.float32 if name in twins else torch.bfloat16), name


def test_a_float32_problem_gets_no_twins():
    problem = parse_problem(BF16_LINEAR.removesuffix(";dtype=bfloat16"))
    calls = torch_baseline._all_calls(problem, torch, functional, float32=True)
    assert not any(name.endswith(torch_baseline.FLOAT32_SUFFIX) for name in calls)


def test_the_twins_count_in_torch_s_best():
    assert torch_baseline.best_torch({"F.linear": 10.0, "F.linear" + torch_baseline.FLOAT32_SUFFIX: 30.0}) == 30.0


def test_the_bench_takes_the_option():
    parser = argparse.ArgumentParser()
    tune_quality.add_arguments(parser)
    assert parser.parse_args(["--torch-float32"]).torch_float32 is True
    assert parser.parse_args([]).torch_float32 is False
