"""``python -m looprl <command> [options]``: tune, search, train or bench."""

from __future__ import annotations

import importlib
import sys

COMMANDS = ("tune", "search", "train", "bench")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m looprl {{{','.join(COMMANDS)}}} [options]  (--help after a command for its options)", file=sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    return importlib.import_module(f"looprl.cli.{argv[0]}").main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
