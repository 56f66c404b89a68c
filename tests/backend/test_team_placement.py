"""A parallel kernel on looprl's private runtime holds each thread of its team to a core of its
own for the call (looprl.backend.placement): the calling thread to the core it is on, the pool
threads to other cores of its affinity; the caller's affinity is as it was after the call; a
caller held to one core, or a runtime looprl does not own, is left alone."""

import json
import os
import subprocess
import sys

import pytest

from looprl.backend.placement import pool_cores
from looprl.backend.threads import available_cores


def test_pool_threads_take_the_lowest_other_cores_of_the_caller_s_affinity():
    assert pool_cores(0, {0, 1}, 2) == (1,)
    assert pool_cores(1, {0, 1}, 2) == (0,)
    assert pool_cores(2, {0, 1, 2, 3}, 3) == (0, 1)
    assert pool_cores(5, {3, 5, 9}, 3) == (3, 9)


def test_a_team_larger_than_the_caller_s_cores_is_left_unplaced():
    assert pool_cores(0, {0}, 2) is None
    assert pool_cores(0, {0, 1}, 3) is None


# In a fresh interpreter (no torch: the private runtime is the one loaded). After a two-thread
# call: the kernel's result and the caller's affinity as before; then, in a region of the team's
# own under placed_team, each thread's core (sched_getcpu) and affinity: each held to one core,
# the two cores different.
CODE = """
import ctypes, os, sys
import numpy as np, looprl
from looprl.backend import placement, threads
problem = looprl.matmul(64, 48, 32)
kernel = looprl.compile(looprl.initial_nest(problem).parallel(0), threads=2)
a, b = (np.random.default_rng(0).standard_normal(s).astype(np.float32) for s in problem.input_shapes)
before = os.sched_getaffinity(0)
assert np.allclose(kernel(a, b), a @ b, rtol=1e-5, atol=1e-5)
assert os.sched_getaffinity(0) == before, (os.sched_getaffinity(0), before)
runtime = threads.private_runtime()
assert runtime is not None
cores = {}
body = placement._REGION_BODY(lambda _: cores.__setitem__(runtime.omp_get_thread_num(), (placement.current_core(), sorted(os.sched_getaffinity(0)))))
with placement.placed_team(2):
    runtime.GOMP_parallel(body, None, 2, 0)
assert os.sched_getaffinity(0) == before
print(sorted(cores.items()))
"""


@pytest.mark.skipif(available_cores() < 2 or not os.path.exists("/proc/self/maps"), reason="needs two cores and /proc")
def test_a_two_thread_call_runs_each_thread_on_its_own_core_and_restores_the_caller_s_affinity(child):
    result, outputs = child
    assert "placed" in outputs, result.stderr[-2000:]
    cores = dict(eval(outputs["placed"][-1]))  # noqa: S307 - our own child's printed list
    assert sorted(cores) == [0, 1], cores
    (caller, caller_mask), (pool, pool_mask) = cores[0], cores[1]
    assert caller_mask == [caller] and pool_mask == [pool] and caller != pool, cores


HELD = """
import os
import numpy as np, looprl
from looprl.backend import placement
problem = looprl.matmul(64, 48, 32)
kernel = looprl.compile(looprl.initial_nest(problem).parallel(0), threads=2)
a, b = (np.ones(s, np.float32) for s in problem.input_shapes)
kernel(a, b)
os.sched_setaffinity(0, {placement.current_core()})  # the caller now holds itself to one core
held = os.sched_getaffinity(0)
assert (kernel.run(a, b, np.empty((64, 48), np.float32), threads=1) is None)
with placement.placed_team(2):  # a team of two cannot be placed on one core: nothing is changed
    assert os.sched_getaffinity(0) == held
print("ok")
"""


# Both scripts in one fresh interpreter (one process start and import of looprl, not two), each
# in a namespace of its own, the held caller last (it holds the process to one core); what each
# printed is kept only where it ran to its end, so one failing fails its own test alone.
CHILD = """
import contextlib, io, json, sys, traceback
outputs = {}
for name, part in (("placed", PLACED), ("held", HELD)):
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(part, name, "exec"), {"__name__": "__main__"})
        outputs[name] = printed.getvalue().strip().splitlines()
    except BaseException:
        traceback.print_exc()
print(json.dumps(outputs))
"""


@pytest.fixture(scope="module")
def child():
    """The child's process and what each script printed (by name), run once for the module."""
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    script = f"PLACED = {CODE!r}\nHELD = {HELD!r}\n" + CHILD
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result, json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(available_cores() < 2 or not os.path.exists("/proc/self/maps"), reason="needs two cores and /proc")
def test_a_caller_held_to_one_core_is_left_as_it_is(child):
    result, outputs = child
    assert outputs.get("held") == ["ok"], result.stderr[-2000:]


def test_off_the_private_runtime_nothing_is_placed(monkeypatch):
    from looprl.backend import placement

    monkeypatch.setattr(placement, "private_runtime", lambda: None)
    before = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    with placement.placed_team(2):
        if before is not None:
            assert os.sched_getaffinity(0) == before


@pytest.mark.skipif(available_cores() < 2, reason="needs two cores")
def test_placement_is_turned_off_by_its_setting_and_a_bad_setting_is_a_value_error(monkeypatch):
    from looprl.backend import placement

    placed = []
    monkeypatch.setattr(placement, "private_runtime", lambda: object())
    monkeypatch.setattr(placement, "_place_pool", lambda runtime, pool: placed.append(pool))
    monkeypatch.setattr(placement._placed, "cores", None, raising=False)
    for setting in ("1", "0"):
        monkeypatch.setattr(placement, "PLACE_TEAMS", setting)
        with placement.placed_team(2):
            pass
        assert len(placed) == 1  # placed with "1", not again with "0"
    monkeypatch.setattr(placement, "PLACE_TEAMS", "yes")
    with pytest.raises(ValueError, match="LOOPRL_PLACE_TEAMS must be 0 or 1, not 'yes'"):
        with placement.placed_team(2):
            pass
