"""Translate lines of text with a saved model: the inference behind `vanilla-transformer translate` and `evaluate`.

`translate_lines` batches sentences of similar length for `generate()` and gives the translations back in input order;
`read_lines` reads a UTF-8 file (`.gz` too) or standard input line by line and names the line of any bad byte. A
backend (`BACKENDS`) turns a model folder into a `translate(lines, **options)` function: PyTorch (`torch`) or
CTranslate2 (`ct2`, for folders written by `vanilla-transformer export-ct2`).
"""

import codecs
import functools
import gzip
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import BinaryIO

import torch
from tqdm.auto import tqdm
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase


logger = logging.getLogger(__name__)

PathLike = str | os.PathLike


class InvalidUTF8Error(ValueError):
    """A line of an input that is not UTF-8; the message names the file, the line, the byte and its column."""


def read_lines(path: PathLike | None = None) -> list[str]:
    """The lines of a UTF-8 text file (read as gzip when its name ends in `.gz`), or of standard input when `path` is
    None or "-", without their line endings. Lines are split on "\\n" only, never on the Unicode separators
    `str.splitlines` knows, so item N is line N + 1 of the file; a leading byte-order mark is dropped."""
    if path is None or str(path) == "-":
        return _decode_lines(sys.stdin.buffer, "<stdin>")
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as file:
        return _decode_lines(file, str(path))


def _decode_lines(file: BinaryIO, name: str) -> list[str]:
    lines = []
    for number, raw in enumerate(file, 1):
        if number == 1 and raw.startswith(codecs.BOM_UTF8):
            raw = raw[len(codecs.BOM_UTF8) :]
        try:
            lines.append(raw.decode("utf-8").rstrip("\r\n"))
        except UnicodeDecodeError as error:
            column = len(raw[: error.start].decode("utf-8")) + 1  # in characters, as editors count
            raise InvalidUTF8Error(
                f"{name}: line {number} is not valid UTF-8 (byte 0x{raw[error.start]:02x} at column {column})"
            ) from None
    return lines


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
    **generate_kwargs,
) -> list[str]:
    """
    Translate each of `lines` with `model.generate()`; the translations come back in the order of `lines`.

    Sentences are sorted by tokenized length, longest first (running out of memory then happens at once, not at the
    end), and cut into batches of at most `batch_size` sentences and, with `max_tokens`, at most that many source
    tokens, padding included. Empty and whitespace-only lines give "" without reaching the model. A line longer than
    `warn_length` tokens (default: `tokenizer.model_max_length`) is logged with its line number and still translated
    whole: sinusoidal positions have no length limit, and truncating would silently lose text.

    `num_beams` and `generate_kwargs` (`max_new_tokens`, `length_penalty`, ...) go to `generate()`; left out, the
    model's generation config decides. The model runs in eval mode under `torch.inference_mode()`, on its own device.
    A tqdm bar counts the sentences when `show_progress` (default: when standard error is a terminal).
    """
    if batch_size < 1 or (max_tokens is not None and max_tokens < 1):
        raise ValueError(f"batch_size ({batch_size}) and max_tokens ({max_tokens}) must be positive")
    translations, to_translate, input_ids = tokenize_lines(tokenizer, lines, warn_length)
    if not to_translate:
        return translations
    lengths = [len(ids) for ids in input_ids]
    if num_beams is not None:
        generate_kwargs["num_beams"] = num_beams
    show_progress = sys.stderr.isatty() if show_progress is None else show_progress

    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), tqdm(total=len(to_translate), unit="sentence", disable=not show_progress) as bar:
            for batch in _length_sorted_batches(lengths, batch_size, max_tokens):
                padded = tokenizer.pad({"input_ids": [input_ids[k] for k in batch]}, return_tensors="pt")
                outputs = model.generate(**padded.to(model.device), **generate_kwargs)
                for k, text in zip(batch, tokenizer.batch_decode(outputs, skip_special_tokens=True)):
                    translations[to_translate[k]] = text.strip()
                bar.update(len(batch))
    finally:
        model.train(was_training)
    return translations


def tokenize_lines(tokenizer: PreTrainedTokenizerBase, lines: Sequence[str], warn_length: int | None = None):
    """What every backend does first: `translations` ("" for each line), the indices of the non-empty lines
    (`to_translate`) and their token ids, with a warning for lines longer than `warn_length` (default:
    `tokenizer.model_max_length`)."""
    texts = [line.strip() for line in lines]
    translations = [""] * len(texts)
    to_translate = [index for index, text in enumerate(texts) if text]
    input_ids = tokenizer([texts[index] for index in to_translate])["input_ids"] if to_translate else []
    _warn_long_lines(
        [(to_translate[k] + 1, len(ids)) for k, ids in enumerate(input_ids)], warn_length or tokenizer.model_max_length
    )
    return translations, to_translate, input_ids


def _length_sorted_batches(lengths: list[int], batch_size: int, max_tokens: int | None) -> list[list[int]]:
    """Indices into `lengths`, longest first, cut greedily into batches of at most `batch_size` items and at most
    `max_tokens` padded tokens. A sentence longer than `max_tokens` is a batch of its own."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__, reverse=True)  # stable: ties keep input order
    batches, batch = [], []
    for index in order:
        # The first (longest) sentence of a batch sets its padded width.
        if batch and (len(batch) == batch_size or (max_tokens and (len(batch) + 1) * lengths[batch[0]] > max_tokens)):
            batches.append(batch)
            batch = []
        batch.append(index)
    batches.append(batch)
    return batches


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


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


Translator = Callable[..., list[str]]  # translate(lines, *, batch_size, num_beams, show_progress, **generate_kwargs)


def torch_translator(model_dir: PathLike, device: str | None = None) -> Translator:
    """The model folder `model_dir` (model, tokenizer and generation config, as `save_pretrained` writes them) loaded
    with transformers onto `device` (default: CUDA when available), as `translate_lines` bound to the two."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).to(device or default_device()).eval()
    return functools.partial(translate_lines, model, tokenizer)


def ct2_translator(model_dir: PathLike, device: str | None = None) -> Translator:
    """A CTranslate2 folder (from `vanilla-transformer export-ct2`); see `ctranslate2_export.ct2_translator`."""
    from .ctranslate2_export import ct2_translator

    return ct2_translator(model_dir, device)


# How the commands run a model folder: a backend loads it (folder, device) and returns its translate function.
BACKENDS: dict[str, Callable[[PathLike, str | None], Translator]] = {"torch": torch_translator, "ct2": ct2_translator}


__all__ = ["BACKENDS", "InvalidUTF8Error", "read_lines", "torch_translator", "translate_lines"]
