"""What `train` records of a run in its output folder (`hub.card_facts.RunRecord`, `run_arguments.json`): the
arguments a resumed run takes from the run it continues, and the facts the model card reports of it; and the check
that a resumed run's flags do not contradict them."""

import os
from pathlib import Path

import torch

from ..hub.card_facts import RUN_RECORD_FILE, RunFacts, RunRecord
from ..errors import UserError, user_errors


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


def recorded_run(checkpoint: str) -> RunRecord | None:
    """The record of the run holding `checkpoint`; None for a run that recorded none (then the checkpoint's
    config.json still decides the model). A record that is not JSON is a `UserError` naming it."""
    with user_errors(ValueError, OSError, path=Path(checkpoint).parent / RUN_RECORD_FILE):
        return RunRecord.read(Path(checkpoint).parent)


def record_arguments(arguments, splits=None) -> None:
    """Record in the output folder what a resumed run takes from this one (`arguments`, a `parsing.RunArguments`)
    and, given the `splits`, what the model card reports of it (`run_facts`). Paths are absolute, so that the run
    resumes from any folder."""
    training_args = arguments.training
    values = {}
    for name in FIXED_ON_RESUME + KEPT_ON_RESUME:
        args = next(a for a in arguments[:4] if hasattr(a, name))
        value = getattr(args, name)
        if name in PATH_ARGUMENTS and value and Path(value).exists():
            value = str(Path(value).resolve())
        values[name] = getattr(value, "value", value)  # the Trainer's enums as their names
    before = RunRecord.read(training_args.output_dir)
    facts = before.facts if before is not None else RunFacts()
    if splits is not None:
        facts = run_facts(facts, splits, training_args)
    RunRecord(values, arguments.profile.demo, facts).write(training_args.output_dir)


def run_facts(before: RunFacts, splits, training_args) -> RunFacts:
    """What the model card reports of the run beyond its arguments: the pairs of each split and the hardware of each
    session (`before`: what earlier sessions of a resumed run recorded)."""
    hardware = [*(before.hardware or [])]
    if (this := describe_hardware(training_args)) not in hardware:
        hardware.append(this)
    return RunFacts(**{**vars(before), "pairs": {name: len(split) for name, split in splits.items()},
                       "hardware": hardware})


def record_training_time(output_dir: str | os.PathLike, clock, state) -> None:
    """Add to the run's record the steps of the whole run and, where the `clock` (a `callbacks.TrainingClock`) saw all
    of it, its training time."""
    record = RunRecord.read(output_dir)
    facts = record.facts
    facts.steps, facts.epochs, facts.sessions = state.global_step, state.epoch, clock.sessions
    # Without the whole run's time (resumed from a checkpoint saved without the clock), none.
    facts.training_seconds = clock.seconds if clock.complete else None
    record.write(output_dir)


def describe_hardware(training_args) -> str:
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
    recorded (`recorded`; `continued`: the unfinished run of the output folder, which the command continues without
    being asked)."""
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
                f"trained with {flag} {before} ({Path(checkpoint).parent / RUN_RECORD_FILE}); leave the flag out to "
                "continue the run as it was" + (", or pass --overwrite-output-dir to replace it" if continued else "")
            )
