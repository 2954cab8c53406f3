"""Checks of what users pass to the model and to `generate()`, so that a mistake gets a clear `ValueError` naming the
argument and its value instead of an index or broadcast error deep in torch, or a silently different result."""

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


def check_attention_mask(attention_mask: torch.Tensor | None, shape: tuple[int, ...], name: str, of: str) -> None:
    """A (batch, length) mask holds one value per token of `of`, whose tokens have `shape`: a mask of another shape
    would be broadcast, or ignored when it is all ones. Masks of other ranks (transformers' prepared 4D masks) pass."""
    if attention_mask is not None and attention_mask.dim() == 2 and tuple(attention_mask.shape) != tuple(shape):
        raise ValueError(
            f"`{name}` has shape {tuple(attention_mask.shape)} but `{of}` has shape {tuple(shape)}: give one mask "
            "value per token (1 for a token, 0 for padding)."
        )
