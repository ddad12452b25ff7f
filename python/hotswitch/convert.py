"""``python -m hotswitch.convert``: checkpoints to and from Hugging Face LLaMA (see ``hotswitch.cli.convert``)."""

import sys

from hotswitch.cli.convert import main

if __name__ == "__main__":
    sys.exit(main())
