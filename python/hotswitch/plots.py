"""``python -m hotswitch.plots``: pictures of a training run (see ``hotswitch.cli.plots``)."""

import sys

from hotswitch.cli.plots import main

if __name__ == "__main__":
    sys.exit(main())
