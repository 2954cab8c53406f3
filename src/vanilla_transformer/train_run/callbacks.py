"""Trainer callbacks of the train command: the run's clock across resumes, a wall-time budget, a checkpoint on
SIGTERM (preemption), and the last step done."""

import contextlib
import json
import logging
import signal
import time
from pathlib import Path

from transformers import EarlyStoppingCallback, TrainerCallback

from ..errors import Preempted
from ..training.checkpoints import checkpoint_folder


logger = logging.getLogger(__name__)


class TrainingClock(TrainerCallback):
    """The wall-clock time of training across resumes: every checkpoint records the seconds of training (evaluations
    included) and the sessions that led to it in `TRAINING_TIME_FILE`, and a run resumed from it starts its clock
    there. After `train()`, `seconds` and `sessions` describe the whole run; the Trainer's `train_runtime` is this
    session's only."""

    TRAINING_TIME_FILE = "training_time.json"

    def __init__(self, resume_from_checkpoint: str | None = None):
        recorded = {}
        if resume_from_checkpoint and (path := Path(resume_from_checkpoint) / self.TRAINING_TIME_FILE).is_file():
            recorded = json.loads(path.read_text(encoding="utf-8"))
        # A checkpoint saved without the clock (an earlier release) leaves the time before it unknown.
        self.complete = not resume_from_checkpoint or bool(recorded)
        self.before = float(recorded.get("seconds", 0.0))
        self.sessions = int(recorded.get("sessions", 1 if resume_from_checkpoint else 0)) + 1
        self.start = None
        self.seconds = self.before

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def _measure(self) -> float:
        if self.start is not None:
            self.seconds = self.before + time.perf_counter() - self.start
        return self.seconds

    def on_save(self, args, state, control, **kwargs):
        folder = checkpoint_folder(args.output_dir, state.global_step)
        if state.is_world_process_zero and folder.is_dir() and self.complete:
            record = dict(seconds=self._measure(), sessions=self.sessions)
            (folder / self.TRAINING_TIME_FILE).write_text(json.dumps(record) + "\n", encoding="utf-8")

    def on_train_end(self, args, state, control, **kwargs):
        self._measure()


class TrainingTimeBudget(TrainerCallback):
    """Stops training, with a checkpoint, at the first optimizer step that ends more than `minutes` after training
    began. Section 6.1 averages checkpoints written on a clock; this bounds a run by the clock too, while `max_steps`
    stays the plan: a run that finishes its steps in time is untouched (and so reproducible step for step), and the
    section 5.3 rate does not depend on the planned length, so a run cut short follows the same schedule."""

    def __init__(self, minutes: float):
        if not minutes > 0:
            raise ValueError(f"The training time budget must be a positive number of minutes, got {minutes!r}.")
        self.seconds = 60.0 * minutes
        self.started = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        elapsed = time.perf_counter() - self.started
        if elapsed > self.seconds and state.global_step < state.max_steps:
            logger.warning(
                "Training time budget of %.1f minutes spent: stopping at step %d of %d (%.1f minutes).",
                self.seconds / 60, state.global_step, state.max_steps, elapsed / 60,
            )
            control.should_training_stop = True
            control.should_save = True
        return control


class Patience(EarlyStoppingCallback):
    """fairseq's `--patience N` as transformers' early stopping: training stops after N validations in a row without
    a lower validation loss (`metric_for_best_model` "loss"; Wu et al. (2021) stop their Multi30k runs after 10
    epochs). The run keeps its last weights, as fairseq's does, for the average of its last checkpoints (section 6.1)
    to be the model: transformers' `load_best_model_at_end` is not asked for. The count is saved with each checkpoint
    and restored when the run resumes."""

    def __init__(self, patience: int):
        super().__init__(early_stopping_patience=patience)

    def on_train_begin(self, args, state, control, **kwargs):
        pass  # transformers' own warns that the best weights will not be loaded at the end: here that is the point


class TrainingProgress(TrainerCallback):
    """How far a run went, for a stop that does not wait for the Trainer (Ctrl-C) to say where it stopped: whether
    training `began`, its last optimizer step done (`step`; None until one is), and whether the trained model was
    `saved` (set by the command).

    Inside `handling`, Ctrl-C (SIGINT) raises `KeyboardInterrupt` at once, as Python does, and again at the end of the
    step under way: an interrupt that arrives while the interpreter runs a finalizer (a `__del__`, a weak reference's
    callback) is printed and dropped there, and training would run on."""

    def __init__(self):
        self.began, self.step, self.saved, self.interrupted = False, None, False, False

    @contextlib.contextmanager
    def handling(self):
        former = signal.signal(signal.SIGINT, self.interrupt)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, former)

    def interrupt(self, number, frame):
        self.interrupted = True
        raise KeyboardInterrupt

    def on_train_begin(self, args, state, control, **kwargs):
        self.began = True

    def on_step_end(self, args, state, control, **kwargs):
        self.step = state.global_step
        if self.interrupted:
            raise KeyboardInterrupt


class SaveOnSignal(TrainerCallback):
    """SIGTERM, the signal by which SLURM, Kubernetes and spot instances preempt a job, handled as a stop with a
    checkpoint: during training the step under way ends, a checkpoint is written and training stops; `stopped` then
    holds the signal and the step, and the command raises `Preempted`. Before training begins there is nothing to
    save, and after it ends the run saves on its own: the signal raises `Preempted` at once. Installed by `handling`,
    in the main thread of one process."""

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM,)):
        self.signals = signals
        self.training = False
        self.received = None
        self.stopped = None  # (signal, step) once training stopped for a signal

    @contextlib.contextmanager
    def handling(self):
        """The signals handled inside the block, their former handlers restored after it."""
        former = {number: signal.signal(number, self.handle) for number in self.signals}
        try:
            yield self
        finally:
            for number, handler in former.items():
                signal.signal(number, handler)

    def handle(self, number, frame):
        if not self.training:
            raise Preempted(f"stopped by {signal.Signals(number).name}", number)
        self.received = number

    def on_train_begin(self, args, state, control, **kwargs):
        self.training = True

    def on_step_end(self, args, state, control, **kwargs):
        if self.received is not None:
            logger.warning("%s received: saving a checkpoint at step %d and stopping",
                           signal.Signals(self.received).name, state.global_step)
            control.should_save = True
            control.should_training_stop = True
            self.stopped = (self.received, state.global_step)
        return control

    def on_train_end(self, args, state, control, **kwargs):
        self.training = False


__all__ = ["Patience", "SaveOnSignal", "TrainingClock", "TrainingProgress", "TrainingTimeBudget"]
