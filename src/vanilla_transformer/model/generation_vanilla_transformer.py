"""Section 6.1's decoding on top of transformers' `generate()`: the decoding rules of `decoding_vanilla_transformer.py`
(the defaults every model saves, the one resolver of decoding settings, the GNMT length penalty) applied to
transformers' beam search, and the per-sentence maximum output length of source length + 50. The search itself stays
transformers' own.
"""

import contextlib
from collections.abc import Sequence
from contextvars import ContextVar

import torch
from transformers import GenerationConfig, GenerationMixin, LogitsProcessor, LogitsProcessorList
from transformers.cache_utils import Cache, EncoderDecoderCache, StaticCache

from .decoding_vanilla_transformer import PACKAGE_SETTINGS, gnmt_length_penalty, resolve_decoding_settings


def check_token_ids(input_ids: torch.Tensor, vocab_size: int, name: str) -> None:
    """Token ids the embedding can look up: at least one, each in [0, vocab_size). Reads the ids' extremes back to the
    host: once per `generate()` call, never per decoding step."""
    if input_ids.numel() == 0:
        raise ValueError(f"`{name}` is empty (shape {tuple(input_ids.shape)}); give at least one token per sequence.")
    smallest, largest = torch.stack(torch.aminmax(input_ids)).tolist()
    if smallest < 0 or largest >= vocab_size:
        bad = smallest if smallest < 0 else largest
        raise ValueError(f"`{name}` contains token id {bad}, outside the vocabulary [0, {vocab_size}).")


def check_attention_mask(attention_mask: torch.Tensor | None, shape: tuple[int, ...], name: str, of: str) -> None:
    """A (batch, length) mask holds one value per token of `of`, whose tokens have `shape`: a mask of another shape
    would be broadcast, or ignored when it is all ones. Masks of other ranks (prepared 4D masks) pass."""
    if attention_mask is not None and attention_mask.dim() == 2 and tuple(attention_mask.shape) != tuple(shape):
        raise ValueError(
            f"`{name}` has shape {tuple(attention_mask.shape)} but `{of}` has shape {tuple(shape)}: give one mask "
            "value per token (1 for a token, 0 for padding)."
        )


def check_generate_inputs(vocab_size: int, input_ids: torch.Tensor | None, kwargs: dict) -> None:
    """What a `generate()` call is given, checked once before decoding: a clear `ValueError` naming the argument
    instead of an index error deep in torch, or a mask silently broadcast. The model's forward checks nothing."""
    decoder_input_ids = kwargs.get("decoder_input_ids")
    for name, ids in (("input_ids", input_ids), ("decoder_input_ids", decoder_input_ids)):
        if ids is not None:
            check_token_ids(ids, vocab_size, name)
    encoder_outputs = kwargs.get("encoder_outputs")
    sources = {
        "input_ids": input_ids,
        "inputs_embeds": kwargs.get("inputs_embeds"),
        "encoder_outputs": None if encoder_outputs is None else encoder_outputs[0],
    }
    for of, states in sources.items():
        if states is not None:  # what the encoder reads: its mask is `attention_mask`
            check_attention_mask(kwargs.get("attention_mask"), states.shape[:2], "attention_mask", of=of)
            break
    if decoder_input_ids is not None:
        check_attention_mask(
            kwargs.get("decoder_attention_mask"), decoder_input_ids.shape[:2], "decoder_attention_mask",
            of="decoder_input_ids",
        )


class MaxLengthOverSourceLogitsProcessor(LogitsProcessor):
    r"""
    Section 6.1's maximum output length, per sentence: a hypothesis of sentence `i` ends with `</s>` at the latest as
    its `max_lengths[i]`-th generated token (`</s>` included). Per sentence rather than per batch, so a sentence gets
    the same translation alone or in a padded batch. `</s>` keeps its model score.
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


# Whether the beam search running in this thread (or asyncio task) ranks finished hypotheses by GNMT's penalty. A
# context variable, not an attribute of the model: concurrent generate() calls on one model each see their own.
_gnmt_length_penalty: ContextVar[bool] = ContextVar("gnmt_length_penalty", default=False)


@contextlib.contextmanager
def attention_kernel(model, implementation: str | None):
    """`model` with the attention kernel `implementation` inside the block (None: its own), its own restored after."""
    own = model.config._attn_implementation
    if implementation is None or implementation == own:
        yield
        return
    model.set_attn_implementation(implementation)
    try:
        yield
    finally:
        model.set_attn_implementation(own)


class VanillaTransformerGenerationMixin(GenerationMixin):
    """transformers' `GenerationMixin` with section 6.1's decoding read from the generation config (or the call):

    - `max_length_over_source` (default 50): when neither the call nor its generation config sets `max_length` or
      `max_new_tokens`, each sentence's output ends at the latest after its source length + 50 tokens. `None` turns it
      off. A `min_new_tokens` or `min_length` beyond it wins: the output then ends with `</s>` at the first position
      they allow.
    - `length_penalty_type` (default `"gnmt"`): for beam search, `"gnmt"` ranks finished hypotheses by
      `log P(Y|X) / ((5 + |Y|) / 6) ** length_penalty` as the paper did; `"transformers"` keeps transformers'
      `log P(Y|X) / |Y| ** length_penalty`.

    transformers' beam search divides the score of a finished hypothesis by |Y| ** length_penalty and offers no public
    hook for another penalty, so two of its private methods are extended (`_update_finished_beams` and
    `_check_early_stop_heuristic`, with the penalty folded into the scores and transformers' exponent set to 0);
    `_reorder_cache` is the hook transformers offers models for their cache. tests/test_generation.py checks by their
    effects that transformers still calls all three (docs/internals.md).

    `output_attentions=True` (in the call or the generation config) decodes with the eager attention kernel, the
    formula of section 3.2.1 that forms the weights: sdpa and flash attention never return them, and transformers
    would hand back empty attention tuples. The model's kernel is restored after the call.
    """

    @torch.no_grad()
    def generate(
        self,
        inputs: torch.Tensor | None = None,
        generation_config: GenerationConfig | None = None,
        logits_processor: LogitsProcessorList | None = None,
        **kwargs,
    ):
        # Before the attention mask's sum sets each sentence's source + 50 limit.
        check_generate_inputs(self.config.vocab_size, kwargs.get("input_ids", inputs), kwargs)
        settings = resolve_decoding_settings(generation_config, kwargs, defaults=self.generation_config)
        for name in PACKAGE_SETTINGS:
            kwargs.pop(name, None)
        processors = LogitsProcessorList(logits_processor or [])
        if settings["max_length_over_source"] is not None:
            lengths = source_lengths(
                kwargs.get("input_ids", inputs),
                kwargs.get("attention_mask"),
                kwargs.get("inputs_embeds"),
                kwargs.get("encoder_outputs"),
                self.config.pad_token_id,
            )
            # A minimum length wins over the limit: the output still ends with </s>, at the first token allowed.
            shortest = max((settings["min_new_tokens"] or 0) + 1, settings["min_length"] or 0)
            max_lengths = (lengths + settings["max_length_over_source"]).clamp(min=shortest)
            eos_token_id = settings["eos_token_id"]
            eos_token_id = eos_token_id[0] if isinstance(eos_token_id, Sequence) else eos_token_id
            processors.append(MaxLengthOverSourceLogitsProcessor(max_lengths, eos_token_id))
            kwargs.update(max_new_tokens=int(max_lengths.max()), max_length=None)
        elif kwargs.get("max_new_tokens") is not None and "max_length" not in kwargs and generation_config is None:
            # The call's max_new_tokens wins over a max_length in the model's generation config (transformers' default
            # 20, which folders saved by earlier `train` runs carry); transformers would warn at every call.
            kwargs["max_length"] = None

        config = generation_config or self.generation_config
        output_attentions = kwargs.get("output_attentions", config.output_attentions)
        token = _gnmt_length_penalty.set(settings["length_penalty_type"] == "gnmt")
        try:
            with attention_kernel(self, "eager" if output_attentions else None):
                return super().generate(
                    inputs, generation_config=generation_config, logits_processor=processors, **kwargs
                )
        finally:
            _gnmt_length_penalty.reset(token)

    def _reorder_cache(self, cache: Cache, beam_idx: torch.LongTensor) -> Cache:
        """Beam search's hook to keep the cache of the hypotheses it extends (`beam_idx` picks, for every row, a row of
        the same sentence). Only the self-attention cache differs between hypotheses; the encoder-decoder attention's
        keys and values are those of the sentence, the same in all its rows, so they stay where they are instead of
        being copied at every step. A static cache is reordered in place, its filled positions only: a compiled
        decoding step (or a CUDA graph) keeps the addresses of its tensors."""
        self_attention_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        if isinstance(self_attention_cache, StaticCache):
            filled = int(self_attention_cache.get_seq_length())
            for layer in self_attention_cache.layers:
                for states in (layer.keys, layer.values) if layer.is_initialized else ():
                    states[:, :, :filled] = states[:, :, :filled].index_select(0, beam_idx)
        else:
            self_attention_cache.reorder_cache(beam_idx)
        return cache

    def _update_finished_beams(self, **state):
        if _gnmt_length_penalty.get():
            # score(Y) = log P(Y|X) / lp(Y), lp(Y) = ((5 + |Y|) / 6) ** alpha, |Y| counting </s> (GNMT, eq. 14)
            length = state["cur_len"] + 1 - state["decoder_prompt_len"]
            state["topk_log_probs"] = state["topk_log_probs"] / gnmt_length_penalty(length, state["length_penalty"])
            state["length_penalty"] = 0.0
        return super()._update_finished_beams(**state)

    def _check_early_stop_heuristic(self, **state):
        if _gnmt_length_penalty.get():
            # The best score a running hypothesis may still reach, under the same length assumption as transformers.
            never = state["early_stopping"] == "never" and state["length_penalty"] > 0.0
            length = (state["max_length"] if never else state["cur_len"]) - state["decoder_prompt_len"]
            penalty = gnmt_length_penalty(length, state["length_penalty"])
            state["running_beam_scores"] = state["running_beam_scores"] / penalty
            state["length_penalty"] = 0.0
        return super()._check_early_stop_heuristic(**state)
