"""Section 5.1's token batches for training: `TokenBatchSampler` sorts sentence pairs by length and cuts them with
`inference/batching.py`'s `cut_batches` (the cut translation batches with too) into a `torch` batch sampler,
shuffled every epoch and shared among processes; `ResegmentedTokenBatchSampler` does it anew each epoch for pairs
segmented anew (BPE-dropout); `EpochOfTokenBatches` tells the sampler the Trainer's epoch in every case.
"""

import heapq
import logging
from collections.abc import Iterator, Sequence

import numpy as np
from torch.utils.data import Sampler
from transformers import TrainerCallback

from ..inference.batching import cut_batches


logger = logging.getLogger(__name__)


class TokenBatchSampler(Sampler[list[int]]):
    """Section 5.1: "Sentence pairs were batched together by approximate sequence length. Each training batch contained
    a set of sentence pairs containing approximately 25000 source tokens and 25000 target tokens."

    Pairs are sorted by (source length, target length) and cut greedily (`cut_batches`) into batches whose padded
    source and padded target tensors both hold at most `max_tokens` tokens: `len(batch) * max(padded source len,
    padded target len) <= max_tokens`, and, with `max_sentences`, at most that many pairs (fairseq's
    `--max-sentences`: batches of short pairs stay small and spread over more steps). A pair that alone exceeds
    `max_tokens` becomes a batch of its own and is reported once, never dropped. With `shuffle`, each epoch breaks length ties at random (so batches mix
    differently) and shuffles the order of the batches; both depend only on `seed` and the epoch given to
    `set_epoch`. Ties move only pairs of identical lengths, so the batch boundaries, and hence `len()`, are the same
    in every epoch.

    Bucketed shapes: with `pad_to_multiple_of` m, lengths are rounded up to multiples of m before anything else, as
    the collator given the same m pads them. Pairs whose rounded source and target lengths agree are then ties, mixed
    at random every epoch, and every batch's padded tensors, (pairs, rounded source length) and (pairs, rounded
    target length), have the same shapes in every epoch: an epoch holds a few distinct shapes, which a compiled
    training step meets again in every later epoch (docs/training.md#bucketed-shapes).

    Batches are lists of indices into a tokenized dataset with `input_ids` and `labels` columns; pass the sampler as
    `batch_sampler` and let `DataCollatorForSeq2Seq` pad (with the same `pad_to_multiple_of`, if any):

    ```python
    >>> sampler = TokenBatchSampler.from_dataset(tokenized, max_tokens=4096, num_replicas=accelerator.num_processes)
    >>> loader = DataLoader(tokenized, batch_sampler=sampler, collate_fn=DataCollatorForSeq2Seq(tokenizer))
    >>> loader = accelerator.prepare(loader)  # each process now iterates its own share of the batches
    ```

    Distributed training: every process builds the same sampler (same lengths and seed) and so the same stream of
    batches; accelerate's `prepare` wraps it in `BatchSamplerShard`, which gives process r batches r, r + n, r + 2n...
    If the number of batches were not a multiple of n, `BatchSamplerShard` (with `even_batches`, its default) would
    repeat the first batches to fill the last round, so with `num_replicas = n > 1` the largest batches are halved
    until the count is a multiple of n: each pair is then seen exactly once per epoch across processes (a loop
    without accelerate wraps it in `BatchSamplerShard` itself). Call `set_epoch` before each epoch on every process;
    `DataLoaderShard.set_epoch` alone does not, and under a Trainer `EpochOfTokenBatches` does.
    """

    def __init__(
        self,
        source_lengths: Sequence[int],
        target_lengths: Sequence[int],
        max_tokens: int,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int = 1,
        pad_to_multiple_of: int | None = None,
        max_sentences: int | None = None,
    ):
        self.source_lengths = np.asarray(source_lengths, dtype=np.int64)
        self.target_lengths = np.asarray(target_lengths, dtype=np.int64)
        if self.source_lengths.ndim != 1 or self.source_lengths.shape != self.target_lengths.shape:
            raise ValueError(
                f"source_lengths and target_lengths must be flat and of equal size, got {len(self.source_lengths)} "
                f"and {len(self.target_lengths)} entries"
            )
        if len(self.source_lengths) == 0:
            raise ValueError("TokenBatchSampler needs at least one sentence pair")
        if max_tokens < 1 or num_replicas < 1 or (max_sentences is not None and max_sentences < 1):
            raise ValueError(f"max_tokens ({max_tokens}), num_replicas ({num_replicas}) and max_sentences "
                             f"({max_sentences}) must be positive")
        self.max_tokens = max_tokens
        self.max_sentences = max_sentences
        self.shuffle = shuffle
        self.seed = seed
        self.num_replicas = num_replicas
        self.pad_to_multiple_of = pad_to_multiple_of
        self.epoch = 0

        width = self._widths()
        self._report_too_long(width)
        self._bounds = cut_batches(width[self._length_order(rng=None)].tolist(), max_tokens, max_sentences)
        if num_replicas > 1:
            self._bounds = self._halve_largest(self._bounds, -len(self._bounds) % num_replicas)

    @classmethod
    def from_dataset(cls, dataset, max_tokens: int, **kwargs) -> "TokenBatchSampler":
        """The sampler for a tokenized `datasets.Dataset`, lengths read from its `input_ids` and `labels` columns."""
        import pyarrow.compute as pc  # installed with datasets

        table = dataset.with_format("arrow")
        source_lengths = pc.list_value_length(table["input_ids"]).to_numpy()
        target_lengths = pc.list_value_length(table["labels"]).to_numpy()
        return cls(source_lengths, target_lengths, max_tokens, **kwargs)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self._bounds)

    def __iter__(self) -> Iterator[list[int]]:
        rng = np.random.default_rng([self.seed, self.epoch]) if self.shuffle else None
        order = self._length_order(rng)
        batches = [order[start:end].tolist() for start, end in self._bounds]
        if rng is not None:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return iter(batches)

    def _length_order(self, rng: np.random.Generator | None) -> np.ndarray:
        """Indices sorted by (padded) source then target length; ties in random order, or in index order without
        `rng`."""
        num_pairs = len(self.source_lengths)
        tie_break = rng.permutation(num_pairs) if rng is not None else np.arange(num_pairs)
        source, target = self._padded(self.source_lengths), self._padded(self.target_lengths)
        return np.lexsort((tie_break, target, source))  # the last key sorts first

    def _padded(self, lengths: np.ndarray) -> np.ndarray:
        """`lengths` as the collator pads them: rounded up to a multiple of `pad_to_multiple_of`, if any."""
        if not self.pad_to_multiple_of:
            return lengths
        return -(-lengths // self.pad_to_multiple_of) * self.pad_to_multiple_of

    def _widths(self) -> np.ndarray:
        """Tokens each pair occupies in its padded tensors: a batch costs len(batch) * the largest width in it."""
        return self._padded(np.maximum(self.source_lengths, self.target_lengths))

    def _halve_largest(self, bounds: list[tuple[int, int]], times: int) -> list[tuple[int, int]]:
        """Halve the batch holding the most pairs, `times` times."""
        heap = [(start - end, start, end) for start, end in bounds]
        heapq.heapify(heap)
        for _ in range(times):
            negative_size, start, end = heapq.heappop(heap)
            if -negative_size < 2:
                raise ValueError(
                    f"Cannot share {len(self.source_lengths)} sentence pairs in batches of at most "
                    f"max_tokens={self.max_tokens} evenly among {self.num_replicas} processes; raise max_tokens or "
                    "use fewer processes"
                )
            middle = (start + end) // 2
            heapq.heappush(heap, (start - middle, start, middle))
            heapq.heappush(heap, (middle - end, middle, end))
        return sorted((start, end) for _, start, end in heap)

    def _report_too_long(self, width: np.ndarray) -> None:
        too_long = np.flatnonzero(width > self.max_tokens)
        if len(too_long) == 0:
            return
        shown = ", ".join(
            f"index {i} (source {self.source_lengths[i]}, target {self.target_lengths[i]} tokens)"
            for i in too_long[:10]
        )
        more = f" and {len(too_long) - 10} more" if len(too_long) > 10 else ""
        logger.warning(
            f"{len(too_long)} sentence pair(s) longer than max_tokens={self.max_tokens} each form a batch of their "
            f"own: {shown}{more}"
        )


class ResegmentedTokenBatchSampler(TokenBatchSampler):
    """`TokenBatchSampler` for training pairs segmented anew every epoch (`training.BPEDropoutDataset`, whose
    `lengths(epoch)` gives that epoch's source and target lengths). Each epoch sorts the pairs by its own lengths and
    cuts them into as many batches as the first epoch had, since the Trainer counts the steps of an epoch once: the
    greedy cut with the smallest token budget that needs no more batches, then the batches holding the most pairs
    halved until the count is reached. The budget so moves by under 1% from `max_tokens` (2,046-2,064 tokens for
    2,048 on Multi30k with BPE-dropout 0.1). Under several processes every process segments and cuts alike, as
    `TokenBatchSampler` does."""

    def __init__(self, dataset, max_tokens: int, **kwargs):
        self.dataset = dataset
        super().__init__(*dataset.lengths(0), max_tokens, **kwargs)
        self._epoch_of_bounds = 0

    def __iter__(self) -> Iterator[list[int]]:
        if self._epoch_of_bounds != self.epoch:
            count = len(self)
            self.source_lengths, self.target_lengths = (np.asarray(lengths, dtype=np.int64)
                                                        for lengths in self.dataset.lengths(self.epoch))
            widths = self._widths()[self._length_order(rng=None)].tolist()
            low, high = 1, max(widths) * len(widths)  # the smallest budget giving at most `count` batches
            while low < high:
                middle = (low + high) // 2
                fits = len(cut_batches(widths, middle, self.max_sentences)) <= count
                low, high = (low, middle) if fits else (middle + 1, high)
            bounds = cut_batches(widths, low, self.max_sentences)
            self._bounds = self._halve_largest(bounds, count - len(bounds))
            self._epoch_of_bounds = self.epoch
        return super().__iter__()


class EpochOfTokenBatches(TrainerCallback):
    """Sets the epoch of a `TokenBatchSampler` at the start of each of the Trainer's epochs, the resumed one included.
    The Trainer reaches a batch sampler through accelerate's wrappers, except in one case: several processes resuming
    mid-epoch, where its loader that skips the batches already trained wraps the `BatchSamplerShard` once more, and a
    sampler freshly built would deal that epoch's remaining batches in epoch 0's order. The epoch under way is the
    integer part of `state.epoch` (the checkpoint's, on resuming), as the Trainer's own count of epochs trained."""

    def __init__(self, sampler: TokenBatchSampler):
        self.sampler = sampler

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.sampler.set_epoch(int(state.epoch or 0))
