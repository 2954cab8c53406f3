"""Section 6.1 decoding on top of transformers' `generate()`: a per-sentence maximum output length of source length
+ 50, and the GNMT length penalty the paper used. Both are logits processors, transformers' own extension point;
the search itself stays transformers' beam search.
"""

import torch
from transformers import LogitsProcessor

# Section 6.1: "beam search with a beam size of 4 and length penalty alpha = 0.6 ... maximum output length during
# inference to input length + 50, but terminate early when possible". Saved in every model's generation config.
PAPER_DECODING = dict(
    num_beams=4,
    length_penalty=0.6,
    length_penalty_type="gnmt",
    early_stopping=True,
    max_length_over_source=50,
)
LENGTH_PENALTY_TYPES = ("gnmt", "transformers")


def gnmt_length_penalty(length: int | torch.Tensor, alpha: float):
    """GNMT (Wu et al., 2016, eq. 14): lp(Y) = (5 + |Y|)^alpha / (5 + 1)^alpha."""
    return ((5 + length) / 6) ** alpha


class GNMTLengthPenaltyLogitsProcessor(LogitsProcessor):
    r"""
    Makes transformers' beam search rank finished hypotheses by the GNMT score `log P(Y|X) / lp(Y)` instead of its own
    `log P(Y|X) / |Y|^length_penalty`.

    Beam search sums the processed log-probabilities of a hypothesis and, when it ends with `</s>`, divides the sum
    by `|Y|^length_penalty`. Run with `length_penalty=0` (divisor 1) and this processor last, the score of `</s>` is
    rewritten so that the sum becomes the GNMT score: `score(</s>) = (S + log p(</s>)) / lp(|Y|) - S`, where `S` is the
    hypothesis's running sum, tracked here from step to step. `|Y|` counts generated tokens including `</s>`, as
    transformers' own penalty does. The other tokens are untouched, so running hypotheses keep their plain sums.

    Exact with `early_stopping=True` (stop once `num_beams` hypotheses are finished, the paper's setting); with other
    `early_stopping` values transformers' stopping heuristic compares running sums with penalised finished scores,
    which may end the search earlier than an exact GNMT search would.
    """

    def __init__(self, alpha: float, eos_token_id: int, num_beams: int):
        self.alpha = alpha
        self.eos_token_id = eos_token_id
        self.num_beams = num_beams
        self.prompt_length = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        rows, length = input_ids.shape
        if self.prompt_length is None:
            self.prompt_length = length
            running_sums = scores.new_zeros(rows)
        else:
            running_sums = self._running_sums(input_ids)

        generated_length = length + 1 - self.prompt_length
        finished = running_sums + scores[:, self.eos_token_id]
        penalised = finished / gnmt_length_penalty(generated_length, self.alpha) - running_sums
        scores = scores.clone()
        scores[:, self.eos_token_id] = torch.where(finished.isfinite(), penalised, finished)

        self.previous_ids, self.previous_scores, self.previous_sums = input_ids, scores, running_sums
        return scores

    def _running_sums(self, input_ids: torch.LongTensor) -> torch.Tensor:
        """Each hypothesis extends one of the previous step's hypotheses of the same sentence (beams are reordered
        between steps): find it by its prefix, then add the score of the token that extended it."""
        rows, length = input_ids.shape
        sentences = rows // self.num_beams
        prefixes = input_ids[:, :-1].reshape(sentences, self.num_beams, 1, length - 1)
        previous = self.previous_ids.reshape(sentences, 1, self.num_beams, length - 1)
        same_prefix = (prefixes == previous).all(-1)  # (sentences, beam, previous beam)
        if not bool(same_prefix.any(-1).all()):
            raise RuntimeError("GNMT length penalty: a hypothesis does not extend any hypothesis of the previous step")
        parent = same_prefix.int().argmax(-1) + torch.arange(sentences, device=input_ids.device)[:, None] * self.num_beams
        parent = parent.reshape(rows)
        return self.previous_sums[parent] + self.previous_scores[parent, input_ids[:, -1]]


class MaxLengthOverSourceLogitsProcessor(LogitsProcessor):
    r"""
    Section 6.1's maximum output length, per sentence: a hypothesis of sentence `i` ends with `</s>` at the latest as
    its `max_lengths[i]`-th generated token (`</s>` included). Per sentence rather than per batch, so a sentence gets the
    same translation alone or in a padded batch. `</s>` keeps its model score.
    """

    def __init__(self, max_lengths: torch.LongTensor, eos_token_id: int):
        self.max_lengths = max_lengths
        self.eos_token_id = eos_token_id
        self.prompt_length = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        rows, length = input_ids.shape
        if self.prompt_length is None:
            self.prompt_length = length
        # Rows are sentences repeated num_beams (or num_return_sequences) times, one after another.
        max_lengths = self.max_lengths.to(scores.device).repeat_interleave(rows // self.max_lengths.shape[0])
        at_limit = (length + 1 - self.prompt_length) >= max_lengths
        if not bool(at_limit.any()):
            return scores
        forced = torch.full_like(scores, -float("inf"))
        forced[:, self.eos_token_id] = scores[:, self.eos_token_id]
        return torch.where(at_limit[:, None], forced, scores)


def source_lengths(input_ids=None, attention_mask=None, inputs_embeds=None, encoder_outputs=None, pad_token_id=None):
    """Number of real source tokens per sentence (the `</s>` included), from whatever `generate()` was given."""
    if attention_mask is not None:
        return attention_mask.sum(-1).long()
    if input_ids is not None:
        if pad_token_id is None:
            return torch.full(input_ids.shape[:1], input_ids.shape[1], device=input_ids.device)
        return (input_ids != pad_token_id).sum(-1)
    states = inputs_embeds if inputs_embeds is not None else encoder_outputs[0]
    return torch.full(states.shape[:1], states.shape[1], device=states.device)
