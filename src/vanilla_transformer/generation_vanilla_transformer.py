"""Section 6.1 decoding on top of transformers' `generate()`: a per-sentence maximum output length of source length
+ 50 (a logits processor), and the GNMT length penalty the paper used (applied where transformers' beam search
scores finished hypotheses, see `VanillaTransformerForConditionalGeneration`). The search stays transformers' own.
"""

import torch
from transformers import LogitsProcessor

# Section 6.1: "beam search with a beam size of 4 and length penalty alpha = 0.6 ... maximum output length during
# inference to input length + 50, but terminate early when possible". Saved in every model's generation config.
# "Terminate early when possible" is tensor2tensor's rule, transformers' early_stopping="never": stop once no running
# hypothesis can beat the finished ones even at the longest length. early_stopping=True (stop at 4 finished
# hypotheses) keeps short ones that end early on a confident model: 34% vs 93% exact match on the number-words demo.
PAPER_DECODING = dict(
    num_beams=4,
    length_penalty=0.6,
    length_penalty_type="gnmt",
    early_stopping="never",
    max_length_over_source=50,
)
LENGTH_PENALTY_TYPES = ("gnmt", "transformers")


def gnmt_length_penalty(length: int | torch.Tensor, alpha: float):
    """GNMT (Wu et al., 2016, eq. 14): lp(Y) = (5 + |Y|)^alpha / (5 + 1)^alpha."""
    return ((5 + length) / 6) ** alpha


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
            # Once per call: rows are sentences repeated num_beams (or num_return_sequences) times, one after another.
            self.prompt_length = length
            self.row_limits = self.max_lengths.to(scores.device).repeat_interleave(rows // self.max_lengths.shape[0])
            self.first_limit = int(self.max_lengths.min())
        generated = length + 1 - self.prompt_length  # the token chosen now is the generated-th
        if generated < self.first_limit:  # no sentence at its limit yet: nothing to do, no device sync
            return scores
        forced = torch.full_like(scores, -float("inf"))
        forced[:, self.eos_token_id] = scores[:, self.eos_token_id]
        return torch.where((generated >= self.row_limits)[:, None], forced, scores)

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
