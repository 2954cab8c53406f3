"""Train a translation model with the paper's recipe on Seq2SeqTrainer (same as `vanilla-transformer train`).

    python examples/train_translation.py                       # offline demo: English -> French number words
    python examples/train_translation.py --source-file train.en.gz --target-file train.de.gz \
        --source-lang en --target-lang de --output-dir runs/en-de --preset base --max-steps 100000
    accelerate launch --config-file examples/accelerate/multi_gpu_ddp.yaml examples/train_translation.py ...
    torchrun --nproc-per-node 2 examples/train_translation.py ...

Every Seq2SeqTrainingArguments flag works (--bf16, --gradient-accumulation-steps, --resume-from-checkpoint, ...);
`--model-name-or-path DIR` fine-tunes a saved model with its own tokenizer and config (docs/training.md).
"""

import sys

from vanilla_transformer.cli.main import main


if __name__ == "__main__":
    main(["train", *sys.argv[1:]])  # the command's one-line errors for bad input
