"""Which checkpoint a run resumes from, found before the flags are parsed (a resumed run's defaults are its own), and
the check of a resumed model's size flags against the checkpoint's config."""

import argparse
import os
from pathlib import Path

from transformers.hf_argparser import string_to_bool
from transformers.trainer import TRAINER_STATE_NAME

from ..hub.card_facts import RUN_RECORD_FILE
from ..model.configuration_vanilla_transformer import VanillaTransformerConfig
from ..errors import CommandParser, UserError
from ..training.checkpoints import checkpoint_step, complete_checkpoints, newest_complete_checkpoint


RESUME_FLAGS = ("--resume_from_checkpoint", "--resume-from-checkpoint")
# The size flags and the config key each one sets.
MODEL_SIZE_FLAGS = dict(d_model="d_model", layers="encoder_layers", heads="encoder_attention_heads",
                        ffn_dim="encoder_ffn_dim", dropout="dropout", attention_dropout="attention_dropout",
                        activation_dropout="activation_dropout")


def resume_checkpoint(argv: list[str]) -> str | None:
    """The --resume-from-checkpoint folder given, read before the other flags, whose defaults it decides."""
    parser = CommandParser(add_help=False)
    parser.add_argument(*RESUME_FLAGS)
    return parser.parse_known_args(argv)[0].resume_from_checkpoint


def given_output_dir(argv: list[str], default: str | None = None) -> str | None:
    """The --output-dir given, else `default` (the run profile's folder; None: the flag is required)."""
    parser = CommandParser(add_help=False)
    parser.add_argument("--output_dir", "--output-dir")
    return parser.parse_known_args(argv)[0].output_dir or default


def resolve_resume(argv: list[str], output_dir: str | None = None) -> tuple[list[str], str | None]:
    """`argv` with the checkpoint the run resumes from, and what was decided, in words for the log (None when
    nothing was). A run resumes from the newest complete checkpoint (`checkpoints.complete_checkpoints`) of
    `--resume-from-checkpoint RUN` (a run folder), of `--resume-from-checkpoint auto` (the `--output-dir` run; a new
    run when it holds none), and, without the flag, of an `--output-dir` holding a run this command started and did
    not finish (`RUN_RECORD_FILE`, no final `trainer_state.json`): the same command run again after a kill or a
    preemption continues where it stopped. Without the flag, `--overwrite-finished-run` and a finished run in
    `--output-dir` make `argv` replace it (`--overwrite-output-dir`). `output_dir`: the folder without `--output-dir`
    (the run profile's)."""
    value = resume_checkpoint(argv)
    output_dir = given_output_dir(argv, output_dir)
    if value is None:
        if output_dir is None or overwrite_given(argv):
            return argv, None
        if finished_run(output_dir) and flag_given(argv, "overwrite_finished_run"):
            return [*argv, "--overwrite_output_dir"], (
                f"{output_dir} holds a finished run: --overwrite-finished-run replaces it with a new one")
        if not unfinished_run(output_dir):
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


def flag_given(argv: list[str], name: str) -> bool:
    """Whether `argv` sets the boolean flag `name` (`--name` or `--name-with-dashes`, its value optional) to true."""
    parser = CommandParser(add_help=False)
    parser.add_argument(f"--{name}", f"--{name.replace('_', '-')}", nargs="?", const="true", default="false")
    try:
        return string_to_bool(getattr(parser.parse_known_args(argv)[0], name))
    except argparse.ArgumentTypeError:  # the full parser refuses the value
        return False


def overwrite_given(argv: list[str]) -> bool:
    """Whether `argv` asks for --overwrite-output-dir (which replaces an unfinished run instead of continuing it)."""
    return flag_given(argv, "overwrite_output_dir")


def unfinished_run(output_dir: str | os.PathLike) -> bool:
    """Whether `output_dir` holds a run that `train` started (`RUN_RECORD_FILE`) and did not finish (the final
    `trainer_state.json`, saved after training, is missing)."""
    return (Path(output_dir) / RUN_RECORD_FILE).is_file() and not finished_run(output_dir)


def finished_run(output_dir: str | os.PathLike) -> bool:
    """Whether `output_dir` holds a finished run: the final `trainer_state.json`, saved after training."""
    return (Path(output_dir) / TRAINER_STATE_NAME).is_file()


def how_to_continue(argv: list[str], output_dir: str | os.PathLike) -> str:
    """How to continue the unfinished run in `output_dir` that the command given `argv` was training, in words: the
    same command, unless it replaces the run (--overwrite-output-dir) or resumes from a given checkpoint, older than
    the newest."""
    value = resume_checkpoint(argv)
    if overwrite_given(argv):
        return "the same command without --overwrite-output-dir continues the run"
    if value not in (None, "auto") and checkpoint_step(Path(value).resolve()) is not None:
        return f"the same command with --resume-from-checkpoint {output_dir} in place of {value} continues the run"
    return "the same command continues the run"


def check_resumed_model(model_args, checkpoint: str) -> None:
    """A `UserError` for a size flag that contradicts the checkpoint's own config.json, the model it continues."""
    config = VanillaTransformerConfig.get_config_dict(checkpoint)[0]
    for name, key in MODEL_SIZE_FLAGS.items():
        given = getattr(model_args, name)
        if given is not None and key in config and given != config[key]:
            raise UserError(f"--{name.replace('_', '-')} {given} contradicts the checkpoint's model: "
                            f"{Path(checkpoint) / 'config.json'} has {key} {config[key]}; leave the flag out to "
                            "resume the run")

