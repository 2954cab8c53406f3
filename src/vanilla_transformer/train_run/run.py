"""`vanilla-transformer train`'s run: train (or fine-tune) a translation model with the paper's recipe on
Seq2SeqTrainer, average the last checkpoints, test, and write the model card.

`main` runs the kind of run its profile says (`profile.py`); the `train` command chooses the profile
(cli/train.py). Every `Seq2SeqTrainingArguments` flag works as usual (`--bf16`,
`--gradient_accumulation_steps`, `--report_to`, ...), and so do `accelerate launch` and `torchrun`.
"""

import contextlib
import logging
import signal
import sys
from pathlib import Path

from transformers import set_seed

from ..extras import require
from ..errors import Preempted, user_errors
from ..hub.reachability import check_model
from ..paths.model_folders import check_tokenizer_fits
from .build import (
    build_model, build_tokenizer, build_trainer, cpu_speedups, describe_model, load_data, tokenize_splits,
    training_dataset, validation_dataset,
)
from .checks import check_arguments, check_new_model
from ..training.checkpoints import checkpoint_folder, newest_complete_checkpoint
from .output_folder import (
    check_output_dir, disk_errors, refused_writes, remove_incomplete_checkpoints, remove_old_run,
)
from .parsing import RunArguments, parse_arguments
from .profile import PAPER_PROFILE, RunProfile
from .report import (
    average_last_checkpoints, card_results, decoding_flags, report_test_results, report_validation_results, save_run,
    validation_schedule, write_card,
)
from .resume import check_resumed_model, how_to_continue, resolve_resume, resume_checkpoint, unfinished_run
from .run_lock import FolderInUseError, run_lock
from .run_record import check_data_unchanged, data_fingerprints, record_arguments, record_training_time
from .callbacks import Patience, SaveOnSignal, TrainingClock, TrainingProgress, TrainingTimeBudget
from ..schedule import paper_learning_rate


logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None, profile: RunProfile = PAPER_PROFILE):
    """Parse, prepare the data, build the model, train, average the last checkpoints, test, write the model card: a
    run of `profile`'s kind (by default the paper's recipe on the data the flags give)."""
    given = sys.argv[1:] if argv is None else argv
    argv, resumed = resolve_resume(given, profile.output_dir)
    continued = resume_checkpoint(argv) is not None and resume_checkpoint(given) is None
    arguments = parse_arguments(argv, profile, continued)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    if resumed:
        logger.info(resumed)
    # SIGTERM stops training with a checkpoint; with several processes each would stop at its own step, so there it
    # keeps its default action. Ctrl-C stops at once, as it stops transformers' Trainer, saying how to continue.
    preemption, progress = SaveOnSignal(), TrainingProgress()
    try:
        with contextlib.ExitStack() as held:
            if arguments.training.world_size == 1:
                held.enter_context(preemption.handling())
                held.enter_context(progress.handling())
            return train(arguments, given, preemption, progress, held)
    except KeyboardInterrupt as interrupt:
        raise KeyboardInterrupt(interruption(arguments.training.output_dir, given, progress)) from interrupt


def train(arguments: RunArguments, given: list[str], preemption: SaveOnSignal, progress: TrainingProgress,
          held: contextlib.ExitStack):
    """`main` after parsing `given` (the flags as given): the run, with SIGTERM handled by `preemption`, its last step
    done in `progress`, and the output folder's lock held in `held` (by the first process) until `main` returns."""
    model_args, data_args, recipe_args, training_args, profile = arguments
    set_seed(training_args.seed)
    splits, callbacks, fingerprints = check_and_load(arguments)
    callbacks = [*(callbacks or []), preemption, progress]
    held.enter_context(refused_writes(training_args.output_dir))
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
        record_arguments(arguments, splits, fingerprints)

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
                        f"{checkpoint_folder(training_args.output_dir, step)}; "
                        f"{how_to_continue(given, training_args.output_dir)}", number)
    averaged = average_last_checkpoints(trainer, recipe_args.average_last) if recipe_args.average_last else None
    save_run(trainer, result)
    progress.saved = True

    if "test" in tokenized:
        metrics, hypotheses = report_test_results(trainer, splits, tokenized, data_args, tokenizer, profile, averaged)
        if trainer.is_world_process_zero():
            results = card_results(metrics, splits, hypotheses, data_args, profile, averaged,
                                   decoding=decoding_flags(trainer.args))
            write_card(training_args.output_dir, results)
    elif eval_dataset is not None:
        report_validation_results(trainer)
    return trainer


def interruption(output_dir: str, given: list[str], progress: TrainingProgress) -> str:
    """What Ctrl-C stopped, in words: how far the run went (`progress`) and how the run in `output_dir` continues
    (`given`: the command's flags), or that there is nothing to continue."""
    stopped = "interrupted" if progress.step is None else f"interrupted after step {progress.step:,}"
    if progress.saved:
        return f"interrupted after training: the model is saved in {output_dir}"
    checkpoint = newest_complete_checkpoint(output_dir) if Path(output_dir).is_dir() else None
    if checkpoint is not None and (progress.began or unfinished_run(output_dir)):
        return (f"{stopped}; the newest complete checkpoint is {checkpoint}: "
                f"{how_to_continue(given, output_dir)} from it")
    if unfinished_run(output_dir):
        return f"{stopped}, before the run's first complete checkpoint: the same command starts it again"
    return f"{stopped}, before the run began: nothing to continue"


def check_and_load(arguments: RunArguments):
    """Every flag, folder and data file, checked before anything is written; the data is loaded to be checked, and a
    resumed run's training files compared with those it trained on. Returns the splits, the Trainer's callbacks and
    the fingerprints of the training files (`run_record.data_fingerprints`)."""
    model_args, data_args, recipe_args, training_args, profile = arguments
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
    check_arguments(arguments)
    fingerprints = data_fingerprints(data_args)
    if training_args.resume_from_checkpoint:
        check_data_unchanged(training_args.resume_from_checkpoint, fingerprints, recipe_args.resume_on_changed_data)
    splits = load_data(data_args, profile, training_args.seed)
    with user_errors(ValueError):
        callbacks = [TrainingTimeBudget(minutes)] if (minutes := recipe_args.max_train_minutes) is not None else []
    if recipe_args.patience is not None:  # the validation loss decides, lower being better
        training_args.metric_for_best_model, training_args.greater_is_better = "loss", False
        callbacks.append(Patience(recipe_args.patience))
    # Checked now rather than at the first log, or at the model card written after training.
    if "tensorboard" in training_args.report_to:
        require("tensorboard", extra="train")
    if "test" in splits:  # for the model card
        require("jinja2", extra="train")
    return splits, callbacks, fingerprints

