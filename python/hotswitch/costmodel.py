"""``python -m hotswitch.costmodel``: fit or check the cost model on measured runs (see ``hotswitch.cli.costmodel``)."""

import sys

from hotswitch.cli.costmodel import main

if __name__ == "__main__":
    sys.exit(main())
