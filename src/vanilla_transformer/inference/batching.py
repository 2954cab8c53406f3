"""Section 5.1 batching, for training and for translation: sentences sorted by length and cut greedily into batches
bounded by a number of padded tokens.

`cut_batches` is the one cut; `length_sorted_batches` applies it to sentences to translate (longest first), and
`training/batch_samplers.py`'s `TokenBatchSampler` to training pairs. Standard library only: every backend batches
with it, CTranslate2's without torch.
"""

from collections.abc import Sequence


def cut_batches(
    widths: Sequence[int], max_tokens: int | None = None, max_sentences: int | None = None, same_width: bool = False
) -> list[tuple[int, int]]:
    """Greedy `(start, end)` slices of `widths` (each sentence's padded length, in the order to batch them): a batch
    grows until one more sentence would make `len(batch) * its widest sentence` exceed `max_tokens`, or the batch
    hold more than `max_sentences`. With `same_width`, a batch also ends where the width changes. A sentence wider
    than `max_tokens` is a batch of its own."""
    bounds, start, widest = [], 0, 0
    for position, width in enumerate(widths):
        widest = max(widest, width)
        size = position - start + 1  # the batch's size with this sentence
        if position > start and (
            (max_tokens and size * widest > max_tokens)
            or (max_sentences and size > max_sentences)
            or (same_width and width != widths[position - 1])
        ):
            bounds.append((start, position))
            start, widest = position, width
    if len(widths):
        bounds.append((start, len(widths)))
    return bounds


def length_sorted_batches(
    lengths: Sequence[int], max_tokens: int | None = None, max_sentences: int | None = None, same_length: bool = False
) -> list[list[int]]:
    """Indices into `lengths` sorted longest first (ties in input order), cut into batches by `cut_batches`: the
    batching of translation, where the longest batch comes first so that running out of memory happens at once.
    `same_length` gives batches of sentences of one length."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__, reverse=True)  # stable: ties keep input order
    widths = [lengths[index] for index in order]
    return [order[start:end] for start, end in cut_batches(widths, max_tokens, max_sentences, same_length)]
