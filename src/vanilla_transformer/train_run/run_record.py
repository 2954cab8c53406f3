"""What `train` records of a run in its output folder (`hub.card_facts.RunRecord`, `run_arguments.json`): the
arguments a resumed run takes from the run it continues, a fingerprint of each training file, and the facts the model
card reports of it; and the checks that a resumed run's flags and training files do not contradict them."""

import gzip
import hashlib
import logging
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
# The training files, fingerprinted under `DATA_FINGERPRINTS` in the record: each one's size, its lines (of the text
# a .gz file holds) and the SHA-256 of its first `FINGERPRINT_HEAD` bytes as stored. A resumed run on other data would
# not be the run its checkpoint continues.
TRAINING_FILES = ("source_file", "target_file", "train_file")
DATA_FINGERPRINTS = "data_fingerprints"
FINGERPRINT_HEAD = 2**20
PATH_ARGUMENTS = ("model_name_or_path", "tokenizer_name", *(name for name in FIXED_ON_RESUME + KEPT_ON_RESUME
                                                           if name.endswith("_file")))


logger = logging.getLogger(__name__)


def checkpoint_run_record(checkpoint: str) -> RunRecord | None:
    """The record of the run holding `checkpoint`; None for a run that recorded none (then the checkpoint's
    config.json still decides the model). A record that is not JSON is a `UserError` naming it."""
    with user_errors(ValueError, OSError, path=Path(checkpoint).parent / RUN_RECORD_FILE):
        return RunRecord.read(Path(checkpoint).parent)


def record_arguments(arguments, splits=None, fingerprints: dict | None = None) -> None:
    """Record in the output folder what a resumed run takes from this one (`arguments`, a `parsing.RunArguments`),
    the `fingerprints` of its training files (`data_fingerprints`) and, given the `splits`, what the model card reports
    of it (`run_facts`). Paths are absolute, so that the run resumes from any folder."""
    training_args = arguments.training
    values = {}
    for name in FIXED_ON_RESUME + KEPT_ON_RESUME:
        args = next(a for a in arguments[:4] if hasattr(a, name))
        value = getattr(args, name)
        if name in PATH_ARGUMENTS and value and Path(value).exists():
            value = str(Path(value).resolve())
        values[name] = getattr(value, "value", value)  # the Trainer's enums as their names
    if fingerprints:
        values[DATA_FINGERPRINTS] = fingerprints
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


def data_fingerprints(data_args) -> dict[str, dict]:
    """The fingerprint of each training file of `data_args` (`TRAINING_FILES`), by absolute path: {} for the demo and
    a Hub dataset. A file that cannot be read is a `UserError` naming it."""
    found = {}
    for name in TRAINING_FILES:
        if (path := getattr(data_args, name, None)) and Path(path).is_file():
            with user_errors(OSError, EOFError, path=path):
                found[str(Path(path).resolve())] = fingerprint(path)
    return found


def fingerprint(path: str | os.PathLike) -> dict:
    """`path`'s size in bytes, its lines (read as gzip when its name ends in `.gz`, as the data loaders read it; a last
    line without its newline counts) and the SHA-256 of its first `FINGERPRINT_HEAD` bytes as stored."""
    with open(path, "rb") as file:
        head = hashlib.sha256(file.read(FINGERPRINT_HEAD)).hexdigest()
    lines, last = 0, b"\n"
    with (gzip.open if str(path).endswith(".gz") else open)(path, "rb") as file:
        while chunk := file.read(2**24):
            lines, last = lines + chunk.count(b"\n"), chunk[-1:]
    return dict(bytes=Path(path).stat().st_size, lines=lines + (last != b"\n"), head_sha256=head)


def check_data_unchanged(checkpoint: str, fingerprints: dict[str, dict], changed_data: bool = False) -> None:
    """A `UserError` naming the first training file whose `fingerprints` differ from those the run that `checkpoint`
    belongs to recorded, and what changed; with `changed_data` (--resume-on-changed-data) a warning instead. A run
    recorded without fingerprints (an older release), and a file the record does not fingerprint, are not checked."""
    record = checkpoint_run_record(checkpoint)
    recorded = (record.arguments.get(DATA_FINGERPRINTS) if record is not None else None) or {}
    for path, before in recorded.items():
        now = fingerprints.get(path)
        if now is None or now == before:
            continue
        if now["lines"] != before.get("lines"):
            change = f"{before.get('lines')} -> {now['lines']} lines"
        elif now["bytes"] != before.get("bytes"):
            change = f"{before.get('bytes'):,} -> {now['bytes']:,} bytes"
        else:
            change = f"other bytes in its first {FINGERPRINT_HEAD // 2**20} MiB"
        if changed_data:
            logger.warning("%s changed since the run trained on it (%s): --resume-on-changed-data continues the run "
                           "on it, which an uninterrupted run would not have seen", path, change)
            continue
        raise UserError(f"{path} changed since the run trained on it ({change}): exact resume is impossible on other "
                        "data; pass --resume-on-changed-data to continue anyway")
