"""Lines of text to and from any backend, without torch: `tokenize_lines` is every backend's first step (empty lines
kept aside, long lines reported), and `translate_in_chunks` feeds a stream of any length to a backend a chunk at a
time. `backends/` runs model folders with PyTorch, CTranslate2 or ONNX Runtime for `vanilla-transformer translate`
and `evaluate`; CTranslate2's imports no torch.
"""

import itertools
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


logger = logging.getLogger(__name__)


# A line over this many times the tokenizer's `model_max_length` tokens (4,096 for the package's tokenizers) is left
# untranslated: self-attention's memory grows with the square of the length (section 3.2.1; Table 1's O(n^2 d) per
# layer), so that past some length no machine translates it, and a source that long (a log line, a pasted file) is no
# sentence. Its place gets an empty line and a warning naming it; the other lines are translated.
UNTRANSLATED_FACTOR = 4
# The bound for a tokenizer that sets no `model_max_length` (transformers' stand-in is a huge number).
UNTRANSLATED_DEFAULT = 4096


def tokenize_lines(
    tokenizer: "PreTrainedTokenizerBase", lines: Sequence[str], warn_length: int | None = None, first_line: int = 1
):
    """What every backend does first: `translations` ("" for each line), the indices of the non-empty lines
    (`to_translate`) and their token ids, with a warning naming the lines (`lines[0]` is line `first_line`) longer
    than `warn_length` (default: `tokenizer.model_max_length`). Lines longer than `untranslated_length(tokenizer)` are
    left out of `to_translate`, with a warning naming them: their translation stays ""."""
    texts = [line.strip() for line in lines]
    translations = [""] * len(texts)
    to_translate = [index for index, text in enumerate(texts) if text]
    # verbose=False: transformers' own warning about the same lines would say it twice, and wrongly (sinusoidal
    # positions have no maximum length).
    input_ids = tokenizer([texts[index] for index in to_translate], verbose=False)["input_ids"] if to_translate else []
    bound = untranslated_length(tokenizer)
    numbered_lengths = [(first_line + to_translate[k], len(ids)) for k, ids in enumerate(input_ids)]
    _warn_long_lines([(number, length) for number, length in numbered_lengths if length <= bound],
                     warn_length or tokenizer.model_max_length)
    if too_long := [(number, length) for number, length in numbered_lengths if length > bound]:
        _warn_untranslated(too_long, bound)
        kept = [k for k, ids in enumerate(input_ids) if len(ids) <= bound]
        to_translate, input_ids = [to_translate[k] for k in kept], [input_ids[k] for k in kept]
    return translations, to_translate, input_ids


def target_prefix_ids(tokenizer: "PreTrainedTokenizerBase", target_prefixes: Sequence[str] | None, num_lines: int,
                      to_translate: list[int]) -> list[list[int]] | None:
    """The token ids of the target prefix of each line to translate (`to_translate`: indices into `target_prefixes`,
    one a line, "" for none), tokenized as targets are but without `</s>`; None without prefixes."""
    if target_prefixes is None:
        return None
    if len(target_prefixes) != num_lines:
        raise ValueError(f"{len(target_prefixes)} target prefixes for {num_lines} lines: give one a line")
    texts = [target_prefixes[k].strip() for k in to_translate]
    return tokenizer(text_target=texts, add_special_tokens=False, verbose=False)["input_ids"] if texts else []


def untranslated_length(tokenizer: "PreTrainedTokenizerBase") -> int:
    """The number of tokens past which a line is left untranslated (`UNTRANSLATED_FACTOR`)."""
    model_max_length = tokenizer.model_max_length
    return UNTRANSLATED_FACTOR * model_max_length if model_max_length < 10**6 else UNTRANSLATED_DEFAULT


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


def _warn_untranslated(numbered_lengths: list[tuple[int, int]], limit: int) -> None:
    shown = ", ".join(f"{number} ({length:,} tokens)" for number, length in numbered_lengths[:10])
    more = f" and {len(numbered_lengths) - 10} more" if len(numbered_lengths) > 10 else ""
    logger.warning(
        f"{'Line' if len(numbered_lengths) == 1 else 'Lines'} {shown}{more} longer than {limit:,} tokens: left "
        "untranslated (an empty line in the output), since attention's memory grows with the square of the length"
    )


__all__ = ["CHUNK_LINES", "UNTRANSLATED_FACTOR", "target_prefix_ids", "tokenize_lines", "translate_in_chunks",
           "untranslated_length"]
