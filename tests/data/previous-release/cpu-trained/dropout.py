"""Dropout kernels for section 5.4, chosen by `config.dropout_implementation` the way transformers chooses attention
kernels by `config._attn_implementation`. The model calls one dropout function; which kernel runs is a setting.

- `"torch"` (the default): torch's `nn.functional.dropout`.
- `"cpu_16bit"`: the same dropout drawn more cheaply on a CPU. torch draws a float per element (`bernoulli_`); this
  kernel draws one 64-bit integer per four elements, 16 random bits per element, of which the low 15 give the element
  a level in [0, 32,768). The keep probability is then a multiple of 1/32,768 (p = 0.1 becomes 3,277/32,768 =
  0.100006) and the kept elements are scaled by the rounded p's 1 / (1 - p), so the expectation stays exact. The
  keep/drop decision is made with integer operations into a 0/1 mask that multiplies the input (a `torch.where` on
  a boolean mask, or converting the mask to floats, takes several times longer on a CPU). On other devices and inside
  a compiled graph it is torch's kernel. The `train` command picks it when it trains on a CPU; docs/speed.md has its
  measurements.
"""

from collections.abc import Callable

import torch
from torch import nn
from transformers.utils import is_torchdynamo_compiling

# One 64-bit random draw gives four elements 16 random bits each; the low 15 bits are the element's level.
RANDOM_LEVELS = 2**15
# The bits of 1.0 in bfloat16: the integer mask becomes a 0/1 multiplier without a conversion.
BFLOAT16_ONE_BITS = 0x3F80


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
    levels = words.view(torch.int16)[: x.numel()].view(x.shape) & (RANDOM_LEVELS - 1)  # uniform over [0, 32,768)
    # level - dropped_levels is negative exactly where the element is dropped: shifting its sign bit over all 16 bits
    # gives -1 (all ones) there and 0 elsewhere, and the bitwise not of that, all ones where the element is kept.
    keep_bits = levels.sub_(dropped_levels).bitwise_right_shift_(15).bitwise_not_()
    keep = keep_bits.bitwise_and_(BFLOAT16_ONE_BITS).view(torch.bfloat16).to(x.dtype)  # 1.0 kept, 0.0 dropped
    return (x * keep).mul_(RANDOM_LEVELS / (RANDOM_LEVELS - dropped_levels))


DROPOUT_FUNCTIONS: dict[str, Callable[[torch.Tensor, float, bool], torch.Tensor]] = {
    "torch": torch_dropout,
    "cpu_16bit": cpu_16bit_dropout,
}
DROPOUT_IMPLEMENTATIONS = tuple(DROPOUT_FUNCTIONS)
