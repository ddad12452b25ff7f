"""``python -m hotswitch.train``: training with Megatron-LM's arguments (see ``hotswitch.cli.train``)."""

import sys

from hotswitch.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
