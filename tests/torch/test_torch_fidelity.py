"""A tuned model computes what the given model computes, and tuning leaves the given model (and
torch's random generator) as they were (issue 51): fused activations, hooks, parametrizations,
pruning, weight norm, negative views, BatchNorm and Dropout; then a seeded property test over
random small models and random edits."""

import copy
import hashlib
import random

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as functional  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.utils import parametrize, prune  # noqa: E402

import looprl  # noqa: E402
from looprl.torch import TunedLinear, stats, tune_module, tuned_layers  # noqa: E402
from looprl.torch.module import TORCH_EVERYWHERE  # noqa: E402
from looprl.torch.records import left_to_torch  # noqa: E402
from looprl.torch.routes import NEGATIVE_VIEW  # noqa: E402
from tests.policies import random_policy  # noqa: E402

# float32 GEMMs summing in another order: relative error of a few ulp times the reduction's
# length, on values of order one (the layers here reduce over at most 32 terms)
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture(scope="module")
def options(tmp_path_factory):
    folder = random_policy(seed=3).save(tmp_path_factory.mktemp("policy") / "policy")
    # looprl's kernels on every call (none routed to torch by timing), unless a test asks for the
    # checks; each layer scheduled by the policy alone (measure=False): what is under test is
    # which calls the kernels compute and what tuning leaves alone, not what a search finds
    return {"policy": str(folder), "cache": str(tmp_path_factory.mktemp("cache") / "f.sqlite"), "compare_torch": False,
            "progress": False, "measure": False}


def close(a, b):
    torch.testing.assert_close(a, b, **TOLERANCE)


def test_a_negative_view_input_is_computed_with_its_values_and_a_negative_weight_by_torch(options):
    """Issue 51 #14: torch._neg_view keeps the values unnegated in memory, with a bit that says so."""
    torch.manual_seed(0)
    layer = nn.Linear(8, 16).eval()
    x = torch.randn(4, 8)
    tuned = tune_module(layer, x, **options)
    with torch.no_grad():
        close(tuned(torch._neg_view(x)), layer(torch._neg_view(x)))
        close(tuned(torch._neg_view(x.t()).t()), layer(-x))  # a strided negative view too
        assert stats(tuned)["looprl_calls"] == 2  # resolved, then looprl's kernels
        weight = torch.randn(16, 8)
        layer.weight.data = torch._neg_view(weight.clone())
        tuned.weight.data = torch._neg_view(weight.clone())
        assert tuned.weight.is_neg()
        close(tuned(x), layer(x))
        close(tuned(x), functional.linear(x, -weight, layer.bias))
    # Torch's call, or (where the native operator has a plan for these rows: looprl.torch.native)
    # the kernels on the values themselves: torch's dispatcher resolves a negative view before an
    # operator that does not handle the bit, so the native operator is handed the values.
    after = stats(tuned)
    assert after["fallbacks"].get(NEGATIVE_VIEW, 0) + after["looprl_calls"] - 2 == 2
    assert set(after["fallbacks"]) <= {NEGATIVE_VIEW}


_HOOK_TABLES = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs", "_backward_hooks",
                "_backward_pre_hooks", "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
                "_load_state_dict_post_hooks")


def state_digest(module: nn.Module, rng: bool = True) -> str:
    """A hash of everything a call or a tune could change in ``module``: every module's type and
    ``training``, its hook tables (keys and the hooks' identities), its parametrizations, every
    parameter's and buffer's identity, dtype, shape, ``requires_grad`` and bytes, and the plain
    tensor attributes (pruning's ``weight``); and (``rng``) torch's CPU random generator's state."""
    digest = hashlib.sha256()

    def add(*parts):
        digest.update(repr(parts).encode())

    def tensor_bytes(tensor):
        return tensor.detach().resolve_neg().contiguous().numpy().tobytes()

    for name, sub in module.named_modules(remove_duplicate=False):
        add(name, type(sub).__qualname__, sub.training)
        for table in _HOOK_TABLES:
            add(table, [(key, id(hook)) for key, hook in getattr(sub, table, {}).items()])
        if parametrize.is_parametrized(sub):
            add("parametrized", {key: [type(p).__qualname__ for p in plist] for key, plist in sub.parametrizations.items()})
        for key, value in vars(sub).items():
            if isinstance(value, torch.Tensor):
                add("attribute", key, value.dtype, tuple(value.shape))
                digest.update(tensor_bytes(value))
        for key, tensor in list(sub._parameters.items()) + list(sub._buffers.items()):
            add(key, None if tensor is None else (id(tensor), tensor.dtype, tuple(tensor.shape), tensor.requires_grad))
            if tensor is not None:
                digest.update(tensor_bytes(tensor))
    if rng:
        digest.update(torch.random.get_rng_state().numpy().tobytes())
    return digest.hexdigest()


@pytest.mark.filterwarnings("ignore:tune_module. on example:RuntimeWarning")  # the model check's timing, on a busy machine
def test_tuning_leaves_the_model_and_torch_s_generator_as_they_were(options):
    """Issue 51 #4 (issue 50 row 8): BatchNorm and Dropout in train mode; the whole-model check on."""
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Dropout(0.5), nn.Linear(16, 8))  # train mode
    x = torch.randn(6, 8)
    before, module_alone = state_digest(model), state_digest(model, rng=False)
    reference = copy.deepcopy(model)
    tuned = tune_module(model, x, **dict(options, compare_torch=True))
    assert state_digest(model) == before  # parameters, buffers, modes, hooks and torch's generator, bit for bit
    assert model[1].num_batches_tracked.item() == 0
    assert tuned.training and all(a.training == b.training for a, b in zip(tuned.modules(), model.modules()))
    assert {name: buffer.clone() for name, buffer in tuned.named_buffers()}.keys() == dict(model.named_buffers()).keys()
    for (name, buffer), (_, given) in zip(tuned.named_buffers(), model.named_buffers()):
        assert torch.equal(buffer, given), name  # the given module's values, not advanced by the timing
    put_back = [name for name, why in left_to_torch(tuned).items() if why == TORCH_EVERYWHERE]  # torch's at every row count
    assert len(tuned_layers(tuned)) + len(put_back) == 2
    for grad in (False, True):  # looprl's kernels (no grad), torch's (autograd): the same numbers, the same statistics
        with torch.set_grad_enabled(grad):
            torch.manual_seed(11)
            expected = reference(x)
            torch.manual_seed(11)
            close(tuned(x), expected)
        for (name, buffer), (_, given) in zip(tuned.named_buffers(), reference.named_buffers()):
            close(buffer.float(), given.float())
    tuned.eval(), reference.eval()
    with torch.no_grad():
        close(tuned(x), reference(x))
    assert state_digest(model, rng=False) == module_alone  # the returned model's calls did not touch the given one


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8)).eval()


def test_a_pruned_or_hooked_layer_is_left_to_torch_with_its_reason(options):
    """Issue 51 #5: pruning's mask (a forward pre-hook) and a forward hook stay in force."""
    from looprl.torch.module import HOOKED, PRUNED

    x = torch.randn(4, 8)
    model = mlp()
    with torch.no_grad():
        prune.l1_unstructured(model[0], "weight", 0.5)
    before = state_digest(model)
    tuned = tune_module(model, x, **options)
    assert state_digest(model) == before
    assert not isinstance(tuned[0], TunedLinear) and isinstance(tuned[2], TunedLinear)
    assert stats(tuned)["left_to_torch"] == {"0": PRUNED}
    assert tuned.state_dict().keys() == model.state_dict().keys()  # weight_orig and weight_mask kept
    tuned.load_state_dict(model.state_dict())
    with torch.no_grad():
        close(tuned(x), model(x))
        for pruned in (model[0], tuned[0]):
            pruned.weight_mask.fill_(1.0)  # the mask changed after tuning
        close(tuned(x), model(x))

    hooked = mlp(1)
    hooked[2].register_forward_hook(lambda layer, args, output: output * 2)
    hooked[0].register_forward_pre_hook(lambda layer, args: (args[0] + 1,))
    with pytest.warns(RuntimeWarning, match="tuned no layer"):
        tuned = tune_module(hooked, x, **options)
    assert stats(tuned)["left_to_torch"] == {"0": HOOKED, "2": HOOKED}
    with torch.no_grad():
        close(tuned(x), hooked(x))


def test_global_module_hooks_and_parametrizations_leave_layers_to_torch(options):
    from looprl.torch.module import GLOBAL_HOOKS, PARAMETRIZED

    class Double(nn.Module):
        def forward(self, weight):
            return 2 * weight

    x = torch.randn(4, 8)
    model = mlp(2)
    parametrize.register_parametrization(model[2], "weight", Double())
    tuned = tune_module(model, x, **options)
    assert isinstance(tuned[0], TunedLinear) and stats(tuned)["left_to_torch"] == {"2": PARAMETRIZED}
    with torch.no_grad():
        close(tuned(x), model(x))
    seen = []
    handle = torch.nn.modules.module.register_module_forward_hook(lambda module, args, output: seen.append(type(module)))
    try:
        with pytest.warns(RuntimeWarning, match="tuned no layer"):
            tuned = tune_module(mlp(3), x, **options)
        assert set(stats(tuned)["left_to_torch"].values()) == {GLOBAL_HOOKS}
    finally:
        handle.remove()


@pytest.mark.filterwarnings("ignore:.*weight_norm.*:FutureWarning")
def test_weight_norm_and_pruning_in_grad_mode_leave_their_layers_to_torch_and_the_rest_is_tuned(options):
    """Issue 51 #10: their weight is not a graph leaf, which copy.deepcopy refuses."""
    from looprl.torch.module import PARAMETRIZED, PRUNED, WEIGHT_NORM

    x = torch.randn(4, 8)
    for normalise, why in ((torch.nn.utils.weight_norm, WEIGHT_NORM), (torch.nn.utils.parametrizations.weight_norm, PARAMETRIZED),
                           (lambda layer: prune.l1_unstructured(layer, "weight", 0.5), PRUNED)):
        model = mlp(4)
        normalise(model[0])
        assert torch.is_grad_enabled()
        before = state_digest(model)
        tuned = tune_module(model, x, **options)
        assert state_digest(model) == before
        assert stats(tuned)["left_to_torch"] == {"0": why} and isinstance(tuned[2], TunedLinear)
        assert tuned[0].weight.grad_fn is not None  # computed from the copy's own parameters, as in the model
        with torch.no_grad():
            close(tuned(x), model(x))
        tuned(x).sum().backward()  # gradients reach the copy's parameters
        assert all(p.grad is not None for p in tuned[0].parameters())
        with torch.no_grad():
            for layer in (model[0], tuned[0]):
                for parameter in layer.parameters():
                    parameter.mul_(1.5)
            close(tuned(x), model(x))


class CallsItsFirstLayerAlone(nn.Module):
    """Issue 51 #1: a layer run by its sequence (fused with the ReLU after it) and called directly."""

    def __init__(self):
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))

    def forward(self, x):
        return self.seq(x).sum(-1, keepdim=True) + self.seq[0](x)


def test_a_fused_layer_called_alone_computes_the_layer_alone(options):
    from looprl.torch.layers import ALONE

    torch.manual_seed(6)
    model = CallsItsFirstLayerAlone().eval()
    x = torch.randn(4, 8)
    tuned = tune_module(model, x, **options)
    layer = tuned.seq[0]
    assert isinstance(layer, TunedLinear) and layer.activation is not None and layer.alone is not None  # fused, and tuned alone too
    assert type(tuned.seq[1]) is nn.ReLU  # the activation module in its place
    with torch.no_grad():
        close(tuned(x), model(x))
        close(tuned.seq[0](x), model.seq[0](x))  # the layer's own function, not relu of it
        close(tuned.seq(x), model.seq(x))
    assert stats(tuned)["fallback_calls"] == 0  # every call looprl's: fused in the sequence, alone by the layer's own kernels

    # Fused only: called alone after tuning, the layer is computed by torch (and says why).
    sequence = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)).eval()
    tuned = tune_module(sequence, x, **options)
    assert tuned[0].alone is None
    with torch.no_grad():
        close(tuned[0](x), sequence[0](x))
        close(tuned(x), sequence(x))
        tuned[1] = nn.SiLU()  # the activation replaced after tuning: the pair runs as two modules
        sequence[1] = nn.SiLU()
        close(tuned(x), sequence(x))
        tuned[1] = nn.GELU()
        sequence[1] = nn.GELU()
        tuned[1].register_forward_hook(lambda module, args, output: output + 1)  # a hook on the activation: it runs
        sequence[1].register_forward_hook(lambda module, args, output: output + 1)
        close(tuned(x), sequence(x))
    assert stats(tuned)["fallbacks"] == {ALONE: 3}


# ---------------------------------------------------------------------------------------------
# The property: random small models, tuned, then edited; the tuned model computes what the model does.

PROPERTY_MODELS = 14
# Through up to eight float32 layers of at most 16 terms each, a reordered sum differs by a few
# ulp per layer, relative to the values' size (up to ~10 here, after hooks and edits scale them).
PROPERTY_TOLERANCE = {"rtol": 3e-5, "atol": 3e-5}
ACTIVATION_MODULES = (nn.ReLU, nn.GELU, lambda: nn.GELU(approximate="tanh"), nn.SiLU)
_UNTUNED: dict = {}


def untuned_tune(problem, *args, **kwargs):
    """looprl.tune's stand-in here: the problem's untuned nest, compiled once per problem (a real
    looprl kernel, its epilogue included; what is under test is the integration, not the search)."""
    if problem.name not in _UNTUNED:
        nest = looprl.initial_nest(problem)
        _UNTUNED[problem.name] = looprl.TuneResult(problem=problem, nest=nest, kernel=looprl.compile(nest), actions=(), gflops=1.0,
                                                   initial_gflops=1.0, seconds=0.0, mode="policy")
    return _UNTUNED[problem.name]


def compiled_once(any_rows_kernel):
    """``any_rows_kernel`` compiling each result's kernel of runtime rows once (each tuned layer
    compiles its own; the stand-in results here are shared by every layer of a problem)."""
    compiled = {}

    def once(result):
        if id(result) not in compiled:
            compiled[id(result)] = (result, any_rows_kernel(result))
        return compiled[id(result)][1]

    return once


class RandomModel(nn.Module):
    """Linear layers (ReLU/GELU/SiLU after some) in nested sequences with BatchNorm and Dropout,
    a layer called twice, one whose weight may be tied to it, and the first layer called directly."""

    def __init__(self, rng: random.Random):
        super().__init__()
        self.width = width = rng.choice((8, 16))
        parts, self.first = [], None
        for index in range(rng.randint(2, 4)):
            out = rng.choice((8, 16))
            block = [nn.Linear(width, out, bias=rng.random() < 0.8)]
            if rng.random() < 0.7:
                block.append(rng.choice(ACTIVATION_MODULES)())
            if rng.random() < 0.35:
                block.append(nn.BatchNorm1d(out))
            if rng.random() < 0.35:
                block.append(nn.Dropout(0.25))
            nested = rng.random() < 0.5
            parts.append(nn.Sequential(*block) if nested else block)
            if index == 0:
                self.first = "body.0.0" if nested else "body.0"
            width = out
        self.body = nn.Sequential(*[module for part in parts for module in ([part] if isinstance(part, nn.Module) else part)])
        self.twice = nn.Linear(width, width)
        self.tied = nn.Linear(width, width)
        if rng.random() < 0.5:
            self.tied.weight = self.twice.weight
        self.direct = rng.random() < 0.5

    def forward(self, x):
        y = self.body(x)
        y = self.twice(torch.relu(self.twice(y)))
        y = y + self.tied(y)
        if self.direct:
            y = y + self.get_submodule(self.first)(x).sum(-1, keepdim=True)
        return y


def random_model(seed: int) -> tuple[RandomModel, set[str]]:
    """A random model and the features it has (for the coverage check)."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model = RandomModel(rng)
    features = set()
    linears = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    body_linears = [name for name in linears if name.startswith("body")]
    if rng.random() < 0.35:
        model.get_submodule(rng.choice(linears)).register_forward_hook(lambda module, args, output: output * 1.5)
        features.add("forward hook")
    if rng.random() < 0.25:
        model.get_submodule(rng.choice(linears)).register_forward_pre_hook(lambda module, args: (args[0] + 0.5,))
        features.add("forward pre-hook")
    if rng.random() < 0.4:
        with torch.set_grad_enabled(rng.random() < 0.5):
            prune.l1_unstructured(model.get_submodule(rng.choice(body_linears)), "weight", 0.4)
        features.add("pruned")
    if model.tied.weight is model.twice.weight:
        features.add("tied")
    if model.direct:
        features.add("called directly")
    for module in model.modules():
        if isinstance(module, nn.BatchNorm1d):
            features.add("batchnorm")
        if isinstance(module, nn.Dropout):
            features.add("dropout")
    model.train(rng.random() < 0.5)
    features.add("train" if model.training else "eval")
    return model, features


def random_edit(rng: random.Random, model: nn.Module, tuned: nn.Module) -> str:
    """One edit, made alike to the model and to the tuned model: a weight's or bias's values
    through ``.data``, a pruning mask, or the mode."""
    kind = rng.choice(("weight", "bias", "mask", "mode"))
    linears = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    name = rng.choice(linears)
    if kind == "mode":
        training = not model.training
        model.train(training), tuned.train(training)
        return kind
    if kind == "mask":
        pruned = [n for n in linears if hasattr(model.get_submodule(n), "weight_mask")]
        if not pruned:
            return "none"
        mask = (torch.rand(model.get_submodule(pruned[0]).weight_mask.shape, generator=torch.Generator().manual_seed(rng.randrange(9999))) < 0.7)
        for m in (model, tuned):
            m.get_submodule(pruned[0]).weight_mask.copy_(mask.float())
        return kind
    factor = rng.choice((-1.3, 0.5, 2.0))
    for m in (model, tuned):
        layer = m.get_submodule(name)
        if kind == "bias":
            if layer.bias is not None:
                layer.bias.data.add_(factor)
        else:
            (layer.weight_orig if hasattr(layer, "weight_orig") else layer.weight).data.mul_(factor)
    return kind


def compare(model: nn.Module, tuned: nn.Module, x, seed: int) -> None:
    """Both models on ``x``, without and with grad mode (looprl's kernels, then torch's), each
    call after the same seed (Dropout in train mode draws alike)."""
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            torch.manual_seed(seed)
            expected = model(x)
            torch.manual_seed(seed)
            got = tuned(x)
        torch.testing.assert_close(got, expected, **PROPERTY_TOLERANCE)


def test_random_models_tuned_compute_what_they_compute_after_random_edits(monkeypatch):
    from looprl.torch import routes

    monkeypatch.setattr("looprl.torch.layers.tune", untuned_tune)
    monkeypatch.setattr(routes, "any_rows_kernel", compiled_once(routes.any_rows_kernel))
    covered, calls = set(), {"looprl": 0}
    options = {"cache": ":memory:", "compare_torch": False, "progress": False}
    for seed in range(PROPERTY_MODELS):
        model, features = random_model(seed)
        covered |= features
        rng = random.Random(1000 + seed)
        # two example shapes, kernels for 1, 2 and 3 rows (each a problem compiled twice: fixed and
        # runtime rows); the calls below of 5 and 9 rows run in row plans beyond them
        examples = [torch.randn(2, model.width), torch.randn(3, model.width)]
        before = state_digest(model)
        tuned = tune_module(model, examples, **options)
        assert state_digest(model) == before, seed  # the given model and torch's generator as they were
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            tuned(examples[0])  # the returned model's call changes its own state (BatchNorm in train mode), not the model's
        assert state_digest(model) == before, seed
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            model(examples[0])  # the same call: both models' states alike again
        for step in range(4):
            compare(model, tuned, torch.randn(rng.choice((2, 3, 5, 9)), model.width), 100 * seed + step)
            covered.add("edit " + random_edit(rng, model, tuned))
        if any(isinstance(module, TunedLinear) and module.activation is not None for module in tuned.modules()):
            covered.add("fused")
        if any(isinstance(module, TunedLinear) and module.alone is not None for module in tuned.modules()):
            covered.add("fused and tuned alone")
        calls["looprl"] += stats(tuned)["looprl_calls"]
    assert calls["looprl"] > 0
    expected = {"forward hook", "forward pre-hook", "pruned", "tied", "called directly", "batchnorm", "dropout", "train", "eval",
                "edit weight", "edit bias", "edit mask", "edit mode", "fused", "fused and tuned alone"}
    assert expected <= covered, expected - covered
