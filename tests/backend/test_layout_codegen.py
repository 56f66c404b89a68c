"""Data layouts in generated code: random layouts x random loop schedules compute what numpy
computes, stay in bounds, and bind() converts constant inputs once."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import looprl
from looprl.backend import codegen
from looprl.backend.kernel_plan import plan_kernel
from looprl.backend.layout_plan import layout_applies
from looprl.target import TARGET_NAMES, Target
from tests.guarded import GuardedArray
from tests.schedules import action_steps, layout_steps, pack_every_tiled_loop, walk, with_layouts
from tests.backend.test_codegen_correctness import assert_matches, random_inputs, reference

PROBLEMS = [
    looprl.matmul(67, 100, 50),  # no split divides these
    looprl.matmul(64, 48, 32),
    looprl.matmul(1, 33, 7),
    looprl.contraction("bmk,bkn->bmn", b=3, m=17, k=9, n=35),  # batched
    looprl.contraction("mk,k->m", m=37, k=50),
    looprl.contraction("mk,nk->mn", m=20, n=30, k=19),
    looprl.contraction("abcd,cde->abe", a=3, b=4, c=5, d=6, e=17),
]
HOST_TARGETS = [Target.named(n) for n in TARGET_NAMES if not Target.named(n).missing_on_host()]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    problem=st.sampled_from(PROBLEMS),
    steps=action_steps(kinds=("split", "swap_down", "swap_up", "pack", "pad")),  # the env's layout actions too
    layouts=layout_steps(),
    seed=st.integers(0, 2**16),
    target=st.sampled_from(HOST_TARGETS),
)
def test_random_layouts_and_schedules_match_numpy(problem, steps, layouts, seed, target):
    nest = with_layouts(walk(problem, steps), layouts, seed)
    a, b = random_inputs(problem, seed)
    kernel = looprl.compile(nest, target=target)
    assert set(kernel.layouts) <= {t for t, _ in nest.layouts}
    assert_matches(problem, kernel, a, b)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=st.sampled_from(PROBLEMS), steps=action_steps(), seed=st.integers(0, 2**16), target=st.sampled_from(HOST_TARGETS))
def test_packed_tiles_match_numpy_and_are_used(problem, steps, seed, target):
    nest = walk(problem, steps)
    wb = len(nest.compute)
    for i, loop in enumerate(nest.write_back):  # tile the write-back like the compute nest
        tiled = [lp for lp in nest.compute if lp.var == loop.var and lp.step > 1]
        if tiled and tiled[-1].step < loop.size and len(nest) < 12:
            nest = nest.split(wb + i, tiled[-1].step)
            break
    nest = pack_every_tiled_loop(nest, seed)
    kernel = looprl.compile(nest, target=target)
    def chained(var):  # each loop's step divides the step of the loop around it
        steps = [lp.step for lp in nest.compute if lp.var == var]
        return all(outer % inner == 0 for outer, inner in zip(steps, steps[1:]))

    for tensor, layout in nest.layouts:
        if tensor != "out" and all(chained(v) for v in layout.index):  # tiles the loops make: used
            assert tensor in kernel.layouts, (nest.key, tensor)
    a, b = random_inputs(problem, seed)
    assert_matches(problem, kernel, a, b)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=st.sampled_from(PROBLEMS), steps=action_steps(), layouts=layout_steps(), side=st.sampled_from(["start", "end"]))
def test_layout_kernels_stay_in_bounds(problem, steps, layouts, side):
    """Inputs, output and the workspace (accumulator and packed inputs) sit against
    inaccessible pages; the packed inputs are also bound once."""
    nest = with_layouts(walk(problem, steps), layouts)
    kernel = looprl.compile(nest)
    shapes = (*problem.input_shapes, problem.output_shape, (kernel.workspace_elements,))
    guards = [GuardedArray(shape, side) for shape in shapes]
    try:
        a, b, out, work = (g.array for g in guards)
        a[...], b[...] = random_inputs(problem, 1)
        kernel.run(a, b, out, reps=2, workspace=work)
        np.testing.assert_allclose(out, reference(problem, a, b), atol=1e-3)
        out[...] = np.nan
        kernel.bind(b=b).run(a, out=out, workspace=work)
        np.testing.assert_allclose(out, reference(problem, a, b), atol=1e-3)
    finally:
        for g in guards:
            g.release()


def packed_matmul(pack_a: bool = False):
    """67x139x229 with B packed in panels of 16 columns and the accumulator stored n-block
    major (padded); ``pack_a`` also splits k by 16 and packs A's k in blocks of 16."""
    problem = looprl.matmul(67, 139, 229)
    nest = looprl.initial_nest(problem).split(2, 16).swap(1)  # m, n/16, k, n16
    if pack_a:
        nest = nest.split(2, 16)  # m, n/16, k/16, k16, n16
    wb = len(nest.compute) + 1
    nest = nest.split(wb, 16)  # the write-back walks n in blocks of 16 too
    nest = nest.layout_pack("in1", "n", 16)
    if pack_a:
        nest = nest.layout_pack("in0", "k", 16)
    return nest.layout_split("out", 1, 16).layout_reorder("out", (1, 0, 2)).layout_pad("out", 1, 8)


def test_a_packed_schedule_uses_its_layouts_and_converts_inside_the_kernel():
    nest = packed_matmul()
    kernel = looprl.compile(nest)
    assert kernel.packed_inputs == ("in1",) and set(kernel.layouts) == {"in1", "out"}
    assert "@looprl_pack_in1" in kernel.ir and "call void @looprl_pack_in1" in kernel.ir
    assert kernel.workspace_elements > nest.layout("out").elements  # the packed B lives there too
    a, b = random_inputs(nest.problem, 2)
    assert_matches(nest.problem, kernel, a, b)


def test_a_layout_the_loops_do_not_walk_affinely_is_inert_and_correct():
    problem = looprl.matmul(40, 64, 24)
    nest = looprl.initial_nest(problem).layout_pack("in1", "n", 16)  # n walked by one unsplit loop
    assert not layout_applies(nest, "in1")
    kernel = looprl.compile(nest)
    assert kernel.packed_inputs == () and kernel.workspace_elements == 40 * 64
    a, b = random_inputs(problem, 3)
    assert_matches(problem, kernel, a, b)


def test_row_major_schedules_generate_the_same_code_as_before_layouts():
    """Kernels without layouts keep the single entry point and no pack functions."""
    nest = looprl.initial_nest(looprl.matmul(67, 100, 50)).split(2, 16).swap(1)
    plan = plan_kernel(nest, Target.host())
    ir = codegen.kernel_ir(plan)
    assert "looprl_pack" not in ir and "looprl_body" not in ir and ir.count("define void") == 1
    assert plan.workspace_elements == 67 * 100 and not plan.has_body


@pytest.mark.parametrize("which", ["a", "b", "both"])
def test_bind_converts_constant_inputs_once(which):
    kernel = looprl.compile(packed_matmul(pack_a=True))
    assert kernel.packed_inputs == ("in0", "in1")
    a, b = random_inputs(kernel.problem, 4)
    expected = reference(kernel.problem, a, b)
    given = {"a": {"a": a}, "b": {"b": b}, "both": {"a": a, "b": b}}[which]
    bound = kernel.bind(**given)
    assert bound.converted == tuple(sorted({"a": "in0", "b": "in1"}[k] for k in given))
    args = {"a": (b.copy(),), "b": (a.copy(),), "both": ()}[which]
    a[...] = 0.0  # the bound kernel holds its own converted copies
    b[...] = 0.0
    for _ in range(2):
        np.testing.assert_allclose(bound(*args), expected, atol=1e-3)


def test_kernels_bound_with_one_shared_dict_keep_one_copy_per_layout():
    """The kernels of one layer bound to one weight (its row counts) hold one converted copy
    per layout, not one each: two kernels storing B alike read one buffer, a kernel storing it
    otherwise (another panel width, or as given) has its own, and every one computes numpy's
    product after the arrays given are changed."""
    alike, also_alike = looprl.compile(packed_matmul()), looprl.compile(packed_matmul(pack_a=True))
    problem = alike.problem
    narrower = looprl.initial_nest(problem).split(2, 8).swap(1).layout_pack("in1", "n", 8)
    other, plain = looprl.compile(narrower), looprl.compile(looprl.initial_nest(problem))
    assert other.packed_inputs == ("in1",) and plain.packed_inputs == ()
    a, b = random_inputs(problem, 6)
    expected = reference(problem, a, b)
    shared: dict = {}
    bound = [kernel.bind(shared=shared, b=b) for kernel in (alike, also_alike, other, plain)]
    buffers = [entry._buffers["in1"] for entry in bound]
    assert buffers[0] is buffers[1]  # one layout: one copy
    assert buffers[2] is not buffers[0] and buffers[3] is not buffers[0] and len(shared) == 3
    b[...] = 0.0  # the copies are the kernels', not the caller's array
    for entry in bound:
        args = (a,) if entry.free == ("in0",) else ()
        np.testing.assert_allclose(entry(*args), expected, atol=1e-3)
    alone = alike.bind(b=random_inputs(problem, 6)[1])  # without shared: a copy of its own, as before
    assert alone._buffers["in1"] is not buffers[0]
    with pytest.raises(ValueError, match="shared"):
        alike.bind(shared=[], b=b)


def test_bind_refuses_bad_arguments():
    kernel = looprl.compile(packed_matmul())
    a, b = random_inputs(kernel.problem, 5)
    with pytest.raises(ValueError, match="at least one input"):
        kernel.bind()
    with pytest.raises(ValueError, match="unknown input 'c'"):
        kernel.bind(c=a)
    with pytest.raises(ValueError, match="twice"):
        kernel.bind(b=b, in1=b)
    with pytest.raises(ValueError, match="shape"):
        kernel.bind(b=a)
    with pytest.raises(ValueError, match="float32"):
        kernel.bind(b=b.astype(np.float64))
    with pytest.raises(ValueError, match="C-contiguous"):
        kernel.bind(b=np.asfortranarray(b))
    bound = kernel.bind(b=b)
    with pytest.raises(ValueError, match="takes the first input"):
        bound(a, b)
    with pytest.raises(ValueError, match="takes the first input"):
        bound()
    with pytest.raises(ValueError, match="shape"):
        bound(b)


def test_a_constant_input_is_converted_outside_the_timed_kernel():
    """Timing a problem that declares B constant calls the bound entry point (B packed once)."""
    from looprl.measurement.timing import time_kernel

    nest = packed_matmul()
    constant = looprl.matmul(67, 139, 229, constant="b")
    assert constant.name.endswith(";const=in1") and looprl.parse_problem(constant.name) == constant
    kernel = looprl.compile(type(nest)(constant, nest.compute, nest.write_back, nest.layouts))
    assert time_kernel(kernel, 0.001).gflops > 0
    a, b = random_inputs(constant, 6)
    assert_matches(constant, kernel, a, b)


@pytest.mark.parametrize("spec, sizes, layout", [
    ("mk,nk->mn", {"m": 5, "k": 19, "n": 21}, "k1.n1"),  # edges in both directions
    ("mk,nk->mn", {"m": 3, "k": 24, "n": 40}, "n16.k1.n1%16"),  # panels: blocks inside each
    ("bmk,bnk->bmn", {"b": 3, "m": 4, "k": 17, "n": 9}, "b1.k1.n1"),
    ("nhwc,oc->nhwo", {"n": 1, "h": 2, "w": 3, "c": 11, "o": 12}, "c1.o1"),  # a 1x1 convolution's weight
])
@pytest.mark.parametrize("target", HOST_TARGETS, ids=lambda t: t.isa)
def test_transposing_packs_move_blocks_and_compute_what_numpy_computes(spec, sizes, layout, target):
    from looprl.backend.packing import transposed_pair
    from looprl.ir.layout import Layout

    problem = looprl.contraction(spec, **sizes)
    index = problem.operands[1]
    relaid = Layout.from_key(index, problem.shape(index), layout)
    assert transposed_pair(index, problem.shape(index), relaid, target.vector_width) is not None
    assert transposed_pair("kn", (13, 16), Layout.from_key("kn", (13, 16), "n8.k1.n1%8"), 16) is None  # no transposition
    nest = looprl.initial_nest(problem)
    if "%" in layout:  # n-panels: the n loop walks them panel by panel
        panel = int(layout.split("%")[1])
        nest = nest.split([lp.var for lp in nest.compute].index("n"), panel)
    nest = nest.with_layout("in1", relaid)
    assert layout_applies(nest, "in1")
    kernel = looprl.compile(nest, target=target)
    for side in ("start", "end"):  # inputs, output and workspace against inaccessible pages
        shapes = (*problem.input_shapes, problem.output_shape, (kernel.workspace_elements,))
        guards = [GuardedArray(shape, side) for shape in shapes]
        try:
            a, b, out, work = (g.array for g in guards)
            a[...], b[...] = random_inputs(problem, 3)
            kernel.run(a, b, out, reps=1, workspace=work)
            np.testing.assert_allclose(out, reference(problem, a, b), rtol=0, atol=1e-4)
        finally:
            for g in guards:
                g.release()


@pytest.mark.parametrize("k, n, panel, stage", [
    (37, 53, 16, False),  # rows no group of 8 divides, a last panel partly filled
    (64, 40, 8, False),
    (29, 70, 16, True),  # a stage's block (the rows of the k block loop) packed the same way
    (8, 33, 16, False),  # one group exactly
])
@pytest.mark.parametrize("target", HOST_TARGETS, ids=lambda t: t.isa)
def test_panel_packs_copy_rows_in_groups_and_compute_what_numpy_computes(k, n, panel, stage, target):
    """A right operand packed into column panels (``kn[n<p>.k1.n1%<p>]``) sends each row's
    chunks to another panel: the pack copies 8 rows chunk by chunk (PackFacts.group), and the
    rows no group covers one by one; a layout whose chunks stay side by side is copied row by
    row. Inputs, output and workspace against inaccessible pages."""
    from looprl.backend.packing import PACK_ROW_GROUP, pack_facts
    from looprl.ir.cache_blocks import Blocks, blocked_steps
    from looprl.ir.layout import Layout

    problem = looprl.matmul(13, n, k)
    panels = Layout.from_key("kn", (k, n), f"n{panel}.k1.n1%{panel}")
    assert pack_facts("kn", (k, n), panels, target.vector_width).group == PACK_ROW_GROUP
    assert pack_facts("kn", (k, n), Layout.row_major("kn", (k, n)), target.vector_width).group == 1
    if stage:  # blocks of 16 rows of k by 2 panels, each k block staged
        nest = looprl.initial_nest(problem).apply(tuple(blocked_steps(problem, 4, panel, Blocks(16, None, 2 * panel), stage="k")))
        assert nest.staged_at("in1") is not None and nest.layout("in1").key == panels.key
    else:
        nest = looprl.initial_nest(problem)
        nest = nest.split([lp.var for lp in nest.compute].index("n"), panel).with_layout("in1", panels)
    assert layout_applies(nest, "in1")
    _runs_against_guard_pages(looprl.compile(nest, target=target), problem, seed=5)


@pytest.mark.parametrize("k, n", [(1029, 70), (4096, 16)])  # rows no group of 8 divides, a partial panel; one panel
def test_a_threaded_kernel_s_team_packs_a_large_right_operand_in_parts(k, n):
    """A kernel with a parallel loop packs a right operand of TEAM_PACK_ELEMENTS or more on its
    team, each thread a share of its row groups and the last one the rows no group covers; on
    one thread the calling thread packs it alone. Both compute what numpy computes, inputs,
    output and workspace against inaccessible pages; a small operand is packed by the caller."""
    from looprl.backend.codegen import TEAM_PACK_ELEMENTS
    from looprl.backend.threads import available_cores

    problem = looprl.matmul(13, n, k)
    assert k * n >= TEAM_PACK_ELEMENTS
    nest = looprl.initial_nest(problem)
    nest = nest.split([lp.var for lp in nest.compute].index("n"), 16).with_layout("in1", _panels_layout(k, n))
    nest = nest.parallel([lp.var for lp in nest.compute].index("n"))
    kernel = looprl.compile(nest, threads=2)
    assert "@looprl_pack_in1_team" in kernel.ir and "GOMP_parallel" in kernel.ir
    for threads in sorted({1, min(2, available_cores())}):
        _runs_against_guard_pages(kernel, problem, seed=7, threads=threads, reps=2, atol=1e-3)
    small = looprl.matmul(13, 32, 64)
    little = looprl.initial_nest(small)
    little = little.split([lp.var for lp in little.compute].index("n"), 16).with_layout("in1", _panels_layout(64, 32))
    little = little.parallel([lp.var for lp in little.compute].index("n"))
    assert "_team" not in looprl.compile(little, threads=2).ir


def _panels_layout(k, n):
    from looprl.ir.layout import Layout

    return Layout.from_key("kn", (k, n), "n16.k1.n1%16")


def _runs_against_guard_pages(kernel, problem, seed: int, threads: int = 1, reps: int = 1, atol: float = 1e-4) -> None:
    """``kernel`` computes what numpy computes with its inputs, output and workspace each
    against an inaccessible page, at either end."""
    for side in ("start", "end"):
        shapes = (*problem.input_shapes, problem.output_shape, (kernel.workspace_elements,))
        guards = [GuardedArray(shape, side) for shape in shapes]
        try:
            a, b, out, work = (g.array for g in guards)
            a[...], b[...] = random_inputs(problem, seed)
            kernel.run(a, b, out, reps=reps, workspace=work, threads=threads)
            np.testing.assert_allclose(out, reference(problem, a, b), rtol=1e-5, atol=atol)
        finally:
            for g in guards:
                g.release()
