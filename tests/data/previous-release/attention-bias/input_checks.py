"""Checks of what users pass to the model and to `generate()`, so that a mistake gets a clear `ValueError` naming the
argument and its value instead of an index or broadcast error deep in torch, or a silently different result.

The model checks token ids on tensors, which reads them back to the host: it does so in inference only. Training
checks them in the data, on the CPU before the batch reaches the device (`check_feature_token_ids`, applied by
`training.TokenIdCheckingCollator`), so that checking them never makes a training step wait for the device."""

from collections.abc import Sequence
from itertools import chain

import numpy as np
import torch
from transformers.utils import is_torchdynamo_compiling


def check_token_ids(input_ids: torch.Tensor, vocab_size: int, name: str) -> None:
    """Token ids the embedding can look up: at least one, each in [0, vocab_size)."""
    if input_ids.numel() == 0:
        raise ValueError(f"`{name}` is empty (shape {tuple(input_ids.shape)}); give at least one token per sequence.")
    if is_torchdynamo_compiling():
        return
    smallest, largest = (int(value) for value in torch.aminmax(input_ids))
    if smallest < 0 or largest >= vocab_size:
        bad = smallest if smallest < 0 else largest
        raise ValueError(f"`{name}` contains token id {bad}, outside the vocabulary [0, {vocab_size}).")


# Feature fields that hold token ids; `labels` may also hold the loss's ignore index.
TOKEN_ID_FIELDS = ("input_ids", "decoder_input_ids", "labels")
IGNORE_INDEX = -100


def check_feature_token_ids(features: Sequence[dict], vocab_size: int) -> None:
    """Token ids of tokenized examples (lists of ids, or arrays), before collation: each in [0, vocab_size), and -100
    also allowed in `labels`. Pure Python and numpy: no tensor is read back from a device."""
    for name in TOKEN_ID_FIELDS:
        rows = [ids if isinstance(ids, list) else np.asarray(ids).ravel().tolist()
                for feature in features if (ids := feature.get(name)) is not None]
        rows = [ids for ids in rows if len(ids)]
        if not rows:
            continue
        smallest, largest = min(map(min, rows)), max(map(max, rows))
        if smallest < 0 and name == "labels":
            smallest = min((i for i in chain.from_iterable(rows) if i != IGNORE_INDEX), default=0)
        if smallest < 0 or largest >= vocab_size:
            bad = smallest if smallest < 0 else largest
            raise ValueError(
                f"`{name}` of a training example contains token id {bad}, outside the model's vocabulary "
                f"[0, {vocab_size}): was the data tokenized with another tokenizer than the model's?"
            )


def check_attention_mask(attention_mask: torch.Tensor | None, shape: tuple[int, ...], name: str, of: str) -> None:
    """A (batch, length) mask holds one value per token of `of`, whose tokens have `shape`: a mask of another shape
    would be broadcast, or ignored when it is all ones. Masks of other ranks (transformers' prepared 4D masks) pass, and
    so does every mask inside a compiled graph, where a static cache's length is a tensor that comparing would read."""
    if is_torchdynamo_compiling():
        return
    if attention_mask is not None and attention_mask.dim() == 2 and tuple(attention_mask.shape) != tuple(shape):
        raise ValueError(
            f"`{name}` has shape {tuple(attention_mask.shape)} but `{of}` has shape {tuple(shape)}: give one mask "
            "value per token (1 for a token, 0 for padding)."
        )
