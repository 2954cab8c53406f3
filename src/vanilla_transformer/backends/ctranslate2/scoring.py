"""CTranslate2's `score_batch` as the `ct2` backend of `vanilla-transformer score`: `ct2_score_pairs` gives each
sentence pair's log-probability as `inference.scoring.score_pairs` gives it for a model in memory, batched alike,
without torch. Needs the `ct2` extra."""

import sys
from collections.abc import Sequence

from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from ...inference.hypotheses import PairScore, pair_batches


def ct2_score_pairs(
    translator,
    tokenizer: PreTrainedTokenizerBase,
    sources: Sequence[str],
    targets: Sequence[str],
    *,
    batch_size: int = 32,
    max_tokens: int | None = None,
    show_progress: bool | None = None,
) -> list[PairScore]:
    """The log-probability the CTranslate2 `translator` gives each of `targets` as the translation of the source of
    the same index, in input order, batched as `score_pairs` batches them. CTranslate2 appends and scores the `</s>`
    that ends each target, as the model's own pass does."""
    source_ids, target_ids, batches = pair_batches(tokenizer, sources, targets, batch_size, max_tokens)
    scores: list[PairScore | None] = [None] * len(sources)
    show_progress = sys.stderr.isatty() if show_progress is None else show_progress
    with tqdm(total=len(sources), unit="pair", disable=not show_progress) as bar:
        for batch in batches:
            batch_sources = [tokenizer.convert_ids_to_tokens(source_ids[k]) for k in batch]
            # CTranslate2 appends </s> to each target: the tokenizer's is taken off.
            batch_targets = [tokenizer.convert_ids_to_tokens(target_ids[k])[:-1] for k in batch]
            for k, result in zip(batch, translator.score_batch(batch_sources, batch_targets, max_input_length=0)):
                scores[k] = PairScore(float(sum(result.log_probs)), tuple(result.tokens), tuple(result.log_probs))
            bar.update(len(batch))
    return scores


__all__ = ["ct2_score_pairs"]
