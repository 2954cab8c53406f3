"""Translate lines of text with a model in memory: `translate_lines` batches sentences of similar length for
`generate()` and gives the translations back in input order; `translate_in_chunks` does the same for a stream of any
length, a chunk at a time. `tokenize_lines` is the first step of every backend (`backends/` runs model folders with
PyTorch or CTranslate2 for `vanilla-transformer translate` and `evaluate`).
"""

import contextlib
import itertools
import logging
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .batching import length_sorted_batches
from .compiled_decoding import GENERATE_KWARGS, SOURCE_BUCKET, bucket_length, compiled_decoding


logger = logging.getLogger(__name__)


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
    **generate_kwargs,
) -> list[str]:
    """
    Translate each of `lines` with `model.generate()`; the translations come back in the order of `lines`.

    Sentences are sorted by tokenized length, longest first (running out of memory then happens at once, not at the
    end), and cut into batches of at most `batch_size` sentences and, with `max_tokens`, at most that many source
    tokens, padding included. Empty and whitespace-only lines give "" without reaching the model. A line longer than
    `warn_length` tokens (default: `tokenizer.model_max_length`) is logged with its line number and still translated
    whole: sinusoidal positions have no length limit, and truncating would silently lose text. `first_line` is the
    number the report gives `lines[0]` (`translate_in_chunks` passes each chunk's place in the file).

    `num_beams` and `generate_kwargs` (`max_new_tokens`, `length_penalty`, ...) go to `generate()`; left out, the
    model's generation config decides. The model runs in eval mode under `torch.inference_mode()`, on its own device.
    A tqdm bar counts the sentences when `show_progress` (default: when standard error is a terminal).

    `compile=True` decodes with a static cache and a compiled decoding step (`compiled_decoding.py`), for greedy search,
    sampling and beam search. Sources are padded to a multiple of 16 tokens and batched within those lengths, and a
    batch short of sentences is filled up with copies of its first one, so that a file compiles one step per length
    (and decoding setting), reused by all its batches and by later calls. The first batch of each length waits for its
    compilation; translations are those of eager decoding up to floating-point rounding.
    """
    if batch_size < 1 or (max_tokens is not None and max_tokens < 1):
        raise ValueError(f"batch_size ({batch_size}) and max_tokens ({max_tokens}) must be positive")
    translations, to_translate, input_ids = tokenize_lines(tokenizer, lines, warn_length, first_line)
    if not to_translate:
        return translations
    if num_beams is not None:
        generate_kwargs["num_beams"] = num_beams
    if compile:
        generate_kwargs.update(GENERATE_KWARGS)
    batches = _batches([len(ids) for ids in input_ids], batch_size, max_tokens, compile)
    show_progress = sys.stderr.isatty() if show_progress is None else show_progress
    with (
        _eval_mode(model),
        torch.inference_mode(),
        compiled_decoding(model) if compile else contextlib.nullcontext(),
        tqdm(total=len(to_translate), unit="sentence", disable=not show_progress) as bar,
    ):
        for batch, rows in batches:
            texts = _generate(model, tokenizer, [input_ids[k] for k in batch], rows, compile, generate_kwargs)
            for k, text in zip(batch, texts):
                translations[to_translate[k]] = text
            bar.update(len(batch))
    return translations


@contextlib.contextmanager
def _eval_mode(model: PreTrainedModel) -> Iterator[None]:
    """`model` in eval mode, then back in the mode it was in."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _generate(model, tokenizer, sources: list[list[int]], rows: int, compile: bool, generate_kwargs: dict) -> list[str]:
    """The translations of one batch of token ids, filled up to `rows` sentences with copies of its first (the
    translations of the copies come back too) and, for compiled decoding, padded to a multiple of `SOURCE_BUCKET`."""
    sources = sources + sources[:1] * (rows - len(sources))
    padded = tokenizer.pad(
        {"input_ids": sources}, pad_to_multiple_of=SOURCE_BUCKET if compile else None, return_tensors="pt"
    )
    outputs = model.generate(**padded.to(model.device), **generate_kwargs)
    return [text.strip() for text in tokenizer.batch_decode(outputs, skip_special_tokens=True)]


def _batches(
    lengths: list[int], batch_size: int, max_tokens: int | None, compile: bool
) -> list[tuple[list[int], int]]:
    """`(batch, rows)` pairs: the indices of a batch's sources, and the number of sentences it is generated with (its
    own, or with `compile` a full batch's)."""
    if compile:
        return _compiled_decoding_batches(lengths, batch_size, max_tokens)
    return [(batch, len(batch)) for batch in length_sorted_batches(lengths, max_tokens, batch_size)]


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


def tokenize_lines(
    tokenizer: PreTrainedTokenizerBase, lines: Sequence[str], warn_length: int | None = None, first_line: int = 1
):
    """What every backend does first: `translations` ("" for each line), the indices of the non-empty lines
    (`to_translate`) and their token ids, with a warning naming the lines (`lines[0]` is line `first_line`) longer
    than `warn_length` (default: `tokenizer.model_max_length`)."""
    texts = [line.strip() for line in lines]
    translations = [""] * len(texts)
    to_translate = [index for index, text in enumerate(texts) if text]
    # verbose=False: transformers' own warning about the same lines would say it twice, and wrongly (sinusoidal
    # positions have no maximum length).
    input_ids = tokenizer([texts[index] for index in to_translate], verbose=False)["input_ids"] if to_translate else []
    _warn_long_lines(
        [(first_line + to_translate[k], len(ids)) for k, ids in enumerate(input_ids)],
        warn_length or tokenizer.model_max_length,
    )
    return translations, to_translate, input_ids


# Lines translated at a time from a stream: enough to sort into batches of similar length, few enough that memory
# stays flat however long the input.
CHUNK_LINES = 2048


def translate_in_chunks(
    translate: Callable[..., list[str]], lines: Iterable[str], chunk_lines: int = CHUNK_LINES, **options
) -> Iterator[str]:
    """The translations of `lines`, in order, from `translate(chunk, first_line=..., **options)` (`translate_lines`
    with a model and tokenizer bound, or a function of `backends.BACKENDS`) called on `chunk_lines` lines at a time:
    each chunk is sorted and batched by length on its own, and only one chunk and its translations are held."""
    if chunk_lines < 1:
        raise ValueError(f"chunk_lines must be positive, got {chunk_lines}")
    lines = iter(lines)
    first_line = 1
    while chunk := list(itertools.islice(lines, chunk_lines)):
        yield from translate(chunk, first_line=first_line, **options)
        first_line += len(chunk)


def _warn_long_lines(numbered_lengths: list[tuple[int, int]], limit: int) -> None:
    too_long = [(number, length) for number, length in numbered_lengths if length > limit]
    if not too_long:
        return
    shown = ", ".join(f"{number} ({length} tokens)" for number, length in too_long[:10])
    more = f" and {len(too_long) - 10} more" if len(too_long) > 10 else ""
    logger.warning(
        f"{'Line' if len(too_long) == 1 else 'Lines'} {shown}{more} longer than {limit} tokens: translated whole, "
        "but inputs far longer than the training sentences usually translate poorly"
    )


__all__ = ["CHUNK_LINES", "tokenize_lines", "translate_in_chunks", "translate_lines"]
