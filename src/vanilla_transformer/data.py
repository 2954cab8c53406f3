"""Parallel corpora as a `datasets.Dataset` with one `translation` column of `{source_lang: str, target_lang: str}`, the
layout of the WMT datasets that transformers' `run_translation.py` expects.

Local files are read whole into memory and checked line by line, so every error names the file and the line.
"""

import json
import logging
from collections.abc import Iterable
from pathlib import Path

from .extras import require
from .text_files import read_lines


datasets = require("datasets", extra="train")


logger = logging.getLogger(__name__)

PathLike = str | Path


def load_parallel_files(
    source_file: PathLike, target_file: PathLike, source_lang: str, target_lang: str
) -> datasets.Dataset:
    """Two aligned plain-text files (optionally `.gz`), one sentence a line, as Multi30k and most WMT releases ship."""
    source_lines, target_lines = _read_lines(source_file), _read_lines(target_file)
    if len(source_lines) != len(target_lines):
        raise ValueError(
            f"{source_file} has {len(source_lines)} lines but {target_file} has {len(target_lines)}; "
            "parallel files must be aligned line by line"
        )
    rows = ((number, source, target) for number, (source, target) in enumerate(zip(source_lines, target_lines), 1))
    return _to_dataset(rows, source_lang, target_lang, source_file, target_file)


def load_tsv(path: PathLike, source_lang: str, target_lang: str) -> datasets.Dataset:
    """A `source<TAB>target` file (optionally `.gz`)."""

    def rows():
        for number, line in enumerate(_read_lines(path), 1):
            fields = line.split("\t")
            if len(fields) != 2:
                if not line.strip():
                    fields = ["", ""]  # a blank line: skipped like an empty pair
                else:
                    raise ValueError(f"{path}, line {number}: expected one tab, found {len(fields) - 1}")
            yield number, fields[0], fields[1]

    return _to_dataset(rows(), source_lang, target_lang, path, path)


def load_jsonl(path: PathLike, source_lang: str, target_lang: str) -> datasets.Dataset:
    """JSON lines (optionally `.gz`), each an object with a `translation` dict, as the WMT datasets store them."""

    def rows():
        for number, line in enumerate(_read_lines(path), 1):
            if not line.strip():
                yield number, "", ""
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}, line {number}: invalid JSON ({error.msg})") from error
            translation = record.get("translation") if isinstance(record, dict) else None
            if not isinstance(translation, dict):
                raise ValueError(f"{path}, line {number}: expected a JSON object with a 'translation' dict")
            for lang in (source_lang, target_lang):
                if lang not in translation:
                    raise ValueError(f"{path}, line {number}: the translation has no '{lang}' key")
                if not isinstance(translation[lang], str):
                    raise ValueError(f"{path}, line {number}: translation['{lang}'] is not a string")
            yield number, translation[source_lang], translation[target_lang]

    return _to_dataset(rows(), source_lang, target_lang, path, path)


def load_hub_dataset(
    name: str, config_name: str | None, split: str, source_lang: str, target_lang: str
) -> datasets.Dataset:
    """A split of a Hub dataset in the WMT layout through `datasets.load_dataset`, e.g. `wmt14`, `de-en`, `train`."""
    dataset = datasets.load_dataset(name, config_name, split=split)
    check_translation_languages(dataset, source_lang, target_lang, description=f"{name} ({config_name}, {split})")
    return dataset


def check_translation_languages(
    dataset: datasets.Dataset, source_lang: str, target_lang: str, description: str
) -> None:
    """Raise a `ValueError` naming what is missing unless `dataset` has a `translation` column with both languages."""
    feature = dataset.features.get("translation")
    if feature is None:
        raise ValueError(f"{description} has no 'translation' column (columns: {dataset.column_names})")
    if isinstance(feature, datasets.Translation):
        languages = feature.languages
    else:
        languages = list(feature) if isinstance(feature, dict) else []
    for lang in (source_lang, target_lang):
        if lang not in languages:
            raise ValueError(f"{description} has no '{lang}' language in its translations (it has {languages})")


def load_parallel_corpus(
    source_lang: str,
    target_lang: str,
    *,
    source_file: PathLike | None = None,
    target_file: PathLike | None = None,
    pairs_file: PathLike | None = None,
    dataset_name: str | None = None,
    dataset_config_name: str | None = None,
    split: str = "train",
) -> datasets.Dataset:
    """One split of a corpus from exactly one of: `source_file` + `target_file`, a `pairs_file` ending in `.tsv` or
    `.jsonl` (either optionally `.gz`), or a Hub `dataset_name` (with `dataset_config_name` and `split`)."""
    given = [source_file is not None or target_file is not None, pairs_file is not None, dataset_name is not None]
    if sum(given) != 1:
        raise ValueError("give exactly one of source_file + target_file, pairs_file or dataset_name")
    if given[0]:
        if source_file is None or target_file is None:
            raise ValueError("source_file and target_file go together")
        return load_parallel_files(source_file, target_file, source_lang, target_lang)
    if dataset_name is not None:
        return load_hub_dataset(dataset_name, dataset_config_name, split, source_lang, target_lang)
    suffix = str(pairs_file).removesuffix(".gz")
    if suffix.endswith(".tsv"):
        return load_tsv(pairs_file, source_lang, target_lang)
    if suffix.endswith(".jsonl"):
        return load_jsonl(pairs_file, source_lang, target_lang)
    raise ValueError(f"{pairs_file}: expected a .tsv or .jsonl file (optionally .gz)")


def filter_long_pairs(
    dataset: datasets.Dataset, max_source_length: int, max_target_length: int, num_proc: int | None = None
) -> datasets.Dataset:
    """Drop the pairs of a tokenized dataset whose `input_ids` exceed `max_source_length` tokens or whose `labels`
    exceed `max_target_length`, and log how many were dropped."""
    missing = [column for column in ("input_ids", "labels") if column not in dataset.column_names]
    if missing:
        raise ValueError(f"filter_long_pairs needs a tokenized dataset; it has no {missing} column(s)")
    kept = dataset.filter(
        lambda sources, targets: [
            len(source) <= max_source_length and len(target) <= max_target_length
            for source, target in zip(sources, targets)
        ],
        input_columns=["input_ids", "labels"],
        batched=True,
        num_proc=num_proc,
        desc="Filtering long pairs",
    )
    dropped = len(dataset) - len(kept)
    if dropped:
        logger.warning(
            f"Dropped {dropped} of {len(dataset)} sentence pairs longer than {max_source_length} source or "
            f"{max_target_length} target tokens"
        )
    return kept


def _read_lines(path: PathLike) -> list[str]:
    """The lines of a UTF-8 text file, `.gz` or not (`text_files.read_lines`); an empty file is an error."""
    lines = read_lines(path)
    if not lines:
        raise ValueError(f"{path} is empty")
    return lines


def _to_dataset(
    rows: Iterable[tuple[int, str, str]],
    source_lang: str,
    target_lang: str,
    source_name: PathLike,
    target_name: PathLike,
) -> datasets.Dataset:
    """The dataset of (line number, source, target) rows: pairs empty on both sides are skipped and counted, pairs
    empty on one side are an error."""
    translations, skipped = [], 0
    for number, source, target in rows:
        source, target = source.strip(), target.strip()
        if not source and not target:
            skipped += 1
        elif not source or not target:
            empty_file, lang = (source_name, source_lang) if not source else (target_name, target_lang)
            raise ValueError(f"{empty_file}, line {number}: empty '{lang}' sentence in a non-empty pair")
        else:
            translations.append({source_lang: source, target_lang: target})
    if skipped:
        logger.warning(f"Skipped {skipped} empty sentence pair(s) in {_describe(source_name, target_name)}")
    if not translations:
        raise ValueError(f"{_describe(source_name, target_name)} holds no sentence pairs")
    features = datasets.Features({"translation": datasets.Translation(languages=[source_lang, target_lang])})
    return datasets.Dataset.from_dict({"translation": translations}, features=features)


def _describe(source_name: PathLike, target_name: PathLike) -> str:
    return str(source_name) if source_name == target_name else f"{source_name} / {target_name}"
