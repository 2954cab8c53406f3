"""Saved model folders checked before loading: the files a command needs are there and whole, and the tokenizer fits
the model. A folder without tokenizer files is named as such, not blamed on a missing sentencepiece."""

import os
from pathlib import Path

from ..errors import UserError, describe, user_errors
from .files import file_problem

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
GENERATION_CONFIG = "generation_config.json"  # optional: without it, the model's own decoding defaults
CT2_WEIGHTS = "model.bin"  # what CTranslate2's converters write
ONNX_ENCODER = "encoder_model.onnx"  # what export-onnx writes, among others


class ModelFolderError(UserError):
    """A model folder that cannot be used as asked (`folder`); the message says what is wrong with it."""

    def __init__(self, folder: str | os.PathLike, message: str):
        super().__init__(message)
        self.folder = folder


class ExportFolderError(ModelFolderError):
    """An export folder given where a transformers model folder is needed: `backend` ("ct2", "onnx") runs it."""

    def __init__(self, folder: str | os.PathLike, backend: str):
        kind, command = {"ct2": ("a CTranslate2", "export-ct2"), "onnx": ("an ONNX", "export-onnx")}[backend]
        super().__init__(folder, f"{folder} is {kind} folder (from {command})")
        self.backend = backend


def is_model_folder(folder: str | os.PathLike) -> bool:
    """Whether `folder` holds a transformers model: its config.json and weights."""
    folder = Path(folder)
    return (folder / "config.json").is_file() and any((folder / name).is_file() for name in WEIGHT_FILES)


def check_model_folder(value: str, *, config: bool = True, weights: bool = True, tokenizer: bool = True) -> None:
    """A `ModelFolderError` unless the folder `value` holds the files asked for (`config.json`, weights, tokenizer
    files), whole; an export folder given for a transformers one is an `ExportFolderError`, which names its backend."""
    folder = Path(value)
    if config and not (folder / "config.json").is_file():
        raise ModelFolderError(value, f"{value} has no config.json: it is not a saved model folder")
    if weights and not any((folder / name).is_file() for name in WEIGHT_FILES):
        if (folder / CT2_WEIGHTS).is_file():
            raise ExportFolderError(value, "ct2")
        if (folder / ONNX_ENCODER).is_file():
            raise ExportFolderError(value, "onnx")
        raise ModelFolderError(value, f"{value} has no model weights ({WEIGHT_FILES[0]})")
    if tokenizer and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ModelFolderError(value, f"{value} has no tokenizer files ({' or '.join(TOKENIZER_FILES)})")
    check_model_files(folder, [*(["config.json", GENERATION_CONFIG] if config else []),
                               *(WEIGHT_FILES[:2] if weights else []), *(TOKENIZER_FILES if tokenizer else [])])


def check_model_files(folder: str | os.PathLike, names) -> None:
    """A `ModelFolderError` naming the first of the files `names` of `folder` that is truncated or garbled."""
    for name in names:
        if (Path(folder) / name).is_file() and (problem := file_problem(Path(folder) / name)) is not None:
            raise ModelFolderError(folder, problem)


# The special tokens a tokenizer and its model must agree on: the tokenizer's attribute and the config's keys.
SPECIAL_TOKEN_IDS = (
    ("pad_token_id", ("pad_token_id",)),
    ("eos_token_id", ("eos_token_id",)),
    ("bos_token_id", ("bos_token_id", "decoder_start_token_id")),
)


def check_tokenizer_fits(model: str, tokenizer: str | None = None) -> None:
    """A `ModelFolderError` unless the tokenizer (in `tokenizer`, else in `model`) fits the model saved in `model`: each
    of its ids has a row of the embedding (section 3.4: one matrix of `vocab_size` rows), and its padding, end and start
    ids are the model's. A model and a tokenizer that were not trained together would otherwise fail deep in torch, or
    translate into nonsense. Local folders only: a Hub model is checked by the library that fetches it."""
    if not (Path(model) / "config.json").is_file() or tokenizer is not None and not Path(tokenizer).is_dir():
        return
    from transformers import AutoTokenizer, PretrainedConfig

    tokenizer = tokenizer or model
    with user_errors(OSError, ValueError):
        config = PretrainedConfig.get_config_dict(model)[0]
    keys = ["vocab_size", *(key for _, keys in SPECIAL_TOKEN_IDS for key in keys)]
    if all(config.get(key) is None for key in keys):
        return  # nothing to hold the tokenizer against
    try:
        loaded = AutoTokenizer.from_pretrained(tokenizer, trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError) as error:  # transformers reading files that are not a tokenizer's
        raise ModelFolderError(tokenizer, f"cannot read the tokenizer in {tokenizer}: {describe(error)}") from error
    where = "its tokenizer" if tokenizer == model else f"the tokenizer {tokenizer}"
    vocab_size = config.get("vocab_size")
    if vocab_size is not None and len(loaded) > vocab_size:
        raise ModelFolderError(
            model, f"{where} has {len(loaded):,} tokens but the model {model} has {vocab_size:,} embedding rows "
            "(vocab_size): they were not made together"
        )
    for attribute, keys in SPECIAL_TOKEN_IDS:
        token_id = getattr(loaded, attribute)
        for key in keys:
            if token_id is not None and config.get(key) is not None and config[key] != token_id:
                raise ModelFolderError(
                    model, f"{where} has {attribute} {token_id} but the model {model} has {key} {config[key]}: they "
                    "were not made together"
                )


__all__ = [
    "TOKENIZER_FILES",
    "WEIGHT_FILES",
    "ExportFolderError",
    "ModelFolderError",
    "check_model_files",
    "check_model_folder",
    "check_tokenizer_fits",
    "is_model_folder",
]
