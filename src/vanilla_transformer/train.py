"""`vanilla-transformer train`: train (or fine-tune) a translation model with the paper's recipe on Seq2SeqTrainer.

With no data arguments it trains on the English -> French number-words corpus the package generates
(`number_words.py`), so the main job runs offline. Every `Seq2SeqTrainingArguments` flag works as usual
(`--bf16`, `--gradient_accumulation_steps`, `--report_to`, ...), and so do `accelerate launch` and `torchrun`.
"""

import json
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    HfArgumentParser,
    Seq2SeqTrainingArguments,
    set_seed,
)

from .configuration_vanilla_transformer import PRESETS, VanillaTransformerConfig
from .data import filter_long_pairs, load_parallel_corpus
from .extras import require
from .hub import write_model_card
from .metrics import score_translations
from .modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from .number_words import number_words_corpus
from .tokenization import train_tokenizer
from .training import (
    PAPER_RECIPE,
    BPEDropoutDataset,
    TokenBatchSeq2SeqTrainer,
    TrainingTimeBudget,
    paper_learning_rate,
    tokenize_pairs,
    translation_metrics,
)


logger = logging.getLogger(__name__)

DEMO_OUTPUT_DIR = "outputs/number-words-en-fr"


@dataclass
class ModelArguments:
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "A saved model folder to fine-tune; its tokenizer and config are reused."}
    )
    preset: str = field(default="base", metadata={"help": f"Size of a new model: one of {sorted(PRESETS)}."})
    d_model: int | None = field(default=None, metadata={"help": "Override the preset's d_model."})
    layers: int | None = field(default=None, metadata={"help": "Override the preset's N (encoder and decoder)."})
    heads: int | None = field(default=None, metadata={"help": "Override the preset's h."})
    ffn_dim: int | None = field(default=None, metadata={"help": "Override the preset's d_ff."})
    dropout: float | None = field(default=None, metadata={"help": "Override the preset's P_drop."})
    attention_dropout: float | None = field(
        default=None, metadata={"help": "Dropout on the attention weights (not in the paper; default 0)."}
    )
    activation_dropout: float | None = field(
        default=None, metadata={"help": "Dropout after the feed-forward ReLU (not in the paper; default 0)."}
    )
    tokenizer_name: str | None = field(default=None, metadata={"help": "A saved tokenizer folder to use."})
    vocab_size: int = field(default=37000, metadata={"help": "Size of the shared BPE vocabulary to train."})
    attn_implementation: str | None = field(
        default=None,
        metadata={"help": "Attention kernel (eager, sdpa, flash_attention_2, ...); default: transformers' choice. "
                          "With --bf16 on a CPU, eager trains faster than sdpa (docs/speed.md)."},
    )


@dataclass
class DataArguments:
    source_lang: str = field(default="en")
    target_lang: str = field(default="fr")
    source_file: str | None = field(default=None, metadata={"help": "Training sources, one a line (.gz ok)."})
    target_file: str | None = field(default=None, metadata={"help": "Training targets, aligned with sources."})
    train_file: str | None = field(default=None, metadata={"help": "Training pairs as .tsv or .jsonl(.gz)."})
    dataset_name: str | None = field(default=None, metadata={"help": "A Hub dataset, e.g. wmt14."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Its configuration, e.g. de-en."})
    validation_source_file: str | None = None
    validation_target_file: str | None = None
    validation_file: str | None = None
    test_source_file: str | None = field(default=None, metadata={"help": "Held-out sources, translated at the end."})
    test_target_file: str | None = None
    test_file: str | None = None
    max_source_length: int = field(default=256, metadata={"help": "Longer pairs are dropped (and counted)."})
    max_target_length: int = field(default=256)
    max_tokens: int | None = field(
        default=4096, metadata={"help": "Tokens per training batch (section 5.1); 0 batches by sentences."}
    )
    max_eval_samples: int | None = field(default=None)
    bpe_dropout: float = field(
        default=0.0, metadata={"help": "BPE-dropout probability for the training pairs, segmented anew every epoch "
                                       "(Provilkov et al., 2020; not in the paper; default 0)."}
    )
    bpe_dropout_target: bool = field(
        default=True, metadata={"help": "With --bpe_dropout, segment the targets with dropout too (false: sources "
                                        "only)."}
    )
    demo_train_size: int = field(default=60000, metadata={"help": "Number-words demo: training pairs."})
    demo_max_digits: int = field(default=6, metadata={"help": "Number-words demo: numbers below 10**digits."})


@dataclass
class RecipeArguments:
    lr_scale: float = field(
        default=1.0, metadata={"help": "Multiplies the section 5.3 rate d_model^-0.5 * min(...). Ignored when "
                                       "--learning_rate is given."}
    )
    max_train_minutes: float | None = field(
        default=None, metadata={"help": "Stop training (with a checkpoint) at the first step that ends after this "
                                       "many minutes, even if --max_steps is not reached."}
    )


# The paper's recipe (sections 5.3-5.4) as defaults for the Trainer's own flags; --learning_rate 0 means
# "use d_model^-0.5 * warmup^-0.5 * lr_scale", the peak of the section 5.3 schedule.
PAPER_DEFAULTS = dict(
    PAPER_RECIPE,
    learning_rate=0.0,
    generation_num_beams=4,
    report_to=["tensorboard"],
    eval_strategy="no",
    save_strategy="steps",
    save_steps=1000,
    logging_steps=50,
    ddp_find_unused_parameters=False,  # every parameter takes part in every step
)


# The main job (no data given): a small model sized to train on the number-words corpus in minutes on 2 CPU cores.
# Half the section 5.3 rate: at d_model 128 the formula's peak is 3 times base's, and the held-out accuracy swings from
# one checkpoint to the next (docs/training.md, the demo).
DEMO_DEFAULTS = dict(
    d_model=128,
    layers=3,
    heads=4,
    ffn_dim=512,
    vocab_size=1000,
    max_tokens=2048,
    warmup_steps=300,
    lr_scale=0.5,
    max_steps=800,
    save_steps=400,
    logging_steps=100,
    output_dir=DEMO_OUTPUT_DIR,
)
DATA_FLAGS = ("--source_file", "--train_file", "--dataset_name")


def parse_arguments(argv: list[str] | None = None):
    """The four argument dataclasses and whether this is the demo (no data given). Every flag is spelled with dashes
    (`--max-tokens`) or, as transformers' scripts spell them, with underscores (`--max_tokens`)."""
    argv = sys.argv[1:] if argv is None else argv
    parser = HfArgumentParser(
        (ModelArguments, DataArguments, RecipeArguments, Seq2SeqTrainingArguments),
        prog="vanilla-transformer train",
        description=__doc__.split("\n\n")[0],
    )
    parser.set_defaults(**PAPER_DEFAULTS)
    # The flags given, spelled with underscores.
    flags = {argument.split("=")[0].replace("-", "_").replace("__", "--", 1) for argument in argv}
    is_demo = not flags & set(DATA_FLAGS)
    if is_demo:
        parser.set_defaults(**DEMO_DEFAULTS)
    elif "--output_dir" not in flags:
        parser.error("--output_dir is required when training on your own data.")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available():
        parser.set_defaults(use_cpu=True)  # torchrun on CPUs: the Trainer then runs DDP over gloo
    model_args, data_args, recipe_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    return model_args, data_args, recipe_args, training_args, is_demo


def load_data(data_args: DataArguments, is_demo: bool, seed: int):
    """The `train` split and optional `validation` / `test` splits, as `translation` pair datasets."""
    if is_demo:
        return dict(
            number_words_corpus(
                data_args.target_lang, data_args.demo_train_size, max_digits=data_args.demo_max_digits, seed=seed
            )
        )
    languages = dict(source_lang=data_args.source_lang, target_lang=data_args.target_lang)
    splits = {
        "train": load_parallel_corpus(
            source_file=data_args.source_file,
            target_file=data_args.target_file,
            pairs_file=data_args.train_file,
            dataset_name=data_args.dataset_name,
            dataset_config_name=data_args.dataset_config_name,
            **languages,
        )
    }
    for split in ["validation", "test"]:
        source_file, target_file, pairs_file = (
            getattr(data_args, f"{split}_{kind}") for kind in ("source_file", "target_file", "file")
        )
        if source_file or pairs_file:
            splits[split] = load_parallel_corpus(
                source_file=source_file, target_file=target_file, pairs_file=pairs_file, **languages
            )
    return splits


def build_tokenizer(model_args: ModelArguments, train_pairs, data_args, training_args):
    source = model_args.model_name_or_path or model_args.tokenizer_name
    if source:
        return AutoTokenizer.from_pretrained(source)
    tokenizer_dir = Path(training_args.output_dir) / "tokenizer"
    # One process trains the shared vocabulary on both sides of the training data; the others load it.
    with training_args.main_process_first(desc="training the tokenizer"):
        if training_args.process_index == 0:
            texts = (pair[lang] for pair in train_pairs["translation"]
                     for lang in (data_args.source_lang, data_args.target_lang))
            train_tokenizer(texts, vocab_size=model_args.vocab_size).save_pretrained(tokenizer_dir)
    return AutoTokenizer.from_pretrained(tokenizer_dir)


def build_model(model_args: ModelArguments, data_args: DataArguments, tokenizer):
    if model_args.model_name_or_path:
        return AutoModelForSeq2SeqLM.from_pretrained(
            model_args.model_name_or_path, attn_implementation=model_args.attn_implementation
        )
    sizes = {
        name: value
        for name, value in dict(
            d_model=model_args.d_model,
            dropout=model_args.dropout,
            attention_dropout=model_args.attention_dropout,
            activation_dropout=model_args.activation_dropout,
        ).items()
        if value is not None
    }
    if model_args.layers is not None:
        sizes.update(encoder_layers=model_args.layers, decoder_layers=model_args.layers)
    if model_args.heads is not None:
        sizes.update(encoder_attention_heads=model_args.heads, decoder_attention_heads=model_args.heads)
    if model_args.ffn_dim is not None:
        sizes.update(encoder_ffn_dim=model_args.ffn_dim, decoder_ffn_dim=model_args.ffn_dim)
    config = VanillaTransformerConfig.from_preset(
        model_args.preset,
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.bos_token_id,
        source_lang=data_args.source_lang,
        target_lang=data_args.target_lang,
        attn_implementation=model_args.attn_implementation,  # None: transformers' choice
        **sizes,
    )
    # The model's generation config is section 6.1's decoding (beam 4, GNMT length penalty 0.6, source + 50).
    return VanillaTransformerForConditionalGeneration(config)


def main(argv: list[str] | None = None):
    model_args, data_args, recipe_args, training_args, is_demo = parse_arguments(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    set_seed(training_args.seed)

    splits = load_data(data_args, is_demo, training_args.seed)
    # Checked now rather than at the first log, or at the model card written after training.
    if "tensorboard" in training_args.report_to:
        require("tensorboard", extra="train")
    if "test" in splits and training_args.predict_with_generate:
        require("jinja2", extra="train")
    tokenizer = build_tokenizer(model_args, splits["train"], data_args, training_args)
    model = build_model(model_args, data_args, tokenizer)
    if training_args.device.type == "cpu":  # section 5.4's dropout drawn more cheaply on a CPU (dropout.py)
        model.config.dropout_implementation = "cpu_16bit"
    if not training_args.learning_rate:
        training_args.learning_rate = paper_learning_rate(
            model.config.d_model, training_args.warmup_steps, recipe_args.lr_scale
        )
    logger.info("model: %s parameters, %s", f"{model.num_parameters():,}", model.config.to_diff_dict())

    tokenize = tokenize_pairs(tokenizer, data_args.source_lang, data_args.target_lang)
    with training_args.main_process_first(desc="tokenizing"):
        tokenized = {
            name: split.map(tokenize, batched=True, remove_columns=split.column_names, desc=f"tokenizing {name}")
            for name, split in splits.items()
        }
    if data_args.bpe_dropout:  # the texts of the pairs kept by the length filter, segmented anew every epoch
        tokenized["train"] = tokenized["train"].add_column("translation", splits["train"]["translation"])
    tokenized["train"] = filter_long_pairs(tokenized["train"], data_args.max_source_length, data_args.max_target_length)
    train_dataset = tokenized["train"]
    if data_args.bpe_dropout:
        if not data_args.max_tokens:
            raise ValueError("--bpe_dropout needs token batches (--max_tokens > 0): lengths change every epoch.")
        train_dataset = BPEDropoutDataset.from_translations(
            train_dataset, data_args.source_lang, data_args.target_lang, tokenizer, data_args.bpe_dropout,
            seed=training_args.seed, target_side=data_args.bpe_dropout_target,
        )

    eval_dataset = tokenized.get("validation")
    if eval_dataset is not None and data_args.max_eval_samples:
        eval_dataset = eval_dataset.select(range(min(len(eval_dataset), data_args.max_eval_samples)))
    trainer = TokenBatchSeq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        processing_class=tokenizer,
        # Validation BLEU needs generate(); without --predict_with_generate validation reports its loss only.
        compute_metrics=translation_metrics(tokenizer) if training_args.predict_with_generate else None,
        max_tokens=data_args.max_tokens or None,
        callbacks=[TrainingTimeBudget(minutes)] if (minutes := recipe_args.max_train_minutes) is not None else None,
    )
    result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model()  # model, tokenizer and generation config in output_dir
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()

    if "test" in tokenized and training_args.predict_with_generate:
        report_test_results(trainer, splits["test"], tokenized["test"], data_args, tokenizer)
    elif eval_dataset is not None:
        metrics = trainer.evaluate(metric_key_prefix="eval")
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
    return trainer


def report_test_results(trainer, pairs, tokenized, data_args, tokenizer):
    """Translate the held-out split with beam search; print samples, exact-match accuracy, sacreBLEU (with its
    signature) and chrF on the detokenized text."""
    output = trainer.predict(tokenized, metric_key_prefix="test")
    predictions = np.where(output.predictions < 0, tokenizer.pad_token_id, output.predictions)
    hypotheses = [text.strip() for text in tokenizer.batch_decode(predictions, skip_special_tokens=True)]
    references = [pair[data_args.target_lang] for pair in pairs["translation"]]
    scores = score_translations(hypotheses, references)
    metrics = dict(output.metrics)
    metrics["test_exact_match"] = 100.0 * float(np.mean([h == r for h, r in zip(hypotheses, references)]))
    metrics["test_bleu_signature"] = scores["bleu_signature"]
    metrics["test_chrf_signature"] = scores["chrf_signature"]
    if trainer.is_world_process_zero():
        print(f"\nSample translations ({data_args.source_lang} -> {data_args.target_lang}) of held-out data:")
        for pair, hypothesis in list(zip(pairs["translation"], hypotheses))[:8]:
            mark = "ok " if hypothesis == pair[data_args.target_lang] else "ERR"
            print(f"  {mark} {pair[data_args.source_lang]}\n      -> {hypothesis}\n  (ref) {pair[data_args.target_lang]}")
        print(f"\nHeld-out ({len(references)} pairs, beam {trainer.args.generation_num_beams}): "
              f"exact match {metrics['test_exact_match']:.1f}%, BLEU {metrics['test_bleu']:.2f}, "
              f"chrF {metrics['test_chrf']:.2f}\nsacreBLEU signature: {scores['bleu_signature']}")
        print(f"Model folder (loads with from_pretrained): {trainer.args.output_dir}")
    trainer.log_metrics("test", metrics)
    trainer.save_metrics("test", metrics)
    if trainer.is_world_process_zero():
        # The output folder's model card, from the saved model and these results, which card_results.json keeps for
        # `vanilla-transformer model-card` and `push`.
        results = card_results(metrics, pairs, hypotheses, data_args)
        output_dir = Path(trainer.args.output_dir)
        (output_dir / "card_results.json").write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
        write_model_card(output_dir, output_dir / "README.md", results)
    return metrics


def card_results(metrics, pairs, hypotheses, data_args) -> dict:
    """The test results as `hub.model_card` takes them: scores with their signatures, the data, samples and the
    recipe facts the training arguments do not hold."""
    if data_args.dataset_name:
        data = dict(dataset=data_args.dataset_name, dataset_id=data_args.dataset_name)
    elif data_args.test_source_file or data_args.test_file:
        data = dict(dataset=Path(data_args.test_source_file or data_args.test_file).name)
    else:  # the demo, where a translation is right or wrong
        data = dict(dataset="number words (num2words, held-out numbers)", exact_match=metrics["test_exact_match"])
    return dict(
        results=[
            dict(
                **data,
                split="test",
                bleu=metrics["test_bleu"],
                chrf=metrics["test_chrf"],
                bleu_signature=metrics["test_bleu_signature"],
                chrf_signature=metrics["test_chrf_signature"],
                num_sentences=len(hypotheses),
            )
        ],
        samples=[
            dict(source=pair[data_args.source_lang], reference=pair[data_args.target_lang], hypothesis=hypothesis)
            for pair, hypothesis in list(zip(pairs["translation"], hypotheses))[:5]
        ],
        training=dict(max_tokens=data_args.max_tokens, bpe_dropout=data_args.bpe_dropout,
                      bpe_dropout_target=data_args.bpe_dropout_target),
    )


if __name__ == "__main__":
    main(sys.argv[1:])
