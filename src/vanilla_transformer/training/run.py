"""`vanilla-transformer train`: train (or fine-tune) a translation model with the paper's recipe on Seq2SeqTrainer.

With no data arguments it trains on the English -> French number-words corpus the package generates
(`number_words.py`), so the main job runs offline. Every `Seq2SeqTrainingArguments` flag works as usual
(`--bf16`, `--gradient_accumulation_steps`, `--report_to`, ...), and so do `accelerate launch` and `torchrun`.
"""

import argparse
import contextlib
import json
import logging
import math
import os
import re
import shutil
import signal
import sys
import tempfile
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
from transformers.hf_argparser import string_to_bool

from ..disk import disk_message, disk_problem
from ..errors import CommandParser, OneLineErrors, UserError, describe, user_errors
from ..hub.reachability import check_model
from ..model_folders import check_tokenizer_fits
from .averaging import average_checkpoints, find_checkpoints
from .checkpoints import (
    checkpoint_problem, checkpoint_step, complete_checkpoints, missing_training_state, newest_complete_checkpoint,
    weights_problem,
)
from ..model.configuration_vanilla_transformer import PRESETS, VanillaTransformerConfig
from .cpu_speedups import CPU_SPEEDUPS, CPUSeq2SeqTrainer, keep_freed_memory
from .data import (
    default_num_proc, load_parallel_corpus, log_dropped_pairs, pair_texts, sample_pairs, single_threaded_tokenizers
)
from ..extras import require
from ..hub.card import recorded_run, write_model_card
from ..inference.metrics import score_translations
from ..model.modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from ..demo import report as number_words_report
from ..demo.corpus import number_words_corpus
from .run_lock import FolderInUseError, check_unlocked, run_lock
from .tokenization import SMALLEST_VOCAB_SIZE, train_tokenizer
from .trainer import (
    PAPER_RECIPE,
    VALIDATION_DECODING,
    BPEDropoutDataset,
    Preempted,
    SaveOnSignal,
    TokenBatchSeq2SeqTrainer,
    TrainingClock,
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
    tokenizer_train_pairs: int = field(
        default=1_000_000, metadata={"help": "Learn the vocabulary from at most this many training pairs, drawn at "
                                             "random (0: all)."}
    )
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
    max_sentences: int | None = field(
        default=None, metadata={"help": "With --max_tokens, at most this many pairs a batch (fairseq's "
                                        "--max-sentences); default: no limit."}
    )
    pad_to_multiple_of: int = field(
        default=1, metadata={"help": "Pad training batches to source and target lengths rounded up to a multiple of "
                                     "N, and batch pairs by those lengths: a few batch shapes, the same every epoch, "
                                     "which a compiled step reuses (docs/training.md#bucketed-shapes). Default 8 on "
                                     "a GPU, 1 (each batch padded to its longest pair) elsewhere."}
    )
    max_eval_samples: int | None = field(default=None)
    preprocessing_num_workers: int | None = field(
        default=None, metadata={"help": "Processes that tokenize and filter the data; default: one per core for "
                                        "100,000 training pairs and more, else one."}
    )
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
    average_last: int = field(
        default=0, metadata={"help": "Save the average of the weights of the run's last N checkpoints as the model "
                                     "(section 6.1), and test it; 0 saves the last weights."}
    )
    cpu_speedups: list[str] = field(
        default_factory=lambda: list(CPU_SPEEDUPS),
        metadata={"help": "Training on a CPU, the speed-ups to use (docs/training.md#cpu-speed-ups): any of "
                          f"{', '.join(CPU_SPEEDUPS)}, or none. None is saved with the model. keep_memory makes "
                          "glibc's malloc keep freed memory for the whole process."},
    )
    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "Replace the run --output_dir holds (its checkpoints, weights, Trainer "
                                         "state, results and logs are deleted first); without it, or "
                                         "--resume_from_checkpoint, a folder holding a finished run is refused."}
    )
    resume_weights_only: bool = field(
        default=False, metadata={"help": "Resume from a checkpoint that lacks its optimizer, schedule or random "
                                         "generator state, with what it holds: the run will not match an "
                                         "uninterrupted one. Without it such a checkpoint is refused."}
    )


# The paper's recipe (sections 5.3-5.4) as defaults for the Trainer's own flags; --learning_rate 0 means
# "use d_model^-0.5 * warmup^-0.5 * lr_scale", the peak of the section 5.3 schedule.
PAPER_DEFAULTS = dict(
    PAPER_RECIPE,
    learning_rate=0.0,
    report_to=["tensorboard"],
    eval_strategy="no",
    save_strategy="steps",
    save_steps=1000,
    logging_steps=50,
    ddp_find_unused_parameters=False,  # every parameter takes part in every step
)


# Defaults on a CUDA GPU, where the step must not wait for the host (docs/training.md#on-a-gpu): bucketed shapes, a
# compiled model, batches collated by two worker processes kept from epoch to epoch. Elsewhere the Trainer's own
# defaults stay (no compilation, batches collated in the training process) with exact lengths: the fastest on a CPU.
# Fused Adam (`adamw_torch_fused`) is the recipe's on every device.
GPU_DEFAULTS = dict(
    pad_to_multiple_of=8,
    torch_compile=True,
    dataloader_num_workers=2,
    dataloader_persistent_workers=True,
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
    max_sentences=256,
    bf16=True,  # with eager attention, the fastest CPU training step (docs/speed.md)
    attn_implementation="eager",
    warmup_steps=300,
    lr_scale=0.5,
    max_steps=1200,
    save_steps=50,
    average_last=10,
    logging_steps=100,
    per_device_eval_batch_size=64,
    output_dir=DEMO_OUTPUT_DIR,
)
DATA_FLAGS = ("--source_file", "--train_file", "--dataset_name")


class TrainArgumentParser(OneLineErrors, HfArgumentParser):
    """transformers' parser of dataclass flags, whose errors are one line like every command's."""


def parse_arguments(argv: list[str] | None = None, continued: bool = False):
    """The four argument dataclasses and whether this is the demo (no data given). Every flag is spelled with dashes
    (`--max-tokens`) or, as transformers' scripts spell them, with underscores (`--max_tokens`). A resumed run takes
    its model, data and recipe from the run it continues (`resumed_run`); validation files given mean validation."""
    argv = sys.argv[1:] if argv is None else argv
    parser = TrainArgumentParser(
        (ModelArguments, DataArguments, RecipeArguments, Seq2SeqTrainingArguments),
        prog="vanilla-transformer train",
        usage="%(prog)s [--help] [options]",  # not the hundreds of flags --help lists
        description=f"{__doc__.split(chr(10) * 2)[0]} With no data flags it trains the number-words demo, whose own "
        "settings --help shows beside the defaults (demo: VALUE).",
    )
    parser.set_defaults(**PAPER_DEFAULTS)
    # The flags given, spelled with underscores.
    flags = {argument.split("=")[0].replace("-", "_").replace("__", "--", 1) for argument in argv}
    wants_help = bool({"-h", "--help"} & set(argv))
    if wants_help:  # the defaults of a run on one's own data, the demo's beside them
        show_demo_values(parser)
    checkpoint = resume_checkpoint(argv)
    recorded = recorded_arguments(checkpoint) if checkpoint else {}
    is_demo = recorded.pop("demo", not flags & set(DATA_FLAGS))
    if wants_help:
        pass
    elif is_demo:
        parser.set_defaults(**DEMO_DEFAULTS)
        if not torch.cuda.is_available():
            parser.set_defaults(use_cpu=True)  # the Trainer's bf16 on a CPU
    elif "--output_dir" not in flags and not checkpoint:
        parser.error("--output-dir is required when training on your own data.")
    if trains_on_gpu(argv, parser.get_default("use_cpu")):
        parser.set_defaults(**GPU_DEFAULTS)
    elif not torch.cuda.is_available():
        # Pinned memory speeds copies to a GPU only; without an accelerator torch warns at every evaluation's loader.
        parser.set_defaults(dataloader_pin_memory=False)
    if checkpoint:  # the checkpoint's config.json is the model: a size flag is only what is given
        resumed = {**dict.fromkeys(MODEL_SIZE_FLAGS), "output_dir": str(Path(checkpoint).parent), **recorded}
        parser.set_defaults(**resumed)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available():
        parser.set_defaults(use_cpu=True)  # torchrun on CPUs: the Trainer then runs DDP over gloo
    arguments = parse_into_dataclasses(parser, argv)
    if checkpoint and recorded:
        check_resumed_flags(arguments, recorded, flags, checkpoint, continued)
    data_args, training_args = arguments[1], arguments[3]
    validation_given = data_args.validation_source_file or data_args.validation_file
    if validation_given and "--eval_strategy" not in flags and training_args.eval_strategy == "no":
        # Validation files mean validation: at every checkpoint (--eval-strategy no turns it off).
        parser.set_defaults(eval_strategy="steps", eval_steps=training_args.save_steps)
        arguments = parse_into_dataclasses(parser, argv)
    return (*arguments, is_demo)


def parse_into_dataclasses(parser: HfArgumentParser, argv: list[str]):
    try:
        return parser.parse_args_into_dataclasses(args=argv)
    except ValueError as error:  # the Trainer's arguments check their values and combinations
        parser.error(describe(error))


def show_demo_values(parser: HfArgumentParser) -> None:
    """--help: each flag whose value the demo sets says so after its own default, `(default: VALUE; demo: VALUE)`."""
    for action in parser._actions:
        if action.dest in DEMO_DEFAULTS and action.help is not argparse.SUPPRESS:
            action.help = f"{action.help or ''} (default: %(default)s; demo: {DEMO_DEFAULTS[action.dest]})".strip()


# --- Resuming: the run's own model, tokenizer and recipe -------------------------------------------------------------

# What `train` records of a run in its output folder, so that --resume-from-checkpoint alone continues it.
RUN_ARGUMENTS = "run_arguments.json"
# What a resumed run takes from the run it continues, and may not change: the checkpoint's weights, optimizer state
# and schedule were made with these (a flag with another value is refused).
FIXED_ON_RESUME = (
    "model_name_or_path", "preset", "d_model", "layers", "heads", "ffn_dim", "dropout", "attention_dropout",
    "activation_dropout", "tokenizer_name", "vocab_size", "source_lang", "target_lang", "source_file", "target_file",
    "train_file", "dataset_name", "dataset_config_name", "max_source_length", "max_target_length", "max_tokens",
    "max_sentences", "bpe_dropout", "bpe_dropout_target", "demo_train_size", "demo_max_digits", "lr_scale",
    "learning_rate", "warmup_steps", "lr_scheduler_type", "optim", "adam_beta1", "adam_beta2", "adam_epsilon",
    "weight_decay", "label_smoothing_factor", "max_grad_norm", "per_device_train_batch_size",
    "gradient_accumulation_steps", "seed", "bf16", "fp16",
)
# What it also takes from the run unless a flag says otherwise: to train longer, validate, save or log differently.
KEPT_ON_RESUME = (
    "max_steps", "num_train_epochs", "max_train_minutes", "save_steps", "logging_steps", "eval_strategy",
    "eval_steps", "predict_with_generate", "generation_num_beams", "per_device_eval_batch_size", "average_last",
    "validation_source_file", "validation_target_file", "validation_file", "test_source_file", "test_target_file",
    "test_file", "max_eval_samples", "attn_implementation", "cpu_speedups", "report_to", "use_cpu",
    "pad_to_multiple_of",
)
PATH_ARGUMENTS = ("model_name_or_path", "tokenizer_name", *(name for name in FIXED_ON_RESUME + KEPT_ON_RESUME
                                                           if name.endswith("_file")))


RESUME_FLAGS = ("--resume_from_checkpoint", "--resume-from-checkpoint")


def resume_checkpoint(argv: list[str]) -> str | None:
    """The --resume-from-checkpoint folder given, read before the other flags, whose defaults it decides."""
    parser = CommandParser(add_help=False)
    parser.add_argument(*RESUME_FLAGS)
    return parser.parse_known_args(argv)[0].resume_from_checkpoint


def given_output_dir(argv: list[str]) -> str | None:
    """The --output-dir given, or the demo's when no data flag is given; None when neither."""
    parser = CommandParser(add_help=False)
    parser.add_argument("--output_dir", "--output-dir")
    output_dir = parser.parse_known_args(argv)[0].output_dir
    flags = {argument.split("=")[0].replace("-", "_").replace("__", "--", 1) for argument in argv}
    return output_dir or (None if flags & set(DATA_FLAGS) else DEMO_OUTPUT_DIR)


def resolve_resume(argv: list[str]) -> tuple[list[str], str | None]:
    """`argv` with the checkpoint the run resumes from, and what was decided, in words for the log (None when
    nothing was). A run resumes from the newest complete checkpoint (`checkpoints.complete_checkpoints`) of
    `--resume-from-checkpoint RUN` (a run folder), of `--resume-from-checkpoint auto` (the `--output-dir` run; a new
    run when it holds none), and, without the flag, of an `--output-dir` holding a run this command started and did
    not finish (`RUN_ARGUMENTS`, no final `trainer_state.json`): the same command run again after a kill or a
    preemption continues where it stopped."""
    value = resume_checkpoint(argv)
    output_dir = given_output_dir(argv)
    if value is None:
        if output_dir is None or overwrite_given(argv) or not unfinished_run(output_dir):
            return argv, None
        checkpoint = newest_complete_checkpoint(output_dir)
        if checkpoint is None:
            return argv, None  # stopped before its first complete checkpoint: it starts again (check_output_dir)
        return [*argv, RESUME_FLAGS[0], str(checkpoint)], (
            f"{output_dir} holds a run this command started and did not finish: continuing it from {checkpoint}, "
            f"its newest complete checkpoint (step {checkpoint_step(checkpoint):,})")
    if value == "auto":
        if output_dir is None:
            raise UserError("--resume-from-checkpoint auto continues the run in --output-dir: give --output-dir")
        run = Path(output_dir)
        checkpoint = newest_complete_checkpoint(run) if run.is_dir() else None
        if checkpoint is None:
            return without_resume(argv), f"--resume-from-checkpoint auto: {run} holds no complete checkpoint; a new run"
    elif Path(value).is_dir() and checkpoint_step(Path(value).resolve()) is None:
        run = Path(value)
        checkpoint = newest_complete_checkpoint(run)
        if checkpoint is None:
            incomplete = complete_checkpoints(run)[1]
            found = f" (incomplete: {', '.join(path.name for path in incomplete)})" if incomplete else ""
            raise UserError(f"--resume-from-checkpoint {value} holds no complete checkpoint-<step> folder{found}")
    else:
        return argv, None
    step = checkpoint_step(checkpoint)
    message = f"resuming from {checkpoint}, the newest complete checkpoint of {run} (step {step:,})"
    return [*without_resume(argv), RESUME_FLAGS[0], str(checkpoint)], message


def without_resume(argv: list[str]) -> list[str]:
    """`argv` without --resume-from-checkpoint and its value."""
    kept, skip = [], False
    for argument in argv:
        if skip:
            skip = False
        elif argument in RESUME_FLAGS:
            skip = True
        elif not argument.startswith(tuple(f"{flag}=" for flag in RESUME_FLAGS)):
            kept.append(argument)
    return kept


def overwrite_given(argv: list[str]) -> bool:
    """Whether `argv` asks for --overwrite-output-dir (which replaces an unfinished run instead of continuing it)."""
    parser = CommandParser(add_help=False)
    parser.add_argument("--overwrite_output_dir", "--overwrite-output-dir", nargs="?", const="true", default="false")
    try:
        return string_to_bool(parser.parse_known_args(argv)[0].overwrite_output_dir)
    except argparse.ArgumentTypeError:  # the full parser refuses the value
        return False


def unfinished_run(output_dir: str | os.PathLike) -> bool:
    """Whether `output_dir` holds a run that `train` started (`RUN_ARGUMENTS`) and did not finish (the final
    `trainer_state.json`, saved after training, is missing)."""
    return (Path(output_dir) / RUN_ARGUMENTS).is_file() and not (Path(output_dir) / "trainer_state.json").is_file()


def recorded_arguments(checkpoint: str) -> dict:
    """The arguments the run holding `checkpoint` recorded (`RUN_ARGUMENTS`, with `demo`, without the facts under
    `run`), or {} for a run that recorded none (then the checkpoint's config.json still decides the model)."""
    path = Path(checkpoint).parent / RUN_ARGUMENTS
    if not path.is_file():
        return {}
    with user_errors(ValueError, OSError, path=path):
        recorded = json.loads(path.read_text(encoding="utf-8"))
    recorded.pop("run", None)
    return recorded


def record_arguments(model_args, data_args, recipe_args, training_args, is_demo: bool, splits=None) -> None:
    """Write `RUN_ARGUMENTS` in the output folder: what a resumed run takes from this one, and under `run` what the
    model card reports of it (`run_facts`). Paths are absolute, so that the run resumes from any folder."""
    values = {}
    for name in FIXED_ON_RESUME + KEPT_ON_RESUME:
        args = next(a for a in (model_args, data_args, recipe_args, training_args) if hasattr(a, name))
        value = getattr(args, name)
        if name in PATH_ARGUMENTS and value and Path(value).exists():
            value = str(Path(value).resolve())
        values[name] = getattr(value, "value", value)  # the Trainer's enums as their names
    path = Path(training_args.output_dir) / RUN_ARGUMENTS
    before = json.loads(path.read_text(encoding="utf-8")).get("run", {}) if path.is_file() else {}
    facts = run_facts(before, splits, training_args) if splits is not None else before
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(values, demo=is_demo, run=facts), indent=2) + "\n", encoding="utf-8")


def run_facts(before: dict, splits, training_args: Seq2SeqTrainingArguments) -> dict:
    """What the model card reports of the run beyond its arguments: the pairs of each split and the hardware of each
    session (`before`: what earlier sessions of a resumed run recorded)."""
    hardware = [*before.get("hardware", [])]
    if (this := describe_hardware(training_args)) not in hardware:
        hardware.append(this)
    return dict(before, pairs={name: len(split) for name, split in splits.items()}, hardware=hardware)


def record_training_time(output_dir: str | os.PathLike, clock: TrainingClock, state) -> None:
    """Add to `RUN_ARGUMENTS` the steps of the whole run and, where the clock saw all of it, its training time."""
    path = Path(output_dir) / RUN_ARGUMENTS
    recorded = json.loads(path.read_text(encoding="utf-8"))
    facts = recorded.setdefault("run", {})
    facts.update(steps=state.global_step, epochs=state.epoch, sessions=clock.sessions)
    if clock.complete:
        facts["training_seconds"] = clock.seconds
    else:  # resumed from a checkpoint saved without the clock
        facts.pop("training_seconds", None)
    path.write_text(json.dumps(recorded, indent=2) + "\n", encoding="utf-8")


def describe_hardware(training_args: Seq2SeqTrainingArguments) -> str:
    """The hardware a process trains on, in words, e.g. "1 x NVIDIA H100 80GB HBM3" or "CPU, 2 cores"."""
    device, processes = training_args.device, training_args.world_size
    if device.type == "cuda":
        return f"{processes} x {torch.cuda.get_device_name(device)}"
    if device.type == "cpu":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        return f"CPU, {cores} cores" + (f", {processes} processes" if processes > 1 else "")
    return f"{processes} x {device.type}"


def check_resumed_flags(arguments, recorded: dict, flags: set[str], checkpoint: str, continued: bool = False) -> None:
    """A `UserError` for a flag that gives a `FIXED_ON_RESUME` argument another value than the run it resumes
    (`continued`: the unfinished run of the output folder, which the command continues without being asked)."""
    for name in FIXED_ON_RESUME:
        if f"--{name}" not in flags or name not in recorded:
            continue
        args = next(a for a in arguments if hasattr(a, name))
        given, before = getattr(args, name), recorded[name]
        given = getattr(given, "value", given)
        if name in PATH_ARGUMENTS and given and before and Path(given).exists():
            same = Path(given).resolve() == Path(before).resolve()
        else:
            same = given == before
        if not same:
            flag = f"--{name.replace('_', '-')}"
            given, before = (f"{value:g}" if isinstance(value, float) else value for value in (given, before))
            raise UserError(
                f"{flag} {given} contradicts the run "
                f"{'this command continues (unfinished)' if continued else '--resume-from-checkpoint continues'}, "
                f"trained with {flag} {before} ({Path(checkpoint).parent / RUN_ARGUMENTS}); leave the flag out to "
                "continue the run as it was" + (", or pass --overwrite-output-dir to replace it" if continued else "")
            )


# The size flags and the config key each one sets.
MODEL_SIZE_FLAGS = dict(d_model="d_model", layers="encoder_layers", heads="encoder_attention_heads",
                        ffn_dim="encoder_ffn_dim", dropout="dropout", attention_dropout="attention_dropout",
                        activation_dropout="activation_dropout")


def check_resumed_model(model_args: ModelArguments, checkpoint: str) -> None:
    """A `UserError` for a size flag that contradicts the checkpoint's own config.json, the model it continues."""
    config = VanillaTransformerConfig.get_config_dict(checkpoint)[0]
    for name, key in MODEL_SIZE_FLAGS.items():
        given = getattr(model_args, name)
        if given is not None and key in config and given != config[key]:
            raise UserError(f"--{name.replace('_', '-')} {given} contradicts the checkpoint's model: "
                            f"{Path(checkpoint) / 'config.json'} has {key} {config[key]}; leave the flag out to "
                            "resume the run")


def trains_on_gpu(argv: list[str], use_cpu: bool) -> bool:
    """Whether the Trainer will train on a CUDA GPU: one is available and `--use-cpu` (default `use_cpu`) is off."""
    if not torch.cuda.is_available():
        return False
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--use_cpu", "--use-cpu", nargs="?", const="true", default=None)
    value = parser.parse_known_args(argv)[0].use_cpu
    try:
        return not (use_cpu if value is None else string_to_bool(value))
    except argparse.ArgumentTypeError:  # the Trainer's parser refuses the value
        return False


# What shows that a folder holds a run (and what --overwrite-output-dir deletes): checkpoints, the trained weights,
# the Trainer's state and arguments, the results and the TensorBoard logs.
CHECKPOINT = re.compile(r"checkpoint-\d+")
RUN_MARKERS = ("model.safetensors", "model.safetensors.index.json", "trainer_state.json")
RUN_FILES = (*RUN_MARKERS, "model-*-of-*.safetensors", "training_args.bin", "*_results.json", "runs", RUN_ARGUMENTS)


def check_output_dir(recipe_args: RecipeArguments, training_args: Seq2SeqTrainingArguments) -> None:
    """A `UserError` unless `--output-dir` is a new or empty folder, one without a run, a run given
    `--overwrite-output-dir`, or one resumed from an existing checkpoint with `--resume-from-checkpoint`."""
    output_dir, checkpoint = Path(training_args.output_dir), training_args.resume_from_checkpoint
    if output_dir.exists() and not output_dir.is_dir():
        raise UserError(f"--output-dir {output_dir} is a file, not a folder")
    if training_args.process_index == 0:  # the process that will hold the lock (run_lock.py)
        with user_errors(FolderInUseError):
            check_unlocked(output_dir)
    if checkpoint is not None:
        if recipe_args.overwrite_output_dir:
            raise UserError("--overwrite-output-dir would delete the run --resume-from-checkpoint continues; give one")
        if not Path(checkpoint).is_dir():
            raise UserError(f"--resume-from-checkpoint {checkpoint}: no such folder")
        check_resumed_checkpoint(Path(checkpoint), recipe_args.resume_weights_only)
        return
    run = sorted(
        path.name for path in output_dir.glob("*") if CHECKPOINT.fullmatch(path.name) or path.name in RUN_MARKERS
    )
    if run and unfinished_run(output_dir) and newest_complete_checkpoint(output_dir) is None:
        logger.info("%s holds a run stopped before its first complete checkpoint: it starts again", output_dir)
    elif run and not recipe_args.overwrite_output_dir:
        raise UserError(
            f"--output-dir {output_dir} holds a run ({', '.join(run[:3])}{', ...' if len(run) > 3 else ''}); pass "
            "--overwrite-output-dir to replace it, --resume-from-checkpoint to continue it, or choose another folder"
        )


def check_resumed_checkpoint(checkpoint: Path, weights_only: bool = False) -> None:
    """A `UserError` for a checkpoint to resume from that is incomplete (naming the newest complete one of its run),
    or that lacks the training state that makes the resumed run the uninterrupted one (unless `weights_only`, when
    the log says the run will differ)."""
    if (problem := checkpoint_problem(checkpoint)) is not None:
        newest = newest_complete_checkpoint(checkpoint.parent)
        use = f"resume from {newest}, the newest complete one" if newest else f"{checkpoint.parent} holds none"
        raise UserError(f"--resume-from-checkpoint {checkpoint} is incomplete ({problem}); {use}")
    if missing := missing_training_state(checkpoint):
        missing = " and ".join(missing)
        if not weights_only:
            raise UserError(f"--resume-from-checkpoint {checkpoint} has no {missing}: the resumed run would not match "
                            "an uninterrupted one; pass --resume-weights-only to go on with what it holds")
        logger.warning("Resuming from %s without its %s (--resume-weights-only): the run will not match an "
                       "uninterrupted one", checkpoint, missing)


def remove_incomplete_checkpoints(output_dir: str | os.PathLike) -> None:
    """Delete the checkpoints of `output_dir` that a kill cut short (never used, and rewritten when the run reaches
    their step again), saying so."""
    if not Path(output_dir).is_dir():
        return
    for path, problem in complete_checkpoints(output_dir)[1].items():
        logger.info("Removing %s, an incomplete checkpoint: %s", path, problem)
        shutil.rmtree(path)


@contextlib.contextmanager
def disk_errors(output_dir: str | os.PathLike, process_index: int = 0):
    """A write into the run's folder that the disk refuses (a checkpoint, the final model; `user_errors.disk_problem`)
    as a `UserError` naming the folder, the space and the checkpoint to continue from; the first process deletes what
    was cut short (checkpoints, the final weights), so that nothing half-written is left under a name that a later
    command would trust."""
    try:
        yield
    except Exception as error:
        if isinstance(error, UserError) or (problem := disk_problem(error, output_dir)) is None:
            raise
        if process_index == 0:
            remove_incomplete_checkpoints(output_dir)
            if weights_problem(output_dir) is not None:
                (Path(output_dir) / "model.safetensors").unlink()
        newest = newest_complete_checkpoint(output_dir)
        needed = sum(path.stat().st_size for path in newest.rglob("*") if path.is_file()) if newest else None
        then = (f"; {newest} is the newest complete checkpoint: free space and run the same command to continue"
                if newest else "; free space and run the command again")
        raise UserError(disk_message(output_dir, problem, needed) + then) from error


def remove_run(output_dir: str | os.PathLike) -> None:
    """Delete the run in `output_dir` (what `RUN_FILES` and `CHECKPOINT` match), so that a new run never mixes its
    checkpoints, state or logs with the old one's. Other files (a model card, notes) stay."""
    for path in Path(output_dir).glob("*"):
        if not (CHECKPOINT.fullmatch(path.name) or any(path.match(pattern) for pattern in RUN_FILES)):
            continue
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def check_arguments(model_args, data_args, recipe_args, training_args, is_demo: bool) -> None:
    """`UserError`s for values and combinations that would otherwise fail after files are written, or mid-run; checked
    before the data is loaded, which may take minutes."""
    if model_args.vocab_size < SMALLEST_VOCAB_SIZE and not (model_args.model_name_or_path or model_args.tokenizer_name):
        raise UserError(f"--vocab-size {model_args.vocab_size} is too small: the byte alphabet (256) and the special "
                        f"tokens need {SMALLEST_VOCAB_SIZE}, and merges come on top")
    if training_args.max_steps == 0 or training_args.max_steps < -1:
        raise UserError(f"--max-steps must be a positive number of steps (or -1: --num-train-epochs decides), "
                        f"got {training_args.max_steps}")
    for name in ("vocab_size", "max_source_length", "max_target_length", "max_eval_samples", "pad_to_multiple_of"):
        value = getattr(model_args if name == "vocab_size" else data_args, name)
        if value is not None and value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
    if data_args.max_tokens is not None and data_args.max_tokens < 0:
        raise UserError(f"--max-tokens must be positive (or 0: batches of sentences), got {data_args.max_tokens}")
    if not 0 <= data_args.bpe_dropout < 1:
        raise UserError(f"--bpe-dropout must be in [0, 1), got {data_args.bpe_dropout}")
    if data_args.max_sentences is not None and (data_args.max_sentences < 1 or not data_args.max_tokens):
        raise UserError(f"--max-sentences must be positive and goes with --max-tokens, got {data_args.max_sentences}")
    if data_args.bpe_dropout and not data_args.max_tokens:
        raise UserError("--bpe-dropout needs token batches (--max-tokens > 0): lengths change every epoch")
    check_checkpoints_to_average(recipe_args, training_args)
    if recipe_args.lr_scale <= 0:
        raise UserError(f"--lr-scale must be positive, got {recipe_args.lr_scale}")
    if unknown := [name for name in recipe_args.cpu_speedups if name not in (*CPU_SPEEDUPS, "none")]:
        raise UserError(f"--cpu-speedups: unknown {unknown[0]!r}; choose from {', '.join(CPU_SPEEDUPS)}, or none")
    has_validation = is_demo or data_args.validation_source_file or data_args.validation_file
    if training_args.eval_strategy != "no" and not has_validation:
        raise UserError(
            f"--eval-strategy {training_args.eval_strategy.value} needs validation data: --validation-source-file and "
            "--validation-target-file, or --validation-file"
        )


def check_checkpoints_to_average(recipe_args: RecipeArguments, training_args: Seq2SeqTrainingArguments) -> None:
    """A `UserError` when --average-last asks for more checkpoints than a run of --max-steps steps saves."""
    if recipe_args.average_last < 0:
        raise UserError(f"--average-last must be 0 (no averaging) or a number of checkpoints, got "
                        f"{recipe_args.average_last}")
    if not recipe_args.average_last or training_args.max_steps < 1:
        return
    if training_args.save_strategy != "steps":
        raise UserError(f"--average-last {recipe_args.average_last} averages checkpoints: it needs --save-strategy "
                        f"steps, not {training_args.save_strategy.value}")
    every = training_args.save_steps  # below 1: a share of the run, as the Trainer reads it
    saved = int(training_args.max_steps // (every if every >= 1 else math.ceil(training_args.max_steps * every)))
    if recipe_args.average_last > saved:
        raise UserError(f"--average-last {recipe_args.average_last} needs as many checkpoints, but --max-steps "
                        f"{training_args.max_steps} with --save-steps {training_args.save_steps:g} saves {saved}")


def load_data(data_args: DataArguments, is_demo: bool, seed: int):
    """The `train` split and optional `validation` / `test` splits, as `translation` pair datasets."""
    if is_demo:
        try:
            return dict(number_words_corpus(
                data_args.target_lang, data_args.demo_train_size, max_digits=data_args.demo_max_digits, seed=seed
            ))
        except ValueError as error:  # the corpus names its own arguments: the flags here
            raise UserError(f"--demo-train-size {data_args.demo_train_size} with --demo-max-digits "
                            f"{data_args.demo_max_digits}: {error}") from error
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
    checkpoint = training_args.resume_from_checkpoint
    if checkpoint and (Path(checkpoint) / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(checkpoint)  # the Trainer saves the tokenizer with each checkpoint
    source = model_args.model_name_or_path or model_args.tokenizer_name
    if source:
        return AutoTokenizer.from_pretrained(source)
    tokenizer_dir = Path(training_args.output_dir) / "tokenizer"
    if training_args.resume_from_checkpoint and tokenizer_dir.is_dir():
        return AutoTokenizer.from_pretrained(tokenizer_dir)  # the run's own, which its checkpoints were trained with
    # One process trains the shared vocabulary on both sides of the training data; the others load it.
    with training_args.main_process_first(desc="training the tokenizer"):
        if training_args.process_index == 0:
            pairs = sample_pairs(train_pairs, model_args.tokenizer_train_pairs, seed=training_args.seed)
            texts = pair_texts(pairs, data_args.source_lang, data_args.target_lang)
            train_tokenizer(texts, vocab_size=model_args.vocab_size).save_pretrained(tokenizer_dir)
    return AutoTokenizer.from_pretrained(tokenizer_dir)


def build_model(model_args: ModelArguments, data_args: DataArguments, tokenizer, checkpoint: str | None = None):
    """The model to train: the one `checkpoint` holds (resuming), the one to fine-tune, or a new one."""
    if checkpoint or model_args.model_name_or_path:
        return AutoModelForSeq2SeqLM.from_pretrained(
            checkpoint or model_args.model_name_or_path, attn_implementation=model_args.attn_implementation
        )
    # The model's generation config is section 6.1's decoding (beam 4, GNMT length penalty 0.6, source + 50).
    return VanillaTransformerForConditionalGeneration(new_model_config(model_args, data_args, tokenizer))


def cpu_speedups(recipe_args: RecipeArguments, training_args: Seq2SeqTrainingArguments) -> tuple[str, ...]:
    """The CPU speed-ups this run uses (cpu_training.py): those `--cpu-speedups` names when training on a CPU, none
    elsewhere. The process-wide one, `keep_memory`, is switched on here."""
    if training_args.device.type != "cpu":
        return ()
    speedups = tuple(name for name in recipe_args.cpu_speedups if name != "none")
    if "keep_memory" in speedups:
        keep_freed_memory()
    return speedups


def new_model_config(model_args: ModelArguments, data_args: DataArguments, tokenizer=None) -> VanillaTransformerConfig:
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


def check_new_model(model_args: ModelArguments, data_args: DataArguments) -> None:
    """A `UserError` for a preset, size or attention kernel the model refuses: the model is built on the meta device
    (no memory, no weights), so that its own checks run before anything is written."""
    with user_errors(ValueError, ImportError), torch.device("meta"):
        VanillaTransformerForConditionalGeneration(new_model_config(model_args, data_args))


def main(argv: list[str] | None = None):
    """Parse, prepare the data, build the model, train, average the last checkpoints, test, write the model card."""
    given = sys.argv[1:] if argv is None else argv
    argv, resumed = resolve_resume(given)
    continued = resumed is not None and resume_checkpoint(given) is None
    model_args, data_args, recipe_args, training_args, is_demo = parse_arguments(argv, continued)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    if resumed:
        logger.info(resumed)
    # SIGTERM stops training with a checkpoint; with several processes each would stop at its own step, so there it
    # keeps its default action.
    preemption = SaveOnSignal()
    with contextlib.ExitStack() as held:
        if training_args.world_size == 1:
            held.enter_context(preemption.handling())
        return train(model_args, data_args, recipe_args, training_args, is_demo, preemption, held)


def train(model_args, data_args, recipe_args, training_args, is_demo: bool, preemption: SaveOnSignal,
          held: contextlib.ExitStack):
    """`main` after parsing: the run, with SIGTERM handled by `preemption` and the output folder's lock held in
    `held` (by the first process) until `main` returns."""
    set_seed(training_args.seed)
    splits, callbacks = check_and_load(model_args, data_args, recipe_args, training_args, is_demo)
    callbacks = [*(callbacks or []), preemption]
    if training_args.process_index == 0:  # one run per output folder, from here to the end
        with user_errors(FolderInUseError):
            held.enter_context(run_lock(training_args.output_dir))
    held.enter_context(disk_errors(training_args.output_dir, training_args.process_index))
    if training_args.eval_strategy != "no" or data_args.validation_source_file or data_args.validation_file:
        logger.info(validation_schedule(training_args))
    if recipe_args.overwrite_output_dir:
        remove_old_run(training_args)

    if training_args.process_index == 0:
        remove_incomplete_checkpoints(training_args.output_dir)
        record_arguments(model_args, data_args, recipe_args, training_args, is_demo, splits)

    tokenizer = build_tokenizer(model_args, splits["train"], data_args, training_args)
    model = build_model(model_args, data_args, tokenizer, training_args.resume_from_checkpoint)
    speedups = cpu_speedups(recipe_args, training_args)
    if not training_args.learning_rate:
        training_args.learning_rate = paper_learning_rate(
            model.config.d_model, training_args.warmup_steps, recipe_args.lr_scale
        )
    logger.info("model: %s", describe_model(model))

    tokenized = tokenize_splits(splits, tokenizer, data_args, training_args)
    train_dataset = training_dataset(tokenized["train"], tokenizer, data_args, training_args.seed)
    eval_dataset = validation_dataset(tokenized, data_args.max_eval_samples)
    clock = TrainingClock(training_args.resume_from_checkpoint)
    trainer = build_trainer(model, tokenizer, training_args, data_args, train_dataset, eval_dataset,
                            [*(callbacks or []), clock], speedups)
    result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    if trainer.is_world_process_zero():
        record_training_time(training_args.output_dir, clock, trainer.state)
    if preemption.stopped:
        number, step = preemption.stopped
        raise Preempted(f"stopped by {signal.Signals(number).name} at step {step:,}, with a checkpoint: "
                        f"{Path(training_args.output_dir) / f'checkpoint-{step}'}; the same command continues the run",
                        number)
    averaged = average_last_checkpoints(trainer, recipe_args.average_last) if recipe_args.average_last else None
    save_run(trainer, result)

    if "test" in tokenized:
        metrics, hypotheses = report_test_results(trainer, splits, tokenized, data_args, tokenizer, averaged, is_demo)
        if trainer.is_world_process_zero():
            results = card_results(metrics, splits, hypotheses, data_args, averaged, is_demo,
                                   decoding=decoding_flags(trainer.args))
            write_card(training_args.output_dir, results)
    elif eval_dataset is not None:
        report_validation_results(trainer)
    return trainer


def check_and_load(model_args, data_args, recipe_args, training_args, is_demo: bool):
    """Every flag, folder and data file, checked before anything is written; the data is loaded to be checked. Returns
    the splits and the Trainer's callbacks."""
    check_output_dir(recipe_args, training_args)
    if training_args.resume_from_checkpoint:
        check_resumed_model(model_args, training_args.resume_from_checkpoint)
    elif model_args.model_name_or_path:
        check_model(model_args.model_name_or_path)
    else:
        check_new_model(model_args, data_args)
    if model_args.tokenizer_name:
        check_model(model_args.tokenizer_name, config=False, weights=False)
    if model_args.model_name_or_path:
        check_tokenizer_fits(model_args.model_name_or_path, model_args.tokenizer_name)
    check_arguments(model_args, data_args, recipe_args, training_args, is_demo)
    with user_errors(ValueError, OSError, EOFError):  # the data loaders name the file and line of a bad one
        splits = load_data(data_args, is_demo, training_args.seed)
    with user_errors(ValueError):
        callbacks = [TrainingTimeBudget(minutes)] if (minutes := recipe_args.max_train_minutes) is not None else None
    # Checked now rather than at the first log, or at the model card written after training.
    if "tensorboard" in training_args.report_to:
        require("tensorboard", extra="train")
    if "test" in splits:  # for the model card
        require("jinja2", extra="train")
    return splits, callbacks


def validation_schedule(training_args: Seq2SeqTrainingArguments) -> str:
    """When the run validates and what it reports, in words (for the log)."""
    strategy = training_args.eval_strategy.value
    when = dict(epoch="at the end of every epoch", no="never (--eval-strategy no)").get(strategy)
    when = when or f"every {training_args.eval_steps:g} steps"
    what = "loss"
    if training_args.predict_with_generate:
        what = "loss, BLEU and chrF" + (f" ({validation_decoding(training_args)})" if strategy != "no" else "")
    return f"validation: {what} {when}"


def validation_decoding(training_args: Seq2SeqTrainingArguments) -> str:
    """The decoding of validation BLEU, in words."""
    return decoding_flags(training_args) or (
        f"greedy, at most source length + {VALIDATION_DECODING['max_length_over_source']} tokens")


def decoding_flags(training_args: Seq2SeqTrainingArguments) -> str | None:
    """The decoding that `--generation-num-beams` / `--generation-max-length` set for validation and test, in words;
    None when neither is given (validation: `VALIDATION_DECODING`, test: the model's generation config)."""
    beams, length = training_args.generation_num_beams, training_args.generation_max_length
    words = ([f"beam {beams}"] if beams else []) + ([f"at most {length} tokens"] if length else [])
    return ", ".join(words) or None


def remove_old_run(training_args: Seq2SeqTrainingArguments) -> None:
    """--overwrite-output-dir: one process deletes the run the output folder holds, before the others go on."""
    with training_args.main_process_first(desc="removing the old run"):
        if training_args.process_index == 0:
            remove_run(training_args.output_dir)


def tokenize_splits(splits, tokenizer, data_args: DataArguments, training_args: Seq2SeqTrainingArguments) -> dict:
    """Every split tokenized, by one process per core for a large corpus. Over-long training pairs are dropped as they
    are tokenized (and logged); validation and test pairs all stay."""
    languages = (tokenizer, data_args.source_lang, data_args.target_lang)
    tokenize = dict(
        train=tokenize_pairs(*languages, data_args.max_source_length, data_args.max_target_length,
                             keep_translation=bool(data_args.bpe_dropout)),
        other=tokenize_pairs(*languages),
    )
    num_proc = data_args.preprocessing_num_workers or default_num_proc(len(splits["train"]))
    with training_args.main_process_first(desc="tokenizing"), single_threaded_tokenizers(num_proc):
        tokenized = {
            name: split.map(tokenize["train" if name == "train" else "other"], batched=True,
                            remove_columns=split.column_names, desc=f"tokenizing {name}",
                            num_proc=num_proc if len(split) >= 1000 else None)
            for name, split in splits.items()
        }
    log_dropped_pairs(len(splits["train"]), len(tokenized["train"]), data_args.max_source_length,
                      data_args.max_target_length)
    return tokenized


def training_dataset(tokenized_train, tokenizer, data_args: DataArguments, seed: int):
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
    only. With CPU `speedups`, the Trainer that applies them inside its steps (cpu_training.py)."""
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


def average_last_checkpoints(trainer, last_n: int) -> str:
    """Section 6.1: give the model the average of the weights of the run's last `last_n` checkpoints. Returns what it
    averaged, in words."""
    trainer.accelerator.wait_for_everyone()  # the last checkpoint is written
    checkpoints = find_checkpoints(trainer.args.output_dir, last_n)
    with tempfile.TemporaryDirectory() as folder:
        average_checkpoints(checkpoints, folder, force=True)
        trainer.model.load_state_dict(type(trainer.model).from_pretrained(folder).state_dict())
    steps = [int(path.name.removeprefix("checkpoint-")) for path in checkpoints]
    return f"the average of the last {last_n} checkpoints (steps {steps[0]:,}-{steps[-1]:,})"


def save_run(trainer, result) -> None:
    """The model, tokenizer and generation config in the output folder, with the training metrics and the Trainer's
    state."""
    trainer.save_model()
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()


def report_validation_results(trainer) -> None:
    """Without a test split to translate: the validation loss (and BLEU and chrF with --predict-with-generate)."""
    metrics = trainer.evaluate(metric_key_prefix="eval")
    if "eval_bleu" in metrics:  # what the model card reports with the scores
        signatures = score_translations(["."], ["."])  # sacreBLEU's signature depends on its settings only
        metrics.update(eval_bleu_signature=signatures["bleu_signature"],
                       eval_chrf_signature=signatures["chrf_signature"])
        metrics["eval_decoding"] = validation_decoding(trainer.args)
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)


def report_test_results(trainer, splits, tokenized, data_args, tokenizer, averaged: str | None = None,
                        is_demo: bool = False):
    """Translate the `test` split with the model's generation config (section 6.1's beam search) unless
    `--generation-num-beams` / `--generation-max-length` say otherwise, whatever `--predict-with-generate` says for
    validation; print samples, exact-match accuracy, sacreBLEU (with its
    signature) and chrF on the detokenized text, and save them. The demo also translates its `seen` split, the numbers
    below 1,000 that are in training (`seen_` keys), and scores both per magnitude (number_words_report.py).
    `averaged` says which checkpoints the model averages, if it does. Returns the metrics and each split's
    translations."""
    if not trainer.args.predict_with_generate:
        # --predict-with-generate false keeps generate() out of validation; test files are still translated and scored.
        trainer.args.predict_with_generate = True
        trainer.compute_metrics = translation_metrics(tokenizer)
    metrics, hypotheses = {}, {}
    for name in ("test", "seen") if is_demo else ("test",):
        metrics_of_split, hypotheses[name] = translate_and_score(trainer, splits[name], tokenized[name],
                                                                 data_args.target_lang, tokenizer, prefix=name)
        metrics.update(metrics_of_split)
    if is_demo:
        metrics.update(number_words_report.magnitude_metrics(splits, hypotheses, data_args.target_lang))
    if trainer.is_world_process_zero():
        print_test_results(trainer, splits, hypotheses, metrics, data_args, averaged, is_demo)
    trainer.log_metrics("test", metrics)
    trainer.save_metrics("test", metrics)
    return metrics, hypotheses


def translate_and_score(trainer, pairs, tokenized, target_lang: str, tokenizer, prefix: str):
    """The beam-search translations of one split and its `{prefix}_` metrics: the Trainer's (loss, BLEU, chrF),
    exact match and the sacreBLEU signatures."""
    output = trainer.predict(tokenized, metric_key_prefix=prefix)
    predictions = np.where(output.predictions < 0, tokenizer.pad_token_id, output.predictions)
    hypotheses = [text.strip() for text in tokenizer.batch_decode(predictions, skip_special_tokens=True)]
    references = [pair[target_lang] for pair in pairs["translation"]]
    scores = score_translations(hypotheses, references)
    metrics = dict(output.metrics)
    metrics[f"{prefix}_exact_match"] = 100.0 * float(np.mean([h == r for h, r in zip(hypotheses, references)]))
    metrics[f"{prefix}_bleu_signature"] = scores["bleu_signature"]
    metrics[f"{prefix}_chrf_signature"] = scores["chrf_signature"]
    return metrics, hypotheses


def sample_indices(pairs, count: int, is_demo: bool) -> list[int]:
    """The pairs a report shows: the first `count`; in the demo, the first of each magnitude."""
    return number_words_report.sample_indices(pairs) if is_demo else list(range(min(count, len(pairs))))


def print_test_results(trainer, splits, hypotheses, metrics, data_args, averaged, is_demo):
    source_lang, target_lang = data_args.source_lang, data_args.target_lang
    test = splits["test"]
    print(f"\nSample translations ({source_lang} -> {target_lang}) of held-out data:")
    for index in sample_indices(test, 8, is_demo):
        number_words_report.print_pair(test[index]["translation"], hypotheses["test"][index], source_lang, target_lang)
    beams = trainer.args.generation_num_beams or trainer.model.generation_config.num_beams
    print(f"\nHeld-out ({len(test)} pairs, beam {beams}): "
          f"exact match {metrics['test_exact_match']:.1f}%, BLEU {metrics['test_bleu']:.2f}, "
          f"chrF {metrics['test_chrf']:.2f}")
    if is_demo:
        number_words_report.print_results(splits, hypotheses, metrics, source_lang, target_lang)
    print(f"sacreBLEU signature: {metrics['test_bleu_signature']}")
    if averaged:
        print(f"Model: {averaged}")
    print(f"Model folder (loads with from_pretrained): {trainer.args.output_dir}")


def card_results(metrics, splits, hypotheses, data_args, averaged=None, is_demo: bool = False,
                 decoding: str | None = None) -> dict:
    """The test results as `hub.model_card` takes them: scores with their signatures, the data, samples and the
    recipe facts the training arguments do not hold; `decoding`: how the test was decoded, where flags changed the
    model's generation config. The demo's card also reports the numbers below 1,000 seen in
    training, and card_results.json keeps exact match per magnitude (number_words_report.py)."""
    if is_demo:
        evaluations = number_words_report.card_evaluations(metrics)
    elif data_args.dataset_name:
        evaluations = [("test", "test", dict(dataset=data_args.dataset_name, dataset_id=data_args.dataset_name))]
    else:
        evaluations = [("test", "test", dict(dataset=Path(data_args.test_source_file or data_args.test_file).name))]
    test = splits["test"]
    results = dict(
        results=[
            dict(
                **data,
                split=split,
                bleu=metrics[f"{prefix}_bleu"],
                chrf=metrics[f"{prefix}_chrf"],
                bleu_signature=metrics[f"{prefix}_bleu_signature"],
                chrf_signature=metrics[f"{prefix}_chrf_signature"],
                num_sentences=len(hypotheses[prefix]),
                **({"decoding": decoding} if decoding else {}),
            )
            for prefix, split, data in evaluations
        ],
        samples=[
            dict(source=test[index]["translation"][data_args.source_lang],
                 reference=test[index]["translation"][data_args.target_lang], hypothesis=hypotheses["test"][index])
            for index in sample_indices(test, 5, is_demo)
        ],
        training=dict(max_tokens=data_args.max_tokens, bpe_dropout=data_args.bpe_dropout,
                      bpe_dropout_target=data_args.bpe_dropout_target),
    )
    if averaged:  # the card names the weights in its table of models
        results["variants"] = [dict(model=averaged, decoding=decoding or "the defaults above",
                                    bleu=metrics["test_bleu"], chrf=metrics["test_chrf"])]
    if is_demo:
        results.update(number_words_report.card_extras(splits, hypotheses, data_args.target_lang))
    return results


def write_card(output_dir: str | os.PathLike, results: dict) -> None:
    """The output folder's model card, from the saved model and the test `results`, which card_results.json keeps for
    `vanilla-transformer model-card` and `push`."""
    output_dir = Path(output_dir)
    # The data and languages as the run recorded them (run_arguments.json); the demo's own description wins.
    run = recorded_run(output_dir)
    results = {**{name: run[name] for name in ("training_data", "datasets", "source_lang", "target_lang")
                  if name in run}, **results}
    (output_dir / "card_results.json").write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    write_model_card(output_dir, output_dir / "README.md", results)


if __name__ == "__main__":
    main(sys.argv[1:])
