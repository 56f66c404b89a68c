"""Benchmark sets of problems with a fixed, seeded train/test split.

``mm64-256`` is LoopTune's set: matmuls with M, N and K each in 64..256 step 16 (13^3 = 2197
problems), 80% for training and 20% (440) for testing. The split is stored in
``envs/mm64-256.json`` (shipped as package data) with explicit dimension names; :func:`build_dataset` regenerates the
same content from the seed (a test checks that the file and the generator agree), and is
used when the package is installed without the repository's ``envs/`` folder.

``mm384-1024`` is the same construction at sizes where the operands no longer fit in L2
(M, N and K each in 384..1024 step 128, 216 problems, 44 for testing): there, cache blocking
matters besides the register tile, and a search has to find both (a harder set for the
searches and the cost model than the L2-resident mm64-256).

``models`` is the GEMMs and attention products of published models (BERT, GPT-2, SmolLM,
TinyLlama, ViT-S/16, ResNet-50, MobileNetV2), derived from their configurations in
:mod:`looprl.workloads.architectures` (which says how, the bounds, what is left out and why) and
split by model: the test split is whole models that no training problem comes from. It and
``models-called`` also have a derived ``validation`` split (:func:`validation_entries`: the
training models' linear layers at row counts no split holds), for choosing between policies
without looking at a test split. Its rows
carry ``model``, ``layer``, ``derivation``, ``spec`` and ``sizes``; :func:`dataset_entries`
returns them, :func:`dataset_problems` the problems alone.

``gemm-shapes`` is a seeded random draw of contractions with the variety of real layers that
the grids lack: each extent log-uniform (rows 1..4096, so decode rows of 1-16 and odd counts such
as 197 or 12544-like long thin GEMMs; columns and reductions 8..4096, half of them multiples
of 8), a quarter of them batched (``bmk,bkn->bmn`` or the attention-score ``bmk,bnk->bmn``),
at most 2^26 multiply-adds each, and no shape of the ``models`` test split. It is a training
set for policies meant for models they never saw: the grids teach only square-ish L2-sized
problems.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from looprl import checks, defaults

from looprl.workloads.architectures import MODEL_NAMES, TEST_MODELS, excluded_entries, model_entries
from looprl.workloads.entries import DatasetEntry
from looprl.ir.problem import Problem, as_problem
from looprl.resources import shipped_path

SPLITS = ("train", "validation", "test", "all")
# Rows of the validation split: no split of models or models-called holds them (theirs are 1, 4,
# 16, 128, 512, 1024 and the vision models' own), so no policy is trained on their labels.
VALIDATION_ROWS = (2, 8, 256)

_DEFINITIONS = {
    "mm64-256": {
        "description": "matmuls C[m,n] = A[m,k] @ B[k,n] with m, n, k each in 64..256 step 16",
        "spec": "mk,kn->mn",
        "values": list(range(64, 257, 16)),
        "seed": 20230905,
        "test_fraction": 0.2,
    },
    "mm384-1024": {
        "description": "matmuls C[m,n] = A[m,k] @ B[k,n] with m, n, k each in 384..1024 step 128",
        "spec": "mk,kn->mn",
        "values": list(range(384, 1025, 128)),
        "seed": 20261124,
        "test_fraction": 0.2,
    },
    "gemm-shapes": {
        "description": "seeded random GEMM and batched-GEMM shapes with log-uniform extents (rows 1..4096, "
                       "columns and reductions 8..4096), at most 2^26 multiply-adds, none of the models test split",
        "count": 600,
        "seed": 20261125,
        "test_fraction": 0.2,
        "max_macs": 2 ** 26,
    },
    "models": {
        "description": "GEMMs and attention products of published models, derived from their configurations "
                       "(looprl.workloads.architectures); split by model",
    },
    "models-called": {
        "description": "the linear layers of the models dataset as a model calls them (the problems looprl.tune searches "
                       "for torch's nn.Linear): the weight constant, re-laid as its twin (mk,kn->mn), and at up to "
                       f"{defaults.COLD_ROWS} rows (decode) also as stored (mk,nk->mn), both read cold (every other layer's "
                       "weight read between two calls), with the decode layers too wide for models (TinyLlama's MLP, LM "
                       "heads); split by model as models is",
        "called_from": "models",
    },
}


def dataset_names() -> list[str]:
    return sorted(_DEFINITIONS)


def build_dataset(name: str) -> dict:
    """The dataset's JSON content, generated from its definition and seed (or, for
    ``models``, from the models' configurations)."""
    definition = _definition(name)
    if "count" in definition:
        return _shapes_content(name, definition)
    if "called_from" in definition:
        return _called_content(name, definition)
    if "values" not in definition:
        return _models_content(name, definition)
    values = definition["values"]
    everything = [{"m": m, "n": n, "k": k} for m in values for n in values for k in values]
    order = np.random.default_rng(definition["seed"]).permutation(len(everything))
    test_count = math.ceil(len(everything) * definition["test_fraction"])
    test = sorted((everything[i] for i in order[:test_count]), key=lambda p: (p["m"], p["n"], p["k"]))
    train = sorted((everything[i] for i in order[test_count:]), key=lambda p: (p["m"], p["n"], p["k"]))
    return {
        "name": name,
        "description": definition["description"],
        "spec": definition["spec"],
        "seed": definition["seed"],
        "train": train,
        "test": test,
    }


def _shapes_content(name: str, definition: dict) -> dict:
    rng = np.random.default_rng(definition["seed"])
    held_out = {(e.spec, e.sizes) for e in model_entries() if e.model in TEST_MODELS}

    def extent(low_exponent: float, high_exponent: float, aligned: bool) -> int:
        value = int(round(2.0 ** rng.uniform(low_exponent, high_exponent)))
        return max(8, value // 8 * 8) if aligned else value

    rows, seen = [], set()
    while len(rows) < definition["count"]:
        kind = rng.uniform()
        spec = "mk,kn->mn" if kind < 0.75 else ("bmk,bkn->bmn" if kind < 0.875 else "bmk,bnk->bmn")
        aligned = bool(rng.uniform() < 0.5)
        sizes = {"m": extent(0, 12, False), "n": extent(3, 12, aligned), "k": extent(3, 12, aligned)}
        if spec != "mk,kn->mn":
            sizes = {"b": int(rng.integers(2, 17)), **sizes}
        macs = math.prod(sizes.values())
        key = (spec, tuple(sizes.items()))
        if macs > definition["max_macs"] or macs < 4096 or key in held_out or key in seen:
            continue
        seen.add(key)
        rows.append({"spec": spec, "sizes": sizes})
    test_count = math.ceil(len(rows) * definition["test_fraction"])
    order = rng.permutation(len(rows))
    return {
        "name": name,
        "description": definition["description"],
        "seed": definition["seed"],
        "train": [rows[i] for i in sorted(order[test_count:])],
        "test": [rows[i] for i in sorted(order[:test_count])],
    }


def _models_content(name: str, definition: dict) -> dict:
    entries = model_entries()
    return {
        "name": name,
        "description": definition["description"],
        "train_models": [m for m in MODEL_NAMES if m not in TEST_MODELS],
        "test_models": [m for m in MODEL_NAMES if m in TEST_MODELS],
        "train": [e.to_row() for e in entries if e.model not in TEST_MODELS],
        "test": [e.to_row() for e in entries if e.model in TEST_MODELS],
    }


def _called_content(name: str, definition: dict) -> dict:
    source = load_dataset(definition["called_from"])
    content = {"name": name, "description": definition["description"],
               "train_models": source["train_models"], "test_models": source["test_models"]}
    # the models' decode layers too wide for the models dataset (n or k > 4096: TinyLlama's MLP, LM heads)
    decode = [e.entry for e in excluded_entries() if dict(e.entry.sizes)["m"] <= defaults.COLD_ROWS]
    for split, models in (("train", source["train_models"]), ("test", source["test_models"])):
        wide = [entry for entry in decode if entry.model in models]
        content[split] = [row for entry in dataset_entries(definition["called_from"], split) + tuple(wide) for row in as_called(entry)]
    return content


def as_called(entry: DatasetEntry) -> list[dict]:
    """The rows of ``entry`` as a model calls it, if it is a linear layer's GEMM (an ``mk,kn->mn``
    of a model that is not a convolution): the twin tune searches (weight constant, re-laid
    ``kn``) and, up to :data:`defaults.COLD_ROWS` rows, the layer as stored (``nk``), both cold
    (the dataset's models that decode hold hundreds of MB of weights: past twice any
    last-level cache). Anything else: no rows."""
    if entry.model is None or entry.spec != "mk,kn->mn" or "conv" in (entry.derivation or ""):
        return []
    sizes = dict(entry.sizes)
    few = sizes["m"] <= defaults.COLD_ROWS
    twin = replace(entry, constant=("in1",), cold=few)
    rows = [twin.to_row()]
    if few:
        rows.append(replace(twin, spec="mk,nk->mn", sizes=(("m", sizes["m"]), ("n", sizes["n"]), ("k", sizes["k"]))).to_row())
    return rows


def dataset_path(name: str) -> Path:
    _definition(name)
    return shipped_path("envs", f"{name}.json")


def write_dataset(name: str, path: Path | None = None) -> Path:
    path = Path(path) if path is not None else dataset_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    content = build_dataset(name)
    text = json.dumps({k: v for k, v in content.items() if k not in ("train", "test")}, indent=2)[:-2]
    # One problem per line keeps the file readable and diffs small.
    for split in ("train", "test"):
        rows = ",\n".join("    " + json.dumps(p) for p in content[split])
        text += f',\n  "{split}": [\n{rows}\n  ]'
    path.write_text(text + "\n}\n", encoding="utf-8")
    return path


def load_dataset(name: str) -> dict:
    """The stored dataset file (or the generated content when the file is not available)."""
    path = dataset_path(name)
    if path.exists():
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"dataset file {path} is unreadable: {error}") from error
    return build_dataset(name)


def dataset_entries(name: str, split: str = "train") -> tuple[DatasetEntry, ...]:
    """The rows of ``split`` ("train", "validation", "test" or "all") of dataset ``name``, each a
    frozen :class:`DatasetEntry` (spec, sizes, and for ``models`` the model, layer and
    derivation). ``validation`` (:func:`validation_entries`) is derived, not stored, and only
    ``models`` and ``models-called`` have one; ``all`` is train and test."""
    split = checks.one_of(split, "split", SPLITS)
    if split == "validation":
        return validation_entries(name)
    content = load_dataset(name)
    rows = content["train"] + content["test"] if split == "all" else content[split]
    try:
        return tuple(DatasetEntry.from_row(row, content.get("spec")) for row in rows)
    except ValueError as error:
        raise ValueError(f"dataset {name}: {error}") from None


@functools.cache  # a tuple of frozen entries, derived from the shipped files
def validation_entries(name: str) -> tuple[DatasetEntry, ...]:
    """The validation split of ``models`` or ``models-called``: the linear layers of the training
    models (the ``mk,kn->mn`` GEMMs of ``models``' train split that are not convolutions), each
    once, at :data:`VALIDATION_ROWS` rows, row counts no split holds; for ``models-called`` as a
    model calls them (:func:`as_called`). Disjoint from both stored splits, so that choosing
    between policies (or keeping an adaptation) never looks at the test split, and no policy
    was trained on these problems' labels. Any other dataset: a ValueError."""
    source = _definition(name).get("called_from", name)
    if source != "models":
        raise ValueError(f"dataset {name!r} has no validation split (only models and models-called: their training "
                         f"models' linear layers at {', '.join(map(str, VALIDATION_ROWS))} rows)")
    layers = {}
    for entry in dataset_entries("models", "train"):
        sizes = dict(entry.sizes)
        if entry.spec == "mk,kn->mn" and "conv" not in (entry.derivation or ""):
            layers.setdefault((sizes["k"], sizes["n"]), entry)
    entries = [_at_rows(entry, rows) for entry in layers.values() for rows in VALIDATION_ROWS]
    if name == "models":
        return tuple(entries)
    # models-called also holds the training models' decode layers too wide for models (LM heads, TinyLlama's MLP)
    train_models = set(load_dataset("models")["train_models"])
    wide = {}
    for excluded in excluded_entries():
        entry, sizes = excluded.entry, dict(excluded.entry.sizes)
        if entry.model in train_models and sizes["m"] <= defaults.COLD_ROWS and (sizes["k"], sizes["n"]) not in layers:
            wide.setdefault((sizes["k"], sizes["n"]), entry)
    entries += [_at_rows(entry, rows) for entry in wide.values() for rows in VALIDATION_ROWS]
    return tuple(DatasetEntry.from_row(row) for entry in entries for row in as_called(entry))


def _at_rows(entry: DatasetEntry, rows: int) -> DatasetEntry:
    """``entry``'s layer at ``rows`` rows, its derivation saying so."""
    sizes = dict(entry.sizes)
    return replace(entry, sizes=(("m", rows), ("n", sizes["n"]), ("k", sizes["k"])),
                   derivation=f"{entry.derivation}; at {rows} rows (validation)")


def dataset_problems(name: str, split: str = "train") -> tuple[Problem, ...]:
    """The problems of ``split`` ("train", "validation", "test" or "all") of dataset ``name``."""
    return tuple(entry.problem for entry in dataset_entries(name, split))


def _definition(name: str) -> dict:
    if not isinstance(name, str) or name not in _DEFINITIONS:
        raise ValueError(f"unknown dataset {name!r}; known datasets: {', '.join(dataset_names())}")
    return _DEFINITIONS[name]


if __name__ == "__main__":  # python -m looprl.workloads.datasets: rewrite the stored files
    for dataset in dataset_names():
        print(write_dataset(dataset))


def env_problems(dataset: str = defaults.DATASET, split: str = "train", problems=None) -> tuple[Problem, ...]:
    """The problems an env with these arguments draws from: ``problems`` when given, else the
    dataset's split."""
    if problems is None:
        return tuple(p for group in dataset_groups(dataset, split) for p in group)
    if isinstance(problems, (str, Problem)):
        problems = [problems]
    if not hasattr(problems, "__iter__"):
        raise ValueError(f"problems must be a list of Problems or problem strings, got {type(problems).__name__}")
    resolved = []
    for index, item in enumerate(problems):
        try:
            resolved.append(as_problem(item))
        except ValueError as error:
            raise ValueError(f"problems[{index}]: {error}") from None
    if not resolved:
        raise ValueError("problems must not be empty")
    return tuple(resolved)


def dataset_groups(dataset, split: str = "train") -> tuple[tuple[Problem, ...], ...]:
    """The split of each dataset ``dataset`` names: one name or a list of names."""
    names = [dataset] if isinstance(dataset, str) else dataset
    if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"unknown dataset {dataset!r}; known datasets: {', '.join(dataset_names())} (or a non-empty list of them)")
    return tuple(dataset_problems(name, split) for name in dict.fromkeys(names))
