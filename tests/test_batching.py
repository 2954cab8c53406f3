"""Section 5.1 token batching: token budget counted on padded tensors, coverage, per-epoch shuffling, length grouping,
the distributed contract with accelerate's `BatchSamplerShard` (every pair once per epoch across processes), and the
same cut batching sentences to translate."""

import logging

import numpy as np
import pytest
import torch
from accelerate.data_loader import BatchSamplerShard, prepare_data_loader
from datasets import Dataset
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from torch.utils.data import DataLoader
from transformers import DataCollatorForSeq2Seq, PreTrainedTokenizerFast

from vanilla_transformer.inference.batching import cut_batches, length_sorted_batches
from vanilla_transformer.training.batch_samplers import (
    EpochOfTokenBatches,
    ResegmentedTokenBatchSampler,
    TokenBatchSampler,
)


def multi30k_like_lengths(num_pairs: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Source lengths around 12 tokens (2 to 40) and target lengths correlated with them, as in Multi30k En-De."""
    rng = np.random.default_rng(seed)
    source = np.clip(rng.normal(12, 4.5, num_pairs).round(), 2, 40).astype(int)
    target = np.clip((source * rng.normal(0.95, 0.15, num_pairs)).round(), 2, 40).astype(int)
    return source, target


def padded_tokens(batch, source, target, pad_to_multiple_of=1):
    """Tokens in the larger of the batch's two padded tensors, what `max_tokens` bounds."""
    longest = max(source[batch].max(), target[batch].max())
    return len(batch) * -(-longest // pad_to_multiple_of) * pad_to_multiple_of


def padding_fraction(batches, source, target):
    """Share of pad positions in all source and target tensors."""
    real = sum(source[batch].sum() + target[batch].sum() for batch in batches)
    total = sum(len(batch) * (source[batch].max() + target[batch].max()) for batch in batches)
    return 1 - real / total


def assert_each_index_once(batches, num_pairs):
    indices = [index for batch in batches for index in batch]
    assert sorted(indices) == list(range(num_pairs))


# --- The token budget and coverage ---------------------------------------------------------------------------------


@pytest.mark.parametrize("max_tokens, pad_to_multiple_of", [(400, None), (1000, None), (1000, 8)])
def test_batches_fit_the_budget_counted_with_padding(max_tokens, pad_to_multiple_of):
    source, target = multi30k_like_lengths(2001)
    sampler = TokenBatchSampler(source, target, max_tokens, pad_to_multiple_of=pad_to_multiple_of)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        tokens = [padded_tokens(batch, source, target, pad_to_multiple_of or 1) for batch in batches]
        assert max(tokens) <= max_tokens
        assert_each_index_once(batches, len(source))
        assert len(batches) == len(sampler)
    # The budget is used: on average batches are nearly full.
    assert np.mean(tokens) > 0.8 * max_tokens


def test_max_sentences_caps_the_batches_of_short_pairs_only():
    short, long = np.full(1000, 4), np.full(1000, 40)  # 1,000 pairs of 4 tokens, 1,000 of 40
    source = target = np.concatenate([short, long])
    uncapped = list(TokenBatchSampler(source, target, 2000, shuffle=False))
    capped = TokenBatchSampler(source, target, 2000, shuffle=False, max_sentences=100)
    batches = list(capped)
    assert_each_index_once(batches, len(source))
    assert len(batches) == len(capped)
    assert max(map(len, batches)) == 100
    # The 40-token pairs come 50 to a batch either way; the 4-token pairs, 500 to a batch without the cap.
    assert sorted(len(b) for b in uncapped) == [50] * 20 + [500] * 2
    assert sorted(len(b) for b in batches) == [50] * 20 + [100] * 10
    with pytest.raises(ValueError, match="max_sentences"):
        TokenBatchSampler(source, target, 2000, max_sentences=0)


def test_a_pair_longer_than_the_budget_is_a_lone_batch_reported_once(caplog):
    source, target = multi30k_like_lengths(300)
    source[17], target[42] = 500, 300
    with caplog.at_level(logging.WARNING, logger="vanilla_transformer.training.batch_samplers"):
        sampler = TokenBatchSampler(source, target, max_tokens=256)
        batches = list(sampler)
        sampler.set_epoch(1)
        batches += list(sampler)
    assert [17] in batches and [42] in batches
    assert all(padded_tokens(b, source, target) <= 256 for b in batches if b not in ([17], [42]))
    assert len(caplog.records) == 1
    assert "index 17 (source 500, target" in caplog.text and "index 42 (source" in caplog.text


def test_len_matches_iteration_in_every_epoch():
    for num_pairs, max_tokens, num_replicas in [(1, 64, 1), (7, 64, 2), (999, 300, 3), (1000, 2000, 4), (513, 90, 8)]:
        source, target = multi30k_like_lengths(num_pairs, seed=num_pairs)
        sampler = TokenBatchSampler(source, target, max_tokens, num_replicas=num_replicas)
        for epoch in range(3):
            sampler.set_epoch(epoch)
            assert len(list(sampler)) == len(sampler)
        assert len(sampler) % num_replicas == 0


# --- Shuffling -----------------------------------------------------------------------------------------------------


def test_epochs_differ_and_seed_plus_epoch_reproduces():
    source, target = multi30k_like_lengths(1001)

    def batches(seed, epoch):
        sampler = TokenBatchSampler(source, target, 500, seed=seed)
        sampler.set_epoch(epoch)
        return list(sampler)

    assert batches(0, 1) == batches(0, 1)
    assert batches(0, 1) != batches(0, 2)
    assert batches(0, 1) != batches(1, 1)
    # Not only the order of batches changes: pairs of equal lengths also meet different neighbours.
    as_sets = lambda batches: {frozenset(batch) for batch in batches}  # noqa: E731
    assert as_sets(batches(0, 1)) != as_sets(batches(0, 2))
    # And the order of the batches is shuffled, not left in length order.
    shortest_sources = lambda batches: [min(source[batch]) for batch in batches]  # noqa: E731
    assert shortest_sources(batches(0, 1)) != sorted(shortest_sources(batches(0, 1)))
    assert shortest_sources(batches(0, 1)) != shortest_sources(batches(0, 2))


def test_without_shuffle_batches_come_in_length_order():
    source, target = multi30k_like_lengths(500)
    sampler = TokenBatchSampler(source, target, 400, shuffle=False)
    first = list(sampler)
    sampler.set_epoch(5)
    assert list(sampler) == first
    flat = [index for batch in first for index in batch]
    assert flat == sorted(flat, key=lambda i: (source[i], target[i], i))


# --- Grouping by length ---------------------------------------------------------------------------------------------


def test_batches_are_length_homogeneous():
    source, target = multi30k_like_lengths(20000)
    batches = list(TokenBatchSampler(source, target, max_tokens=4096))
    permutation = np.random.default_rng(0).permutation(len(source))
    random_batches = np.array_split(permutation, len(batches))  # same number, hence same average size
    grouped, random = padding_fraction(batches, source, target), padding_fraction(random_batches, source, target)
    assert grouped < 0.1 and grouped < random / 4, (grouped, random)


# --- Bucketed shapes ------------------------------------------------------------------------------------------------


def padded_shapes(batches, source, target, multiple=1):
    """Each batch's (pairs, padded source length, padded target length), as a collator padding to `multiple` pads."""
    round_up = lambda length: -(-int(length) // multiple) * multiple  # noqa: E731
    return [(len(batch), round_up(source[batch].max()), round_up(target[batch].max())) for batch in batches]


def test_bucketed_batches_mix_pairs_of_a_bucket_and_keep_their_padded_shapes_in_every_epoch():
    source, target = multi30k_like_lengths(5000)
    sampler = TokenBatchSampler(source, target, max_tokens=1000, pad_to_multiple_of=8)
    epochs = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        epochs.append(list(sampler))
    shapes = [sorted(padded_shapes(batches, source, target, 8)) for batches in epochs]
    assert shapes[0] == shapes[1] == shapes[2]
    assert len(set(shapes[0])) <= 20 < len(epochs[0])  # a few shapes, far fewer than batches
    assert {length for shape in shapes[0] for length in shape[1:]} <= {8, 16, 24, 32, 40}
    # Pairs whose lengths differ but round alike are ties: batches mix them anew every epoch, so padded exactly, the
    # shapes of one epoch are not those of the next.
    assert sorted(padded_shapes(epochs[0], source, target)) != sorted(padded_shapes(epochs[1], source, target))
    # Exact lengths, for comparison: the same shapes every epoch too, but about as many as there are batches.
    exact = TokenBatchSampler(source, target, max_tokens=1000)
    assert len(set(padded_shapes(list(exact), source, target))) > 2 * len(set(shapes[0]))


def test_bucketed_batches_collated_with_the_same_multiple_have_the_predicted_shapes():
    source_lengths, target_lengths = multi30k_like_lengths(300)
    sources = [" ".join(f"s{j}" for j in range(n)) for n in source_lengths]
    targets = [" ".join(f"t{j}" for j in range(n)) for n in target_lengths]
    tokenizer = tiny_tokenizer(" ".join(sources + targets).split())
    tokenized = Dataset.from_dict({"input_ids": tokenizer(sources)["input_ids"],
                                   "labels": tokenizer(text_target=targets)["input_ids"]})
    sampler = TokenBatchSampler.from_dataset(tokenized, max_tokens=400, pad_to_multiple_of=8)
    loader = DataLoader(tokenized, batch_sampler=sampler,
                        collate_fn=DataCollatorForSeq2Seq(tokenizer, pad_to_multiple_of=8))
    source, target = sampler.source_lengths, sampler.target_lengths
    for epoch in range(2):
        sampler.set_epoch(epoch)
        shapes = [(len(batch["input_ids"]), batch["input_ids"].shape[1], batch["labels"].shape[1]) for batch in loader]
        sampler.set_epoch(epoch)
        assert shapes == padded_shapes(list(sampler), source, target, 8)
        assert all(pairs * max(lengths) <= 400 for pairs, *lengths in shapes)


# --- Distributed: one global batch stream, sharded by accelerate -----------------------------------------------------


@pytest.mark.parametrize("num_pairs", [3, 4, 101, 777])
@pytest.mark.parametrize("num_processes", [2, 3])
def test_batch_sampler_shard_splits_every_epoch_exactly(num_pairs, num_processes):
    source, target = multi30k_like_lengths(num_pairs, seed=num_pairs)
    # Each process builds its own sampler from the same lengths and seed, as in a real launch.
    samplers = [
        TokenBatchSampler(source, target, max_tokens=150, seed=3, num_replicas=num_processes)
        for _ in range(num_processes)
    ]
    for epoch in range(4):
        shards = []
        for rank, sampler in enumerate(samplers):
            sampler.set_epoch(epoch)
            shard = BatchSamplerShard(sampler, num_processes=num_processes, process_index=rank)  # even_batches=True
            shards.append(list(shard))
            assert len(shards[rank]) == len(shard) == len(sampler) // num_processes
        index_sets = [{index for batch in shard for index in batch} for shard in shards]
        assert sum(len(s) for s in index_sets) == num_pairs  # disjoint ...
        assert set().union(*index_sets) == set(range(num_pairs))  # ... and complete
        assert_each_index_once([batch for shard in shards for batch in shard], num_pairs)


def test_accelerate_prepared_dataloaders_see_every_pair_once():
    source, target = multi30k_like_lengths(333)
    seen = []
    for rank in range(2):
        sampler = TokenBatchSampler(source, target, 200, num_replicas=2)
        sampler.set_epoch(1)
        loader = DataLoader(range(len(source)), batch_sampler=sampler, collate_fn=list)
        loader = prepare_data_loader(loader, num_processes=2, process_index=rank, put_on_device=False)
        seen.extend(index for batch in loader for index in batch)
    assert sorted(seen) == list(range(len(source)))


def test_a_process_resuming_mid_epoch_gets_that_epochs_batches_through_the_callback():
    """Resuming mid-epoch under several processes, the Trainer skips the batches already trained with accelerate's
    `skip_first_batches`, whose loader wraps the `BatchSamplerShard` once more: its `set_epoch` no longer reaches a
    freshly built sampler, which would deal epoch 0's batches. `EpochOfTokenBatches` sets it from the state."""
    from accelerate import skip_first_batches
    from transformers import TrainerControl, TrainerState

    source, target = multi30k_like_lengths(333)

    def rank_0_loader():
        sampler = TokenBatchSampler(source, target, 200, num_replicas=2)
        loader = DataLoader(range(len(source)), batch_sampler=sampler, collate_fn=list)
        return sampler, prepare_data_loader(loader, num_processes=2, process_index=0, put_on_device=False)

    sampler, loader = rank_0_loader()
    sampler.set_epoch(2)  # as the Trainer does, through the loader's BatchSamplerShard
    epoch_2 = list(loader)
    fresh, resumed = rank_0_loader()  # a new process, 3 batches into epoch 2
    resumed = skip_first_batches(resumed, 3)
    resumed.set_epoch(2)  # what the Trainer calls; `resumed.batch_sampler.batch_sampler` is the BatchSamplerShard
    assert fresh.epoch == 0 and list(resumed) != epoch_2[3:]
    EpochOfTokenBatches(fresh).on_epoch_begin(None, TrainerState(epoch=2 + 3 / len(epoch_2)), TrainerControl())
    assert fresh.epoch == 2 and list(resumed) == epoch_2[3:]


def test_impossible_even_split_is_an_error():
    # Three pairs, each alone over budget: three single-pair batches cannot be shared evenly by two processes.
    with pytest.raises(ValueError, match="evenly among 2 processes"):
        TokenBatchSampler([50, 50, 50], [50, 50, 50], max_tokens=64, num_replicas=2)


# --- With a tokenized dataset and the Hugging Face collator ----------------------------------------------------------


def tiny_tokenizer(words):
    vocab = {"<pad>": 0, "<unk>": 1, "</s>": 2, **{word: i + 3 for i, word in enumerate(sorted(set(words)))}}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", unk_token="<unk>", eos_token="</s>")


def test_dataloader_with_seq2seq_collator_end_to_end():
    source_lengths, target_lengths = multi30k_like_lengths(200)
    sources = [" ".join(f"s{j}" for j in range(n)) for n in source_lengths]
    targets = [" ".join(f"t{j}" for j in range(n)) for n in target_lengths]
    tokenizer = tiny_tokenizer(" ".join(sources + targets).split())
    tokenized = Dataset.from_dict(
        {
            "input_ids": tokenizer(sources)["input_ids"],
            "attention_mask": tokenizer(sources)["attention_mask"],
            "labels": tokenizer(text_target=targets)["input_ids"],
        }
    ).select(range(199, -1, -1))  # an indices mapping, as after shuffling or filtering

    sampler = TokenBatchSampler.from_dataset(tokenized, max_tokens=256)
    loader = DataLoader(tokenized, batch_sampler=sampler, collate_fn=DataCollatorForSeq2Seq(tokenizer))
    batches = list(loader)
    assert len(batches) == len(sampler)
    assert sum(len(batch["input_ids"]) for batch in batches) == len(tokenized)
    for batch in batches:
        assert batch["input_ids"].dtype == torch.long
        assert len(batch["input_ids"]) * max(batch["input_ids"].shape[1], batch["labels"].shape[1]) <= 256
        assert ((batch["input_ids"] == 0) == (batch["attention_mask"] == 0)).all()  # pad id 0
    assert any((batch["labels"] == -100).any() for batch in batches)  # labels padded for the loss


def test_rejects_inconsistent_lengths():
    with pytest.raises(ValueError, match="equal size"):
        TokenBatchSampler([1, 2], [1], max_tokens=10)
    with pytest.raises(ValueError, match="at least one"):
        TokenBatchSampler([], [], max_tokens=10)


# --- Lengths that change every epoch (BPE-dropout) -----------------------------------------------------------------


class LengthsGrowingWithEpochs:
    """Stands in for `BPEDropoutDataset`: every epoch adds 0-3 tokens at random to each side of each pair."""

    def __init__(self, num_pairs):
        self.source, self.target = multi30k_like_lengths(num_pairs)

    def lengths(self, epoch):
        rng = np.random.default_rng(epoch)
        return [lengths + rng.integers(0, 4, len(lengths)) for lengths in (self.source, self.target)]


@pytest.mark.parametrize("num_replicas", [1, 2])
def test_resegmented_sampler_cuts_each_epoch_by_its_own_lengths_into_as_many_batches(num_replicas):
    dataset, max_tokens = LengthsGrowingWithEpochs(10000), 1000
    sampler = ResegmentedTokenBatchSampler(dataset, max_tokens, seed=1, num_replicas=num_replicas)
    first_epoch = TokenBatchSampler(*dataset.lengths(0), max_tokens, seed=1, num_replicas=num_replicas)
    sampler.set_epoch(0)
    assert list(sampler) == list(first_epoch)  # the first epoch is plain token batching
    for epoch in range(1, 4):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        # The Trainer counts an epoch's steps once: every epoch has the first epoch's number of batches.
        assert len(batches) == len(sampler) == len(first_epoch) and len(batches) % num_replicas == 0
        assert_each_index_once(batches, 10000)
        source, target = (np.asarray(side) for side in dataset.lengths(epoch))
        # Cut by this epoch's lengths: the budget stays within 3% of max_tokens (one batch in ~150 more or fewer at
        # max_tokens), and batches are as length-homogeneous as those of plain token batching with that budget.
        budget = max(padded_tokens(batch, source, target) for batch in batches)
        assert 0.97 * max_tokens <= budget <= 1.03 * max_tokens
        fresh = TokenBatchSampler(source, target, budget, seed=1, num_replicas=num_replicas)
        assert padding_fraction(batches, source, target) <= padding_fraction(list(fresh), source, target) + 0.01
    # An epoch's batches depend on the seed and the epoch only, not on the epochs before (resuming a run).
    resumed = ResegmentedTokenBatchSampler(dataset, max_tokens, seed=1, num_replicas=num_replicas)
    resumed.set_epoch(2)
    sampler.set_epoch(2)
    assert list(resumed) == list(sampler)


def test_resegmented_sampler_keeps_max_sentences():
    dataset = LengthsGrowingWithEpochs(3000)
    sampler = ResegmentedTokenBatchSampler(dataset, 1000, seed=1, max_sentences=20)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert max(map(len, batches)) <= 20 and len(batches) == len(sampler)
        assert_each_index_once(batches, 3000)


# --- Sentences to translate: the same cut, longest first -------------------------------------------------------------


def test_translation_batches_are_cut_as_the_training_batches():
    lengths = [5, 12, 3, 12, 7, 30, 1, 7, 9]
    batches = length_sorted_batches(lengths, max_tokens=24)
    assert batches == [[5], [1, 3], [8, 4], [7, 0, 2], [6]]  # longest first, ties in input order
    widths = sorted(lengths, reverse=True)
    assert [len(batch) for batch in batches] == [end - start for start, end in cut_batches(widths, max_tokens=24)]
    assert all(len(batch) * lengths[batch[0]] <= 24 for batch in batches if len(batch) > 1)


def test_translation_batches_bounded_by_sentences_and_of_one_length():
    lengths = [4, 4, 4, 2, 2, 3, 4, 2]
    assert length_sorted_batches(lengths, max_sentences=3) == [[0, 1, 2], [6, 5, 3], [4, 7]]
    assert length_sorted_batches(lengths, max_sentences=3, same_length=True) == [[0, 1, 2], [6], [5], [3, 4, 7]]
    assert length_sorted_batches(lengths, max_tokens=8, same_length=True) == [[0, 1], [2, 6], [5], [3, 4, 7]]
    assert length_sorted_batches([]) == []
