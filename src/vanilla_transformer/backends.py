"""The translation backends of `vanilla-transformer translate` and `evaluate`, side by side: each loads a model folder
onto a device and returns a `translate(lines, **options)` function, looked up by name in `BACKENDS`.

- `torch`: a folder as `save_pretrained` writes it, run by transformers' `generate()` (`translate.translate_lines`).
- `ct2`: a folder written by `vanilla-transformer export-ct2`, run by CTranslate2's search (`ct2_translate_lines`);
  needs the `ct2` extra.
- `onnx`: a folder written by `vanilla-transformer export-onnx`, run by ONNX Runtime behind transformers' `generate()`
  (`onnx_model.py`, then `translate.translate_lines` as for `torch`); needs the `onnx` extra.

All batch alike (`batching.length_sorted_batches`) and read the decoding settings as `generate()` reads them.
"""

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, GenerationConfig, PreTrainedTokenizerBase

from .batching import length_sorted_batches
from .extras import require
from .generation_vanilla_transformer import PAPER_DECODING, gnmt_length_penalty, resolve_decoding_settings
from .translate import InputTooLongError, tokenize_lines, translate_lines


PathLike = str | os.PathLike
Translator = Callable[..., list[str]]  # translate(lines, *, batch_size, num_beams, show_progress, **generate_kwargs)


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


# --- torch ---------------------------------------------------------------------------------------------------------


def torch_translator(model_dir: PathLike, device: str | None = None) -> Translator:
    """The model folder `model_dir` (model, tokenizer and generation config, as `save_pretrained` writes them) loaded
    with transformers onto `device` (default: CUDA when available), as `translate_lines` bound to the two."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).to(device or default_device()).eval()
    return functools.partial(translate_lines, model, tokenizer)


# --- ct2 -----------------------------------------------------------------------------------------------------------


def ct2_translator(model_dir: PathLike, device: str | None = None) -> Translator:
    """The CTranslate2 folder `model_dir` (from `ctranslate2_export.export_ctranslate2`) loaded on `device` ("cpu",
    "cuda", "cuda:1"; default: CUDA when CTranslate2 sees a GPU), as `ct2_translate_lines` bound to its translator,
    tokenizer and generation config."""
    ctranslate2 = require("ctranslate2", extra="ct2")
    model_dir = Path(model_dir)
    if not ctranslate2.contains_model(str(model_dir)):
        if (model_dir / "config.json").is_file() and any(model_dir.glob("*.safetensors")):
            raise ValueError(
                f"{model_dir} is a transformers model folder; the ct2 backend needs it exported first: "
                f"`vanilla-transformer export-ct2 --model {model_dir} --out {model_dir}-ct2`, then --model "
                f"{model_dir}-ct2."
            )
        raise ValueError(
            f"{model_dir} holds no CTranslate2 model (model.bin); make one with `vanilla-transformer export-ct2`."
        )
    if device is None:
        device = "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"
    device_type, _, index = device.partition(":")
    translator = ctranslate2.Translator(str(model_dir), device=device_type, device_index=int(index or 0))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if (model_dir / "generation_config.json").is_file():
        generation_config = GenerationConfig.from_pretrained(model_dir)
    else:
        generation_config = GenerationConfig(**PAPER_DECODING)
    return functools.partial(ct2_translate_lines, translator, tokenizer, generation_config=generation_config)


# The settings of `generate()` that become CTranslate2's search settings; other options go to `translate_batch`.
DECODING_SETTINGS = (
    "num_beams",
    "length_penalty",
    "length_penalty_type",
    "early_stopping",
    "max_length_over_source",
    "max_new_tokens",
    "max_length",
)


def ct2_translate_lines(
    translator,
    tokenizer: PreTrainedTokenizerBase,
    lines: list[str],
    *,
    batch_size: int = 32,
    max_tokens: int | None = None,
    warn_length: int | None = None,
    show_progress: bool | None = None,
    first_line: int = 1,
    generation_config: GenerationConfig | None = None,
    **options,
) -> list[str]:
    r"""
    Translate each of `lines` with a `ctranslate2.Translator`, batched as `translate_lines` does for `generate()`
    (sorted by length, `batch_size` sentences and `max_tokens` tokens at most, empty lines give "", long lines reported
    with their number counted from `first_line`); the translations come back in input order.

    The decoding settings of `generate()` are read as it reads them: from `options`, else from `generation_config`
    (the exported model's; section 6.1's when missing):

    - `num_beams` (4 in the paper): CTranslate2's `beam_size`.
    - `length_penalty` (alpha, 0.6) and `length_penalty_type`: CTranslate2's own penalty is transformers' formula,
      finished hypotheses ranked by `log P(Y|X) / |Y|^alpha` (`"transformers"`; `|Y|` counts `</s>`). With `"gnmt"`
      (the paper's) the hypotheses CTranslate2's search finished are re-ranked by `log P(Y|X) / ((5 + |Y|) / 6)^alpha`.
      The search itself ranks candidates by `log P(Y|X)`, as transformers' does, but CTranslate2 stops once
      `beam_size` hypotheses are finished, while `generate()` stops when no running hypothesis can still win
      (`early_stopping="never"`), so the two may finish different hypotheses.
    - `max_new_tokens`: CTranslate2's `max_decoding_length`. Left out, each output ends at the latest after its source
      length + `max_length_over_source` (50) tokens, `</s>` included; as CTranslate2 takes one maximum length per
      call, batches then hold sentences of one length. Where `generate()` ends an output at the limit with `</s>`,
      CTranslate2 stops one token earlier without it: the same text in greedy search, a slightly different score in
      beam search.

    Other `options` go to `Translator.translate_batch` unchanged (`repetition_penalty`, `no_repeat_ngram_size`, ...).
    """
    if batch_size < 1 or (max_tokens is not None and max_tokens < 1):
        raise ValueError(f"batch_size ({batch_size}) and max_tokens ({max_tokens}) must be positive")
    # As generate() reads them: the call's settings, else the model's generation config.
    generation_config = generation_config or GenerationConfig(**PAPER_DECODING)
    settings = resolve_decoding_settings(None, options, defaults=generation_config)
    options = {name: value for name, value in options.items() if name not in DECODING_SETTINGS}
    search, gnmt_alpha = ct2_search(settings, options)

    translations, to_translate, input_ids = tokenize_lines(tokenizer, lines, warn_length, first_line)
    if not to_translate:
        return translations
    batches = ct2_batches([len(ids) for ids in input_ids], settings, batch_size, max_tokens)
    show_progress = sys.stderr.isatty() if show_progress is None else show_progress
    with tqdm(total=len(to_translate), unit="sentence", disable=not show_progress) as bar:
        for batch, max_length in batches:
            sources = [tokenizer.convert_ids_to_tokens(input_ids[k]) for k in batch]
            for k, result in zip(batch, _translate_batch(translator, sources, max_length, search)):
                tokens = result.hypotheses[0] if gnmt_alpha is None else _best_gnmt_hypothesis(result, gnmt_alpha)
                text = tokenizer.decode(tokenizer.convert_tokens_to_ids(tokens), skip_special_tokens=True)
                translations[to_translate[k]] = text.strip()
            bar.update(len(batch))
    return translations


def ct2_search(settings: dict, options: dict) -> tuple[dict, float | None]:
    """`Translator.translate_batch`'s search arguments for `generate()`'s decoding `settings` (as resolved), with the
    other `options` as given, and the alpha by which to re-rank the finished hypotheses with GNMT's length penalty
    (the paper's), or None where CTranslate2's own ranking stands."""
    num_beams = settings["num_beams"] or 1
    alpha = 1.0 if settings["length_penalty"] is None else settings["length_penalty"]
    # With GNMT, every finished hypothesis comes back with its score, to be re-ranked.
    rerank = settings["length_penalty_type"] == "gnmt" and num_beams > 1 and alpha != 0
    # CTranslate2 has one stopping rule, transformers' early_stopping=True: stop once beam_size hypotheses are finished.
    search = dict(
        beam_size=num_beams,
        length_penalty=alpha,
        num_hypotheses=num_beams if rerank else 1,
        return_scores=rerank,
        return_end_token=True,  # so |Y| counts </s>, as in generate(); decoding drops it
        min_decoding_length=0,  # generate() may end with </s> at once
        max_input_length=0,  # translate whole sentences, as the PyTorch backend does
    )
    search.update(options)
    return search, alpha if rerank else None


def ct2_batches(
    lengths: list[int], settings: dict, batch_size: int, max_tokens: int | None
) -> list[tuple[list[int], int]]:
    """The sources of `lengths` tokens in length-sorted batches, each with its maximum output length as `generate()`'s
    decoding `settings` set it."""
    max_length_over_source = settings["max_length_over_source"]
    if max_length_over_source is None:
        # generate()'s own limits: max_length counts the decoder start token; with neither set, 20 new tokens.
        limit = settings["max_new_tokens"] or (settings["max_length"] - 1 if settings["max_length"] else 20)
        return [(batch, limit) for batch in length_sorted_batches(lengths, max_tokens, max_sentences=batch_size)]
    # generate() forces </s> as the last of source + 50 tokens; CTranslate2 stops one token earlier, without it.
    # CTranslate2 takes one maximum output length per call, so a batch holds sentences of one length.
    return [
        (batch, max(1, lengths[batch[0]] + max_length_over_source - 1))
        for batch in length_sorted_batches(lengths, max_tokens, max_sentences=batch_size, same_length=True)
    ]


def _translate_batch(translator, sources: list[list[str]], max_length: int, search: dict):
    """`translator.translate_batch` of `sources` (tokens), an `InputTooLongError` where they or their outputs outgrow
    the exported position table."""
    try:
        return translator.translate_batch(sources, max_decoding_length=max_length, **search)
    except RuntimeError as error:
        if "position encodings" not in str(error):
            raise
        raise InputTooLongError(
            f"{error}: the CTranslate2 model has a fixed number of positions; export it again with a larger "
            "--max-positions, or shorten the input or max_new_tokens"
        ) from error


def _best_gnmt_hypothesis(result, alpha: float) -> list[str]:
    """The finished hypothesis with the best GNMT score, from CTranslate2's scores `log P(Y|X) / |Y|^alpha`."""

    def gnmt_score(hypothesis_and_score):
        tokens, score = hypothesis_and_score
        return score * len(tokens) ** alpha / gnmt_length_penalty(len(tokens), alpha)

    return max(zip(result.hypotheses, result.scores), key=gnmt_score)[0]


# --- onnx ----------------------------------------------------------------------------------------------------------


def onnx_translator(model_dir: PathLike, device: str | None = None) -> Translator:
    """The ONNX folder `model_dir` (from `onnx_export.export_onnx`) loaded into ONNX Runtime on `device` (default: the
    CPU), as `translate_lines` bound to its model and tokenizer: the torch backend's batching and `generate()`."""
    from .onnx_model import VanillaTransformerORTForConditionalGeneration

    model = VanillaTransformerORTForConditionalGeneration.from_pretrained(model_dir, device=device)
    return functools.partial(translate_lines, model, AutoTokenizer.from_pretrained(model_dir))


# How the commands run a model folder: a backend loads it (folder, device) and returns its translate function.
BACKENDS: dict[str, Callable[[PathLike, str | None], Translator]] = {
    "torch": torch_translator,
    "ct2": ct2_translator,
    "onnx": onnx_translator,
}


__all__ = [
    "BACKENDS",
    "InputTooLongError",
    "ct2_translate_lines",
    "ct2_translator",
    "onnx_translator",
    "torch_translator",
]
