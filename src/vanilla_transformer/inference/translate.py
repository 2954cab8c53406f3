"""Translate lines of text with a model in memory: `translate_lines` batches sentences of similar length for
`generate()` and gives the translations back in input order, as text or as each source's n best hypotheses with
their scores (`hypotheses.py`); `translate_in_chunks` (`lines.py`) does the same for a stream of any length, a chunk at
a time.
"""

import contextlib
import functools
import sys
from collections.abc import Iterator, Sequence

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..model.decoding_vanilla_transformer import resolve_decoding_settings
from .alignment import align
from .batching import length_sorted_batches
from .compiled_decoding import GENERATE_KWARGS, SOURCE_BUCKET, bucket_length, compiled_decoding
from .hypotheses import EMPTY, Hypothesis, alignment_layer_of, check_nbest, hypothesis
from .lines import CHUNK_LINES, target_prefix_ids, tokenize_lines, translate_in_chunks
from .scoring import teacher_forced_pass


def translate_lines(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    lines: Sequence[str],
    *,
    batch_size: int = 32,
    max_tokens: int | None = None,
    num_beams: int | None = None,
    warn_length: int | None = None,
    show_progress: bool | None = None,
    first_line: int = 1,
    compile: bool = False,
    nbest: int | None = None,
    token_scores: bool = False,
    seed: int | None = None,
    target_prefixes: Sequence[str] | None = None,
    alignment: str | None = None,
    alignment_layer: int | None = None,
    **generate_kwargs,
) -> list[str] | list[list[Hypothesis]]:
    """
    Translate each of `lines` with `model.generate()`, in order. With `nbest` (at most the beams), each line gives its
    `nbest` best hypotheses, best first, with scores (`Hypothesis`; with `token_scores`, each token's), scored by
    `scoring.teacher_forced_pass`; with `alignment` ("hard" or "soft"), their word alignment from decoder layer
    `alignment_layer`'s encoder-decoder attention (default `ALIGNMENT_LAYER`), heads averaged (`alignment.py`).

    Sentences are sorted by tokenized length, longest first (memory runs out at once, if it does), and cut into batches
    of at most `batch_size` sentences and, with `max_tokens`, at most that many source tokens, padding included. Empty
    and whitespace-only lines give "" without reaching the model. A line longer than `warn_length` tokens (default:
    `tokenizer.model_max_length`) is logged with its line number and still translated whole (truncating would silently
    lose text). A line past `lines.untranslated_length(tokenizer)` (4 times `model_max_length`), which attention's
    memory could not hold, gives "" and a warning naming it. `first_line` is the number the report gives `lines[0]`
    (`translate_in_chunks` passes each chunk's place in the file).

    `num_beams` and `generate_kwargs` (`max_new_tokens`, `length_penalty`, `do_sample`, ...) go to `generate()`, else
    the model's generation config decides; `seed` seeds torch first, so that sampling draws the same translations
    again. `target_prefixes` (one a line, "" for none) start the translations: the search continues them. The model
    runs in eval mode, on its own device; a tqdm bar counts sentences when `show_progress` (default: on a terminal).

    `compile=True` decodes with a static cache and a compiled decoding step, eager decoding's translations up to
    rounding (`compiled_decoding.py`: sources padded, batches filled up, one compilation per length).
    """
    if batch_size < 1 or (max_tokens is not None and max_tokens < 1):
        raise ValueError(f"batch_size ({batch_size}) and max_tokens ({max_tokens}) must be positive")
    settings = _decoding_settings(model, generate_kwargs, num_beams, nbest, compile, seed)
    alignment_layer = alignment_layer_of(alignment, nbest, alignment_layer, model.config.decoder_layers)
    translations, to_translate, input_ids = tokenize_lines(tokenizer, lines, warn_length, first_line)
    translations = translations if nbest is None else [[EMPTY] for _ in translations]
    if not to_translate:
        return translations
    prefixes = target_prefix_ids(tokenizer, target_prefixes, len(lines), to_translate)
    batches = _batches([len(ids) for ids in input_ids], batch_size, max_tokens, compile, prefixes)
    show_progress = sys.stderr.isatty() if show_progress is None else show_progress
    score = None if nbest is None else functools.partial(
        _hypotheses, model, tokenizer, nbest=nbest, settings=settings, with_tokens=token_scores,
        alignment=(alignment, alignment_layer))
    for k, output in zip(to_translate, _decode(model, tokenizer, input_ids, prefixes, batches, compile,
                                               show_progress, generate_kwargs, score)):
        translations[k] = output
    return translations


def _decode(model, tokenizer, input_ids, prefixes, batches, compile: bool, show_progress: bool, generate_kwargs: dict,
            score):
    """The outputs of `input_ids` (with their target `prefixes`, if any), in their order, generated batch by batch
    (`batches`: `_batches`); `score(sources, sequences, prefixes)` makes a batch's hypotheses of its sequences (None:
    their texts are the outputs)."""
    outputs = [None] * len(input_ids)
    with (
        _eval_mode(model),
        torch.inference_mode(),
        compiled_decoding(model) if compile else contextlib.nullcontext(),
        tqdm(total=len(input_ids), unit="sentence", disable=not show_progress) as bar,
    ):
        for batch, rows in batches:
            sources = [input_ids[k] for k in batch]
            starts = [prefixes[k] for k in batch] if prefixes is not None else None
            found = _generate(model, tokenizer, sources, starts, rows, compile, generate_kwargs)
            for k, output in zip(batch, found if score is None else score(sources, found, starts)):
                outputs[k] = output
            bar.update(len(batch))
    return outputs


def _decoding_settings(model, generate_kwargs: dict, num_beams, nbest, compile: bool, seed: int | None) -> dict:
    """The decoding settings of a call, resolved as `generate()` resolves them, its n-best length checked against its
    beams; `generate_kwargs` completed with what the call's options ask of `generate()`, and torch seeded."""
    if seed is not None:
        torch.manual_seed(seed)
    if num_beams is not None:
        generate_kwargs["num_beams"] = num_beams
    settings = resolve_decoding_settings(None, generate_kwargs, defaults=model.generation_config)
    check_nbest(nbest, settings["num_beams"])
    if nbest is not None:
        generate_kwargs["num_return_sequences"] = nbest
    generate_kwargs.update(GENERATE_KWARGS if compile else {})
    return settings


@contextlib.contextmanager
def _eval_mode(model: PreTrainedModel) -> Iterator[None]:
    """`model` in eval mode, then back in the mode it was in."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _generate(model, tokenizer, sources: list[list[int]], prefixes, rows: int, compile: bool, generate_kwargs: dict):
    """The translations of one batch of token ids, filled up to `rows` sentences with copies of its first (the
    translations of the copies come back too) and, for compiled decoding, padded to a multiple of `SOURCE_BUCKET`:
    their text, or with `num_return_sequences` the token ids of each sentence's hypotheses, one after another. Target
    `prefixes` (of one length) follow the decoder's start token."""
    sources = sources + sources[:1] * (rows - len(sources))
    padded = tokenizer.pad(
        {"input_ids": sources}, pad_to_multiple_of=SOURCE_BUCKET if compile else None, return_tensors="pt"
    ).to(model.device)
    if prefixes is not None:
        start = model.config.decoder_start_token_id
        prefixes = prefixes + prefixes[:1] * (rows - len(prefixes))
        padded["decoder_input_ids"] = torch.tensor([[start, *prefix] for prefix in prefixes], device=model.device)
    outputs = model.generate(**padded, **generate_kwargs)
    if generate_kwargs.get("num_return_sequences") is not None:
        return outputs.tolist()
    return [text.strip() for text in tokenizer.batch_decode(outputs, skip_special_tokens=True)]


def _hypotheses(model, tokenizer, sources, outputs, prefixes, *, nbest: int, settings: dict, with_tokens: bool,
                alignment: tuple):
    """Each of `sources`' `nbest` hypotheses (`outputs`: `generate()`'s sequences, `nbest` a source) as `Hypothesis`
    objects, scored by a teacher-forced pass. After a target prefix, the tokens and scores are the continuation's, as
    beam search ranked it (the prefix is given, not chosen)."""
    eos, pad = model.config.eos_token_id, model.config.pad_token_id
    targets = [_generated_ids(row, eos, pad) for row in outputs[: len(sources) * nbest]]
    repeated = [source for source in sources for _ in range(nbest)]
    given = [len(prefix) for prefix in prefixes for _ in range(nbest)] if prefixes is not None else [0] * len(targets)
    kind, layer = alignment
    scores, weights = teacher_forced_pass(model, repeated, targets, layer if kind else None)
    links = align(tokenizer, repeated, targets, weights, kind) if kind else [None] * len(targets)
    found = [
        hypothesis(tokenizer.decode(target, skip_special_tokens=True).strip(),
                   tokenizer.convert_ids_to_tokens(target[cut:]), token_scores[cut:], settings, with_tokens, aligned)
        for target, token_scores, cut, aligned in zip(targets, scores, given, links)
    ]
    return [found[k * nbest: (k + 1) * nbest] for k in range(len(sources))]


def _generated_ids(row: list[int], eos: int, pad: int | None) -> list[int]:
    """The tokens `generate()` chose in `row` (after the decoder's start token), up to and with the first `</s>`."""
    generated = row[1:]
    if eos in generated:
        return generated[: generated.index(eos) + 1]
    while generated and generated[-1] == pad:
        generated = generated[:-1]
    return generated


def _batches(
    lengths: list[int], batch_size: int, max_tokens: int | None, compile: bool, prefixes=None
) -> list[tuple[list[int], int]]:
    """`(batch, rows)` pairs: the indices of a batch's sources, and the number of sentences it is generated with (its
    own, or with `compile` a full batch's). With target `prefixes`, a batch holds prefixes of one length (the decoder
    starts all its sentences at one position)."""
    if compile:
        batches = _compiled_decoding_batches(lengths, batch_size, max_tokens)
    else:
        batches = [(batch, len(batch)) for batch in length_sorted_batches(lengths, max_tokens, batch_size)]
    if prefixes is None:
        return batches
    split = []
    for batch, rows in batches:
        for length in sorted({len(prefixes[k]) for k in batch}):
            part = [k for k in batch if len(prefixes[k]) == length]
            split.append((part, rows if compile else len(part)))
    return split


def _compiled_decoding_batches(lengths: list[int], batch_size: int, max_tokens: int | None):
    """`(batch, rows)` pairs for compiled decoding: each batch holds sources of one bucketed length and is padded to
    `rows` sentences, a full batch's; batches of one length give one shape. The longest sentence comes first: its
    batch sizes the static cache for all the others (transformers keeps the longest cache it has made)."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__, reverse=True)  # stable: ties keep input order
    widths = [bucket_length(lengths[index]) for index in order]  # already sorted, longest first
    batches = []
    for batch in length_sorted_batches(widths, max_tokens, max_sentences=batch_size, same_length=True):
        width = widths[batch[0]]
        rows = min(batch_size, max(1, max_tokens // width)) if max_tokens else batch_size
        batches.append(([order[position] for position in batch], rows))
    return batches


__all__ = ["CHUNK_LINES", "tokenize_lines", "translate_in_chunks", "translate_lines"]
