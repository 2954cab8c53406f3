"""The log-probability a model in memory gives translations: `score_pairs` scores sentence pairs as they are given
(filtering a noisy corpus, reranking an n-best list), and `teacher_forced_pass` scores token ids, which
`translate.py` uses for the scores of the hypotheses a search found (and their alignment, `alignment.py`).

One teacher-forced pass of the whole model (section 3.4): the decoder reads `<s>` and the target shifted right, and
the softmax at each position gives log P(y_t | y_<t, X) of the target's next token, `</s>` included.
"""

import contextlib
import sys
from collections.abc import Sequence

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..model.generation_vanilla_transformer import attention_kernel
from .hypotheses import PairScore, pair_batches


def teacher_forced_pass(
    model: PreTrainedModel, source_ids: Sequence[Sequence[int]], target_ids: Sequence[Sequence[int]],
    attention_layer: int | None = None,
) -> tuple[list[list[float]], list[torch.Tensor] | None]:
    """log P(y_t | y_<t, X) for each token of each of `target_ids` (`</s>` included where it ends one) given the
    source of the same index in `source_ids`, from one padded batch through `model` (eval mode, no gradient); with
    `attention_layer` (from 0; negative from the last), from the same pass, that decoder layer's encoder-decoder
    attention with its heads averaged, a (target tokens, source tokens) matrix a pair. The eager kernel, the formula of
    section 3.2.1 written out, forms the weights whatever kernel the model was loaded with (sdpa and flash attention
    never do)."""
    pad, start, device = model.config.pad_token_id, model.config.decoder_start_token_id, model.device
    # Targets are padded at their end: the decoder's causal mask keeps each real position from seeing the padding.
    decoder_inputs = _padded([[start, *target[:-1]] for target in target_ids], pad, device)
    attend = attention_layer is not None
    with attention_kernel(model, "eager") if attend else contextlib.nullcontext(), torch.inference_mode():
        outputs = model(
            input_ids=_padded(source_ids, pad, device),
            attention_mask=_mask(source_ids, device),
            decoder_input_ids=decoder_inputs,
            output_attentions=attend,
            use_cache=False,
        )
        targets = _padded(target_ids, 0, device)
        log_probs = outputs.logits.float().log_softmax(-1).gather(-1, targets[..., None])[..., 0].cpu()
    token_scores = [row[: len(target)].tolist() for row, target in zip(log_probs, target_ids)]
    if not attend:
        return token_scores, None
    weights = outputs.cross_attentions[attention_layer].float().mean(1).cpu()  # (pair, target, source)
    return token_scores, [weights[k, : len(t), : len(s)] for k, (s, t) in enumerate(zip(source_ids, target_ids))]


def score_pairs(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sources: Sequence[str],
    targets: Sequence[str],
    *,
    batch_size: int = 32,
    max_tokens: int | None = None,
    show_progress: bool | None = None,
) -> list[PairScore]:
    """The log-probability `model` gives each of `targets` as the translation of the source of the same index, in
    input order. Pairs are sorted by length and batched as `translate_lines` batches sources (`batch_size` pairs and,
    with `max_tokens`, that many tokens of the longer side at most). Each side is tokenized as training tokenized it,
    `</s>` appended; an empty target is scored as `</s>` alone."""
    source_ids, target_ids, batches = pair_batches(tokenizer, sources, targets, batch_size, max_tokens)
    scores: list[PairScore | None] = [None] * len(sources)
    show_progress = sys.stderr.isatty() if show_progress is None else show_progress
    was_training = model.training
    model.eval()
    try:
        with tqdm(total=len(sources), unit="pair", disable=not show_progress) as bar:
            for batch in batches:
                batch_targets = [target_ids[k] for k in batch]
                found, _ = teacher_forced_pass(model, [source_ids[k] for k in batch], batch_targets)
                for k, target, token_scores in zip(batch, batch_targets, found):
                    tokens = tuple(tokenizer.convert_ids_to_tokens(target))
                    scores[k] = PairScore(float(sum(token_scores)), tokens, tuple(token_scores))
                bar.update(len(batch))
    finally:
        model.train(was_training)
    return scores


def _padded(rows: Sequence[Sequence[int]], pad: int, device) -> torch.Tensor:
    width = max(len(row) for row in rows)
    return torch.tensor([[*row, *[pad] * (width - len(row))] for row in rows], device=device)


def _mask(rows: Sequence[Sequence[int]], device) -> torch.Tensor:
    width = max(len(row) for row in rows)
    return torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows], device=device)


__all__ = ["score_pairs", "teacher_forced_pass"]
