"""``python -m looprl.bench``: the command line of :mod:`looprl.cli.bench`."""

import sys

from looprl.cli.bench import main

if __name__ == "__main__":
    sys.exit(main())
