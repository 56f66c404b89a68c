import gc
import os
import sys

# The suite writes bytecode caches even where the environment turns them off
# (PYTHONDONTWRITEBYTECODE=1, as some hosts and CI images set). Without them every interpreter
# the suite starts compiles what it imports again: each pytest-xdist worker of each of the
# README's two runs re-rewrote the asserts of all ~120 test modules (collection 18.4 -> 8.0 CPU s
# per worker on a Zen 3), and each process a test starts (CLIs, Ray's workers, the wheel's
# interpreter) compiled looprl's ~170 modules (~0.5 CPU s). Set here, before pytest imports the
# test modules; the workers and the processes the tests start inherit it. Only __pycache__
# folders (ignored by git) are written.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
    sys.dont_write_bytecode = False

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# The kernels the tests run share torch's libgomp (each worker imports torch when it collects;
# looprl/backend/threads.py), whose idle threads spin 300,000 times after each parallel region
# (libgomp's default): with two workers on two cores they spin on the core the other worker
# computes on, and their CPU is counted. With GOMP_SPINCOUNT=1000, what looprl's own runtime
# sets where it loads libgomp first, tests/backend cost 64.3 CPU s -> 60.1 (two workers, by `time`).
# Set here, before anything loads libgomp; workers and the processes the tests start inherit
# it. tests/backend/test_runtime_sharing.py runs its processes without it.
if not {"GOMP_SPINCOUNT", "OMP_WAIT_POLICY"} & set(os.environ):
    os.environ["GOMP_SPINCOUNT"] = "1000"

# Inductor compiles in the process that asks (one compile thread) instead of a pool of its own:
# by default the first Inductor compilation of a process (compile_threads = its cores, 2 here)
# starts a sidecar process that imports torch again (~2 CPU s) and a pool of workers for C++
# compiles that a warm Inductor cache rarely needs; each pytest worker and each docs block that
# compiled with Inductor paid it. The compiled graphs are the same; only where Inductor's own
# compilation runs changes. Set before torch is imported (its config reads the variable then);
# the workers and the processes the tests start inherit it.
if "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ:
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"

# Every property test replays the same examples on every run and host (derandomize: drawn from
# a seed fixed by the test function; no example database carried between runs): its verdict never
# depends on the examples one run happened to draw. A failure found once is kept as an explicit
# @example beside its test. Each test's own @settings (its example count) inherits this.
settings.register_profile("looprl", derandomize=True, database=None)
settings.load_profile("looprl")

TARGET_VARIABLE = "LOOPRL_TARGET"  # looprl.target.TARGET_VARIABLE, read here without importing looprl
RERUN_SHARE = 3


def examples(count: int) -> int:
    """How many examples a target-dependent property test draws: ``count`` where looprl's
    default target is the host's, a third of them (at least one) where ``LOOPRL_TARGET`` names a
    target (.ci/run's second command, ``LOOPRL_TARGET=avx2 ... -m target_dependent``). The host's
    run draws them all, over every target the test draws from; the re-run is there to fail a
    test that assumes the host's ISA or policy (what the default target decides: the tiles, the
    plans, the shipped policy, the dot products), which its first examples reach as well as the
    rest. Its explicit ``@example``s run in both."""
    named = os.environ.get(TARGET_VARIABLE, "").strip().lower() not in ("", "host")
    return max(1, count // RERUN_SHARE) if named else count


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread_per_worker():
    """Under pytest-xdist (``-n 2``: one worker per core) each worker's torch runs on one
    thread. Two threads of torch's OpenMP pool spin on both cores; with the other worker busy
    there, a torch call timed against a looprl kernel ran 8x slower than alone and flipped the
    judgements ``tests/torch/test_torch_routes.py`` checks. Run serially, torch keeps its threads."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    try:
        import torch
    except ImportError:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(autouse=True, scope="session")
def private_cache_dir(tmp_path_factory):
    """Keep the tests (and the processes they start) out of the user's measurement cache."""
    previous = os.environ.get("LOOPRL_CACHE_DIR")
    os.environ["LOOPRL_CACHE_DIR"] = str(tmp_path_factory.mktemp("looprl-cache"))
    yield
    if previous is None:
        os.environ.pop("LOOPRL_CACHE_DIR", None)
    else:
        os.environ["LOOPRL_CACHE_DIR"] = previous


@pytest.fixture(autouse=True, scope="session")
def strict_evaluation():
    """Evaluators re-raise compile and run failures in the tests (and in the processes they
    start): a failure must never pass for a slow schedule. Tests of the failure path turn it
    off for themselves."""
    previous = os.environ.get("LOOPRL_STRICT")
    os.environ["LOOPRL_STRICT"] = "1"
    yield
    if previous is None:
        os.environ.pop("LOOPRL_STRICT", None)
    else:
        os.environ["LOOPRL_STRICT"] = previous


@pytest.fixture
def cache_path(tmp_path):
    return os.path.join(tmp_path, "measurements.sqlite")


@pytest.fixture
def failing_compiles(monkeypatch):
    """``failing_compiles(fails)``: from now on, evaluators fail (non-strict) to compile every
    nest for which ``fails(nest)`` is true, as a code generator bug would."""
    from looprl.errors import CompileError
    from looprl.measurement import evaluator as evaluator_module

    real_compile = evaluator_module.compile

    def install(fails):
        monkeypatch.setenv("LOOPRL_STRICT", "0")

        def compile_or_fail(nest, *args, **kwargs):
            if fails(nest):
                raise CompileError("simulated compile failure")
            return real_compile(nest, *args, **kwargs)

        monkeypatch.setattr(evaluator_module, "compile", compile_or_fail)

    return install


@pytest.fixture(autouse=True)
def a_quiet_machine(monkeypatch):
    """The machine's load (looprl.measurement.load) reads quiet in the tests unless a test
    simulates load: two pytest workers share two cores, so a real reading taken while the other
    worker computes says busy at random, and tune would then keep its answer as provisional, or
    re-time a remembered one and find it slow, and a test's "tuned again is a lookup" would
    depend on the other worker. A test that replaces the timing rule (``timing.best_time``, as
    tests/measurement/test_busy_machine.py's slowed timer does) gets real readings and re-timings through it."""
    from looprl.measurement import load, timing
    from looprl.tune import store

    real_best_time, real_reference, real_retime = timing.best_time, load.time_reference, store.retime_remembered

    def reference(target, threads=1, lock=None, settle_s=0.0):
        return real_reference(target, threads, lock, settle_s) if timing.best_time is not real_best_time else 100.0

    def retime(record, evaluator):
        return real_retime(record, evaluator) if timing.best_time is not real_best_time else True

    monkeypatch.setattr(load, "time_reference", reference)
    monkeypatch.setattr(store, "retime_remembered", retime)


@pytest.fixture(autouse=True, scope="session")
def a_timing_lock_per_worker(tmp_path_factory):
    """Each pytest worker times under a machine-wide lock of its own (a file in its own temporary
    folder), so one worker's timings never wait for the other's: the tests assert behaviour,
    never a speed, and the load readings read quiet (:func:`a_quiet_machine`). Waiting for the
    other worker's timings cost about a minute and a half of the suite's wall-clock time on two
    cores. Tests of the lock itself make their own lock files; processes a test starts use the
    real default."""
    from looprl.measurement import lock

    real = lock.default_lock_path
    own = tmp_path_factory.mktemp("timing-lock") / "looprl-timing.lock"
    lock.default_lock_path = lambda: own
    yield
    lock.default_lock_path = real


@pytest.fixture(autouse=True, scope="session")
def bandwidth_measured_once_per_session():
    """Each host bandwidth (a target, buffer size, thread count and budget) is measured for real
    once per test process, then given again: tune measures the L2, LLC and DRAM bandwidths for
    every new measurement cache (about four seconds of CPU each; many tests tune into a fresh
    ``:memory:`` cache), and a machine's bandwidth is not what those tests check. tests/measurement/test_roofline.py
    checks the measurement itself (and replaces this with its own stand-in where it counts
    measurements)."""
    from looprl.measurement import roofline

    real = roofline.measure_bandwidth_gbs
    measured = {}

    def once(target, buffer_bytes, threads=1, budget_s=0.3):
        try:
            key = (target.key, buffer_bytes, threads, budget_s)
            hash(key)
        except (AttributeError, TypeError):  # not a target, an unhashable argument: the real checks answer
            return real(target, buffer_bytes, threads, budget_s)
        if key not in measured:
            measured[key] = real(target, buffer_bytes, threads, budget_s)
        return measured[key]

    roofline.measure_bandwidth_gbs = once
    yield
    roofline.measure_bandwidth_gbs = real


@pytest.fixture(autouse=True)
def looprl_loggers_enabled(monkeypatch):
    """looprl's loggers are enabled in every test: a library a test in the same worker set up
    (Ray's logging configuration) may have disabled the loggers it does not name, and tests that
    read looprl's log lines (caplog) would then pass or fail by the order the worker ran them in."""
    import logging

    for name, logger in list(logging.root.manager.loggerDict.items()):
        if (name == "looprl" or name.startswith("looprl.")) and isinstance(logger, logging.Logger) and logger.disabled:
            monkeypatch.setattr(logger, "disabled", False)


TARGET_DEPENDENT = "target_dependent"


def pytest_configure(config):
    """The README's second run (``LOOPRL_TARGET=<isa> ... -m target_dependent``) stops at once,
    passing, where the target it names has the host's own vector ISA (``LOOPRL_TARGET=avx2`` on
    an AVX2-only CPU): the first run already ran every one of those tests with that ISA as the
    default target (its tiles, plans, shipped policy and dot products), and a test that assumes
    the host's ISA cannot fail there. Only the LLVM CPU name differs (the host's, ``znver3``,
    against the generic ``x86-64-v3``), which no target-dependent test is about; code for the
    generic targets is compiled and checked by the tests that name them. Decided in the
    controller, before any worker starts."""
    named = os.environ.get(TARGET_VARIABLE, "").strip().lower()
    if (hasattr(config, "workerinput") or named in ("", "host")
            or config.getoption("markexpr", "") != TARGET_DEPENDENT):
        return
    from looprl.target import TARGET_NAMES, Target

    if named in TARGET_NAMES and Target.named(named).isa == Target.host().isa:
        pytest.exit(f"{TARGET_VARIABLE}={named} is this host's own vector ISA: the run without it already ran "
                    f"the {TARGET_DEPENDENT} tests with {named} as the default target", returncode=0)


def pytest_ignore_collect(collection_path, config):
    """Under ``-m target_dependent`` alone (.ci/run's second command) a test file whose text never
    names the marker is not imported: none of its tests would run, and importing it (torch,
    RLlib, transformers, pytest's rewriting of its asserts) cost each worker seconds (the
    marker is only ever applied in the test files themselves:
    tests/project/test_test_map.py checks it)."""
    if (config.getoption("markexpr", "") == TARGET_DEPENDENT and collection_path.suffix == ".py"
            and collection_path.name.startswith("test_") and TARGET_DEPENDENT not in collection_path.read_text()):
        return True
    return None


@pytest.fixture
def ray_session():
    """A Ray of this test process's own (two CPUs, no dashboard) for the tests that train with
    RLlib in the test process, shared by consecutive tests that ask for it: the first starts it,
    :func:`pytest_runtest_teardown` stops it after the last (starting a Ray costs ~1.5 CPU s
    and ~5 s of waiting; one left idle, ~3% of a core). The training runs of the command line
    called in the test process (``looprl.cli.train.main``) attach to it and leave it running."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    import torch

    torch.set_num_threads(1)
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False)
    yield


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """Stop :func:`ray_session`'s Ray after the last of the consecutive tests that use it."""
    ray = sys.modules.get("ray")
    if ray is None or "ray_session" not in getattr(item, "fixturenames", ()):
        return
    if (nextitem is None or "ray_session" not in getattr(nextitem, "fixturenames", ())) and ray.is_initialized():
        ray.shutdown()


# The longest groups (training runs with Ray, command lines, benchmarks, tuned torch modules,
# the docs' blocks) start each pytest-xdist worker's share, the tests marked slow first of all;
# the short tests end each share. pytest-xdist's worksteal hands worker i the i-th contiguous
# share of the collection and, when a worker runs dry, gives it the last half of what the
# busiest worker has left: a long test at the end of a share ran last while the other worker
# idled (the docs' torch blocks, ~40 s, once ended a run whose other worker had stopped 34 s
# before). Laid out this way what is stolen is short tests.
LONG_FIRST = ("tests/train/", "tests/cli/", "tests/bench/", "tests/torch/", "tests/project/test_docs.py")


def _uses_ray(item) -> bool:
    return "ray_session" in getattr(item, "fixturenames", ())


def _long_units(items) -> tuple[list[list], list]:
    """The long tests in units, one per test file (a module's fixtures are set up once per
    worker that runs any of its tests) but for the tests that share one Ray, which are one unit
    (they run side by side on one worker); the files holding a test marked slow first, then
    the groups in :data:`LONG_FIRST`'s order. And the short tests, in the collection's order."""
    def group(item) -> int:
        return next((i for i, prefix in enumerate(LONG_FIRST) if item.nodeid.startswith(prefix)), len(LONG_FIRST))

    units: dict[str, list] = {}
    for item in items:
        if group(item) < len(LONG_FIRST):
            units.setdefault("ray" if _uses_ray(item) else item.nodeid.split("::")[0], []).append(item)
    order = sorted(units.values(), key=lambda unit: (all(item.get_closest_marker("slow") is None for item in unit),
                                                      min(group(item) for item in unit)))
    return order, [item for item in items if group(item) == len(LONG_FIRST)]


def _share_sizes(count: int, workers: int) -> list[int]:
    """How many tests pytest-xdist's worksteal first hands each worker (its check_schedule)."""
    sizes = []
    for index in range(workers):
        sizes.append(count // (workers - index))
        count -= sizes[-1]
    return sizes


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected: the shares are of what runs
def pytest_collection_modifyitems(config, items):
    units, short = _long_units(items)
    workers = getattr(config, "workerinput", {}).get("workercount", 1)
    shares: list[list] = [[] for _ in range(workers)]
    for index, unit in enumerate(units):  # dealt in turn: each share starts with its long tests
        shares[index % workers].extend(unit)
    laid_out, taken = [], 0
    for share, size in zip(shares, _share_sizes(len(items), workers)):
        fill = size - len(share)
        if fill < 0:  # more long tests than one share holds: longest first, as they come
            laid_out = [item for unit in units for item in unit] + short
            break
        laid_out += share + short[taken:taken + fill]
        taken += fill
    items[:] = laid_out


def pytest_collection_finish(session):
    """What collection created (the imported modules: torch, transformers, RLlib, the test modules
    and their constants) is moved out of the garbage collector's generations (``gc.freeze``): a
    full collection then walks what the tests made, not the ~460,000 objects a worker holds once
    it imported torch and transformers (0.28 CPU s each on a Zen 3, ~0 after). The tests that
    check a graph or a kernel is freed collect explicitly (tests/torch: ~20 times), and Python's
    own full collections run as objects pile up. Objects a test makes are collected as before."""
    gc.freeze()
