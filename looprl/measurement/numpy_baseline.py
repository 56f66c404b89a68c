"""numpy's GFLOPS on one thread (or ``threads`` BLAS threads), timed in a child process.

OpenBLAS reads ``OPENBLAS_CORETYPE`` and its thread count when numpy is first imported, so the
baseline needs a fresh interpreter with its own environment: the thread variables of every
BLAS (``OPENBLAS_NUM_THREADS``, ``OMP_NUM_THREADS``, ...) are set to the thread count, so
looprl's N-thread kernels are compared with numpy on N BLAS threads. ``numpy_gflops`` starts
one; run this module directly to time in-process.

Which kernels numpy runs follows the ISA of the code it is compared with: for the host's own
ISA (``isa=None``, or the host's, e.g. ``"avx512"`` on an AVX-512 machine)
``OPENBLAS_CORETYPE`` is unset and OpenBLAS picks its native kernels; for a narrower ISA it is
set to that ISA's OpenBLAS core type (``"avx2"``: Haswell, ``"sse4"``: Nehalem), so that AVX2
code cross-compiled and timed on an AVX-512 host is compared with numpy's AVX2 kernels, what
numpy would run on an AVX2 machine. On an AMD EPYC (Zen 5, AVX-512) host, a 1024^3 float32
matmul on one thread ran at 245-253 GFLOPS unset against 131-136 with Haswell.

What is timed is what a user writes: ``np.matmul(a, b, out=out)`` for ``mk,kn->mn`` and
``bmk,bkn->bmn``, ``np.matmul(a, b.swapaxes(-1, -2), out=out)`` for ``mk,nk->mn`` and
``bmk,bnk->bmn`` (einsum need not call BLAS for batched products); for any other spec
``np.einsum`` with its optimal path, or, where faster, ``np.matmul`` on transposed or reshaped
views (``km,kn->mn``, ``bkm,bkn->bmn`` and the 1x1 convolutions ``nchw,oc->nohw`` and
``nhwc,oc->nhwo``); then the problem's epilogue, if it has one, one numpy call
per step (:mod:`looprl.measurement.numpy_epilogue`): numpy's time covers the same work as the
fused kernel's. A cold problem's constant operands (``;cold``, ``;between=``) are timed on
rotating copies, each call the next (:func:`operand_sets`), as looprl's kernels and torch's
calls are: numpy reads its weights from as far as the problem says, not from a warm cache
(before, numpy alone ran warm on cold problems: a 1x960x960 decode layer at 50 GFLOPS against
the 21 of looprl's kernel reading from memory, in ``decode_gemms_znver5_cold.txt``).

:class:`BaselineChild` keeps such a child running and times one problem at a time on request
(one JSON line in, one out), so that a benchmark can time numpy in turn with its own kernels,
round after round, rather than once before all of them. A child that dies (killed by a
signal, or an import that fails in it) is one line naming the child and the signal or error
(:attr:`BaselineChild.failure`); its figures are then None.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile

from looprl import checks
from looprl.backend.threads import check_threads
from looprl.measurement.lock import machine_lock
from looprl.measurement.timing import best_time, cold_copy_count
from looprl.target import Target

_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")
# OpenBLAS core type whose kernels use at most this vector ISA (widest first, as TARGET_NAMES)
CORETYPES = {"avx512": "SkylakeX", "avx2": "Haswell", "sse4": "Nehalem"}
_MATMUL_SPECS = ("mk,kn->mn", "bmk,bkn->bmn")
_TRANSPOSED_SPECS = ("mk,nk->mn", "bmk,bnk->bmn")


def coretype_for(isa: str | None, host_isa: str | None = None) -> str | None:
    """The ``OPENBLAS_CORETYPE`` for comparing with code for ``isa``: None (native kernels)
    when ``isa`` is None or not narrower than ``host_isa`` (default: this machine's), else
    the core type of ``isa``."""
    isa = checks.one_of(isa, "isa", CORETYPES, allow_none=True)
    if isa is None:
        return None
    host_isa = checks.one_of(Target.host().isa if host_isa is None else host_isa, "host isa", CORETYPES)
    widths = list(CORETYPES)
    return CORETYPES[isa] if widths.index(isa) > widths.index(host_isa) else None


def baseline_environment(isa: str | None = None, host_isa: str | None = None, threads: int = 1) -> dict[str, str]:
    """The child's environment: ``threads`` BLAS threads (default one), and
    ``OPENBLAS_CORETYPE`` as :func:`coretype_for` says (an inherited value is dropped either
    way)."""
    threads = check_threads(threads)
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    env.update({name: str(threads) for name in _THREAD_VARIABLES})
    coretype = coretype_for(isa, host_isa)
    if coretype is not None:
        env["OPENBLAS_CORETYPE"] = coretype
    return env


def baseline_label(isa: str | None = None, host_isa: str | None = None, threads: int = 1) -> str:
    """What the baseline runs, for reports: e.g. ``"numpy, 1 thread, native kernels"``."""
    coretype = coretype_for(isa, host_isa)
    kernels = "native kernels" if coretype is None else f"OPENBLAS_CORETYPE={coretype} ({isa} kernels)"
    return f"numpy, {threads} thread{'s' if threads != 1 else ''}, {kernels}"


NUMPY_CHILD = ("-m", "looprl.measurement.numpy_baseline", "--serve")  # the child's interpreter arguments


class BaselineChild:
    """A baseline timed in a child process that stays up: ``time(problem, budget_s)`` sends it
    one problem and returns what it answers (None once it failed). The child prints one JSON
    line when ready (``{"label": ...}``, or ``{"error": ...}`` when it cannot time at all), then
    answers each request line ``{"problem": name, "budget_s": s}`` with ``{"gflops": ...}``.
    The caller holds the machine-wide lock while it times; ``name`` says which child it is in
    messages ("numpy baseline")."""

    def __init__(self, name: str, arguments, environment: dict[str, str]):
        self.name = name
        self.failure: str | None = None
        self._errors = tempfile.TemporaryFile(mode="w+", encoding="utf-8")  # a file, not a pipe: a chatty child never blocks
        self._process = subprocess.Popen([sys.executable, *arguments], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._errors, text=True, env=environment)
        hello = self._answer()
        self.label = None if hello is None else hello.get("label")

    def time(self, problem, budget_s: float):
        """The child's figure for ``problem`` (its name is sent), or None once it has failed."""
        if self.failure is not None:
            return None
        try:
            self._process.stdin.write(json.dumps({"problem": problem.name, "budget_s": budget_s}) + "\n")
            self._process.stdin.flush()
        except OSError:
            pass  # it died: the answer's end of file says how
        answer = self._answer()
        return None if answer is None else answer.get("gflops")

    def _answer(self) -> dict | None:
        line = self._process.stdout.readline()
        answer = None
        if line:
            try:
                answer = json.loads(line)
            except ValueError:
                answer = {"error": f"unreadable answer {line.strip()[:200]!r}"}
        if answer is not None and "error" not in answer:
            return answer
        self.failure = f"{self.name} process failed: {answer['error']}" if answer is not None else self._death()
        self.close()
        return None

    def _death(self) -> str:
        """One line: how the child ended (the signal that killed it, or its status and last error line)."""
        try:
            status = self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            status = self._process.wait()
        self._errors.seek(0)
        lines = [line.strip() for line in self._errors.read().splitlines() if line.strip()]
        last = f": {lines[-1]}" if lines else " (no error output)"
        if status < 0:
            try:
                signal_name = signal.Signals(-status).name
            except ValueError:
                signal_name = f"signal {-status}"
            return f"{self.name} process was killed by {signal_name}{last if lines else ''}"
        return f"{self.name} process ended (exit status {status}){last}"

    def close(self) -> None:
        """End the child (its stdin closed; killed if it does not end in a few seconds)."""
        if self._process.poll() is None:
            try:
                self._process.stdin.close()
                self._process.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self._process.kill()
                self._process.wait()
        for stream in (self._process.stdin, self._process.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        self._errors.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def numpy_child(isa: str | None = None, threads: int = 1) -> BaselineChild:
    """A running numpy baseline (:class:`BaselineChild`) with ``threads`` BLAS threads and the
    OpenBLAS kernels for ``isa`` (:func:`baseline_environment`)."""
    return BaselineChild("numpy baseline", NUMPY_CHILD, baseline_environment(isa, threads=threads))


def numpy_gflops(problems: list, budget_s: float = 0.3, isa: str | None = None, threads: int = 1) -> list[float]:
    """GFLOPS of numpy (see the module docstring for the call) for each problem, measured in
    a child process with ``threads`` BLAS threads (default one) and the OpenBLAS kernels for
    ``isa`` (None: native), by the common timing rule; this process holds the machine-wide
    lock meanwhile. A child that fails is a RuntimeError of one line naming it and the signal or error."""
    budget_s = checks.seconds(budget_s, "budget_s")
    with machine_lock(), numpy_child(isa, threads) as child:
        values = [child.time(problem, budget_s) for problem in problems]
        if child.failure is not None:
            raise RuntimeError(child.failure)
    return values


def in_turn_with_numpy(kernel, problem, budget_s: float = 0.1, isa: str | None = None, threads: int = 1,
                       rounds: int = 3) -> tuple[float, float]:
    """``(looprl's GFLOPS, numpy's GFLOPS)`` on ``problem``: ``kernel`` (on its own thread
    count) and numpy (in a child process with ``threads`` BLAS threads and ``isa``'s OpenBLAS
    kernels) timed in turn, ``budget_s`` each, for ``rounds`` rounds under the machine-wide
    lock, each keeping its best, so that a drift of the machine touches both figures alike. A
    child that fails is a RuntimeError of one line naming it."""
    from looprl.measurement.timing import time_kernel

    budget_s = checks.seconds(budget_s, "budget_s")
    rounds = checks.positive_int(rounds, "rounds")
    mine = theirs = 0.0
    with machine_lock(), numpy_child(isa, threads) as child:
        for _ in range(rounds):
            mine = max(mine, time_kernel(kernel, budget_s, lock=contextlib.nullcontext()).gflops)
            theirs = max(theirs, child.time(problem, budget_s))
            if child.failure is not None:
                raise RuntimeError(child.failure)
    return mine, theirs


def _einsum_call(spec: str, a, b, out):
    import numpy as np

    path = np.einsum_path(spec, a, b, optimize="optimal")[0]

    def run():
        np.einsum(spec, a, b, out=out, optimize=path)

    return run


def _view_call(problem, a, b, out):
    """``np.matmul`` on transposed or reshaped views of the operands, for the specs a user
    writes that way (:data:`_VIEW_SPECS`), else None."""
    import numpy as np

    spec, sizes = problem.spec, dict(problem.sizes)
    if spec == "km,kn->mn":
        return lambda: np.matmul(a.T, b, out=out)
    if spec == "bkm,bkn->bmn":
        return lambda: np.matmul(a.swapaxes(-1, -2), b, out=out)
    if spec == "nchw,oc->nohw":  # a 1x1 convolution, NCHW: W @ X per image
        x = a.reshape(sizes["n"], sizes["c"], sizes["h"] * sizes["w"])
        y = out.reshape(sizes["n"], sizes["o"], sizes["h"] * sizes["w"])
        return lambda: np.matmul(b, x, out=y)
    if spec == "nhwc,oc->nhwo":  # a 1x1 convolution, NHWC: X @ W^T over all pixels
        x = a.reshape(-1, sizes["c"])
        y = out.reshape(-1, sizes["o"])
        return lambda: np.matmul(x, b.T, out=y)
    return None


def _view_is_faster(einsum_run, view_run, budget_s: float) -> bool:
    """Whether matmul on views (None: not available) runs faster here than ``np.einsum``
    (optimal path): a short timing of each, outside the reported one."""
    if view_run is None:
        return False

    def repeat_of(run):
        return lambda reps: [run() for _ in range(reps)]

    times = [best_time(repeat_of(run), budget_s / 3, flops=1, lock=contextlib.nullcontext()).seconds for run in (einsum_run, view_run)]
    return times[1] < times[0]


def _blas_threads() -> int:
    """The BLAS threads this process was started with (:func:`baseline_environment`; one when unset)."""
    text = os.environ.get("OPENBLAS_NUM_THREADS", "1")
    return int(text) if text.isdigit() and int(text) > 0 else 1


def operand_sets(problem, a, b, threads: int = 1) -> list[tuple]:
    """The ``(a, b)`` pairs numpy is timed on, each call taking the next: ``[(a, b)]`` for a
    warm problem; for one with bytes read between calls (``;cold``, ``;between=``), each
    constant operand in :func:`~looprl.measurement.timing.cold_copy_count` copies (for
    ``threads`` threads: as looprl's kernels and torch's calls are timed), so numpy too reads
    its weights from as far as the problem says rather than from a warm cache."""
    from looprl.backend.buffers import aligned_empty

    operands = {"in0": a, "in1": b}
    copies = {}
    for tensor, array in operands.items():
        count = cold_copy_count(array.nbytes, between=problem.between, threads=threads) if tensor in problem.constant else 1
        copies[tensor] = [array]
        for _ in range(count - 1):
            copy = aligned_empty(array.shape, array.dtype)
            copy[...] = array  # the values do not matter, only that each copy is its own memory
            copies[tensor].append(copy)
    count = max(len(c) for c in copies.values())
    return [tuple(copies[t][i % len(copies[t])] for t in operands) for i in range(count)]


def _in_turn(runs: list):
    """One call that runs the next of ``runs`` each time (the only one when there is one)."""
    if len(runs) == 1:
        return runs[0]
    turn = [0]

    def run():
        runs[turn[0]]()
        turn[0] = (turn[0] + 1) % len(runs)

    return run


def _numpy_call(problem, rng, budget_s: float, threads: int = 1):
    """A ``repeat(reps)`` that runs ``problem`` in numpy (module docstring) on fresh operands
    (where two calls could do, the faster in a short timing out of ``budget_s``), a cold
    problem's constant operands rotated (:func:`operand_sets`)."""
    import numpy as np

    from looprl.backend.buffers import aligned_empty
    from looprl.measurement.numpy_epilogue import apply_epilogue

    a, b = (aligned_empty(s) for s in problem.input_shapes)
    a[...] = rng.uniform(-1, 1, a.shape)
    b[...] = rng.uniform(-1, 1, b.shape)
    out = aligned_empty(problem.output_shape)
    sets = operand_sets(problem, a, b, threads)
    if problem.spec in _MATMUL_SPECS:
        runs = [lambda a=a, b=b: np.matmul(a, b, out=out) for a, b in sets]
    elif problem.spec in _TRANSPOSED_SPECS:
        runs = [lambda a=a, b=b: np.matmul(a, b.swapaxes(-1, -2), out=out) for a, b in sets]
    elif _view_is_faster(_einsum_call(problem.spec, a, b, out), _view_call(problem, a, b, out), budget_s):
        runs = [_view_call(problem, a, b, out) for a, b in sets]
    else:
        runs = [_einsum_call(problem.spec, a, b, out) for a, b in sets]
    run = _in_turn(runs)

    extra = {}
    for what, shape in problem.epilogue_shapes:
        extra[what] = aligned_empty(shape)
        extra[what][...] = rng.uniform(-1, 1, shape)
    scratch = aligned_empty(problem.output_shape)
    epilogue = problem.epilogue

    def repeat(reps: int) -> None:
        for _ in range(reps):
            run()
            if not epilogue.is_identity:
                apply_epilogue(epilogue, out, scratch, extra.get("bias"), extra.get("residual"))

    return repeat


def _time_in_process(names: list[str], budget_s: float) -> list[float]:
    import numpy as np

    from looprl.ir.problem import parse_problem
    from looprl.measurement.numpy_epilogue import erf_source

    erf_source()  # imports scipy's erf now, if there is one, not inside a timing
    rng = np.random.default_rng(0)
    results = []
    for name in names:
        problem = parse_problem(name)
        if not problem.dtype.numpy_computes:  # numpy has no bfloat16
            results.append(math.nan)
            continue
        # The parent holds the machine-wide lock while this process runs.
        results.append(best_time(_numpy_call(problem, rng, budget_s, _blas_threads()), budget_s, flops=problem.flops, lock=contextlib.nullcontext()).gflops)
    return results


def _serve() -> None:
    """The child's loop (:class:`BaselineChild`): one problem per request line, its operands
    made once and kept while the next requests name the same problem."""
    import numpy as np

    from looprl.ir.problem import parse_problem
    from looprl.measurement.numpy_epilogue import erf_source

    erf_source()
    print(json.dumps({"label": "numpy " + np.__version__}), flush=True)
    rng = np.random.default_rng(0)
    problem, repeat = None, None
    for line in sys.stdin:
        request = json.loads(line)
        if problem is None or request["problem"] != problem.name:
            problem, repeat = None, None  # the previous problem's buffers freed first
            problem = parse_problem(request["problem"])
            if not problem.dtype.numpy_computes:  # numpy has no bfloat16: not timed (a float32 figure would be another problem's)
                print(json.dumps({"gflops": None}), flush=True)
                problem = None
                continue
            repeat = _numpy_call(problem, rng, request["budget_s"], _blas_threads())
        timing = best_time(repeat, request["budget_s"], flops=problem.flops, lock=contextlib.nullcontext())
        print(json.dumps({"gflops": timing.gflops}), flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        _serve()
    else:
        request = json.loads(sys.stdin.read())
        print(json.dumps({"gflops": _time_in_process(request["problems"], request["budget_s"])}))
