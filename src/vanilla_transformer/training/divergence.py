"""A run whose loss stops being finite stops, as fairseq's does, instead of training on to the end with weights of NaN.

No training step waits for the device to tell: the loss is read where the Trainer logs it (`on_log`, a number the
Trainer has already read back, every `--logging-steps`), and the weights once before each checkpoint, so that no
checkpoint of non-finite weights is written (a loss that is NaN makes the weights NaN at that step's update; with
`--fp16` the Trainer's loss scaler skips such an update and the weights stay as they were). `TrainingDiverged` then
names the step and the newest checkpoint, the last with finite weights.
"""

import math

import torch
from transformers import TrainerCallback

from ..errors import TrainingDiverged
from .checkpoints import checkpoint_step, complete_checkpoints


def finite_weights(model) -> bool:
    """Whether every parameter of `model` is finite: one read from the device for all of them."""
    checks = [torch.isfinite(parameter.detach()).all() for parameter in model.parameters()]
    return bool(torch.stack(checks).all()) if checks else True


class StopOnNonFiniteLoss(TrainerCallback):
    """Stops training at the first logged loss that is not finite, or at a checkpoint due while the weights are not
    finite (which is then not written: every checkpoint saved holds finite weights). `diverged` holds the step and
    what was found, in words; `finite_step` is the last step whose logged loss was finite (None before one is).
    Registered after the callbacks that decide to save, so that it can cancel their save."""

    def __init__(self):
        self.diverged: tuple[int, str] | None = None
        self.finite_step: int | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.diverged, self.finite_step = None, None

    def on_log(self, args, state, control, logs=None, **kwargs):
        loss = (logs or {}).get("loss")
        if loss is None:
            return control
        if math.isfinite(loss):
            self.finite_step = state.global_step
        else:
            self.stop(control, state.global_step, f"the training loss logged at step {state.global_step:,} is {loss}")
        return control

    def on_step_end(self, args, state, control, model=None, **kwargs):
        return self.check_weights_before_saving(state, control, model)

    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        return self.check_weights_before_saving(state, control, model)

    def check_weights_before_saving(self, state, control, model):
        if control.should_save and model is not None and not finite_weights(model):
            self.stop(control, state.global_step, f"the weights are not finite at step {state.global_step:,}")
        return control

    def stop(self, control, step: int, found: str) -> None:
        if self.diverged is None:
            self.diverged = (step, found)
        control.should_training_stop = True
        control.should_save = control.should_evaluate = False

    def raise_if_diverged(self, output_dir: str) -> None:
        """`TrainingDiverged`, naming the step and the newest complete checkpoint before it, if training stopped
        here."""
        if self.diverged is None:
            return
        step, found = self.diverged
        if self.finite_step is not None:
            found += f" (finite when last logged, at step {self.finite_step:,})"
        kept = [path for path in complete_checkpoints(output_dir)[0] if checkpoint_step(path) <= step]
        last = (f"{kept[-1]} is the newest checkpoint, with finite weights" if kept
                else "no checkpoint was saved before")
        raise TrainingDiverged(f"training diverged and stopped at step {step:,}: {found}; {last}")


__all__ = ["StopOnNonFiniteLoss", "finite_weights"]
