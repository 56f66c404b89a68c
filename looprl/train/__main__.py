"""``python -m looprl.train``: the command line of :mod:`looprl.cli.train`."""

import sys

from looprl.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
