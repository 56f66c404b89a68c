"""Checks that need a fresh interpreter of their own, run together in one (a start imports torch
again): tests/torch/test_dynamo.py's backend found by name and tests/torch/test_native.py's
forked child read their own outcome from :func:`fresh_interpreter_checks`."""

import functools
import json
import subprocess
import sys
import textwrap

# The checks that need an interpreter of their own, in one fresh interpreter (each such start imports torch again: ~3.4 CPU
# s on a Zen 3), run in this order, each in a namespace of its own: the backend found by name before anything imports
# looprl (tests/torch/test_dynamo.py), then the forked child (tests/torch/test_native.py), which imports it. Each check's outcome is its own line.
FRESH_CHECKS = {
    "backend by name": textwrap.dedent(
        """
        import sys
        import torch
        assert 'looprl' in torch._dynamo.list_backends()
        assert 'looprl' not in sys.modules
        """
    ),
    "forked child": textwrap.dedent(
        """
        import os, sys, threading
        import torch
        sys.path.insert(0, os.getcwd())
        import looprl
        from looprl import dynamo
        from looprl.backend import placement
        from looprl.ir.layers import linear
        from looprl.torch.routes import LinearKernels

        placement.places_teams = lambda: False
        made = {}

        def make():  # in another thread: everything that could run a parallel region from Python
            results = {}
            for rows in (1, 64):
                problem = linear(rows, 40, 256, bias=True)
                nest = looprl.initial_nest(problem)
                if rows == 64:
                    nest = nest.split(2, 64).swap(1).swap(0).parallel(0)
                results[rows] = looprl.TuneResult(problem=problem, nest=nest, kernel=looprl.compile(nest, threads=2), gflops=1.0,
                                                  mode="policy", threads=2)
            kernels = LinearKernels(40, 256, None, results, frozen=True)
            index = dynamo._register(dynamo._layers, kernels, [])
            made.update(kernels=kernels, index=index, operator=dynamo._linear_operator(kernels, index))
            with torch.no_grad():
                made["operator"](x, layer.weight, layer.bias, index)  # the Python operator's call, which makes the plan

        layer = torch.nn.Linear(40, 256)
        x = torch.randn(50, 40)
        maker = threading.Thread(target=make)
        maker.start()
        maker.join()
        kernels, index, operator = made["kernels"], made["index"], made["operator"]
        with torch.no_grad():
            operator(x, layer.weight, layer.bias, index)  # this thread: the team natively, Python never told
        assert 50 in kernels.native._kept
        pid = os.fork()
        if pid == 0:
            try:
                with torch.no_grad():
                    operator(x, layer.weight, layer.bias, index)
                os._exit(3)
            except Exception as error:
                os._exit(0 if "forked" in str(error) else 4)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
        """
    ),
}
FRESH_RUNNER = textwrap.dedent(
    """
    import contextlib, io, json, sys, traceback
    for name, code in json.loads(sys.stdin.read()).items():
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                exec(compile(code, name, "exec"), {"__name__": "__main__"})
            outcome = {"error": None, "printed": printed.getvalue()}
        except BaseException:
            outcome = {"error": traceback.format_exc(), "printed": printed.getvalue()}
        print(json.dumps([name, outcome]), flush=True)
    """
)


@functools.cache
def fresh_interpreter_checks() -> dict:
    """Each of :data:`FRESH_CHECKS`' outcome (``error``: its traceback, None where it ran to its
    end; ``printed``: its output), from one fresh interpreter per test process; a check the
    interpreter never reported (it died or hung) has the interpreter's stderr as its error."""
    result = subprocess.run([sys.executable, "-c", FRESH_RUNNER], input=json.dumps(FRESH_CHECKS), capture_output=True, text=True,
                            timeout=240)
    outcomes = dict(json.loads(line) for line in result.stdout.splitlines() if line.startswith("["))
    missing = {"error": f"the interpreter exited with {result.returncode} before this check's end:\n{result.stderr[-2000:]}", "printed": ""}
    return {name: outcomes.get(name, missing) for name in FRESH_CHECKS}
