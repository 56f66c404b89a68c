"""The AutoTVM cost model: features, XGBoost model, saved files; and LoopNest.from_key."""

import json
import sys

import numpy as np
import pytest

import looprl
from looprl.costmodel import FEATURE_KEY, feature_length, feature_names, features, features_batch
from looprl.costmodel.schedule_features import CONTEXT_NAMES, context_matrix, register_plan
from looprl.costmodel.model import CostModel, TransferModel, import_xgboost
from looprl.ir.nest import LoopNest, initial_nest
from looprl.target import Target

PROBLEMS = [
    looprl.matmul(32, 48, 40),
    looprl.matmul(67, 139, 229),
    looprl.contraction("bmk,bkn->bmn", b=3, m=16, k=24, n=20),
    looprl.contraction("mk,nk->mn", m=20, n=36, k=12),
]

AVX512 = Target.named("avx512")  # features describe one target's register planning


def random_nests(problem, count, seed=0, max_loops=10):
    rng = np.random.default_rng(seed)
    nests = []
    for _ in range(count):
        nest = initial_nest(problem)
        for _ in range(int(rng.integers(0, 7))):
            i = int(rng.integers(len(nest.compute)))
            if rng.random() < 0.5 and len(nest) < max_loops and nest.loops[i].size >= 2:
                nest = nest.split(i, int(rng.integers(2, min(16, nest.loops[i].size) + 1)))
            elif i + 1 < len(nest.compute) and nest.loops[i].var != nest.loops[i + 1].var:
                nest = nest.swap(i)
        nests.append(nest)
    return nests


def test_features_have_one_length_for_every_problem_and_are_deterministic():
    length = feature_length()
    assert len(feature_names()) == length
    for problem in PROBLEMS:
        for nest in random_nests(problem, 6):
            row = features(nest, target=AVX512)
            assert row.shape == (length,) and row.dtype == np.float32
            assert np.all(np.isfinite(row)) and np.all(row >= 0)
            assert np.array_equal(row, features(nest, target=AVX512))
    batch = features_batch([n for p in PROBLEMS for n in random_nests(p, 3)], target=AVX512)
    assert batch.shape == (12, length)
    assert np.array_equal(batch[0], features(random_nests(PROBLEMS[0], 1)[0], target=AVX512))


def test_features_take_a_resolved_target():
    nest = initial_nest(looprl.matmul(64, 64, 64))
    for wrong in (None, "avx512"):
        with pytest.raises(ValueError, match="features .of one target.s register planning.: expected a looprl Target"):
            features(nest, target=wrong)
    tiled = nest.split(0, 4).swap(1)  # a register tile of 4 rows x 64 columns: fits AVX-512 only
    assert not np.array_equal(features(tiled, target=AVX512), features(tiled, target=Target.named("sse4")))


def test_features_distinguish_schedules_and_follow_the_code_generator():
    problem = looprl.matmul(64, 64, 64)
    root = initial_nest(problem)  # m, k, n: n (the output's last dimension) innermost
    tiled = root.split(0, 4).swap(1)  # m/4, k, m4, n: a register tile of 4 rows
    assert not np.array_equal(features(root, target=AVX512), features(tiled, target=AVX512))
    rows, _ = context_matrix(tiled, AVX512)
    vectorised = CONTEXT_NAMES.index("vectorised")
    assert rows[:, vectorised].tolist() == [0, 0, 0, 1, 0, 1]  # innermost compute and write-back loops on n
    plan = register_plan(tiled, AVX512)
    in_scope = rows[: len(tiled.compute), CONTEXT_NAMES.index("register_scope")]
    assert in_scope.tolist() == [float(i >= plan.scope_start and not plan.streaming) for i in range(len(tiled.compute))]
    # length, top-down and bottom-up are log2(1 + x) of 16, 16*64, 16*64*4*64 for the outer loop
    assert rows[0, :3] == pytest.approx(np.log2(1 + np.array([16, 16, 16 * 64 * 4 * 64])))


def test_from_key_round_trips_and_refuses_bad_keys():
    for problem in PROBLEMS:
        for nest in random_nests(problem, 10, seed=1):
            assert LoopNest.from_key(problem, nest.key) == nest
    problem = PROBLEMS[0]
    for bad in ["", "m32s1,k40s1,n48s1", "m32s1,k40s1|m32s1,n48s1", "m32s1,k40s1,n48s1|m32s1", "m32s1,k40s1,n48s2|m32s1,n48s1",
                "m8s4,m4s1,k40s1,n48s1|m32s1,n48s1,k40s1", "m8s4t5,m4s1,k40s1,n48s1|m32s1,n48s1", "x32s1,k40s1,n48s1|m32s1,n48s1"]:
        with pytest.raises(ValueError, match="key|schedule"):
            LoopNest.from_key(problem, bad)


def synthetic(problem, count, seed):
    """Schedules and made-up GFLOPS: a vectorised innermost loop is ~5x faster."""
    nests = random_nests(problem, count, seed)
    rng = np.random.default_rng(seed)
    good = np.array([n.compute[-1].var == problem.output[-1] for n in nests])
    return nests, np.where(good, 50.0, 10.0) + rng.random(count), good


@pytest.mark.parametrize("objective", ["rank", "regression"])
def test_model_ranks_a_clearly_better_set_above_a_worse_one(objective):
    problem = PROBLEMS[1]
    nests, gflops, _ = synthetic(problem, 120, 0)
    model = CostModel(objective).fit(features_batch(nests, target=AVX512), gflops)
    test_nests, _, good = synthetic(problem, 60, 1)
    assert good.any() and not good.all()
    scores = model.predict(features_batch(test_nests, target=AVX512))
    assert scores.shape == (60,)
    ordered = (scores[good][:, None] > scores[~good][None, :]).mean()  # pairs ranked right
    assert ordered > 0.9
    assert good[np.argsort(-scores)[:5]].all()


def test_transfer_model_starts_from_the_global_model():
    nests, gflops, _ = synthetic(PROBLEMS[1], 80, 0)
    global_model = CostModel().fit(features_batch(nests, target=AVX512), gflops, groups=[n.problem.name for n in nests])
    transfer = TransferModel(global_model)
    x = features_batch(random_nests(PROBLEMS[0], 20, 2), target=AVX512)
    assert np.array_equal(transfer.predict(x), global_model.predict(x))
    local, local_gflops, good = synthetic(PROBLEMS[0], 40, 3)
    transfer.fit(features_batch(local, target=AVX512), local_gflops)
    scores = transfer.predict(features_batch(local, target=AVX512))
    assert scores[good].mean() > scores[~good].mean()


def test_save_and_load_round_trip(tmp_path):
    nests, gflops, _ = synthetic(PROBLEMS[0], 60, 0)
    x = features_batch(nests, target=AVX512)
    model = CostModel("regression", target="host-key").fit(x, gflops)
    path = model.save(tmp_path / "model.json")
    loaded = CostModel.load(path, target="host-key", objective="regression")
    assert loaded.objective == "regression" and loaded.target == "host-key" and loaded.trained_on == 60
    assert np.allclose(loaded.predict(x), model.predict(x))


def test_corrupt_or_mismatched_model_files_are_value_errors_naming_the_file(tmp_path):
    nests, gflops, _ = synthetic(PROBLEMS[0], 30, 0)
    path = CostModel(target="host-key").fit(features_batch(nests, target=AVX512), gflops).save(tmp_path / "model.json")
    data = json.loads(path.read_text())

    def written(name, content):
        target = tmp_path / name
        target.write_text(content if isinstance(content, str) else json.dumps(content))
        return target

    cases = [
        written("truncated.json", path.read_text()[:200]),
        written("binary.json", "\x00\x01garbage"),
        written("other.json", {"hello": 1}),
        written("features.json", {**data, "features": "0.codegen0"}),
        written("trees.json", {**data, "booster": {"learner": "nonsense"}}),
        written("length.json", {**data, "feature_length": 5}),
        written("layout.json", {**data, "layout": {"max_levels": 10, "isa": "nosuch"}}),
        tmp_path / "missing.json",
    ]
    for bad in cases:
        with pytest.raises(ValueError, match=bad.name):
            CostModel.load(bad)
    with pytest.raises(ValueError, match="model.json.*target"):
        CostModel.load(path, target="another-host")
    with pytest.raises(ValueError, match="model.json.*objective"):
        CostModel.load(path, objective="regression")
    assert data["features"] == FEATURE_KEY


def test_model_refuses_bad_input():
    with pytest.raises(ValueError, match="objective"):
        CostModel("nosuch")
    model = CostModel()
    with pytest.raises(ValueError, match="not fitted"):
        model.predict(np.zeros((1, feature_length())))
    with pytest.raises(ValueError, match="feature matrix"):
        model.fit(np.zeros((3, 7)), [1, 2, 3])
    with pytest.raises(ValueError, match="GFLOPS values"):
        model.fit(np.zeros((3, feature_length())), [1, 2])


def test_missing_xgboost_is_a_clear_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "xgboost", None)
    with pytest.raises(ImportError, match=r"looprl\[autotvm\]"):
        import_xgboost()


def test_cost_model_refuses_fractional_seeds_and_bad_levels():
    for kwargs, name in ((dict(seed=1.5), "seed"), (dict(seed=-1), "seed"), (dict(max_levels=0), "max_levels"),
                         (dict(max_levels=True), "max_levels"), (dict(rounds=np.bool_(True)), "rounds")):
        with pytest.raises(ValueError, match=f"{name} must be a"):
            CostModel(**kwargs)
    model = CostModel(seed=np.int64(3), max_levels=np.int64(4), rounds=np.int32(2))
    assert (model.seed, model.layout["max_levels"], model.rounds) == (3, 4, 2)
