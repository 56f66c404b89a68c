"""The ``models`` dataset: real models' contractions, split by model."""

import dataclasses
import json
from collections import defaultdict

import numpy as np
import pytest

import looprl
from looprl.workloads import architectures
from looprl.workloads.architectures import MAX_MACS, MAX_NK, MODEL_NAMES, TEST_MODELS, excluded_entries
from looprl.workloads.datasets import dataset_entries, dataset_path, dataset_problems, load_dataset
from looprl.ir.nest import initial_nest
from looprl.ir.problem import parse_problem


@pytest.fixture(scope="module")
def everything():
    return dataset_entries("models", "all")


def _find(entries, model, layer):
    """The entry of ``model`` whose layer list names ``layer``."""
    found = [e for e in entries if e.model == model and layer in e.layer.split(", ")]
    assert len(found) == 1, (model, layer, found)
    return found[0]


def test_split_is_by_model_and_shares_no_shape():
    train, test = dataset_entries("models", "train"), dataset_entries("models", "test")
    train_models, test_models = {e.model for e in train}, {e.model for e in test}
    assert not train_models & test_models
    assert test_models == set(TEST_MODELS) and train_models | test_models == set(MODEL_NAMES)
    assert not {(e.spec, e.sizes) for e in train} & {(e.spec, e.sizes) for e in test}
    content = load_dataset("models")
    assert (content["train_models"], content["test_models"]) == ([m for m in MODEL_NAMES if m not in TEST_MODELS], list(TEST_MODELS))
    assert 0.25 <= len(test) / (len(train) + len(test)) <= 0.35
    assert dataset_problems("models", "all") == dataset_problems("models", "train") + dataset_problems("models", "test")


def test_bounds_and_metadata(everything):
    assert 150 <= len(everything) <= 400
    shapes = defaultdict(set)
    for entry in everything:
        sizes = dict(entry.sizes)
        assert sizes["n"] <= MAX_NK and sizes["k"] <= MAX_NK and min(sizes.values()) >= 1
        assert entry.macs <= MAX_MACS and entry.problem.flops == 2 * entry.macs
        assert entry.spec in ("mk,kn->mn", "bmk,bnk->bmn", "bmk,bkn->bmn")
        assert entry.model in MODEL_NAMES and entry.layer.strip() and entry.derivation.strip()
        assert (entry.spec, entry.sizes) not in shapes[entry.model], f"{entry.model} lists {entry.problem.name} twice"
        shapes[entry.model].add((entry.spec, entry.sizes))
        assert parse_problem(entry.problem.name) == entry.problem  # the numpy child parses names
    assert {e.spec for e in everything} == {"mk,kn->mn", "bmk,bnk->bmn", "bmk,bkn->bmn"}
    assert {e.model for e in everything} == set(MODEL_NAMES)


@pytest.mark.parametrize(("model", "layer", "sizes"), [
    ("bert-base", "seq128/ffn.up", {"m": 128, "n": 3072, "k": 768}),
    ("bert-base", "seq128/attention.qkv_proj", {"m": 128, "n": 3 * 768, "k": 768}),
    ("bert-large", "seq512/ffn.down", {"m": 512, "n": 1024, "k": 4096}),
    ("bert-base", "seq512/attention.scores", {"b": 12, "m": 512, "n": 512, "k": 64}),
    ("bert-base", "seq512/attention.context", {"b": 12, "m": 512, "n": 64, "k": 512}),
    ("bert-large", "classifier", {"m": 1, "n": 2, "k": 1024}),
    ("gpt2", "decode-b4/attention.qkv_proj", {"m": 4, "n": 2304, "k": 768}),
    ("gpt2-medium", "prefill1024/attention.scores", {"b": 16, "m": 1024, "n": 1024, "k": 64}),
    ("smollm-360m", "prefill512/attention.k_proj", {"m": 512, "n": 5 * 64, "k": 960}),
    ("smollm-135m", "decode-b16/mlp.down_proj", {"m": 16, "n": 576, "k": 1536}),
    ("tinyllama-1.1b", "prefill128/attention.v_proj", {"m": 128, "n": 4 * 64, "k": 2048}),
    ("resnet-50", "conv1", {"m": 112 * 112, "n": 64, "k": 3 * 7 * 7}),
    ("resnet-50", "layer2.0.downsample.0", {"m": 28 * 28, "n": 512, "k": 256}),
    ("resnet-50", "layer3.4.conv2", {"m": 14 * 14, "n": 256, "k": 256 * 9}),
    ("resnet-50", "fc", {"m": 1, "n": 1000, "k": 2048}),
    ("mobilenet-v2", "features.2.conv.0", {"m": 112 * 112, "n": 96, "k": 16}),
    ("mobilenet-v2", "features.18.0", {"m": 7 * 7, "n": 1280, "k": 320}),
    ("vit-s16", "patch_embed", {"m": 14 * 14, "n": 384, "k": 3 * 16 * 16}),
    ("vit-s16", "attention.context", {"b": 6, "m": 197, "n": 64, "k": 197}),
])
def test_derivations_match_hand_computed_sizes(everything, model, layer, sizes):
    assert dict(_find(everything, model, layer).sizes) == sizes


def test_shared_shapes_are_listed_once_with_their_layers(everything):
    shared = _find(everything, "resnet-50", "layer1.0.downsample.0")
    assert shared.layer == "layer1.0.conv3, layer1.0.downsample.0, layer1.1.conv3, layer1.2.conv3"
    assert "56*56 output pixels, 256 out channels, 64*1*1 inputs" in shared.derivation
    assert _find(everything, "smollm-135m", "decode-b1/attention.q_proj").layer == "decode-b1/attention.q_proj, decode-b1/attention.o_proj"
    assert "(fused q,k,v)" in _find(everything, "bert-base", "seq128/attention.qkv_proj").derivation


def test_exclusions_are_beyond_the_bounds_and_documented():
    excluded = excluded_entries()
    layers = {(x.entry.model, layer.split("/")[-1]) for x in excluded for layer in x.entry.layer.split(", ")}
    assert {("tinyllama-1.1b", "mlp.up_proj"), ("resnet-50", "layer4.0.conv2"), ("gpt2", "lm_head"), ("gpt2-medium", "ffn.up")} <= layers
    doc = architectures.__doc__
    for entry_model, layer in layers:
        assert entry_model in doc and (layer in doc or layer.startswith("layer4.")), (entry_model, layer)
    for item in excluded:
        sizes = dict(item.entry.sizes)
        assert max(sizes["n"], sizes["k"]) > MAX_NK or item.entry.macs > MAX_MACS, item
        assert item.reason


def test_entries_are_immutable(everything):
    assert isinstance(everything, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        everything[0].model = "other"
    grid = dataset_entries("mm64-256", "test")
    assert grid[0].model is None and grid[0].layer is None
    assert tuple(e.problem for e in grid) == dataset_problems("mm64-256", "test")


def test_rows_are_stored_one_per_line_with_named_fields():
    lines = [line for line in dataset_path("models").read_text().splitlines() if '"model"' in line]
    assert len(lines) == len(dataset_entries("models", "all"))
    assert list(json.loads(lines[0].strip().rstrip(","))) == ["model", "layer", "derivation", "spec", "sizes"]


def test_initial_nests_compile_and_the_smallest_match_numpy(everything):
    by_spec = defaultdict(list)
    for entry in everything:
        by_spec[entry.spec].append(entry.problem)
    rng = np.random.default_rng(0)
    for spec, problems in by_spec.items():
        for problem in sorted(set(problems), key=lambda p: p.flops)[:4]:
            a, b = (rng.uniform(-1, 1, shape).astype(np.float32) for shape in problem.input_shapes)
            expected = np.einsum(spec, a.astype(np.float64), b.astype(np.float64))
            got = looprl.compile(initial_nest(problem))(a, b)
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-3 * max(1, problem.size("k")) ** 0.5)


def test_every_initial_nest_compiles(everything):
    for problem in {e.problem for e in everything}:
        assert looprl.compile(initial_nest(problem)).problem == problem


def test_bad_names_are_rejected():
    with pytest.raises(ValueError, match="unknown dataset"):
        dataset_entries("model")
    with pytest.raises(ValueError, match="unknown split"):
        dataset_entries("models", "valid")
    with pytest.raises(ValueError, match="unknown split"):
        dataset_problems("models", None)
