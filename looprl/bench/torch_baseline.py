"""torch's GFLOPS for problems: ``torch.matmul``, ``F.linear`` and oneDNN's prepacked linear side by side, timed in a child process.

The benchmarks compare looprl with the best library on the host: numpy (OpenBLAS,
:mod:`looprl.measurement.numpy_baseline`) and torch, whose CPU GEMMs are MKL's or oneDNN's,
whichever torch dispatches to. torch is timed in a child process with ``threads`` threads
(``torch.set_num_threads`` and the BLAS thread variables), by the common timing rule, while this
process holds the machine-wide lock: :func:`torch_child` keeps one up and times a problem per
request (its operands made and its weight packed once per problem, outside the timed calls),
so that a benchmark times torch in turn with its own kernels (:mod:`looprl.bench.peers`);
:func:`torch_gflops` times a list of problems once. A machine without torch gets None for each
figure; an ``import torch`` that raises anything else (a broken install's ``OSError``) is the
child's failure, one line naming it.

What is timed is what a torch user writes for the problem, under ``torch.no_grad()``:

* ``mk,nk->mn`` (a linear layer's ``x @ W.T``): ``F.linear(x, W, bias)`` and
  ``torch.matmul(x, W.T)``;
* ``mk,kn->mn``: ``torch.matmul(a, b)`` and ``F.linear(a, W)`` with ``W = b.T`` stored as
  ``nn.Linear`` stores it (made contiguous before timing: the model would hold it so);
* for both of these, where torch has oneDNN (``torch.backends.mkldnn``), oneDNN's linear on a
  weight packed once beforehand (``torch.ops.mkldnn._reorder_linear_weight``, then
  ``_linear_pointwise`` with the activation fused): what ``torch.compile`` with Inductor's
  ``freezing`` runs for a linear layer. On the project's AMD EPYC (Zen 5) it ran 2.2-2.4x
  faster than ``F.linear`` (MKL) at 64-512 rows, so a comparison without it would flatter
  looprl;
* batched products ``bmk,bkn->bmn`` / ``bmk,bnk->bmn``: ``torch.matmul`` (no ``F.linear``);
* any other spec: ``torch.einsum``.

Every tensor is in the problem's dtype (a bfloat16 problem: bfloat16 tensors, as a bfloat16
model holds them). A cold problem's weight (constant ``in1``) is timed as looprl's kernels are
(:func:`~looprl.measurement.timing.cold_copy_count` copies for the child's thread count, each
call the next; packed once each), so both read it from as far as the problem says.

The problem's epilogue follows, one torch call per step (``F.linear`` takes the bias itself
when the scale is 1, as ``nn.Linear`` does), so torch's time covers the same work as the
fused kernel's. :func:`best_torch` is the best of the calls.

With ``float32=True`` (``looprl-bench tune --torch-float32``) a bfloat16 problem's calls are
also timed on float32 tensors, named with :data:`FLOAT32_SUFFIX` (``"F.linear (float32)"``,
...) and counted in the best: the call a user makes where torch's bfloat16 is slow (a CPU
without AVX512_BF16, or torch held to AVX2, where oneDNN's packed linear refuses bfloat16), so
that bfloat16 code is compared with the fastest way torch computes the layer, not only with
torch's bfloat16 call.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys

from looprl import checks
from looprl.backend.threads import check_threads
from looprl.ir.dtypes import FLOAT32
from looprl.measurement.lock import machine_lock
from looprl.measurement.numpy_baseline import BaselineChild, baseline_environment, coretype_for
from looprl.measurement.timing import best_time, cold_copy_count

CALLS = ("torch.matmul", "F.linear", "oneDNN packed")
FLOAT32_SUFFIX = " (float32)"  # a bfloat16 problem's call timed on float32 tensors (``float32=True``)
_ONEDNN_ACTIVATIONS = {None: ("none", "none"), "relu": ("relu", "none"), "gelu": ("gelu", "none"), "gelu_tanh": ("gelu", "tanh"),
                       "silu": ("swish", "none")}  # looprl's activation -> oneDNN's post-op name and algorithm


# How torch's kernels are held to a narrower ISA than the host's (when code for that ISA is compared):
# ATen's own kernels, oneDNN's and MKL's, each by its environment variable.
_NARROWED = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
             "sse4": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}}


def torch_environment(isa: str | None = None, threads: int = 1) -> dict[str, str]:
    """The torch baseline child's environment: :func:`baseline_environment`'s, with torch's
    kernels (ATen, oneDNN, MKL) held to ``isa`` where it is narrower than the host's (as
    numpy's are, by ``OPENBLAS_CORETYPE``)."""
    env = baseline_environment(isa, threads=threads)
    if coretype_for(isa) is not None:
        env.update(_NARROWED[isa])
    return env


TORCH_CHILD = ("-m", "looprl.bench.torch_baseline", "--serve")  # the child's interpreter arguments
FLOAT32_FLAG = "--float32"  # the child's argument: bfloat16 problems' calls also on float32 tensors


def torch_child(isa: str | None = None, threads: int = 1, float32: bool = False) -> BaselineChild:
    """A running torch baseline (:class:`~looprl.measurement.numpy_baseline.BaselineChild`) on
    ``threads`` threads, its kernels held to ``isa`` (:func:`torch_environment`): each
    ``time(problem, budget_s)`` answers ``{call: GFLOPS or None}``; its ``label`` says what
    ran. ``float32``: a bfloat16 problem's calls timed on float32 tensors too (module
    docstring). An ``import torch`` that fails with anything but ImportError (a broken install's
    OSError) is the child's failure, one line."""
    arguments = TORCH_CHILD + ((FLOAT32_FLAG,) if checks.flag(float32, "float32") else ())
    return BaselineChild("torch baseline", arguments, torch_environment(isa, check_threads(threads)))


def torch_gflops(problems: list, budget_s: float = 0.3, threads: int = 1, isa: str | None = None) -> tuple[list[dict[str, float | None]], str]:
    """For each problem, ``{"torch.matmul": ..., "F.linear": ..., "oneDNN packed": ...}``, GFLOPS or None
    (None: the call does not apply to the spec, or torch is not installed), timed in a child
    process on ``threads`` threads; and what ran, for reports (torch's version and the kernels
    it chose, e.g. ``"torch 2.13.0+cpu, AVX512 kernels"``). ``isa``: torch's kernels held to
    it where it is narrower than the host's (:func:`torch_environment`; None: the host's).
    A child that fails is a RuntimeError of one line naming it and the signal or error."""
    budget_s = checks.seconds(budget_s, "budget_s")
    with machine_lock(), torch_child(isa, threads) as child:
        figures = [child.time(problem, budget_s) for problem in problems]
        if child.failure is not None:
            raise RuntimeError(child.failure)
    return figures, child.label


def best_torch(figures: dict[str, float | None]) -> float:
    """The better of torch's calls for one problem (NaN if none was timed)."""
    timed = [value for value in figures.values() if value is not None]
    return max(timed) if timed else math.nan


def _calls(problem, torch, functional):
    """Name -> a no-argument callable computing ``problem`` in torch, its epilogue included."""
    generator = torch.Generator().manual_seed(0)

    dtype = getattr(torch, problem.dtype.name)  # float32, or bfloat16: every tensor of the problem in it, as a bfloat16 model holds them

    def uniform(shape):
        return (torch.rand(*shape, generator=generator) * 2 - 1).to(dtype)

    a, b = (uniform(shape) for shape in problem.input_shapes)
    epilogue = problem.epilogue
    extra = {what: uniform(shape) for what, shape in problem.epilogue_shapes}
    bias, residual = extra.get("bias"), extra.get("residual")
    activation = {None: None, "relu": functional.relu, "gelu": functional.gelu, "silu": functional.silu,
                  "gelu_tanh": lambda y: functional.gelu(y, approximate="tanh")}[epilogue.activation]
    bias_in_gemm = epilogue.scale == 1.0

    def finish(y, bias_added: bool):
        if epilogue.scale != 1.0:
            y = y * epilogue.scale
        if bias is not None and not bias_added:
            y = y + bias
        if activation is not None:
            y = activation(y)
        return y + residual if residual is not None else y

    def rotating(weight):  # a cold problem's weight: each call takes the next copy, as looprl's kernels are timed
        if not problem.cold or "in1" not in problem.constant:
            return [weight]
        count = cold_copy_count(weight.numel() * weight.element_size(), between=problem.between, threads=torch.get_num_threads())
        return [weight] + [weight.clone() for _ in range(count - 1)]

    def in_turn(calls):
        turn = [0]

        def run():
            turn[0] = (turn[0] + 1) % len(calls)
            return calls[turn[0]]()

        return run if len(calls) > 1 else calls[0]

    def linear_of(weight):  # weight stored [n, k], as nn.Linear holds it
        return in_turn([lambda w=w: finish(functional.linear(a, w, bias if bias_in_gemm else None), bias_in_gemm) for w in rotating(weight)])

    def onednn_of(weight):  # oneDNN's linear on the weight packed once, the activation fused as a post-op
        if not torch.backends.mkldnn.is_available():
            return None
        fused = epilogue.scale == 1.0 and residual is None
        name, algorithm = _ONEDNN_ACTIVATIONS[epilogue.activation] if fused else ("none", "none")

        def run_on(packed):
            y = torch.ops.mkldnn._linear_pointwise(a, packed, bias if epilogue.scale == 1.0 else None, name, [], algorithm)
            return y if fused else finish(y, epilogue.scale == 1.0)

        try:
            packed = [torch.ops.mkldnn._reorder_linear_weight(w, a.shape[0]) for w in rotating(weight)]
        except RuntimeError:  # no packed linear for this dtype on this ISA (oneDNN's bfloat16 needs AVX512_BF16 or AVX-NE-CONVERT)
            return None
        return in_turn([lambda p=p: run_on(p) for p in packed])

    spec = problem.spec
    if spec in ("mk,nk->mn", "mk,kn->mn"):
        weight = b if spec == "mk,nk->mn" else b.T.contiguous()
        matmuls = [lambda w=w: finish(torch.matmul(a, w.T if spec == "mk,nk->mn" else w), False) for w in rotating(b)]
        calls = {"torch.matmul": in_turn(matmuls), "F.linear": linear_of(weight)}
        onednn = onednn_of(weight)
        return calls if onednn is None else {**calls, "oneDNN packed": onednn}
    if spec == "bmk,bkn->bmn":
        return {"torch.matmul": lambda: finish(torch.matmul(a, b), False)}
    if spec == "bmk,bnk->bmn":
        return {"torch.matmul": lambda: finish(torch.matmul(a, b.transpose(-1, -2)), False)}
    return {"torch.matmul": lambda: finish(torch.einsum(spec, a, b), False)}  # torch.einsum: the matmul of other specs


def _all_calls(problem, torch, functional, float32: bool) -> dict:
    """:func:`_calls` of ``problem``, and where ``float32`` and the problem is not float32, the
    same calls on float32 tensors, named with :data:`FLOAT32_SUFFIX`."""
    calls = _calls(problem, torch, functional)
    if float32 and problem.dtype is not FLOAT32:
        wide = _calls(problem.with_dtype(FLOAT32), torch, functional)
        calls.update({name + FLOAT32_SUFFIX: call for name, call in wide.items()})
    return calls


def _timed_calls(calls: dict, flops: int, budget_s: float) -> dict[str, float | None]:
    figures = dict.fromkeys(CALLS)
    for call_name, call in calls.items():

        def repeat(reps: int, call=call) -> None:
            for _ in range(reps):
                call()

        # The parent holds the machine-wide lock while this process runs.
        figures[call_name] = best_time(repeat, budget_s, flops=flops, lock=contextlib.nullcontext()).gflops
    return figures


def _label(torch, float32: bool = False) -> str:
    narrowed = os.environ.get("ONEDNN_MAX_CPU_ISA")
    kernels = f"{torch.backends.cpu.get_cpu_capability()} kernels" + (f", oneDNN and MKL up to {narrowed}" if narrowed else "")
    return f"torch {torch.__version__}, {kernels}" + (", bfloat16 problems' calls also on float32 tensors" if float32 else "")


def _serve(float32: bool = False) -> None:
    """The child's loop (:class:`~looprl.measurement.numpy_baseline.BaselineChild`): one
    problem per request line, its operands made (and its weight packed) once and kept while
    the next requests name the same problem."""
    from looprl.ir.problem import parse_problem

    try:
        import torch
        import torch.nn.functional as functional
    except ImportError:
        torch = None
    except Exception as error:  # a broken install (a missing shared library: OSError): the child's failure
        print(json.dumps({"error": f"import torch failed: {type(error).__name__}: {' '.join(str(error).split())}"}), flush=True)
        return
    print(json.dumps({"label": "torch not installed" if torch is None else _label(torch, float32)}), flush=True)
    if torch is not None:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    problem, calls = None, None
    for line in sys.stdin:
        request = json.loads(line)
        if torch is None:
            print(json.dumps({"gflops": dict.fromkeys(CALLS)}), flush=True)
            continue
        with torch.no_grad():
            if problem is None or request["problem"] != problem.name:
                problem, calls = None, None  # the previous problem's tensors freed first
                problem = parse_problem(request["problem"])
                calls = _all_calls(problem, torch, functional, float32)
            figures = _timed_calls(calls, problem.flops, request["budget_s"])
        print(json.dumps({"gflops": figures}), flush=True)


if __name__ == "__main__":
    _serve(float32=FLOAT32_FLAG in sys.argv[1:])
