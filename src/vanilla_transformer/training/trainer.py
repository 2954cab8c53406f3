"""The paper's training recipe (sections 5.1-5.4) as ready Hugging Face Trainer pieces.

- `paper_training_arguments`: Adam(0.9, 0.98, 1e-9), the section 5.3 learning rate, label smoothing 0.1.
- `TokenBatchSeq2SeqTrainer`: a `Seq2SeqTrainer` whose training batches hold ~`max_tokens` tokens of similar
  length (section 5.1) instead of a fixed number of sentences.
- `BPEDropoutDataset`: training pairs segmented anew every epoch with BPE-dropout (not in the paper).
- `TokenIdCheckingCollator`: a data collator that checks token ids against the vocabulary on the CPU, where batches
  are built, so that a bad id gets a clear error and the training step never waits for the device to check it.
- `label_smoothed_cross_entropy`: section 5.4's label-smoothed loss in torch's fused kernel.

The `train` command's speed-ups for CPU training live apart, in `cpu_speedups.py`, its callbacks in `callbacks.py`.
- `tokenize_pairs` and `translation_metrics`: preprocessing and BLEU/chrF evaluation for `predict_with_generate`.
"""

import copy
import logging
from collections.abc import Sequence
from functools import partial
from itertools import chain

import numpy as np
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset
from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments
from transformers.trainer_utils import seed_worker

from .batch_samplers import EpochOfTokenBatches, ResegmentedTokenBatchSampler, TokenBatchSampler
from .recipe import PAPER_RECIPE
from .checkpoints import MarkCompleteCheckpoints
from .divergence import StopOnNonFiniteLoss
from ..inference.metrics import score_translations
from ..schedule import paper_learning_rate
from .tokenization import BPEDropout


logger = logging.getLogger(__name__)


# Validation BLEU during training is a progress signal, decoded cheaply: greedy search, each sentence ending at the latest
# at its source length + 20 tokens. An undertrained model runs most sentences to the limit, and section 6.1's beam 4 up to
# source + 50 could take longer than the training between two validations. The test set keeps section 6.1's decoding.
VALIDATION_DECODING = dict(num_beams=1, max_length_over_source=20)


def paper_training_arguments(
    output_dir: str, d_model: int, warmup_steps: int = 4000, lr_scale: float = 1.0, **overrides
) -> Seq2SeqTrainingArguments:
    """`Seq2SeqTrainingArguments` with the recipe of sections 5.3-5.4; any other Trainer argument in `overrides`."""
    learning_rate = paper_learning_rate(d_model, warmup_steps, lr_scale)
    recipe = dict(PAPER_RECIPE, warmup_steps=warmup_steps, learning_rate=learning_rate)
    return Seq2SeqTrainingArguments(output_dir=output_dir, **{**recipe, **overrides})


def label_smoothed_cross_entropy(epsilon: float):
    """Section 5.4's label smoothing as a Trainer `compute_loss_func`: the loss of transformers' `LabelSmoother`,
    (1 - epsilon) * NLL + epsilon * mean over the vocabulary of -log p, summed over the target tokens (labels -100
    ignored) and divided by `num_items_in_batch` (the whole accumulated batch's token count) when the Trainer gives
    it, else by this batch's. torch's fused `cross_entropy(label_smoothing=epsilon)` makes fewer passes over the
    (tokens x vocabulary) logits than `LabelSmoother` does, forward and backward."""

    def compute_loss(outputs, labels: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        loss = F.cross_entropy(  # half-precision logits in float32, as accelerate's float32 copy of the outputs has them
            logits.flatten(0, -2).float(), labels.flatten(), ignore_index=-100, label_smoothing=epsilon,
            reduction="sum",
        )
        if num_items_in_batch is None:
            num_items_in_batch = (labels != -100).sum()
        elif torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        return loss / num_items_in_batch

    return compute_loss


def untied_missing_keys(model, missing_keys: list[str]) -> list[str]:
    """The `missing_keys` of a state dict loaded into `model` that are not a tied copy of a weight it held: safetensors
    stores each tied weight once (one name of `model.all_tied_weights_keys`' group), and loading it fills every copy."""
    names = {}  # each tied weight: its names
    for target, source in (getattr(model, "all_tied_weights_keys", None) or {}).items():
        names.setdefault(source, {source}).add(target)
    tied = {name: group for group in names.values() for name in group}
    missing = set(missing_keys)
    return [key for key in missing_keys if not tied.get(key, set()) - missing]


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


class TokenIdCheckingCollator:
    """A data collator that first checks the examples' token ids against the model's vocabulary
    (`check_feature_token_ids`: a clear `ValueError` naming the bad id instead of an index error deep in torch), then
    calls `collator`. It runs where the batch is built, on the CPU, before anything reaches the device, so checking
    never makes a training step wait for the device."""

    def __init__(self, collator, vocab_size: int):
        self.collator = collator
        self.vocab_size = vocab_size

    def __call__(self, features):
        check_feature_token_ids(features, self.vocab_size)
        return self.collator(features)


class TokenBatchSeq2SeqTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` with the batching of section 5.1: each training batch holds about `max_tokens` source and
    target tokens (padding included) of pairs of similar length, reshuffled every epoch. Under several processes
    every process builds the same batch list and accelerate deals the batches out, so each process trains on a
    disjoint share and every pair is seen once per epoch. With `max_tokens=None` it batches like `Seq2SeqTrainer`.
    `validation_decoding` (e.g. `VALIDATION_DECODING`): the `generate()` arguments of `evaluate()` where neither the
    call nor the training arguments set them; `predict()` decodes with the model's generation config.
    A collator that pads to a multiple (`DataCollatorForSeq2Seq(..., pad_to_multiple_of=8)`) makes the batches
    bucketed: the sampler compares lengths rounded as the collator pads them, so every epoch repeats the first
    epoch's few batch shapes (`TokenBatchSampler`).
    Training batches are collated through `TokenIdCheckingCollator`, in `dataloader_num_workers` worker processes
    when that is above 0: token ids are checked on the CPU, and the training step does not wait for the device to
    check them.
    Each checkpoint is marked complete once written (`checkpoints.MarkCompleteCheckpoints`), so that one cut short
    by a kill is never resumed from or averaged. A loss that stops being finite stops training, and `train()` raises
    `errors.TrainingDiverged` (`divergence.StopOnNonFiniteLoss`). Resuming reports the checkpoint's missing weights
    but not the copies of the shared embedding, which a checkpoint stores once (`untied_missing_keys`)."""

    def __init__(self, *args, max_tokens: int | None = None, max_sentences: int | None = None,
                 validation_decoding: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        # After the callbacks given, which may decide to save: a save of non-finite weights is cancelled, then marked.
        self.divergence = StopOnNonFiniteLoss()
        self.add_callback(self.divergence)
        self.add_callback(MarkCompleteCheckpoints)
        self.max_tokens = max_tokens
        self.max_sentences = max_sentences
        self.validation_decoding = validation_decoding or {}
        self._flops_per_input_token = None
        if self.compute_loss_func is None and self.args.label_smoothing_factor > 0:
            # The same loss as the Trainer's LabelSmoother, in torch's fused kernel.
            self.compute_loss_func = label_smoothed_cross_entropy(self.args.label_smoothing_factor)

    def train(self, *args, **kwargs):
        result = super().train(*args, **kwargs)
        self.divergence.raise_if_diverged(self.args.output_dir)
        return result

    def _issue_warnings_after_load(self, load_result):
        # The Trainer's report of a checkpoint loaded to resume from, which would list the tied copies as missing.
        missing = untied_missing_keys(self.model, load_result.missing_keys)
        super()._issue_warnings_after_load(load_result._replace(missing_keys=missing))

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # The loss takes the labels out of the inputs, and a decoder given no labels builds a key/value cache for
        # decoding, which the loss never reads.
        inputs = {**inputs, "use_cache": False}
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval", **gen_kwargs):
        # `validation_decoding` (e.g. VALIDATION_DECODING) where neither the call nor `--generation-num-beams` sets the
        # search; an explicit length (the call's, `--generation-max-length`) wins over its source + N limit.
        defaults = dict(self.validation_decoding)
        if self.args.generation_num_beams is not None:
            defaults.pop("num_beams", None)
        return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix, **{**defaults, **gen_kwargs})

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        # Seq2SeqTrainer fills the model's generation config with transformers' defaults at every prediction step
        # (`max_length` 20, `min_length` 0, ...); saved with the model, that `max_length` makes transformers warn at
        # every `generate(max_new_tokens=...)`. The model keeps the generation config it had.
        generation_config = copy.deepcopy(self.model.generation_config)
        try:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys, **gen_kwargs)
        finally:
            self.model.generation_config = generation_config

    def floating_point_ops(self, inputs) -> int:
        main_input = getattr(self.model, "main_input_name", "input_ids")
        if main_input not in inputs:
            return 0
        if self._flops_per_input_token is None:  # the Trainer's count walks every module: once, not every step
            self._flops_per_input_token = super().floating_point_ops({main_input: torch.empty(1)})
        return inputs[main_input].numel() * self._flops_per_input_token

    def get_train_dataloader(self) -> DataLoader:
        collator = TokenIdCheckingCollator(self.data_collator, self.model.get_input_embeddings().num_embeddings)
        if self.max_tokens is None:  # the Trainer's own loader, built with the checking collator
            unchecked, self.data_collator = self.data_collator, collator
            try:
                return super().get_train_dataloader()
            finally:
                self.data_collator = unchecked
        dataset = self.train_dataset
        if not isinstance(dataset, BPEDropoutDataset):
            dataset = self._remove_unused_columns(dataset, description="Training")
        # Same batches on every process; a multiple of processes x accumulation steps, so no batch is repeated to
        # even out the last optimizer step. Lengths are bucketed as the collator pads them.
        batching = dict(seed=self.args.seed, num_replicas=self.args.world_size * self.args.gradient_accumulation_steps,
                        max_sentences=self.max_sentences,
                        pad_to_multiple_of=getattr(self.data_collator, "pad_to_multiple_of", None))
        if isinstance(dataset, BPEDropoutDataset):
            sampler = ResegmentedTokenBatchSampler(dataset, self.max_tokens, **batching)
        else:
            sampler = TokenBatchSampler.from_dataset(dataset, self.max_tokens, **batching)
        self.pop_callback(EpochOfTokenBatches)  # the sampler of a loader built before, if any
        self.add_callback(EpochOfTokenBatches(sampler))
        workers = self.args.dataloader_num_workers
        options = {}
        if workers > 0:
            # A `BPEDropoutDataset` segments each epoch in the dataset object: workers that outlived an epoch would
            # keep serving the segmentation of the epoch they were started in.
            persistent = self.args.dataloader_persistent_workers and not isinstance(dataset, BPEDropoutDataset)
            options = dict(prefetch_factor=self.args.dataloader_prefetch_factor, persistent_workers=persistent,
                           multiprocessing_context=self.args.dataloader_multiprocessing_context)
        loader = DataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=collator,
            num_workers=workers,
            pin_memory=self.args.dataloader_pin_memory and self.args.device.type != "cpu",
            worker_init_fn=partial(seed_worker, num_workers=workers, rank=self.args.process_index),
            **options,
        )
        return self.accelerator.prepare(loader)


class BPEDropoutDataset(Dataset):
    """Training pairs for `TokenBatchSeq2SeqTrainer`, segmented anew every epoch with BPE-dropout
    (`tokenization.BPEDropout`, probability `p`; not in the paper): both sides, as Provilkov et al. do, or with
    `target_side=False` the sources only, the targets keeping the tokenizer's own segmentation. Validation and test
    keep it too. Epoch e draws from `numpy.random.default_rng([seed, e])`, so a seed gives the same segmentations in
    every run and every process; the Trainer's `set_epoch` selects the epoch. Items are `{input_ids,
    attention_mask, labels}` for `DataCollatorForSeq2Seq`; the trainer batches them by each epoch's lengths
    (`batching.ResegmentedTokenBatchSampler`)."""

    def __init__(
        self, sources: list[str], targets: list[str], tokenizer, p: float, seed: int = 0, target_side: bool = True
    ):
        if len(sources) != len(targets):
            raise ValueError(f"{len(sources)} sources but {len(targets)} targets: pairs must be aligned")
        if not sources:
            raise ValueError("BPEDropoutDataset needs at least one sentence pair")
        self.bpe_dropout = BPEDropout(tokenizer, p)
        self.seed = seed
        self.target_side = target_side
        self.epoch = 0
        # Pre-tokenized once; only the merges are drawn every epoch.
        self._source_words = [self.bpe_dropout.words(text) for text in sources]
        self._target_words = [self.bpe_dropout.words(text) for text in targets]
        if not target_side:
            self._target_ids = BPEDropout(tokenizer, 0.0).encode(self._target_words, rng=None)
        self._segmented_epoch, self._segmented = None, None

    @classmethod
    def from_translations(cls, dataset, source_lang: str, target_lang: str, tokenizer, p: float, seed: int = 0,
                          target_side: bool = True):
        """From a `datasets.Dataset` with a `translation` column of `{source_lang: str, target_lang: str}`."""
        pairs = dataset["translation"]
        return cls([pair[source_lang] for pair in pairs], [pair[target_lang] for pair in pairs], tokenizer, p, seed,
                   target_side)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def segmented(self, epoch: int) -> tuple[list[list[int]], list[list[int]]]:
        """The (source ids, target ids) of every pair in `epoch`; the last epoch asked for is kept."""
        if self._segmented_epoch != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            sources = self.bpe_dropout.encode(self._source_words, rng)
            targets = self.bpe_dropout.encode(self._target_words, rng) if self.target_side else self._target_ids
            self._segmented = sources, targets
            self._segmented_epoch = epoch
        return self._segmented

    def lengths(self, epoch: int) -> tuple[list[int], list[int]]:
        """Source and target lengths of every pair in `epoch`, in tokens (with `</s>`)."""
        return tuple([len(ids) for ids in side] for side in self.segmented(epoch))

    def __len__(self) -> int:
        return len(self._source_words)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        sources, targets = self.segmented(self.epoch)
        return {"input_ids": sources[index], "attention_mask": [1] * len(sources[index]), "labels": targets[index]}


def tokenize_pairs(
    tokenizer,
    source_lang: str,
    target_lang: str,
    max_source_length: int | None = None,
    max_target_length: int | None = None,
    keep_translation: bool = False,
):
    """A `datasets.map(batched=True)` function: `translation` pairs -> `input_ids` and `labels` (each ending in
    `</s>`). Nothing is truncated: with `max_source_length` / `max_target_length`, pairs with more tokens on that side
    are dropped from the output (the train command counts and logs them: `data.log_dropped_pairs`). Dropping them
    here spares a second pass over the corpus and leaves the result without an indices mapping, so reading its
    lengths for token batching stays a column read. `keep_translation` keeps the
    pairs' text beside the ids (BPE-dropout segments it anew each epoch). No attention mask is stored:
    `DataCollatorForSeq2Seq` makes it when it pads, and a WMT-sized corpus stores a third fewer integers."""

    def fits(source: list[int], target: list[int]) -> bool:
        return (max_source_length is None or len(source) <= max_source_length) and (
            max_target_length is None or len(target) <= max_target_length
        )

    def tokenize(batch):
        sources = [pair[source_lang] for pair in batch["translation"]]
        targets = [pair[target_lang] for pair in batch["translation"]]
        columns = dict(tokenizer(sources, text_target=targets, return_attention_mask=False))
        if keep_translation:
            columns["translation"] = batch["translation"]
        if max_source_length is None and max_target_length is None:
            return columns
        kept = [fits(source, target) for source, target in zip(columns["input_ids"], columns["labels"])]
        if all(kept):
            return columns
        return {name: [value for value, keep in zip(values, kept) if keep] for name, values in columns.items()}

    return tokenize


def translation_metrics(tokenizer):
    """`compute_metrics` for `predict_with_generate`: sacreBLEU and chrF on detokenized text (`score_translations`)."""

    def compute_metrics(eval_prediction):
        predictions, labels = eval_prediction.predictions, eval_prediction.label_ids
        if isinstance(predictions, tuple):
            predictions = predictions[0]
        predictions = np.where(predictions < 0, tokenizer.pad_token_id, predictions)
        labels = np.where(labels < 0, tokenizer.pad_token_id, labels)
        hypotheses = [text.strip() for text in tokenizer.batch_decode(predictions, skip_special_tokens=True)]
        references = [text.strip() for text in tokenizer.batch_decode(labels, skip_special_tokens=True)]
        scores = score_translations(hypotheses, references)
        lengths = [np.count_nonzero(row != tokenizer.pad_token_id) for row in predictions]
        return {"bleu": scores["bleu"], "chrf": scores["chrf"], "gen_len": float(np.mean(lengths))}

    return compute_metrics


__all__ = [
    "BPEDropoutDataset",
    "TokenBatchSeq2SeqTrainer",
    "TokenIdCheckingCollator",
    "label_smoothed_cross_entropy",
    "paper_learning_rate",
    "paper_training_arguments",
    "tokenize_pairs",
    "translation_metrics",
    "untied_missing_keys",
]
