"""The `train` command's flags parsed into the four argument dataclasses (`arguments.py` and transformers'
`Seq2SeqTrainingArguments`), with defaults layered from the paper's recipe, the run's profile, the device and, for a
resumed run, the run it continues."""

import argparse
import os
import sys
from pathlib import Path
from typing import NamedTuple

import torch
from transformers import HfArgumentParser, Seq2SeqTrainingArguments
from transformers.hf_argparser import string_to_bool

from ..errors import OneLineErrors, describe
from .arguments import (
    GPU_DEFAULTS, NO_CUDA_DEFAULTS, PAPER_DEFAULTS, DataArguments, ModelArguments, RecipeArguments, given_flags,
)
from ..training.cpu_speedups import cpu_computes_bfloat16
from .profile import PAPER_PROFILE, RunProfile
from .resume import MODEL_SIZE_FLAGS, resume_checkpoint
from .run_record import DATA_FINGERPRINTS, check_resumed_flags, checkpoint_run_record


class RunArguments(NamedTuple):
    """A run's arguments: the three dataclasses of the package's flags, the Trainer's, and the run's profile."""

    model: ModelArguments
    data: DataArguments
    recipe: RecipeArguments
    training: Seq2SeqTrainingArguments
    profile: RunProfile


class TrainArgumentParser(OneLineErrors, HfArgumentParser):
    """transformers' parser of dataclass flags, whose errors are one line like every command's."""


def argument_parser(description: str | None = None) -> TrainArgumentParser:
    """The parser of every flag, with the paper's recipe as the Trainer's defaults."""
    parser = TrainArgumentParser(
        (ModelArguments, DataArguments, RecipeArguments, Seq2SeqTrainingArguments),
        prog="vanilla-transformer train",
        usage="%(prog)s [--help] [options]",  # not the hundreds of flags --help lists
        description=description,
    )
    parser.set_defaults(**PAPER_DEFAULTS)
    return parser


def parse_arguments(argv: list[str] | None = None, profile: RunProfile = PAPER_PROFILE,
                    continued: bool = False) -> RunArguments:
    """The run's arguments, with `profile`'s defaults. Every flag is spelled with dashes (`--max-tokens`) or, as
    transformers' scripts spell them, with underscores (`--max_tokens`). A resumed run takes its model, data and
    recipe from the run it continues (`continued`: the unfinished run of the output folder); validation files given
    mean validation."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argument_parser()
    flags = given_flags(argv)
    checkpoint = resume_checkpoint(argv)
    record = checkpoint_run_record(checkpoint) if checkpoint else None
    recorded = {name: value for name, value in (record.arguments if record is not None else {}).items()
                if name != DATA_FINGERPRINTS}
    parser.set_defaults(**profile.defaults)
    if not torch.cuda.is_available():
        parser.set_defaults(**profile.no_cuda_defaults)
    if profile.output_dir is None and "--output_dir" not in flags and not checkpoint:
        parser.error("--output-dir is required when training on your own data.")
    on_gpu = trains_on_gpu(argv, parser.get_default("use_cpu"))
    if on_gpu:
        parser.set_defaults(**GPU_DEFAULTS)
    elif not torch.cuda.is_available():
        parser.set_defaults(**NO_CUDA_DEFAULTS)
    if not on_gpu and parser.get_default("bf16") and not cpu_computes_bfloat16():
        parser.set_defaults(bf16=False)  # a profile's bf16, on a CPU that emulates it; a --bf16 given stays
    if checkpoint:  # the checkpoint's config.json is the model: a size flag is only what is given
        parser.set_defaults(**{**dict.fromkeys(MODEL_SIZE_FLAGS), "output_dir": str(Path(checkpoint).parent),
                               **recorded})
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
    return RunArguments(*arguments, profile)


def parse_into_dataclasses(parser: TrainArgumentParser, argv: list[str]):
    parser.refuse_unknown_flags(argv)
    try:
        return parser.parse_args_into_dataclasses(args=argv)
    except ValueError as error:  # the Trainer's arguments check their values and combinations
        parser.error(describe(error))


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


def trainer_help(description: str, profile: RunProfile = PAPER_PROFILE) -> str:
    """`train --help-trainer`: every flag with its help, the Trainer's as transformers gives them, with this machine's
    defaults; a flag whose value `profile` sets says so after its own default, `(default: VALUE; NAME: VALUE)`."""
    parser = argument_parser(description)
    parser.set_defaults(**(GPU_DEFAULTS if trains_on_gpu([], False) else {}))
    if not torch.cuda.is_available():
        parser.set_defaults(**NO_CUDA_DEFAULTS)
    for action in parser._actions:
        if action.dest in profile.defaults and action.help is not argparse.SUPPRESS:
            value = profile.defaults[action.dest]
            action.help = f"{action.help or ''} (default: %(default)s; {profile.name}: {value})".strip()
    return parser.format_help()
