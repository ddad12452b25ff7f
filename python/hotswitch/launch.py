"""``python -m hotswitch.launch``: starts the ranks of a job (see ``hotswitch.cli.launch``)."""

import sys

from hotswitch.cli.launch import main

if __name__ == "__main__":
    sys.exit(main())
