"""What each test costs in CPU seconds: a pytest plugin, and a summary of what it wrote.

CPU time, not wall time, because the suite's figures are taken beside other work: a test that
waits (for the machine-wide timing lock, a process's start, Ray's shutdown) costs no CPU. The
CPU of a test is its process's user + system time and that of the child processes it waited for
(Ray's workers, reparented when Ray stops, are not counted).

    CPUTIME_OUT=/tmp/cpu python -m pytest -n 2 --dist worksteal -p tests.cputime
    python -m tests.cputime /tmp/cpu            # CPU seconds per folder, per file, the slowest tests

Each pytest-xdist worker appends one JSON line per test, ``[nodeid, cpu_s, wall_s]``, to
``$CPUTIME_OUT.<worker>``; nothing is recorded where ``CPUTIME_OUT`` is unset.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import resource
import sys
import time

import pytest


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of the children it has waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    prefix = os.environ.get("CPUTIME_OUT")
    cpu, wall = cpu_seconds(), time.perf_counter()
    yield
    if prefix:
        row = [item.nodeid, round(cpu_seconds() - cpu, 3), round(time.perf_counter() - wall, 3)]
        with open(f"{prefix}.{os.environ.get('PYTEST_XDIST_WORKER', 'main')}", "a") as file:
            file.write(json.dumps(row) + "\n")


def summary(prefix: str, slowest: int = 30) -> str:
    """CPU seconds per test folder and per file, and the ``slowest`` tests, from the rows under ``prefix``."""
    rows = [json.loads(line) for path in sorted(glob.glob(f"{glob.escape(prefix)}.*")) for line in open(path)]
    folders, files = collections.Counter(), collections.Counter()
    for nodeid, cpu, _ in rows:
        path = nodeid.split("::")[0]
        files[path] += cpu
        folders["/".join(path.split("/")[:2])] += cpu
    lines = [f"{len(rows)} tests, {sum(files.values()):.1f} CPU s (wall s summed over the workers: {sum(r[2] for r in rows):.1f})"]
    lines += [f"{cpu:8.1f}  {folder}" for folder, cpu in folders.most_common()]
    lines += [""] + [f"{cpu:8.1f}  {path}" for path, cpu in files.most_common(slowest)]
    lines += [""] + [f"{cpu:8.2f}  {nodeid}" for nodeid, cpu, _ in sorted(rows, key=lambda row: -row[1])[:slowest]]
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary(sys.argv[1]))
