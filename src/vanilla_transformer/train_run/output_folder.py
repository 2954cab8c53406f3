"""The run's output folder: what shows that it holds a run, the checks before a run writes into it, deleting an old
run or the checkpoints a kill cut short, and a disk or a folder that refuses a write."""

import contextlib
import errno
import logging
import os
import shutil
from pathlib import Path

from transformers.trainer import TRAINER_STATE_NAME, TRAINING_ARGS_NAME
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

from ..hub.card_facts import RUN_RECORD_FILE
from ..paths.disk import folder_size, write_errors
from ..errors import UserError, describe, user_errors
from ..paths.folders import existing_folder
from ..training.checkpoints import (
    checkpoint_problem, checkpoint_step, complete_checkpoints, missing_training_state, newest_complete_checkpoint,
    weights_problem,
)
from .resume import unfinished_run
from .run_lock import FolderInUseError, check_unlocked


logger = logging.getLogger(__name__)

# What shows that a folder holds a run (with its checkpoint-<step> folders), and what --overwrite-output-dir deletes:
# those, the Trainer's arguments, the results, the TensorBoard logs and the run's record.
RUN_MARKERS = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, TRAINER_STATE_NAME)
# What a folder that refuses every write (a read-only mount, no permission) raises.
REFUSED_WRITE_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)
RUN_FILES = (*RUN_MARKERS, "model-*-of-*.safetensors", TRAINING_ARGS_NAME, "*_results.json", "runs", RUN_RECORD_FILE)


def check_output_dir(recipe_args, training_args) -> None:
    """A `UserError` unless `--output-dir` is a new or empty folder, one without a run, a run given
    `--overwrite-output-dir`, or one resumed from an existing checkpoint with `--resume-from-checkpoint`."""
    output_dir, checkpoint = Path(training_args.output_dir), training_args.resume_from_checkpoint
    if output_dir.exists() and not output_dir.is_dir():
        raise UserError(f"--output-dir {output_dir} is a file, not a folder")
    check_writable(output_dir)
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
        path.name for path in output_dir.glob("*") if checkpoint_step(path) is not None or path.name in RUN_MARKERS
    )
    if run and unfinished_run(output_dir) and newest_complete_checkpoint(output_dir) is None:
        logger.info("%s holds a run stopped before its first complete checkpoint: it starts again", output_dir)
    elif run and not recipe_args.overwrite_output_dir:
        raise UserError(
            f"--output-dir {output_dir} holds a run ({', '.join(run[:3])}{', ...' if len(run) > 3 else ''}); pass "
            "--overwrite-output-dir to replace it, --resume-from-checkpoint to continue it, or choose another folder"
        )


def check_writable(output_dir: Path) -> None:
    """A `UserError` naming the folder when `output_dir`, or the folder it would be made in, cannot be written: on a
    read-only file system, or without the permission (os.access, which also says so to root on a read-only mount)."""
    folder = existing_folder(output_dir)
    if os.access(folder, os.W_OK | os.X_OK):
        return
    read_only = hasattr(os, "statvfs") and os.statvfs(folder).f_flag & os.ST_RDONLY
    why = "is on a read-only file system" if read_only else "is not writable (permission denied)"
    raise UserError(f"--output-dir {output_dir} cannot be written: {folder} {why}")


@contextlib.contextmanager
def refused_writes(output_dir: str | os.PathLike):
    """A write into `output_dir` (or the making of it) that the folder refuses, on a read-only file system or without
    the permission, as a `UserError` naming the folder: what `check_writable` could not foresee (a mount made
    read-only during the run, a network file system's own rules)."""
    try:
        yield
    except OSError as error:
        folder, filename = Path(output_dir).absolute(), error.filename
        written = Path(os.fsdecode(filename)).absolute() if isinstance(filename, (str, bytes, os.PathLike)) else None
        if error.errno not in REFUSED_WRITE_ERRNOS or written is None or not (
                written == folder or folder in written.parents or written in folder.parents):
            raise
        raise UserError(f"--output-dir {output_dir} cannot be written: {describe(error)}") from error


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


def disk_errors(output_dir: str | os.PathLike, process_index: int = 0):
    """A write into the run's folder that the disk refuses (a checkpoint, the final model; `disk.write_errors`) as a
    `UserError` naming the folder, the space and the checkpoint to continue from; the first process deletes what was
    cut short (checkpoints, the final weights), so that nothing half-written is left under a name that a later command
    would trust."""

    def clean_up_and_continue_from() -> tuple[int | None, str]:
        if process_index == 0:
            remove_incomplete_checkpoints(output_dir)
            if weights_problem(output_dir) is not None:
                (Path(output_dir) / SAFE_WEIGHTS_NAME).unlink()
        newest = newest_complete_checkpoint(output_dir)
        needed = folder_size(newest, "**/*") if newest else None
        return needed, (f"; {newest} is the newest complete checkpoint: free space and run the same command to "
                        "continue" if newest else "; free space and run the command again")

    return write_errors(output_dir, then=clean_up_and_continue_from)


def remove_run(output_dir: str | os.PathLike) -> None:
    """Delete the run in `output_dir` (its checkpoints and what `RUN_FILES` match), so that a new run never mixes its
    checkpoints, state or logs with the old one's. Other files (a model card, notes) stay."""
    for path in Path(output_dir).glob("*"):
        if not (checkpoint_step(path) is not None or any(path.match(pattern) for pattern in RUN_FILES)):
            continue
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def remove_old_run(training_args) -> None:
    """--overwrite-output-dir: one process deletes the run the output folder holds, before the others go on."""
    with training_args.main_process_first(desc="removing the old run"):
        if training_args.process_index == 0:
            remove_run(training_args.output_dir)

