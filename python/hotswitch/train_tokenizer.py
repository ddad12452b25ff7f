"""``python -m hotswitch.train_tokenizer``: a SentencePiece model from text (see ``hotswitch.cli.train_tokenizer``)."""

import sys

from hotswitch.cli.train_tokenizer import main

if __name__ == "__main__":
    sys.exit(main())
