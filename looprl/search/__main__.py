"""``python -m looprl.search``: the command line of :mod:`looprl.cli.search`."""

import sys

from looprl.cli.search import main

if __name__ == "__main__":
    sys.exit(main())
