"""The paper's training recipe (sections 5.1-5.4) as ready Hugging Face Trainer pieces.

- `paper_training_arguments`: Adam(0.9, 0.98, 1e-9), the section 5.3 learning rate, label smoothing 0.1.
- `TokenBatchSeq2SeqTrainer`: a `Seq2SeqTrainer` whose training batches hold ~`max_tokens` tokens of similar
  length (section 5.1) instead of a fixed number of sentences.
- `BPEDropoutDataset`: training pairs segmented anew every epoch with BPE-dropout (not in the paper).
- `TokenIdCheckingCollator`: a data collator that checks token ids against the vocabulary on the CPU, so that the
  model need not read them back from the device on a training step.
- `tokenize_pairs` and `translation_metrics`: preprocessing and BLEU/chrF evaluation for `predict_with_generate`.
"""

import logging
import time
from functools import partial
from types import MethodType

import numpy as np
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset
from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments, TrainerCallback
from transformers.trainer_utils import seed_worker

from .batching import ResegmentedTokenBatchSampler, TokenBatchSampler
from .extras import require
from .input_checks import check_feature_token_ids
from .metrics import score_translations
from .tokenization import BPEDropout


ConvertOutputsToFp32 = require("accelerate.utils.operations", extra="train").ConvertOutputsToFp32
logger = logging.getLogger(__name__)


def paper_learning_rate(d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    """Peak factor of section 5.3. transformers' `inverse_sqrt` schedule multiplies it by
    min(step / warmup, sqrt(warmup / step)), which gives exactly
    lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)."""
    return scale * (d_model * warmup_steps) ** -0.5


# Sections 5.3-5.4 as `Seq2SeqTrainingArguments` fields. Residual dropout (P_drop = 0.1) lives in the model config.
# The paper clips no gradients (`max_grad_norm=0`) and Adam has no weight decay. Not the paper's: the logged loss keeps
# a NaN or infinite step's loss instead of replacing it (`logging_nan_inf_filter`), since testing each step's loss
# makes every step wait for the device.
PAPER_RECIPE = dict(
    lr_scheduler_type="inverse_sqrt",
    warmup_steps=4000,
    optim="adamw_torch_fused",
    adam_beta1=0.9,
    adam_beta2=0.98,
    adam_epsilon=1e-9,
    weight_decay=0.0,
    max_grad_norm=0.0,
    label_smoothing_factor=0.1,
    predict_with_generate=True,
    logging_nan_inf_filter=False,
)


def paper_training_arguments(
    output_dir: str, d_model: int, warmup_steps: int = 4000, lr_scale: float = 1.0, **overrides
) -> Seq2SeqTrainingArguments:
    """`Seq2SeqTrainingArguments` with the recipe of sections 5.3-5.4; any other Trainer argument in `overrides`."""
    learning_rate = paper_learning_rate(d_model, warmup_steps, lr_scale)
    recipe = dict(PAPER_RECIPE, warmup_steps=warmup_steps, learning_rate=learning_rate)
    return Seq2SeqTrainingArguments(output_dir=output_dir, **{**recipe, **overrides})


# Rows of logits per chunk of `ChunkedLabelSmoothedCrossEntropy`: ~2 MB of float32 at a vocabulary of 8,000, so that a
# chunk's passes stay in a core's cache.
LOSS_CHUNK_ELEMENTS = 2**19


class ChunkedLabelSmoothedCrossEntropy(torch.autograd.Function):
    """Section 5.4's label-smoothed cross-entropy, summed over the rows of (tokens x vocabulary) logits whose label is
    not `ignore_index`, computed a chunk of rows at a time in float32 from logits of any dtype. Per row, with
    lse = log sum_v exp(x_v), the loss (1 - epsilon) * (lse - x_y) + epsilon * (lse - mean_v x_v) and its gradient
    softmax(x) - (1 - epsilon) * onehot(y) - epsilon / V. torch's `cross_entropy` under CPU autocast first copies the
    bfloat16 logits to a float32 tensor and then makes several more passes over it, forward and backward; this reads
    each chunk once while it is in cache (docs/speed.md, `benchmarks/loss_speed.py`). The gradient is written in the
    logits' dtype, as autocast's copy back would."""

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


def label_smoothed_cross_entropy(epsilon: float):
    """Section 5.4's label smoothing as a Trainer `compute_loss_func`: the loss of transformers' `LabelSmoother`,
    (1 - epsilon) * NLL + epsilon * mean over the vocabulary of -log p, summed over the target tokens (labels -100
    ignored) and divided by `num_items_in_batch` (the whole accumulated batch's token count) when the Trainer gives
    it, else by this batch's. On a CPU it is `ChunkedLabelSmoothedCrossEntropy`, elsewhere torch's fused
    `cross_entropy(label_smoothing=epsilon)`; both make fewer passes over the (tokens x vocabulary) logits than
    `LabelSmoother` does, forward and backward."""

    def compute_loss(outputs, labels: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        if logits.device.type == "cpu":
            with torch.autocast("cpu", enabled=False):
                loss = ChunkedLabelSmoothedCrossEntropy.apply(logits.flatten(0, -2), labels.flatten(), epsilon, -100)
        else:  # half-precision logits are upcast first, as accelerate's float32 copy of the outputs did
            loss = F.cross_entropy(
                logits.flatten(0, -2).float(), labels.flatten(), ignore_index=-100, label_smoothing=epsilon,
                reduction="sum",
            )
        if num_items_in_batch is None:
            num_items_in_batch = (labels != -100).sum()
        elif torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        return loss / num_items_in_batch

    return compute_loss


class TokenIdCheckingCollator:
    """A data collator that first checks the examples' token ids against the model's vocabulary
    (`input_checks.check_feature_token_ids`: a clear `ValueError` naming the bad id), then calls `collator`. It runs
    where the batch is built, on the CPU, before anything reaches the device: the model checks ids only in inference,
    since reading them back from the device on every training step would make the step wait for it."""

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
    Training batches are collated through `TokenIdCheckingCollator`, in `dataloader_num_workers` worker processes
    when that is above 0: token ids are checked on the CPU, and the training step does not wait for the device to
    check them."""

    def __init__(self, *args, max_tokens: int | None = None, max_sentences: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_tokens = max_tokens
        self.max_sentences = max_sentences
        self._flops_per_input_token = None
        if self.compute_loss_func is None and self.args.label_smoothing_factor > 0:
            # The same loss as the Trainer's LabelSmoother, fused (see `label_smoothed_cross_entropy`).
            self.compute_loss_func = label_smoothed_cross_entropy(self.args.label_smoothing_factor)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # The loss takes the labels out of the inputs, and a decoder given no labels builds a key/value cache for
        # decoding, which the loss never reads.
        inputs = {**inputs, "use_cache": False}
        # Under --bf16 accelerate wraps the model's forward in autocast and then copies its outputs to float32. The
        # loss here reads the bfloat16 logits as they are (`ChunkedLabelSmoothedCrossEntropy`), so the copy of the
        # (tokens x vocabulary) logits and its backward were pure cost (docs/speed.md). The
        # forward runs under accelerate's autocast all the same, only without the copy.
        module = self.accelerator.unwrap_model(model)
        forward = module.__dict__.get("forward")
        wrapper = getattr(getattr(forward, "__func__", forward), "__wrapped__", None)
        if self.compute_loss_func is None or not isinstance(wrapper, ConvertOutputsToFp32):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        autocast_forward = wrapper.model_forward
        module.forward = MethodType(autocast_forward, module) if hasattr(forward, "__func__") else autocast_forward
        try:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        finally:
            module.forward = forward

    def floating_point_ops(self, inputs) -> int:
        main_input = getattr(self.model, "main_input_name", "input_ids")
        if main_input not in inputs:
            return 0
        if self._flops_per_input_token is None:  # the Trainer's count walks every module: once, not every step
            self._flops_per_input_token = super().floating_point_ops({main_input: torch.empty(1)})
        return inputs[main_input].numel() * self._flops_per_input_token

    def _get_grad_norm(self, model, grad_norm=None):
        # Without clipping (section 5.3 has none: max_grad_norm 0) the Trainer computes the gradient norm after every
        # step only to log it; compute it for the steps that log (the same logged values, less work per step).
        # The step about to end logs as `DefaultFlowCallback` decides, once it has counted it.
        step = self.state.global_step + 1
        logs = step % self.state.logging_steps == 0 or (self.args.logging_first_step and step == 1)
        if grad_norm is None and self.args.logging_strategy == "steps" and not logs:
            return None
        return super()._get_grad_norm(model, grad_norm)

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
        # even out the last optimizer step.
        batching = dict(seed=self.args.seed, num_replicas=self.args.world_size * self.args.gradient_accumulation_steps,
                        max_sentences=self.max_sentences)
        if isinstance(dataset, BPEDropoutDataset):
            sampler = ResegmentedTokenBatchSampler(dataset, self.max_tokens, **batching)
        else:
            sampler = TokenBatchSampler.from_dataset(dataset, self.max_tokens, **batching)
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


class TrainingTimeBudget(TrainerCallback):
    """Stops training, with a checkpoint, at the first optimizer step that ends more than `minutes` after training
    began. Section 6.1 averages checkpoints written on a clock; this bounds a run by the clock too, while `max_steps`
    stays the plan: a run that finishes its steps in time is untouched (and so reproducible step for step), and the
    section 5.3 rate does not depend on the planned length, so a run cut short follows the same schedule."""

    def __init__(self, minutes: float):
        if not minutes > 0:
            raise ValueError(f"The training time budget must be a positive number of minutes, got {minutes!r}.")
        self.seconds = 60.0 * minutes
        self.started = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        elapsed = time.perf_counter() - self.started
        if elapsed > self.seconds and state.global_step < state.max_steps:
            logger.warning(
                "Training time budget of %.1f minutes spent: stopping at step %d of %d (%.1f minutes).",
                self.seconds / 60, state.global_step, state.max_steps, elapsed / 60,
            )
            control.should_training_stop = True
            control.should_save = True
        return control


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
    are dropped from the output (the train command counts and logs them; `data.filter_long_pairs` does the same on
    a tokenized dataset). Dropping them here spares a second pass over the corpus and leaves the result without an
    indices mapping, so reading its lengths for token batching stays a column read. `keep_translation` keeps the
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
    "PAPER_RECIPE",
    "TokenBatchSeq2SeqTrainer",
    "TokenIdCheckingCollator",
    "TrainingTimeBudget",
    "label_smoothed_cross_entropy",
    "paper_learning_rate",
    "paper_training_arguments",
    "tokenize_pairs",
    "translation_metrics",
]
