"""The code generator reads a bfloat16 weight's pairs from the schedule and decides none
(issue 59: a schedule is its problem and steps, and the nest handed to the code generator
carries every layout). A weight's pairs are a ``pair`` step that the producers of schedules add
(:mod:`looprl.measurement.pair_steps`); a nest without one compiles the widening kernel."""

import ast
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import looprl
from looprl.backend.layout_plan import layouts_applied
from looprl.backend.pairs import kernel_pairing, pair_step, pairing
from looprl.ir.register_tiles import tile_steps
from looprl.measurement.pair_steps import with_pairs
from looprl.target import Target
from tests.backend.test_bfloat16 import PROBLEMS, assert_within_bound, bf16_inputs
from tests.schedules import action_steps, walk

BACKEND = Path(__file__).resolve().parents[2] / "looprl" / "backend"
LAYER = looprl.contraction("mk,kn->mn", m=20, n=48, k=77, constant="in1", dtype="bfloat16")  # an odd reduction: a half pair


@pytest.mark.target_dependent
@pytest.mark.parametrize("target", ["host", "avx2"])
def test_an_unpaired_bfloat16_weight_schedule_compiles_the_widening_kernel(target):
    """A register tile whose weight the kernel could pair, handed over without its pair step:
    the kernel stores the weight as the schedule says (no pairs), widens each value, and
    computes the product within the derived bound; the same schedule with its pair step pairs."""
    target = Target.named(target)
    if target.missing_on_host():
        pytest.skip(f"this host cannot run {target.isa} code")
    nest = looprl.initial_nest(LAYER).apply(tile_steps(LAYER, 4, 16))
    assert pair_step(nest, target) is not None  # the kernel could pair it: the schedule does not
    kernel = looprl.compile(nest, target=target)
    assert pairing(nest, target) is None and kernel.layouts == layouts_applied(nest) and "in1" not in kernel.layouts
    assert "vdpbf16ps" not in kernel.assembly()
    a, b = bf16_inputs(LAYER, 11)
    assert_within_bound(LAYER, kernel(a, b), a, b)
    assert_within_bound(LAYER, kernel.bind(b=b)(a), a, b)
    paired = with_pairs(nest, target)
    found = pairing(paired, target)
    assert found is not None and kernel_pairing(paired, target) == ({**layouts_applied(paired), "in1": paired.layout("in1")}, found)
    paired_kernel = looprl.compile(paired, target=target)
    assert ("vdpbf16ps" in paired_kernel.assembly()) == target.bfloat16_dot
    assert_within_bound(LAYER, paired_kernel(a, b), a, b)


def test_no_module_of_the_backend_adds_a_pair_step():
    """The rule of where a kernel can pair (``pair_step``) is defined in the backend and asked
    only by the producers of schedules: no backend module calls it, nor the producers' one place
    (``with_pairs``; the layers keep the backend from importing it anyway)."""
    for path in sorted(BACKEND.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
                assert name not in ("pair_step", "with_pairs", "added_pairs"), f"{path.name}:{node.lineno} decides a pair step"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=st.sampled_from(PROBLEMS), steps=action_steps(kinds=("split", "split", "swap_down", "swap_up", "pack", "pad")),
       target=st.sampled_from(["avx512", "avx2"]))
def test_a_schedule_without_pairs_keeps_exactly_its_applied_layouts(problem, steps, target):
    """Whatever a nest without a pair step is, the kernel's layouts are the nest's applied ones:
    the code generator adds none (where a producer pairs it, the kernel reads those pairs)."""
    target = Target.named(target)
    nest = walk(problem, steps)
    if any(nest.layout("in1").is_paired(var) for var in problem.reduction_dims):
        return  # packed by two along the reduction: the same layout as a pair step's
    assert kernel_pairing(nest, target) == (layouts_applied(nest), None) and pairing(nest, target) is None
    paired = with_pairs(nest, target)
    if paired != nest:
        layouts, found = kernel_pairing(paired, target)
        assert found is not None and found == pairing(paired, target) and layouts["in1"].is_paired(found.var)


def test_a_float32_or_changing_second_input_gets_no_pair_step():
    target = Target.named("avx2")
    for problem in (LAYER.with_dtype("float32"), looprl.matmul(20, 48, 77, dtype="bfloat16")):
        nest = looprl.initial_nest(problem).apply(tile_steps(problem, 4, 16))
        assert pair_step(nest, target) is None and with_pairs(nest, target) == nest
    nest = looprl.initial_nest(LAYER).apply(tile_steps(LAYER, 4, 16))
    assert with_pairs(nest, None) == nest  # no target: no code to pair for
    paired = with_pairs(nest, target)
    assert paired != nest and with_pairs(paired, target) == paired  # paired already

