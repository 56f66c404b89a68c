"""A tuned layer always computes with the weights it holds now (issue 38, item 1): every way
torch lets a user change a parameter, for tune_module and for torch.compile(backend="looprl")."""

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as functional  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch import nn  # noqa: E402

from looprl import torch as looprl_torch  # noqa: E402
from tests.policies import random_policy  # noqa: E402

IN, OUT = 16, 24


@pytest.fixture(scope="module")
def options(tmp_path_factory):
    folder = random_policy(seed=3).save(tmp_path_factory.mktemp("policy") / "policy")
    # looprl's kernels on every call (not routed to torch by timing): their bound weights are under
    # test, not how their schedules were found (measure=False: the policy's answers alone)
    return {"policy": str(folder), "cache": str(tmp_path_factory.mktemp("cache") / "m.sqlite"), "compare_torch": False,
            "measure": False}


# Measured tuning, for the two tests that check an in-place edit of a frozen weight is not seen:
# that holds for kernels bound to a copy of the weight, which the measured search of these
# layers returns; the policy alone's answer for a frozen few-row layer may read the weight
# where it lies (and then sees the edit).
MEASURED = {"measure": True, "budget_s": 0.05}


def fresh(shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def scale_through_data(layer):
    layer.weight.data.mul_(2)


def shift_bias_through_data(layer):
    layer.bias.data.add_(5)


def assign_data(layer):
    layer.weight.data = fresh((OUT, IN), 1)


def assign_strided_data(layer):  # same shape, another storage, not contiguous
    layer.weight.data = fresh((OUT, 2 * IN), 2)[:, ::2]


def edit_a_kept_alias(layer):  # a tensor sharing the storage, with its own version counter
    alias = layer.bias.data
    alias.mul_(-3)


def copy_into(layer):
    with torch.no_grad():
        layer.weight.copy_(fresh((OUT, IN), 3))


def load_state(layer):
    layer.load_state_dict({"weight": fresh((OUT, IN), 4), "bias": fresh((OUT,), 5)})


def load_state_assigned(layer):
    layer.load_state_dict({"weight": nn.Parameter(fresh((OUT, IN), 6)), "bias": nn.Parameter(fresh((OUT,), 7))}, assign=True)


def zero_and_fill(layer):
    with torch.no_grad():
        layer.weight.zero_()
        layer.bias.fill_(0.25)


def add_in_inference_mode(layer):
    with torch.inference_mode():
        layer.weight.add_(fresh((OUT, IN), 8))


def write_through_numpy(layer):
    layer.weight.detach().numpy()[:] = fresh((OUT, IN), 9).numpy()


def replace_the_parameter(layer):
    layer.weight = nn.Parameter(fresh((OUT, IN), 10))


def swap_tensors(layer):
    torch.utils.swap_tensors(layer.weight, nn.Parameter(fresh((OUT, IN), 11)))


EDITS = [scale_through_data, shift_bias_through_data, assign_data, assign_strided_data, edit_a_kept_alias, copy_into, load_state,
         load_state_assigned, zero_and_fill, add_in_inference_mode, write_through_numpy, replace_the_parameter, swap_tensors]


def assert_computes_what_its_parameters_give(call, layer, x, what):
    with torch.no_grad():
        expected = functional.linear(x, layer.weight, layer.bias)
        torch.testing.assert_close(call(x), expected, rtol=1e-5, atol=1e-5, msg=lambda m: f"after {what}: {m}")


def test_a_tuned_layer_computes_with_its_weights_after_every_kind_of_edit(options):
    x = torch.randn(4, IN)
    tuned = looprl_torch.tune_module(nn.Sequential(nn.Linear(IN, OUT)), x, **options)
    layer = tuned[0]
    assert isinstance(layer, looprl_torch.TunedLinear)
    assert_computes_what_its_parameters_give(tuned, layer, x, "tuning")
    for edit in EDITS:
        edit(layer)
        assert_computes_what_its_parameters_give(tuned, layer, x, edit.__name__)
    counted = looprl_torch.stats(tuned)
    assert counted["fallback_calls"] == 0 and counted["looprl_calls"] == 1 + len(EDITS)  # the kernels computed every call


def test_a_compiled_model_computes_with_its_weights_after_every_kind_of_edit(options):
    from looprl import dynamo

    x = torch.randn(4, IN)
    module = nn.Sequential(nn.Linear(IN, OUT)).eval()
    compiled = torch.compile(module, backend="looprl", dynamic=False, options=dict(options, rest="eager"))
    before = dynamo.stats()
    layer = module[0]
    assert_computes_what_its_parameters_give(compiled, layer, x, "compiling")
    for edit in EDITS:
        edit(layer)
        assert_computes_what_its_parameters_give(compiled, layer, x, edit.__name__)
    after = dynamo.stats()
    assert after["fallback_calls"] == before["fallback_calls"] and after["looprl_calls"] - before["looprl_calls"] == 1 + len(EDITS)


@pytest.fixture(scope="module")
def tuned_layer(options):
    return looprl_torch.tune_module(nn.Sequential(nn.Linear(IN, OUT)), torch.randn(4, IN), **options)[0]


PARAMETER = st.sampled_from(["weight", "bias"])
VALUE = st.floats(-4, 4, allow_nan=False, width=32)
EDIT = st.one_of(
    st.tuples(st.just("mul_"), PARAMETER, VALUE),
    st.tuples(st.just("add_"), PARAMETER, VALUE),
    st.tuples(st.just("fill_"), PARAMETER, VALUE),
    st.tuples(st.just("zero_"), PARAMETER, st.just(0.0)),
    st.tuples(st.just("copy_"), PARAMETER, st.integers(0, 2**31 - 1)),
    st.tuples(st.just(".data ="), PARAMETER, st.integers(0, 2**31 - 1)),
    st.tuples(st.just(".data.mul_"), PARAMETER, VALUE),
    st.tuples(st.just("load_state_dict"), st.just("both"), st.integers(0, 2**31 - 1)),
)


def apply(layer, edit):
    how, name, value = edit
    if how == "load_state_dict":
        layer.load_state_dict({"weight": fresh((OUT, IN), value), "bias": fresh((OUT,), value + 1)})
        return
    parameter = getattr(layer, name)
    with torch.no_grad():
        if how in ("mul_", "add_", "fill_"):
            getattr(parameter, how)(value)
        elif how == "zero_":
            parameter.zero_()
        elif how == "copy_":
            parameter.copy_(fresh(parameter.shape, value))
        elif how == ".data =":
            parameter.data = fresh(parameter.shape, value)
        else:
            parameter.data.mul_(value)


@settings(max_examples=40, deadline=None)
@given(edits=st.lists(EDIT, min_size=1, max_size=6), rows=st.integers(1, 6))
def test_a_tuned_layer_equals_linear_after_any_sequence_of_edits(tuned_layer, edits, rows):
    x = torch.randn(rows, IN)
    for edit in edits:
        apply(tuned_layer, edit)
        with torch.no_grad():
            assert tuned_layer.why_not(x) is None  # the kernels, not the fallback, compute it
            # float32 rounding of sums in another order: relative to the terms' magnitudes (a stale
            # weight or bias is off by the size of an edit, far more)
            terms = float((x.abs() @ tuned_layer.weight.abs().T + tuned_layer.bias.abs()).max())
            torch.testing.assert_close(tuned_layer(x), functional.linear(x, tuned_layer.weight, tuned_layer.bias), rtol=1e-5,
                                       atol=1e-5 * max(1.0, terms))


def test_frozen_weights_are_bound_once_a_new_tensor_again_and_an_in_place_edit_is_not_seen(options):
    """``frozen=True`` is the caller's promise that the values stay (Inductor's freezing): no
    comparison per call. A weight replaced by another tensor is bound again; an in-place edit
    through ``.data`` is what the promise rules out, and is not seen (the documented contract)."""
    x = torch.randn(4, IN)
    module = nn.Sequential(nn.Linear(IN, OUT)).eval()
    tuned = looprl_torch.tune_module(module, x, frozen=True, **dict(options, progress=False, **MEASURED))
    layer = tuned[0]
    assert layer.kernels.frozen and not looprl_torch.tune_module(module, x, **dict(options, progress=False))[0].kernels.frozen
    with torch.no_grad():
        torch.testing.assert_close(tuned(x), module(x), rtol=1e-5, atol=1e-5)
        layer.weight.data = fresh((OUT, IN), 7)  # a new tensor: bound again
        torch.testing.assert_close(tuned(x), functional.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
        before = tuned(x)
        layer.weight.data.mul_(2)  # in place: the promise broken, the kernels keep the values bound
        torch.testing.assert_close(tuned(x), before, rtol=0, atol=0)
    with pytest.raises(ValueError, match="frozen"):
        looprl_torch.tune_module(module, x, frozen="yes", **options)


def test_under_inductor_freezing_the_backend_binds_once(options):
    import torch._inductor.config as inductor_config

    from looprl import dynamo

    torch._dynamo.reset()
    module = nn.Sequential(nn.Linear(IN, OUT)).eval()
    compiled = torch.compile(module, backend="looprl", options=dict(options, rest="eager"))
    with inductor_config.patch(freezing=True), torch.no_grad():
        x = torch.randn(5, IN)
        torch.testing.assert_close(compiled(x), module(x), rtol=1e-5, atol=1e-5)
    assert dynamo._layers[max(dynamo._layers.keys())].frozen  # the newest operator's kernels
    torch._dynamo.reset()


def test_a_frozen_layer_binds_a_new_tensor_even_at_a_freed_tensor_s_address(options):
    """Issue 51 #3: a weight replaced twice between calls (``.data =``, a new Parameter) often
    gets the freed address of the tensor the kernels were bound to; a frozen layer binds by
    identity (it keeps the bound tensor), so every new tensor is bound again."""
    size = 256  # large enough for the allocator to hand a freed block back whole
    x = torch.randn(4, size)
    layer = looprl_torch.tune_module(nn.Linear(size, size), x, frozen=True, **dict(options, progress=False))
    assert layer.kernels.frozen
    counter = iter(range(10**6))
    replacements = [
        lambda: setattr(layer.weight, "data", fresh((size, size), next(counter))),
        lambda: setattr(layer, "weight", nn.Parameter(fresh((size, size), next(counter)))),
        lambda: setattr(layer.bias, "data", fresh((size,), next(counter))),
    ]
    with torch.no_grad():
        for round in range(30):
            replace = replacements[round % len(replacements)]
            layer(x)
            replace()
            replace()
            torch.testing.assert_close(layer(x), functional.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-4,
                                       msg=lambda m: f"round {round}: {m}")
    assert looprl_torch.stats(layer)["fallback_calls"] == 0


def test_under_inductor_freezing_weights_given_as_inputs_are_still_compared(options):
    """Issue 51 #2: freezing promises that the parameters and buffers (``get_attr`` nodes) keep
    their values, not the graph's inputs: a weight passed to the compiled function is compared
    on every call, and a module's parameter in the same run stays bound once."""
    import torch._inductor.config as inductor_config

    from looprl import dynamo

    def f(x, weight, bias):
        return torch.relu(functional.linear(x, weight, bias))

    torch._dynamo.reset()
    x, weight, bias = torch.randn(4, IN), fresh((OUT, IN), 20), fresh((OUT,), 21)
    module = nn.Sequential(nn.Linear(IN, OUT)).eval()
    compiled_f = torch.compile(f, backend="looprl", options=dict(options, rest="eager"))
    compiled_module = torch.compile(module, backend="looprl", options=dict(options, rest="eager", **MEASURED))
    with inductor_config.patch(freezing=True), torch.no_grad():
        torch.testing.assert_close(compiled_f(x, weight, bias), f(x, weight, bias), rtol=1e-5, atol=1e-5)
        by_input = dynamo._layers[max(dynamo._layers.keys())]
        weight.copy_(fresh((OUT, IN), 22))  # in place: an input carries no promise
        bias.mul_(-2)
        torch.testing.assert_close(compiled_f(x, weight, bias), f(x, weight, bias), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(compiled_module(x), module(x), rtol=1e-5, atol=1e-5)
        by_attribute = dynamo._layers[max(dynamo._layers.keys())]
        before = compiled_module(x)
        module[0].weight.data.mul_(2)  # in place on a frozen parameter: the promise broken, not seen
        torch.testing.assert_close(compiled_module(x), before, rtol=0, atol=0)
    assert not by_input.frozen and by_attribute.frozen
    torch._dynamo.reset()
