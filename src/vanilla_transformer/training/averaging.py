"""Checkpoint averaging (section 6.1): the base model is the average of the last 5 checkpoints, the big model of the
last 20.

```python
>>> from vanilla_transformer.training.averaging import average_checkpoints, find_checkpoints
>>> average_checkpoints(find_checkpoints("runs/wmt14-base", last_n=5), "runs/wmt14-base/averaged")
```

The average is written straight to `model.safetensors` rather than through the model class: the tensors keep the
names, dtypes and metadata that `save_pretrained` gave the inputs (so the tied embedding stays stored once), no model
is built, memory holds the output plus one tensor at a time, and any model's checkpoints can be averaged.
"""

import fnmatch
import json
import os
import shutil
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import CONFIG_NAME, SAFE_WEIGHTS_NAME

from ..errors import FolderExistsError
from .checkpoints import COMPLETE, IncompleteCheckpointError, checkpoint_problem, checkpoint_step, complete_checkpoints
from ..hub.card_facts import AVERAGED_CHECKPOINTS_FILE
from ..paths.text_files import output_folder


class AveragingError(ValueError):
    """Checkpoints that cannot be averaged as asked: none, too few, without weights, of different models, or an
    output folder among them; the message names the folder or the tensor."""


# Files of a Trainer checkpoint that are not copied next to the average: other weights and the state to resume training.
_NOT_COPIED = [
    SAFE_WEIGHTS_NAME,
    "model.safetensors.index.json",
    "pytorch_model*.bin*",
    "optimizer.*",
    "scheduler.*",
    "scaler.*",
    "rng_state*.pth",
    "trainer_state.json",
    "training_args.bin",
    COMPLETE,
]


def find_checkpoints(run_dir: str | os.PathLike, last_n: int) -> list[Path]:
    """The last `last_n` complete `checkpoint-<step>` folders that the Trainer wrote in `run_dir`, oldest first.

    Folders are ordered by step number, so `checkpoint-100` comes after `checkpoint-20`. A checkpoint whose writing
    was interrupted is left out (`checkpoints.complete_checkpoints` says which and why). Raises `ValueError` if
    `run_dir` holds fewer than `last_n` complete checkpoints: averaging fewer than asked would silently change the
    model.
    """
    run_dir = Path(run_dir)
    if last_n < 1:
        raise AveragingError(f"`last_n` must be at least 1, got {last_n}.")
    if not run_dir.is_dir():
        raise AveragingError(f"Run folder {run_dir} does not exist.")
    complete, skipped = complete_checkpoints(run_dir, to_resume=False)
    if len(complete) < last_n:
        incomplete = f" complete (and {len(skipped)} incomplete)" if skipped else ""
        raise AveragingError(
            f"Asked for the last {last_n} checkpoints but {run_dir} holds {len(complete)}{incomplete} "
            f"`{PREFIX_CHECKPOINT_DIR}-<step>` folders."
        )
    return complete[-last_n:]


def average_checkpoints(
    checkpoint_dirs: list[str | os.PathLike], output_dir: str | os.PathLike, force: bool = False
) -> Path:
    """Write the element-wise mean of the checkpoints' weights to `output_dir` and return it.

    Each folder must be a complete checkpoint (`checkpoints.checkpoint_problem`; `IncompleteCheckpointError`) and hold
    a `model.safetensors` with the same tensor names, shapes and dtypes. Floating-point tensors
    are summed in float64 and divided at the end, then stored in their own dtype; other tensors are taken from the
    last checkpoint. The last checkpoint's other files (config, generation config, tokenizer, custom code) are
    copied, its optimizer and Trainer state are not, so `AutoModelForSeq2SeqLM.from_pretrained(output_dir)` and
    `AutoTokenizer.from_pretrained(output_dir)` load the result; `averaged_checkpoints.json` names the checkpoints
    averaged, with their steps, for the model card (`hub.card_facts.averaged_checkpoints`). An `output_dir` that
    already holds a model (a `config.json` or weights) has its files replaced only with `force`.
    """
    checkpoint_dirs = [Path(path) for path in checkpoint_dirs]
    output_dir = Path(output_dir)
    if not checkpoint_dirs:
        raise AveragingError("No checkpoints to average: give at least one checkpoint folder.")
    for path in checkpoint_dirs:
        if not (path / SAFE_WEIGHTS_NAME).is_file():
            raise AveragingError(f"Checkpoint {path} has no {SAFE_WEIGHTS_NAME}.")
        if (problem := checkpoint_problem(path, to_resume=False)) is not None:
            raise IncompleteCheckpointError(f"Checkpoint {path} is incomplete: {problem}.")
        if output_dir.exists() and path.resolve() == output_dir.resolve():
            raise AveragingError(f"The output folder {output_dir} is one of the checkpoints; choose another folder.")
    if not force and any((output_dir / name).exists() for name in (SAFE_WEIGHTS_NAME, CONFIG_NAME)):
        raise FolderExistsError(output_dir, "already holds a model")
    last = checkpoint_dirs[-1]

    with ExitStack() as stack:
        files = [stack.enter_context(safe_open(path / SAFE_WEIGHTS_NAME, framework="pt")) for path in checkpoint_dirs]
        _check_same_tensors(checkpoint_dirs, files)
        metadata = {**(files[-1].metadata() or {}), "format": "pt"}
        averaged = {}
        for name in files[-1].keys():
            tensor = files[-1].get_tensor(name)
            if tensor.is_floating_point():
                total = torch.zeros_like(tensor, dtype=torch.float64)
                for file in files:
                    total += file.get_tensor(name)
                tensor = (total / len(files)).to(tensor.dtype)
            averaged[name] = tensor

    # Written beside `output_dir` and moved into place once whole, the weights last: an interrupted average, or one
    # the disk refuses, leaves the folder as it was.
    with output_folder(output_dir, replace_files=True, last=(SAFE_WEIGHTS_NAME,)) as folder:
        for path in sorted(last.iterdir()):
            if path.is_file() and not any(fnmatch.fnmatch(path.name, pattern) for pattern in _NOT_COPIED):
                shutil.copy2(path, folder / path.name)
        record = {"checkpoints": [_checkpoint_record(path) for path in checkpoint_dirs]}
        (folder / AVERAGED_CHECKPOINTS_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        save_file(averaged, folder / SAFE_WEIGHTS_NAME, metadata=metadata)
    return output_dir


def _checkpoint_record(checkpoint: Path) -> dict:
    """What the average's record says of one checkpoint: its folder's name, and the step and epoch of its
    `trainer_state.json` (the step of its name where that file is missing or unreadable)."""
    try:
        state = json.loads((checkpoint / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        state = {}
    state = state if isinstance(state, dict) else {}
    step = state.get("global_step", checkpoint_step(checkpoint))
    return {"checkpoint": checkpoint.name, "step": step, "epoch": state.get("epoch")}


def _check_same_tensors(checkpoint_dirs: list[Path], files: list) -> None:
    """Raise `ValueError` naming the checkpoint and the tensor where a checkpoint differs from the first one."""
    reference_dir, reference = checkpoint_dirs[0], files[0]
    expected = {name: _shape_and_dtype(reference, name) for name in reference.keys()}
    for path, file in zip(checkpoint_dirs[1:], files[1:]):
        names = set(file.keys())
        unmatched = sorted(names ^ expected.keys())
        if unmatched:
            name = unmatched[0]
            where, other = (path, reference_dir) if name in names else (reference_dir, path)
            raise AveragingError(f"Checkpoint {where} has tensor {name!r} that {other} lacks: they are different models.")
        for name, (shape, dtype) in expected.items():
            if _shape_and_dtype(file, name) != (shape, dtype):
                other_shape, other_dtype = _shape_and_dtype(file, name)
                raise AveragingError(
                    f"Checkpoint {path} has tensor {name!r} of shape {other_shape} and dtype {other_dtype}, but "
                    f"{reference_dir} has shape {shape} and dtype {dtype}: they are different models."
                )


def _shape_and_dtype(file, name: str) -> tuple[list[int], str]:
    tensor_slice = file.get_slice(name)
    return tensor_slice.get_shape(), tensor_slice.get_dtype()


__all__ = ["AveragingError", "average_checkpoints", "find_checkpoints"]
