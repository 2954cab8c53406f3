"""Dropout kernels for section 5.4, chosen by `config.dropout_implementation` the way transformers chooses attention
kernels by `config._attn_implementation`. The model calls one dropout function; which kernel runs is a setting.

- `"torch"` (the default): torch's `nn.functional.dropout`.
- `"cpu_16bit"`: the same dropout drawn more cheaply on a CPU. torch draws a float per element (`bernoulli_`); this
  kernel draws one 64-bit integer per four elements and reads 16 uniform bits per element. The keep probability is
  then a multiple of 1/65,536 (p = 0.1 becomes 6,554/65,536 = 0.100006) and the kept elements are scaled by the
  rounded p's 1 / (1 - p), so the expectation stays exact. On other devices and inside a compiled graph it is torch's
  kernel. The `train` command picks it when it trains on a CPU; docs/speed.md has its measurements.
"""

from collections.abc import Callable

import torch
from torch import nn
from transformers.utils import is_torchdynamo_compiling

# One 64-bit random draw gives four elements 16 uniform bits each.
RANDOM_LEVELS = 2**16


def torch_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """torch's dropout: each element kept with probability 1 - p and scaled by 1 / (1 - p)."""
    if not training or p == 0:
        return x
    return nn.functional.dropout(x, p=p, training=True)


def cpu_16bit_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout with 16 random bits per element, four elements per 64-bit draw, on a CPU (torch's kernel elsewhere)."""
    if not training or p == 0:
        return x
    if x.device.type != "cpu" or is_torchdynamo_compiling():
        return nn.functional.dropout(x, p=p, training=True)
    dropped_levels = min(round(p * RANDOM_LEVELS), RANDOM_LEVELS - 1)
    words = torch.empty((x.numel() + 3) // 4, dtype=torch.int64).random_(-(2**63), None)  # all 64 bits uniform
    levels = words.view(torch.int16)[: x.numel()].view(x.shape)  # uniform over [-32768, 32767]
    keep = levels >= dropped_levels - RANDOM_LEVELS // 2
    return torch.where(keep, x * (RANDOM_LEVELS / (RANDOM_LEVELS - dropped_levels)), 0)


DROPOUT_FUNCTIONS: dict[str, Callable[[torch.Tensor, float, bool], torch.Tensor]] = {
    "torch": torch_dropout,
    "cpu_16bit": cpu_16bit_dropout,
}
DROPOUT_IMPLEMENTATIONS = tuple(DROPOUT_FUNCTIONS)
