"""``looprl-bench <benchmark> [options]`` (or ``python -m looprl bench``)."""

from __future__ import annotations

import argparse
import sys

from looprl.bench import codegen, env, layers, mixed, tune_quality
from looprl.cli.common import run_command, writable_file

BENCHMARKS = {"codegen": codegen, "env": env, "tune": tune_quality, "layers": layers, "mixed": mixed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="looprl-bench", description=__doc__)
    sub = parser.add_subparsers(dest="benchmark", required=True)
    for name, module in BENCHMARKS.items():
        module.add_arguments(sub.add_parser(name, help=module.__doc__.splitlines()[0]))
    args = parser.parse_args(argv)
    return run_command("looprl-bench", lambda: _main(args))


def _main(args) -> int:
    json_path = writable_file(getattr(args, "json", None) or getattr(args, "json_path", None), "--json")
    if json_path is not None:  # not every benchmark creates it
        try:
            json_path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ValueError(f"--json {json_path}: cannot create its folder: {error}") from error
    BENCHMARKS[args.benchmark].main(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
