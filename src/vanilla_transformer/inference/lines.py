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


def tokenize_lines(
    tokenizer: "PreTrainedTokenizerBase", lines: Sequence[str], warn_length: int | None = None, first_line: int = 1
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


__all__ = ["CHUNK_LINES", "tokenize_lines", "translate_in_chunks"]
