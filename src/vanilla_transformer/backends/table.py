"""The translation backends of `vanilla-transformer translate` and `evaluate`, side by side: each loads a model folder
onto a device and returns a `translate(lines, **options)` function, looked up by name in `BACKENDS`.

- `torch`: a folder as `save_pretrained` writes it, run by transformers' `generate()` (`translate.translate_lines`).
- `ct2`: a folder written by `vanilla-transformer export-ct2`, run by CTranslate2's search
  (`ctranslate2/search.py`); needs the `ct2` extra.
- `onnx`: a folder written by `vanilla-transformer export-onnx`, run by ONNX Runtime behind transformers' `generate()`
  (`onnx/model.py`, then `translate.translate_lines` as for `torch`); needs the `onnx` extra.

All batch alike (`batching.length_sorted_batches`) and read the decoding settings as `generate()` reads them. Each
backend imports what runs it when it loads a folder, so that the table itself imports neither torch nor transformers;
the torch and ONNX backends register the model with transformers (`model.register`), CTranslate2's needs neither.
"""

import functools
import os
from collections.abc import Callable

PathLike = str | os.PathLike
Translator = Callable[..., list[str]]  # translate(lines, *, batch_size, num_beams, show_progress, **generate_kwargs)


def torch_translator(model_dir: PathLike, device: str | None = None) -> Translator:
    """The model folder `model_dir` (model, tokenizer and generation config, as `save_pretrained` writes them) loaded
    with transformers onto `device` (default: CUDA when available), as `translate_lines` bound to the two."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from ..inference.translate import translate_lines
    from ..model import register

    register()  # AutoModelForSeq2SeqLM knows the model
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir, trust_remote_code=False).to(device).eval()
    return functools.partial(translate_lines, model, tokenizer)


def ct2_translator(model_dir: PathLike, device: str | None = None) -> Translator:
    """The `export-ct2` folder `model_dir` loaded by CTranslate2 (`ctranslate2.search.ct2_translator`)."""
    from .ctranslate2.search import ct2_translator as load

    return load(model_dir, device)


def onnx_translator(model_dir: PathLike, device: str | None = None) -> Translator:
    """The ONNX folder `model_dir` (from `onnx.export.export_onnx`) loaded into ONNX Runtime on `device` (default: the
    CPU), as `translate_lines` bound to its model and tokenizer: the torch backend's batching and `generate()`."""
    from transformers import AutoTokenizer

    from ..inference.translate import translate_lines
    from ..model import register
    from .onnx.model import VanillaTransformerORTForConditionalGeneration

    register()  # the pipelines, and the configuration class that the ONNX folder's config.json names
    model = VanillaTransformerORTForConditionalGeneration.from_pretrained(model_dir, device=device)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    return functools.partial(translate_lines, model, tokenizer)


# How the commands run a model folder: a backend loads it (folder, device) and returns its translate function.
BACKENDS: dict[str, Callable[[PathLike, str | None], Translator]] = {
    "torch": torch_translator,
    "ct2": ct2_translator,
    "onnx": onnx_translator,
}


__all__ = ["BACKENDS", "ct2_translator", "onnx_translator", "torch_translator"]
