"""The command-line programs. Each parses its arguments and calls the library; none holds
logic of its own that the library lacks.

- ``python -m hotswitch.train``: training, Megatron-LM's arguments (``cli.train``);
- ``python -m hotswitch.launch``: starts the ranks of a job on this machine (``cli.launch``);
- ``python -m hotswitch.calibration``: fits a hardware profile here (``cli.calibration``);
- ``python -m hotswitch.preprocess_data``: JSONL to Megatron-LM's indexed dataset (``cli.preprocess_data``);
- ``python -m hotswitch.train_tokenizer``: a SentencePiece model from text (``cli.train_tokenizer``);
- ``python -m hotswitch.convert``: checkpoints to and from Hugging Face LLaMA safetensors (``cli.convert``);
- ``python -m hotswitch.costmodel``: fits or checks a hardware profile on measured runs
  (``cli.costmodel``);
- ``python -m hotswitch.cli.plan``: the planner's dry run;
- ``python -m hotswitch.cli.lengths``: a lengths file from a directory of text.
"""
