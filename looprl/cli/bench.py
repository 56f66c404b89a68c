"""``python -m looprl.bench <benchmark> [options]``."""

from __future__ import annotations

import argparse
import sys

from looprl.bench import codegen, env, tune

BENCHMARKS = {"codegen": codegen, "env": env, "tune": tune}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m looprl.bench", description=__doc__)
    sub = parser.add_subparsers(dest="benchmark", required=True)
    for name, module in BENCHMARKS.items():
        module.add_arguments(sub.add_parser(name, help=module.__doc__.splitlines()[0]))
    args = parser.parse_args(argv)
    try:
        BENCHMARKS[args.benchmark].main(args)
    except ValueError as error:
        parser.error(str(error))
    return 0


if __name__ == "__main__":
    sys.exit(main())
