"""Checks of the `train` command's flags, their values and combinations, made before anything is written or loaded:
what would otherwise fail after files are written, or mid-run."""

import math

import torch

from ..model.modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from ..errors import UserError, user_errors
from .arguments import CPU_SPEEDUPS
from .build import new_model_config
from ..training.tokenization import SMALLEST_VOCAB_SIZE


def check_arguments(arguments) -> None:
    """`UserError`s for values and combinations of a run's `arguments` (a `parsing.RunArguments`) that would otherwise
    fail after files are written, or mid-run; checked before the data is loaded, which may take minutes."""
    model_args, data_args, recipe_args, training_args, profile = arguments
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
    if recipe_args.patience is not None and (recipe_args.patience < 1 or training_args.eval_strategy == "no"):
        raise UserError(f"--patience counts validations without a better loss: it needs a positive number and "
                        f"validation (--eval-strategy steps or epoch), got {recipe_args.patience} and "
                        f"--eval-strategy {training_args.eval_strategy.value}")
    if training_args.eval_strategy != "no" and not profile.has_validation(data_args):
        raise UserError(
            f"--eval-strategy {training_args.eval_strategy.value} needs validation data: --validation-source-file and "
            "--validation-target-file, or --validation-file"
        )


def check_checkpoints_to_average(recipe_args, training_args) -> None:
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



def check_new_model(model_args, data_args) -> None:
    """A `UserError` for a preset, size or attention kernel the model refuses: the model is built on the meta device
    (no memory, no weights), so that its own checks run before anything is written."""
    with user_errors(ValueError, ImportError), torch.device("meta"):
        VanillaTransformerForConditionalGeneration(new_model_config(model_args, data_args))
