"""Speed-ups for training on a CPU, switched on by the `train` command when it trains on one (`--cpu_speedups`).

None of them changes the model, its classes or its config: a model trained with them saves exactly what a model
trained without them saves, and computes the same function. None runs when the package is imported or when someone
builds a Trainer of their own; `CPUSeq2SeqTrainer` and `keep_freed_memory` are what the command uses. Each has a name
for `--cpu_speedups`, and docs/speed.md has its measured gain:

- `dropout16`: section 5.4's dropout with 16 random bits per element instead of a float (`CPU16BitDropout`).
- `keep_memory`: glibc's malloc keeps the memory a step frees for the next step (`keep_freed_memory`). Process-wide
  and for good: it is the command's choice, documented in docs/training.md, and left out with `--cpu_speedups` not
  naming it.
- `chunked_loss`: the label-smoothed cross-entropy read a cache-sized chunk of logits at a time
  (`ChunkedLabelSmoothedCrossEntropy`), from bfloat16 logits as they are.
- `bf16_logits`: under `--bf16`, the loss gets the bfloat16 logits autocast made, without accelerate's float32 copy
  of the model's outputs: the chunked loss computes in float32 itself, so the copy and its backward are pure cost.
  It relies on accelerate's `ConvertOutputsToFp32` wrapper (docs/internals.md).
"""

import ctypes
import logging
import os
import platform
from types import MethodType

import torch
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode
from transformers.utils import is_torchdynamo_compiling

from ..extras import require
from .recipe import CPU_SPEEDUPS
from .trainer import TokenBatchSeq2SeqTrainer, label_smoothed_cross_entropy

ConvertOutputsToFp32 = require("accelerate.utils.operations", extra="train").ConvertOutputsToFp32
logger = logging.getLogger(__name__)


# --- dropout16: section 5.4's dropout, drawn more cheaply ---------------------------------------------------------

# One 64-bit random draw gives four elements 16 random bits each; the low 15 bits are the element's level.
RANDOM_LEVELS = 2**15
# The bits of 1.0 in bfloat16: the integer mask becomes a 0/1 multiplier without a conversion.
BFLOAT16_ONE_BITS = 0x3F80


def cpu_16bit_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Dropout in training, on a CPU tensor: torch draws a float per element (`bernoulli_`); this draws one 64-bit
    integer per four elements, 16 random bits per element, of which the low 15 give the element a level in
    [0, 32,768). The keep probability is then a multiple of 1/32,768 (p = 0.1 becomes 3,277/32,768 = 0.100006) and
    kept elements are scaled by the rounded p's 1 / (1 - p), so the expectation stays exact. The keep/drop decision
    is made with integer operations into a 0/1 mask that multiplies the input (a `torch.where` on a boolean mask, or
    converting the mask to floats, takes several times longer on a CPU)."""
    dropped_levels = min(round(p * RANDOM_LEVELS), RANDOM_LEVELS - 1)
    words = torch.empty((x.numel() + 3) // 4, dtype=torch.int64).random_(-(2**63), None)  # all 64 bits uniform
    levels = words.view(torch.int16)[: x.numel()].view(x.shape) & (RANDOM_LEVELS - 1)  # uniform over [0, 32,768)
    # level - dropped_levels is negative exactly where the element is dropped: shifting its sign bit over all 16 bits
    # gives -1 (all ones) there and 0 elsewhere, and the bitwise not of that, all ones where the element is kept.
    keep_bits = levels.sub_(dropped_levels).bitwise_right_shift_(15).bitwise_not_()
    keep = keep_bits.bitwise_and_(BFLOAT16_ONE_BITS).view(torch.bfloat16).to(x.dtype)  # 1.0 kept, 0.0 dropped
    return (x * keep).mul_(RANDOM_LEVELS / (RANDOM_LEVELS - dropped_levels))


class CPU16BitDropout(TorchFunctionMode):
    """While active, every `torch.nn.functional.dropout` in training on a CPU tensor is `cpu_16bit_dropout`; any other
    call, and dropout elsewhere or inside a compiled graph, is torch's own. A torch function mode catches the model's
    calls without changing the model: the same code runs with torch's kernel everywhere else."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.dropout:  # which hands its input positionally and p, training and inplace by name
            (x,), p = args, kwargs["p"]
            if kwargs["training"] and 0 < p < 1 and not kwargs["inplace"] and x.device.type == "cpu" and (
                not is_torchdynamo_compiling()
            ):
                return cpu_16bit_dropout(x, p)
        return func(*args, **kwargs)


# --- keep_memory: glibc's malloc keeps what a step frees ---------------------------------------------------------

# mallopt(3) parameter numbers (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# The largest mmap threshold glibc accepts on 64-bit systems (half its 64 MiB heap size); larger blocks are always
# mapped, and their pages are always taken anew.
LARGEST_MMAP_THRESHOLD = 32 * 1024 * 1024
# Free memory at the top of the heap is handed back only beyond this much: never, in practice, during training.
TRIM_THRESHOLD = 2**31 - 1
# The user's own malloc settings, which take precedence.
MALLOC_ENVIRONMENT = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")


def keep_freed_memory() -> bool:
    """Fixes glibc malloc's mmap and trim thresholds for this process (mallopt(3)), so that memory a training step
    frees is reused by the next step instead of being handed back to the operating system and faulted in again,
    page by zero-filled page. glibc adjusts both thresholds as a program runs, and a training step's mix of sizes keeps
    it handing memory back and taking it again; torch's CPU tuning guide gets the same from preloading jemalloc or
    TCMalloc. The process then holds about its peak memory until it ends, which training reaches on its first steps.

    Returns whether it did: only under glibc, and not when the user set malloc's parameters in the environment (the
    `MALLOC_*_` variables or `glibc.malloc` tunables). It cannot be undone in the process."""
    if platform.libc_ver()[0] != "glibc":
        return False
    user_settings = [name for name in MALLOC_ENVIRONMENT if name in os.environ]
    if user_settings or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        logger.info("malloc settings from the environment kept as they are (%s)",
                    ", ".join(user_settings) or "GLIBC_TUNABLES")
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = mallopt(M_MMAP_THRESHOLD, LARGEST_MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    if done:
        logger.info("malloc keeps freed memory for reuse: mmap threshold %d MiB, no trimming",
                    LARGEST_MMAP_THRESHOLD // 2**20)
    return done


# --- chunked_loss: the label-smoothed loss a chunk of logits at a time ------------------------------------------

# Rows of logits per chunk: ~2 MB of float32 at a vocabulary of 8,000, so that a chunk's passes stay in a core's cache.
LOSS_CHUNK_ELEMENTS = 2**19


class ChunkedLabelSmoothedCrossEntropy(torch.autograd.Function):
    """Section 5.4's label-smoothed cross-entropy, summed over the rows of (tokens x vocabulary) logits whose label is
    not `ignore_index`, computed a chunk of rows at a time in float32 from logits of any dtype. Per row, with
    lse = log sum_v exp(x_v), the loss (1 - epsilon) * (lse - x_y) + epsilon * (lse - mean_v x_v) and its gradient
    softmax(x) - (1 - epsilon) * onehot(y) - epsilon / V. torch's `cross_entropy` under CPU autocast first copies the
    bfloat16 logits to a float32 tensor and then makes several more passes over it, forward and backward; this reads
    each chunk once while it is in cache. The gradient is written in the logits' dtype, as autocast's copy back
    would."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, epsilon: float, ignore_index: int) -> torch.Tensor:
        rows, vocab_size = logits.shape
        chunk = max(1, LOSS_CHUNK_ELEMENTS // vocab_size)
        dtype = torch.promote_types(logits.dtype, torch.float32)  # bfloat16 and float16 are computed in float32
        counted = labels != ignore_index
        targets = labels.masked_fill(~counted, 0).unsqueeze(1)
        log_normalizers = torch.empty(rows, dtype=dtype, device=logits.device)
        losses = torch.empty(rows, dtype=dtype, device=logits.device)
        for start in range(0, rows, chunk):
            part = slice(start, start + chunk)
            x = logits[part].to(dtype)
            log_normalizers[part] = lse = torch.logsumexp(x, dim=1)
            nll = lse - x.gather(1, targets[part]).squeeze(1)
            mean_negative_log_probability = lse - x.sum(1) / vocab_size
            losses[part] = (1 - epsilon) * nll + epsilon * mean_negative_log_probability
        ctx.save_for_backward(logits, targets, counted, log_normalizers)
        ctx.epsilon = epsilon
        return losses.masked_fill_(~counted, 0).sum()

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        logits, targets, counted, log_normalizers = ctx.saved_tensors
        epsilon = ctx.epsilon
        rows, vocab_size = logits.shape
        chunk = max(1, LOSS_CHUNK_ELEMENTS // vocab_size)
        dtype = log_normalizers.dtype
        grad_logits = torch.empty_like(logits)
        row_scale = counted.to(dtype).mul_(grad_loss).unsqueeze(1)  # 0 for ignored rows
        on_target = torch.full((min(chunk, rows), 1), -(1 - epsilon), dtype=dtype, device=logits.device)
        for start in range(0, rows, chunk):
            part = slice(start, start + chunk)
            x = logits[part].to(dtype, copy=True)
            probabilities = x.sub_(log_normalizers[part].unsqueeze(1)).exp_()
            gradient = probabilities.sub_(epsilon / vocab_size)
            gradient.scatter_add_(1, targets[part], on_target[: len(gradient)])
            grad_logits[part] = gradient.mul_(row_scale[part])
        return grad_logits, None, None, None


def chunked_label_smoothed_cross_entropy(epsilon: float):
    """A Trainer `compute_loss_func` with the value of `training.label_smoothed_cross_entropy`, computed by
    `ChunkedLabelSmoothedCrossEntropy` on CPU logits (as `label_smoothed_cross_entropy` elsewhere)."""
    on_other_devices = label_smoothed_cross_entropy(epsilon)

    def compute_loss(outputs, labels: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        if logits.device.type != "cpu":
            return on_other_devices(outputs, labels, num_items_in_batch)
        with torch.autocast("cpu", enabled=False):
            loss = ChunkedLabelSmoothedCrossEntropy.apply(logits.flatten(0, -2), labels.flatten(), epsilon, -100)
        if num_items_in_batch is None:
            num_items_in_batch = (labels != -100).sum()
        return loss / num_items_in_batch

    return compute_loss


# --- The Trainer that applies them --------------------------------------------------------------------------------


class CPUSeq2SeqTrainer(TokenBatchSeq2SeqTrainer):
    """`TokenBatchSeq2SeqTrainer` with the CPU speed-ups named in `speedups` that act inside a training step
    (`dropout16`, `chunked_loss`, `bf16_logits`); `keep_memory` is process-wide and the command's to call
    (`keep_freed_memory`)."""

    def __init__(self, *args, speedups: tuple[str, ...] = CPU_SPEEDUPS, **kwargs):
        super().__init__(*args, **kwargs)
        if "dropout16" in speedups and self.args.torch_compile:
            # A compiled graph keeps torch's dropout anyway, and dynamo does not trace the model correctly under the
            # torch function mode (a tensor's `.device` comes back as its shape).
            logger.info("dropout16 is off: the model is compiled (--torch-compile), and keeps torch's dropout")
            speedups = tuple(name for name in speedups if name != "dropout16")
        self.speedups = tuple(speedups)
        if "chunked_loss" in self.speedups and self.args.label_smoothing_factor > 0:
            self.compute_loss_func = chunked_label_smoothed_cross_entropy(self.args.label_smoothing_factor)

    def training_step(self, *args, **kwargs):
        if "dropout16" not in self.speedups:
            return super().training_step(*args, **kwargs)
        with CPU16BitDropout():
            return super().training_step(*args, **kwargs)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # `bf16_logits`: accelerate wraps the model's forward in autocast, then in `ConvertOutputsToFp32`; for this
        # step the forward is the autocast one alone, and accelerate's wrapper is put back after it.
        module = self.accelerator.unwrap_model(model)
        forward = module.__dict__.get("forward")
        wrapper = getattr(getattr(forward, "__func__", forward), "__wrapped__", None)
        if "bf16_logits" not in self.speedups or not isinstance(wrapper, ConvertOutputsToFp32):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        autocast_forward = wrapper.model_forward
        module.forward = MethodType(autocast_forward, module) if hasattr(forward, "__func__") else autocast_forward
        try:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        finally:
            module.forward = forward


def cpu_computes_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX), as the Intel Xeons the CPU recipes were
    measured on do. Elsewhere (an AVX2-only AMD EPYC, say) torch emulates it, and a bf16 training step is many times
    slower than a float32 one (docs/speed.md): there a profile's bf16 default is dropped."""
    return any(getattr(torch.cpu, name, lambda: False)() for name in ("_is_avx512_bf16_supported",
                                                                       "_is_amx_tile_supported"))
