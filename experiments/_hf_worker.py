"""One mode of ``hf_generate.py`` in a process of its own, and the handle the main process keeps
on it. Not a script (``test_experiments`` skips names that start with ``_``).

The worker (``python experiments/_hf_worker.py MODE CONFIG PROMPT THREADS NEW [--quick] [--target
avx2] [--dtype bfloat16]``, started by :class:`Worker` with ``LOOPRL_CACHE_DIR`` and ``TORCHINDUCTOR_CACHE_DIR`` set to
empty folders) builds the config's model, prepares ``MODE`` once and warms it with one
generation, then answers requests read from its standard input, one a line: ``run`` (one timed
generation) or ``quit``. Each answer is one line of JSON on its standard output after the marker
``@hf `` (so that what a library prints there is not read as one):

* once ready: ``prepare_s`` (from the built model to the end of the warming generation, every cache
  empty), ``tokens`` (that generation's new token ids), ``parameters``, ``bytes_per_token`` (at the
  decode's mean context) and the memory figures below;
* per ``run``: ``tokens``, ``prefill_s``, ``decode_tokens_per_s`` and the memory figures.

Memory figures (:func:`memory`): ``rss_mb`` (resident now) and ``peak_rss_mb`` (the process's
high-water mark), in MB (10^6 bytes).
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MARK = "@hf "


def memory() -> dict:
    """This process's resident and peak resident memory in MB: ``/proc/self/status``'s VmRSS and
    VmHWM where there is one (``ru_maxrss`` would count the parent's memory at the fork: Linux
    keeps the high-water mark across ``execve``), else ``resource.getrusage`` for both."""
    path = Path("/proc/self/status")
    status = path.read_text(encoding="utf-8") if path.exists() else ""
    found = {key: re.search(rf"^{key}:\s+(\d+) kB", status, re.MULTILINE) for key in ("VmRSS", "VmHWM")}
    if not all(found.values()):
        peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return {"rss_mb": None, "peak_rss_mb": round(peak_kb * 1024 / 1e6, 1)}
    return {"rss_mb": round(int(found["VmRSS"].group(1)) * 1024 / 1e6, 1), "peak_rss_mb": round(int(found["VmHWM"].group(1)) * 1024 / 1e6, 1)}


def _answer(values: dict) -> None:
    print(MARK + json.dumps(values), flush=True)


def serve(argv: list[str]) -> int:
    """The worker: prepare one mode, then answer ``run`` requests until ``quit`` or end of input."""
    import argparse
    import gc

    import torch

    from _hf_modes import build, generate, make_prompt, prepared, read_bytes_per_token

    parser = argparse.ArgumentParser()
    for name in ("mode", "config"):
        parser.add_argument(name)
    for name in ("prompt", "threads", "new"):
        parser.add_argument(name, type=int)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--target", default=None)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = build(args.config, args.quick, args.dtype)
    prompt = make_prompt(model, args.prompt)
    facts = {"parameters": sum(p.numel() for p in model.parameters()),
             "bytes_per_token": read_bytes_per_token(model, args.prompt + args.new / 2)}
    started = time.perf_counter()
    runner = prepared(args.mode, model, prompt, args.threads, args.target, Path(os.environ["LOOPRL_CACHE_DIR"]))
    tokens, _, _ = generate(runner, prompt, args.new)
    prepare_s = time.perf_counter() - started
    del model  # the modes that run a copy (or a converted model) no longer hold the one built
    gc.collect()
    _answer(dict(facts, prepare_s=prepare_s, tokens=tokens, **memory()))
    for line in sys.stdin:
        if line.strip() == "quit":
            break
        if line.strip() != "run":
            raise ValueError(f"worker request: expected 'run' or 'quit', got {line.strip()!r}")
        tokens, prefill, rate = generate(runner, prompt, args.new)
        _answer(dict(tokens=tokens, prefill_s=prefill, decode_tokens_per_s=rate, **memory()))
    return 0


class WorkerFailed(RuntimeError):
    """A worker exited or answered nothing; the message is its last line of error."""


class Worker:
    """The main process's handle on one mode's worker: started (and prepared) by the constructor,
    asked for generations by :meth:`run`, ended by :meth:`close`. ``ready`` is its first answer."""

    def __init__(self, mode: str, config: str, prompt: int, threads: int, new: int, quick: bool, target: str | None, caches: Path,
                 dtype: str = "float32"):
        self.mode = mode
        environment = dict(os.environ, LOOPRL_CACHE_DIR=str(caches / "looprl"), TORCHINDUCTOR_CACHE_DIR=str(caches / "inductor"))
        command = [sys.executable, str(Path(__file__).resolve()), mode, config, str(prompt), str(threads), str(new)] + (
            ["--quick"] if quick else []) + (["--target", target] if target else []) + (["--dtype", dtype] if dtype != "float32" else [])
        self.errors = tempfile.TemporaryFile(mode="w+", encoding="utf-8")  # a file, not a pipe: nothing blocks on it
        self.process = subprocess.Popen(command, env=environment, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors,
                                        text=True, cwd=Path(__file__).resolve().parent)
        self.last: dict = {}
        self.ready = self._read()

    def _read(self) -> dict:
        for line in self.process.stdout:
            if line.startswith(MARK):
                self.last = json.loads(line[len(MARK):])
                return self.last
        self.process.wait()
        raise WorkerFailed(self._why())

    def _why(self) -> str:
        self.errors.seek(0)
        lines = [line.strip() for line in self.errors.read().splitlines() if line.strip()]
        raised = [line for line in lines if re.match(r"[\w.]+(Error|Exception): ", line)]  # the exception, not torch's advice after it
        return (raised or lines or [f"exit status {self.process.returncode}"])[-1] + f" (worker exit status {self.process.returncode})"

    def run(self) -> dict:
        """One timed generation: ``tokens``, ``prefill_s``, ``decode_tokens_per_s``, memory figures."""
        try:
            self.process.stdin.write("run\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            self.process.wait()
            raise WorkerFailed(self._why()) from None
        return self._read()

    def close(self) -> None:
        """Ask the worker to end and wait for it (ended by force after a minute)."""
        if self.process.poll() is None:
            try:
                self.process.stdin.write("quit\n")
                self.process.stdin.close()
            except BrokenPipeError:
                pass
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process.stdout.close()
        self.errors.close()


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1:]))
