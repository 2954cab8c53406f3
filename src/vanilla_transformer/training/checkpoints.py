"""Checkpoints that are complete or absent, and the checkpoint a run resumes from.

The Trainer writes a checkpoint file by file into `checkpoint-<step>`: a process killed on the way (out of memory, a
lost node, SIGKILL) leaves a folder with some of its files, or half of one. [`MarkCompleteCheckpoints`], a callback,
marks each checkpoint once the Trainer has written it (`on_save`, the event the Trainer calls after a checkpoint is
saved): every file is flushed to the disk, then `checkpoint_complete.json`, listing each file with its size, is
written beside them and renamed into place. In a run that marks its checkpoints, a checkpoint without the mark was
interrupted and is never used: resuming and averaging take complete checkpoints only, and say which they skipped.

Checkpoints of a run that marks none (transformers' Trainer alone, or an older release of this package) are judged
by their files: a readable `trainer_state.json`, which the Trainer writes last, and complete weights. So are the
checkpoints older than a run's first marked one: an older release wrote them before this one resumed the run.
"""

import json
import os
from pathlib import Path

from transformers import TrainerCallback
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..paths.files import file_problem
from ..hub.card_facts import checkpoint_step


COMPLETE = "checkpoint_complete.json"
# The training state that makes a resumed run the uninterrupted one: the Adam moments, the schedule's step and the
# random generators (dropout, data order), as the Trainer names them.
TRAINING_STATE = {"optimizer.pt": "optimizer state", "scheduler.pt": "learning-rate schedule state",
                  "rng_state*.pth": "random generator states"}


class IncompleteCheckpointError(ValueError):
    """A checkpoint that was not written to the end, or whose files were changed since; the message says which."""


def checkpoint_folder(run_dir: str | os.PathLike, step: int) -> Path:
    """The checkpoint folder of `run_dir` for `step`, named as the Trainer names it."""
    return Path(run_dir) / f"{PREFIX_CHECKPOINT_DIR}-{step}"


def run_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """The `checkpoint-<step>` folders of `run_dir`, complete or not, by step (`checkpoint-100` after `-20`)."""
    folders = [path for path in Path(run_dir).iterdir() if checkpoint_step(path) is not None and path.is_dir()]
    return sorted(folders, key=checkpoint_step)


def first_marked_step(run_dir: str | os.PathLike) -> int | None:
    """The step of the oldest checkpoint of `run_dir` that holds the mark; None when the run marks none."""
    return next((checkpoint_step(path) for path in run_checkpoints(run_dir) if (path / COMPLETE).is_file()), None)


def checkpoint_problem(
    checkpoint: str | os.PathLike, marked_since: int | None = -1, *, to_resume: bool = True
) -> str | None:
    """Why `checkpoint` is not complete, in words; None when it is. `marked_since`: the step of its run's first
    marked checkpoint (`first_marked_step`, found from the folder beside it by default; None: the run marks none).
    A checkpoint without the mark is interrupted if it is newer than that; otherwise (a run, or a part of a run, that
    did not mark) it is judged by its weights, and, `to_resume`, by its `trainer_state.json` too (a folder of weights
    alone can be averaged)."""
    checkpoint = Path(checkpoint)
    if marked_since == -1:
        marked_since = first_marked_step(checkpoint.parent)
    mark = checkpoint / COMPLETE
    if mark.is_file():
        try:
            files = json.loads(mark.read_text(encoding="utf-8"))["files"]
        except (OSError, ValueError, KeyError, TypeError):
            return f"its {COMPLETE} cannot be read"
        for name, size in files.items():
            path = checkpoint / name
            if not path.is_file():
                return f"{name} is missing"
            if (actual := path.stat().st_size) != size:
                return f"{name} holds {actual:,} bytes, not the {size:,} written"
        return None
    if marked_since is not None and (checkpoint_step(checkpoint) or 0) >= marked_since:
        return f"it has no {COMPLETE}: its writing was interrupted"
    state = checkpoint / TRAINER_STATE_NAME
    if not to_resume:
        return weights_problem(checkpoint)
    if not state.is_file():
        return "it has no trainer_state.json, which the Trainer writes last: its writing was interrupted"
    try:
        json.loads(state.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "its trainer_state.json is truncated or not JSON"
    return weights_problem(checkpoint)


def weights_problem(folder: str | os.PathLike) -> str | None:
    """Why the `model.safetensors` of `folder` is not whole, in words; None when it is, or when `folder` has no such
    file (sharded or other weights are not judged here)."""
    path = Path(folder) / "model.safetensors"
    if not path.is_file():
        return None
    problem = file_problem(path)
    return problem.replace(str(path), path.name) if problem else None


def complete_checkpoints(
    run_dir: str | os.PathLike, *, to_resume: bool = True
) -> tuple[list[Path], dict[Path, str]]:
    """The complete checkpoints of `run_dir` by step, and the others with what is wrong with each (`to_resume`: see
    [`checkpoint_problem`])."""
    marked = first_marked_step(run_dir)
    complete, skipped = [], {}
    for path in run_checkpoints(run_dir):
        if (problem := checkpoint_problem(path, marked, to_resume=to_resume)) is None:
            complete.append(path)
        else:
            skipped[path] = problem
    return complete, skipped


def newest_complete_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The complete checkpoint of `run_dir` with the highest step; None when it holds none."""
    complete, _ = complete_checkpoints(run_dir)
    return complete[-1] if complete else None


def missing_training_state(checkpoint: str | os.PathLike) -> list[str]:
    """What of the training state (`TRAINING_STATE`) `checkpoint` lacks, in words."""
    return [what for pattern, what in TRAINING_STATE.items() if not any(Path(checkpoint).glob(pattern))]


def mark_complete(checkpoint: str | os.PathLike) -> None:
    """Flush every file of `checkpoint` to the disk, then write its mark, `COMPLETE` (renamed into place, so that it
    is whole or absent too), listing each file with its size."""
    checkpoint = Path(checkpoint)
    files = {}
    for path in sorted(checkpoint.rglob("*")):
        if path.is_file() and path.name != COMPLETE:
            _fsync(path)
            files[path.relative_to(checkpoint).as_posix()] = path.stat().st_size
    temporary = checkpoint / f".{COMPLETE}.tmp"
    try:
        with open(temporary, "w", encoding="utf-8") as file:
            json.dump(dict(step=checkpoint_step(checkpoint), files=files), file, indent=1)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, checkpoint / COMPLETE)
    finally:
        temporary.unlink(missing_ok=True)
    _fsync(checkpoint)


def _fsync(path: Path) -> None:
    """Flush `path` (a file, or a folder's entries) to the disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class MarkCompleteCheckpoints(TrainerCallback):
    """Marks each checkpoint complete once the Trainer has written it (see the module's docstring). Registered after
    the callbacks that decide to save, so that it sees their decision."""

    def on_step_end(self, args, state, control, **kwargs):
        # A checkpoint about to be written again (a run resumed from an earlier one) loses its old mark first: its
        # files will be a mix of the two until the new mark.
        if control.should_save and args.should_save:
            (self.checkpoint(args, state) / COMPLETE).unlink(missing_ok=True)
        return control

    def on_save(self, args, state, control, **kwargs):
        if args.should_save:  # the process that writes the checkpoint
            if (checkpoint := self.checkpoint(args, state)).is_dir():
                mark_complete(checkpoint)
        return control

    @staticmethod
    def checkpoint(args, state) -> Path:
        return Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"


__all__ = [
    "COMPLETE",
    "IncompleteCheckpointError",
    "MarkCompleteCheckpoints",
    "checkpoint_folder",
    "checkpoint_problem",
    "checkpoint_step",
    "complete_checkpoints",
    "missing_training_state",
    "newest_complete_checkpoint",
    "weights_problem",
]
