"""Train a translation model with the paper's recipe on Seq2SeqTrainer (same as `vanilla-transformer train`).

    python examples/train_translation.py                       # offline demo: English -> French number words
    python examples/train_translation.py --source_file train.en.gz --target_file train.de.gz \
        --source_lang en --target_lang de --output_dir runs/en-de --preset base --max_steps 100000
    accelerate launch --config_file examples/accelerate/multi_gpu_ddp.yaml examples/train_translation.py ...
    torchrun --nproc_per_node 2 examples/train_translation.py ...

Every Seq2SeqTrainingArguments flag works (--bf16, --gradient_accumulation_steps, --resume_from_checkpoint, ...);
`--model_name_or_path DIR` fine-tunes a saved model with its own tokenizer and config.
"""

import sys

from vanilla_transformer.train import main


if __name__ == "__main__":
    main(sys.argv[1:])
