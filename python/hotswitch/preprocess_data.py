"""``python -m hotswitch.preprocess_data``: JSONL to Megatron-LM's indexed dataset (see ``hotswitch.cli.preprocess_data``)."""

import sys

from hotswitch.cli.preprocess_data import main

if __name__ == "__main__":
    sys.exit(main())
