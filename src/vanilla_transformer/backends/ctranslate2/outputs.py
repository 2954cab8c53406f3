"""What CTranslate2's search gives, as the `ct2` backend returns it: a batch's translations as text or as scored
hypotheses (`inference.hypotheses.Hypothesis`, scored by CTranslate2's `score_batch` as `generate()`'s are by the
model's own pass), and `generate()`'s sampling settings as CTranslate2's. Needs the `ct2` extra."""

from transformers import GenerationConfig

from ...extras import require
from ...inference.hypotheses import Hypothesis, hypothesis


def sampling_options(options: dict, defaults: GenerationConfig, seed: int | None) -> dict:
    """`options` with `generate()`'s sampling settings (`do_sample`, `top_k`, `top_p`, `temperature`, each from the
    options, else from the generation config `defaults`) as CTranslate2's, one beam; `seed` seeds its generator."""
    options = dict(options)
    names = ("do_sample", "top_k", "top_p", "temperature")
    do_sample, top_k, top_p, temperature = (
        options.pop(name) if name in options else getattr(defaults, name, None) for name in names)
    if seed is not None:
        require("ctranslate2", extra="ct2").set_random_seed(seed)
    if not do_sample:
        return options
    return dict(options, num_beams=1, sampling_topk=top_k or 0, sampling_topp=1.0 if top_p is None else top_p,
                sampling_temperature=1.0 if temperature is None else temperature)


def batch_outputs(translator, tokenizer, search, sources, prefixes, max_length: int, *, nbest, settings: dict,
                  token_scores: bool, alignment: str | None = None):
    """The translations of a batch of `sources` (token ids; after target `prefixes`, token ids too, if any): their
    texts, or with `nbest` their scored hypotheses (aligned as `alignment` asks)."""
    sources = [tokenizer.convert_ids_to_tokens(ids) for ids in sources]
    if prefixes is not None:
        prefixes = [tokenizer.convert_ids_to_tokens(ids) for ids in prefixes]
        ranked = search.prefixed_hypotheses(translator, sources, prefixes, max_length, nbest or 1)
    elif nbest is None:
        return [_text(tokenizer, tokens) for tokens in search.best_hypotheses(translator, sources, max_length)]
    else:
        ranked = search.ranked_hypotheses(translator, sources, max_length, nbest)
    if nbest is None:
        return [_text(tokenizer, found[0]) for found in ranked]
    return _scored(translator, tokenizer, sources, ranked, settings, token_scores, prefixes, alignment)


def _text(tokenizer, tokens: list[str]) -> str:
    return tokenizer.decode(tokenizer.convert_tokens_to_ids(tokens), skip_special_tokens=True).strip()


def _scored(translator, tokenizer, sources, ranked, settings: dict, with_tokens: bool,
            prefixes=None, alignment: str | None = None) -> list[list[Hypothesis]]:
    """The hypotheses `ranked` (tokens, for each of `sources`) as `Hypothesis` objects, scored by CTranslate2's
    `score_batch`: the log-probability of each token and of the `</s>` it appends. A hypothesis the length limit cut
    keeps that `</s>` where `generate()` would have forced it (the source + N limit), not where it stops without one
    (`max_new_tokens`). After a target prefix, the tokens and scores are the continuation's; the alignment is the whole
    translation's."""
    end = tokenizer.eos_token
    forced_end = settings["max_length_over_source"] is not None
    flat = [tokens for found in ranked for tokens in found]
    targets = [tokens[:-1] if tokens[-1:] == [end] else tokens for tokens in flat]
    repeated = [source for source, found in zip(sources, ranked) for _ in found]
    given = [len(prefixes[i]) if prefixes else 0 for i, found in enumerate(ranked) for _ in found]
    links = _alignments(translator, tokenizer, repeated, flat, alignment) if alignment else [None] * len(flat)
    scored = []
    for tokens, start, result, aligned in zip(flat, given, translator.score_batch(repeated, targets, max_input_length=0),
                                              links):
        cut = tokens[-1:] != [end] and not forced_end
        kept = len(result.tokens) - 1 if cut else len(result.tokens)
        scored.append(hypothesis(_text(tokenizer, result.tokens[:kept]), result.tokens[start:kept],
                                 result.log_probs[start:kept], settings, with_tokens, aligned))
    found = iter(scored)
    return [[next(found) for _ in hypotheses] for hypotheses in ranked]


def _alignments(translator, tokenizer, sources: list[list[str]], hypotheses: list[list[str]], kind: str) -> list:
    """The word alignment of each hypothesis (tokens, with the `</s>` it ended with, if any) of the source of the same
    index, from the attention CTranslate2 returns while the hypothesis is forced as a target prefix: the row of each
    token is the attention of the step that predicted it, as in the torch backend's teacher-forced pass."""
    from ...inference.alignment import align  # torch, for the word matrices: only when an alignment is asked for
    import torch

    prefixes = [tokens[:-1] if tokens[-1:] == [tokenizer.eos_token] else tokens for tokens in hypotheses]
    results = translator.translate_batch(sources, target_prefix=prefixes, return_attention=True, beam_size=1,
                                         max_decoding_length=max(map(len, hypotheses)) + 1, min_decoding_length=0,
                                         max_input_length=0, return_end_token=True)
    weights = [torch.tensor(result.attention[0][: len(tokens)]) for result, tokens in zip(results, hypotheses)]
    ids = [tokenizer.convert_tokens_to_ids(tokens) for tokens in sources]
    return align(tokenizer, ids, [tokenizer.convert_tokens_to_ids(tokens) for tokens in hypotheses], weights, kind)


__all__ = ["batch_outputs", "sampling_options"]
