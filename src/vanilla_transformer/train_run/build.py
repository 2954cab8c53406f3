"""What a `train` run is built from: its data, tokenizer, model and Trainer."""

from pathlib import Path

from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, DataCollatorForSeq2Seq

from ..model.configuration_vanilla_transformer import VanillaTransformerConfig
from ..model.modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from ..paths.disk import write_errors
from ..errors import user_errors
from ..paths.text_files import InvalidUTF8Error
from ..training.cpu_speedups import CPUSeq2SeqTrainer, keep_freed_memory
from ..training.data import (
    DataError,
    default_num_proc,
    log_dropped_pairs,
    pair_texts,
    sample_pairs,
    single_threaded_tokenizers,
)
from ..training.tokenization import train_tokenizer
from ..training.trainer import (
    VALIDATION_DECODING, BPEDropoutDataset, TokenBatchSeq2SeqTrainer, tokenize_pairs, translation_metrics,
)


def load_data(data_args, profile, seed: int) -> dict:
    """The `train` split and optional `validation` / `test` splits of the run, as `translation` pair datasets:
    `profile`'s (a `profile.RunProfile`). A file the data loaders refuse is a `UserError` naming its file and line;
    a full disk under the datasets cache, one naming the cache and its free space."""
    with user_errors(DataError, InvalidUTF8Error, OSError, EOFError), datasets_cache_errors():
        return profile.load_data(data_args, seed)


def datasets_cache_errors():
    """A write that the disk refuses in the datasets cache (`HF_DATASETS_CACHE`, where `datasets` writes the splits it
    loads and tokenizes) as a `UserError` naming the cache folder and its free space: it is often on another disk
    than the run's output folder."""
    from datasets import config

    return write_errors(config.HF_DATASETS_CACHE)


def build_tokenizer(model_args, train_pairs, data_args, training_args):
    """The run's tokenizer: the checkpoint's when resuming, the one given, or one trained on the training pairs."""
    checkpoint = training_args.resume_from_checkpoint
    if checkpoint and (Path(checkpoint) / "tokenizer_config.json").is_file():
        # The Trainer saves the tokenizer with each checkpoint.
        return AutoTokenizer.from_pretrained(checkpoint, trust_remote_code=False)
    source = model_args.model_name_or_path or model_args.tokenizer_name
    if source:
        return AutoTokenizer.from_pretrained(source, trust_remote_code=False)
    tokenizer_dir = Path(training_args.output_dir) / "tokenizer"
    if training_args.resume_from_checkpoint and tokenizer_dir.is_dir():
        # The run's own, which its checkpoints were trained with.
        return AutoTokenizer.from_pretrained(tokenizer_dir, trust_remote_code=False)
    # One process trains the shared vocabulary on both sides of the training data; the others load it.
    with training_args.main_process_first(desc="training the tokenizer"):
        if training_args.process_index == 0:
            pairs = sample_pairs(train_pairs, model_args.tokenizer_train_pairs, seed=training_args.seed)
            texts = pair_texts(pairs, data_args.source_lang, data_args.target_lang)
            train_tokenizer(texts, vocab_size=model_args.vocab_size).save_pretrained(tokenizer_dir)
    return AutoTokenizer.from_pretrained(tokenizer_dir, trust_remote_code=False)


def build_model(model_args, data_args, tokenizer, checkpoint: str | None = None):
    """The model to train: the one `checkpoint` holds (resuming), the one to fine-tune, or a new one."""
    if checkpoint or model_args.model_name_or_path:
        return AutoModelForSeq2SeqLM.from_pretrained(
            checkpoint or model_args.model_name_or_path, attn_implementation=model_args.attn_implementation,
            trust_remote_code=False,
        )
    # The model's generation config is section 6.1's decoding (beam 4, GNMT length penalty 0.6, source + 50).
    return VanillaTransformerForConditionalGeneration(new_model_config(model_args, data_args, tokenizer))


def cpu_speedups(recipe_args, training_args) -> tuple[str, ...]:
    """The CPU speed-ups this run uses (cpu_speedups.py): those `--cpu-speedups` names when training on a CPU, none
    elsewhere. The process-wide one, `keep_memory`, is switched on here."""
    if training_args.device.type != "cpu":
        return ()
    speedups = tuple(name for name in recipe_args.cpu_speedups if name != "none")
    if "keep_memory" in speedups:
        keep_freed_memory()
    return speedups


def new_model_config(model_args, data_args, tokenizer=None) -> VanillaTransformerConfig:
    """The preset with the size flags, for `tokenizer`'s vocabulary and special tokens; with no tokenizer yet, for
    `--vocab-size` tokens (enough to check the flags)."""
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
    vocabulary = dict(vocab_size=model_args.vocab_size)  # the config's default ids are the package tokenizer's
    if tokenizer is not None:
        vocabulary = dict(
            vocab_size=len(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            decoder_start_token_id=tokenizer.bos_token_id,
        )
    return VanillaTransformerConfig.from_preset(
        model_args.preset,
        **vocabulary,
        source_lang=data_args.source_lang,
        target_lang=data_args.target_lang,
        attn_implementation=model_args.attn_implementation,  # None: transformers' choice
        **sizes,
    )


def describe_model(model) -> str:
    """The model in one short line for the log: sizes in the paper's symbols, parameters, vocabulary, and what is not
    the paper's default (config.json holds the rest)."""
    config = model.config

    def pair(encoder, decoder):
        return f"{encoder}" if encoder == decoder else f"{encoder}/{decoder}"

    words = [
        f"N={pair(config.encoder_layers, config.decoder_layers)}",
        f"d_model={config.d_model}",
        f"h={pair(config.encoder_attention_heads, config.decoder_attention_heads)}",
        f"d_ff={pair(config.encoder_ffn_dim, config.decoder_ffn_dim)}",
        f"P_drop={config.dropout:g}",
        f"{model.num_parameters():,} parameters",
        f"vocabulary {config.vocab_size:,}",
    ]
    if config.normalize_before:
        words.append("pre-LN")
    if config.position_embedding_type != "sinusoidal":
        words.append(f"{config.position_embedding_type} positions")
    return ", ".join(words)


def tokenize_splits(splits, tokenizer, data_args, training_args) -> dict:
    """Every split tokenized, by one process per core for a large corpus. Over-long training pairs are dropped as they
    are tokenized (and logged); validation and test pairs all stay."""
    languages = (tokenizer, data_args.source_lang, data_args.target_lang)
    tokenize = dict(
        train=tokenize_pairs(*languages, data_args.max_source_length, data_args.max_target_length,
                             keep_translation=bool(data_args.bpe_dropout)),
        other=tokenize_pairs(*languages),
    )
    num_proc = data_args.preprocessing_num_workers or default_num_proc(len(splits["train"]))
    with (training_args.main_process_first(desc="tokenizing"), single_threaded_tokenizers(num_proc),
          datasets_cache_errors()):
        tokenized = {
            name: split.map(tokenize["train" if name == "train" else "other"], batched=True,
                            remove_columns=split.column_names, desc=f"tokenizing {name}",
                            num_proc=num_proc if len(split) >= 1000 else None)
            for name, split in splits.items()
        }
    log_dropped_pairs(len(splits["train"]), len(tokenized["train"]), data_args.max_source_length,
                      data_args.max_target_length)
    return tokenized


def training_dataset(tokenized_train, tokenizer, data_args, seed: int):
    """The tokenized training pairs; with --bpe-dropout, the same pairs segmented anew every epoch."""
    if not data_args.bpe_dropout:
        return tokenized_train
    return BPEDropoutDataset.from_translations(
        tokenized_train, data_args.source_lang, data_args.target_lang, tokenizer, data_args.bpe_dropout,
        seed=seed, target_side=data_args.bpe_dropout_target,
    )


def validation_dataset(tokenized: dict, max_eval_samples: int | None):
    """The tokenized validation pairs, the first --max-eval-samples of them; None without validation data."""
    eval_dataset = tokenized.get("validation")
    if eval_dataset is not None and max_eval_samples:
        eval_dataset = eval_dataset.select(range(min(len(eval_dataset), max_eval_samples)))
    return eval_dataset


def build_trainer(model, tokenizer, training_args, data_args, train_dataset, eval_dataset, callbacks, speedups=()):
    """The Trainer of the paper's recipe: token batches (section 5.1) and, with --predict-with-generate, validation
    BLEU from generate() (`VALIDATION_DECODING` unless flags set the decoding); without it validation reports its loss
    only. With CPU `speedups`, the Trainer that applies them inside its steps (cpu_speedups.py)."""
    trainer_class, options = TokenBatchSeq2SeqTrainer, {}
    multiple = data_args.pad_to_multiple_of if data_args.pad_to_multiple_of > 1 else None
    if speedups:
        trainer_class, options = CPUSeq2SeqTrainer, dict(speedups=speedups)
    with user_errors(ValueError):  # the Trainer's checks of its arguments together
        return trainer_class(
            model=model,
            args=training_args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            # Lengths rounded up to a multiple: the trainer's sampler batches by them too (bucketed shapes).
            data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, pad_to_multiple_of=multiple),
            processing_class=tokenizer,
            compute_metrics=translation_metrics(tokenizer) if training_args.predict_with_generate else None,
            validation_decoding=VALIDATION_DECODING,
            max_tokens=data_args.max_tokens or None,
            max_sentences=data_args.max_sentences,
            callbacks=callbacks,
            **options,
        )
