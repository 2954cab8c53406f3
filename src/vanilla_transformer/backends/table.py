"""The translation backends of `vanilla-transformer translate` and `evaluate`, side by side: each loads a model folder
onto a device and returns a `translate(lines, **options)` function, looked up by name in `BACKENDS`.

- `torch`: a folder as `save_pretrained` writes it, run by transformers' `generate()` (`translate.translate_lines`).
- `ct2`: a folder written by `vanilla-transformer export-ct2`, run by CTranslate2's search
  (`ctranslate2/search.py`); needs the `ct2` extra.
- `onnx`: a folder written by `vanilla-transformer export-onnx`, run by ONNX Runtime behind transformers' `generate()`
  (`onnx/model.py`, then `translate.translate_lines` as for `torch`); needs the `onnx` extra.

`SCORERS` loads a folder the same way for `vanilla-transformer score`, as a `score(sources, targets, **options)`
function (`inference.scoring.score_pairs`; CTranslate2's `score_batch` for `ct2`).

All batch alike (`batching.length_sorted_batches`) and read the decoding settings as `generate()` reads them. Each
backend imports what runs it when it loads a folder, so that the table itself imports neither torch nor transformers;
the torch and ONNX backends register the model with transformers (`model.register`), CTranslate2's needs neither.
"""

import functools
import os
from collections.abc import Callable

PathLike = str | os.PathLike
Translator = Callable[..., list]  # translate(lines, *, batch_size, num_beams, nbest, show_progress, **generate_kwargs)
Scorer = Callable[..., list]  # score(sources, targets, *, batch_size, max_tokens, show_progress) -> [PairScore]


def torch_translator(model_dir: PathLike, device: str | None = None) -> Translator:
    """The model folder `model_dir` (model, tokenizer and generation config, as `save_pretrained` writes them) loaded
    with transformers onto `device` (default: CUDA when available), as `translate_lines` bound to the two."""
    from ..inference.translate import translate_lines

    return functools.partial(translate_lines, *_torch_model(model_dir, device))


def _torch_model(model_dir: PathLike, device: str | None):
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from ..model import register

    register()  # AutoModelForSeq2SeqLM knows the model
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir, trust_remote_code=False).to(device).eval()
    return model, tokenizer


def ct2_translator(model_dir: PathLike, device: str | None = None) -> Translator:
    """The `export-ct2` folder `model_dir` loaded by CTranslate2 (`ctranslate2.search.ct2_translator`)."""
    from .ctranslate2.search import ct2_translator as load

    return load(model_dir, device)


def onnx_translator(model_dir: PathLike, device: str | None = None) -> Translator:
    """The ONNX folder `model_dir` (from `onnx.export.export_onnx`) loaded into ONNX Runtime on `device` (default: the
    CPU), as `translate_lines` bound to its model and tokenizer: the torch backend's batching and `generate()`."""
    from ..inference.translate import translate_lines

    return functools.partial(_without_alignment, functools.partial(translate_lines, *_onnx_model(model_dir, device)))


def _without_alignment(translate, lines, *, alignment: str | None = None, alignment_layer: int | None = None, **options):
    """`translate(lines, **options)`, an `alignment` refused: the ONNX export's decoder returns no attention."""
    if alignment is not None:
        raise ValueError("the ONNX export's decoder returns no attention to align with: use the torch or ct2 backend")
    return translate(lines, **options)


def _onnx_model(model_dir: PathLike, device: str | None):
    from transformers import AutoTokenizer

    from ..model import register
    from .onnx.model import VanillaTransformerORTForConditionalGeneration

    register()  # the pipelines, and the configuration class that the ONNX folder's config.json names
    model = VanillaTransformerORTForConditionalGeneration.from_pretrained(model_dir, device=device)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    return model, tokenizer


def torch_scorer(model_dir: PathLike, device: str | None = None) -> Scorer:
    """The model folder `model_dir` loaded as for `torch_translator`, as `score_pairs` bound to model and tokenizer."""
    from ..inference.scoring import score_pairs

    return functools.partial(score_pairs, *_torch_model(model_dir, device))


def ct2_scorer(model_dir: PathLike, device: str | None = None) -> Scorer:
    """The `export-ct2` folder `model_dir` loaded by CTranslate2, as `ct2_score_pairs` bound to its translator."""
    from .ctranslate2.scoring import ct2_score_pairs
    from .ctranslate2.search import load_translator

    return functools.partial(ct2_score_pairs, *load_translator(model_dir, device))


def onnx_scorer(model_dir: PathLike, device: str | None = None) -> Scorer:
    """The ONNX folder `model_dir` loaded into ONNX Runtime as for `onnx_translator`, as `score_pairs` bound to it."""
    from ..inference.scoring import score_pairs

    return functools.partial(score_pairs, *_onnx_model(model_dir, device))


# How the commands run a model folder: a backend loads it (folder, device) and returns its translate function.
BACKENDS: dict[str, Callable[[PathLike, str | None], Translator]] = {
    "torch": torch_translator,
    "ct2": ct2_translator,
    "onnx": onnx_translator,
}


# How `vanilla-transformer score` runs a model folder: a backend loads it (folder, device), returns its score function.
SCORERS: dict[str, Callable[[PathLike, str | None], Scorer]] = {
    "torch": torch_scorer,
    "ct2": ct2_scorer,
    "onnx": onnx_scorer,
}


__all__ = ["BACKENDS", "SCORERS", "ct2_scorer", "ct2_translator", "onnx_scorer", "onnx_translator", "torch_scorer",
           "torch_translator"]
