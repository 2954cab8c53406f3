"""Parallel corpora as a `datasets.Dataset` with one `translation` column of `{source_lang: str, target_lang: str}`, the
layout of the WMT datasets that transformers' `run_translation.py` expects.

Local files are read a line at a time into an Arrow file in the `datasets` cache, and checked as they are read, so
every error names the file and the line, and a WMT-sized corpus is never held in memory as Python objects.
"""

import contextlib
import hashlib
import json
import logging
import os
import secrets
from collections.abc import Iterator
from itertools import zip_longest
from pathlib import Path

import numpy as np

from ..extras import require
from ..paths.text_files import InvalidUTF8Error, iter_lines


class DataError(ValueError):
    """A corpus that cannot be read as sentence pairs: the message names the file, the line and what is wrong, or
    the data arguments that do not go together."""


datasets = require("datasets", extra="train")


logger = logging.getLogger(__name__)

PathLike = str | Path


def load_parallel_files(
    source_file: PathLike, target_file: PathLike, source_lang: str, target_lang: str
) -> datasets.Dataset:
    """Two aligned plain-text files (optionally `.gz`), one sentence a line, as Multi30k and most WMT releases ship."""
    return _to_dataset(_parallel_file_rows, dict(source_file=source_file, target_file=target_file), source_lang,
                       target_lang, files=[source_file, target_file])


def load_tsv(path: PathLike, source_lang: str, target_lang: str) -> datasets.Dataset:
    """A `source<TAB>target` file (optionally `.gz`)."""
    return _to_dataset(_tsv_rows, dict(path=path), source_lang, target_lang, files=[path])


def load_jsonl(path: PathLike, source_lang: str, target_lang: str) -> datasets.Dataset:
    """JSON lines (optionally `.gz`), each an object with a `translation` dict, as the WMT datasets store them."""
    return _to_dataset(_jsonl_rows, dict(path=path, source_lang=source_lang, target_lang=target_lang), source_lang,
                       target_lang, files=[path])


def load_hub_dataset(
    name: str, config_name: str | None, split: str, source_lang: str, target_lang: str
) -> datasets.Dataset:
    """A split of a Hub dataset in the WMT layout through `datasets.load_dataset`, e.g. `wmt14`, `de-en`, `train`."""
    try:
        dataset = datasets.load_dataset(name, config_name, split=split)
    except ValueError as error:  # `datasets` refuses a configuration or split the dataset does not have
        raise DataError(f"{name} ({config_name}, {split}): {error}") from error
    check_translation_languages(dataset, source_lang, target_lang, description=f"{name} ({config_name}, {split})")
    return dataset


def check_translation_languages(
    dataset: datasets.Dataset, source_lang: str, target_lang: str, description: str
) -> None:
    """Raise a `DataError` naming what is missing unless `dataset` has a `translation` column with both languages."""
    feature = dataset.features.get("translation")
    if feature is None:
        raise DataError(f"{description} has no 'translation' column (columns: {dataset.column_names})")
    if isinstance(feature, datasets.Translation):
        languages = feature.languages
    else:
        languages = list(feature) if isinstance(feature, dict) else []
    for lang in (source_lang, target_lang):
        if lang not in languages:
            raise DataError(f"{description} has no '{lang}' language in its translations (it has {languages})")


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
        raise DataError("give exactly one of source_file + target_file, pairs_file or dataset_name")
    if given[0]:
        if source_file is None or target_file is None:
            raise DataError("source_file and target_file go together")
        return load_parallel_files(source_file, target_file, source_lang, target_lang)
    if dataset_name is not None:
        return load_hub_dataset(dataset_name, dataset_config_name, split, source_lang, target_lang)
    suffix = str(pairs_file).removesuffix(".gz")
    if suffix.endswith(".tsv"):
        return load_tsv(pairs_file, source_lang, target_lang)
    if suffix.endswith(".jsonl"):
        return load_jsonl(pairs_file, source_lang, target_lang)
    raise DataError(f"{pairs_file}: expected a .tsv or .jsonl file (optionally .gz)")


def sample_pairs(dataset: datasets.Dataset, max_pairs: int | None, seed: int = 0) -> datasets.Dataset:
    """At most `max_pairs` pairs of `dataset`, drawn at random without replacement and kept in corpus order (all of
    them when it holds no more): what the BPE vocabulary is learnt from. A vocabulary of ~37,000 merges is learnt as
    well from a million pairs as from 4.5 million, in a fraction of the time."""
    if not max_pairs or len(dataset) <= max_pairs:
        return dataset
    indices = np.sort(np.random.default_rng(seed).choice(len(dataset), size=max_pairs, replace=False))
    logger.info(f"Learning the vocabulary from {max_pairs:,} of the {len(dataset):,} training pairs")
    return dataset.select(indices)


def pair_texts(dataset: datasets.Dataset, source_lang: str, target_lang: str, batch_size: int = 10_000) -> Iterator[str]:
    """The sentences of `dataset`'s `translation` pairs, source then target for each pair in corpus order, read from
    Arrow `batch_size` pairs at a time: what the BPE vocabulary is learnt from. Reading the column row by row builds a
    Python dict per pair, which costs more than learning from it."""
    for batch in dataset.with_format("arrow").iter(batch_size=batch_size):
        pairs = batch.column("translation").combine_chunks()
        for source, target in zip(pairs.field(source_lang).to_pylist(), pairs.field(target_lang).to_pylist()):
            yield source
            yield target


def default_num_proc(num_pairs: int, threshold: int = 100_000) -> int | None:
    """Processes to tokenize and filter `num_pairs` pairs: one per core for a corpus of `threshold` pairs and more
    (the tokenizer's own threads speed up encoding, not the Python and Arrow work around it), else one (starting
    processes costs more than it saves)."""
    return (os.cpu_count() or 1) if num_pairs >= threshold else None


@contextlib.contextmanager
def single_threaded_tokenizers(num_proc: int | None) -> Iterator[None]:
    """While `num_proc` processes tokenize (two or more), each encodes on one thread: the tokenizer's own threads,
    one per core in every process, would run num_proc times as many threads as there are cores and slow the whole
    map down. `tokenizers` turns its threads off in a forked process by itself only when the parent had used them
    before (a tokenizer trained in the process), not for one loaded from a folder. Sets TOKENIZERS_PARALLELISM=false
    for the block, which the processes forked in it inherit, and restores it afterwards."""
    if not num_proc or num_proc < 2:
        yield
        return
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if saved is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved


def log_dropped_pairs(pairs: int, kept: int, max_source_length: int, max_target_length: int) -> None:
    """Warn how many of `pairs` sentence pairs were dropped as over-long, if any."""
    if pairs > kept:
        logger.warning(
            f"Dropped {pairs - kept} of {pairs} sentence pairs longer than {max_source_length} source or "
            f"{max_target_length} target tokens"
        )


# --- Reading: (line number, source, target) rows, one line at a time ------------------------------------------------


def _parallel_file_rows(source_file: PathLike, target_file: PathLike) -> Iterator[tuple[int, str, str]]:
    source_count = target_count = 0
    for number, (source, target) in enumerate(zip_longest(iter_lines(source_file), iter_lines(target_file)), 1):
        source_count += source is not None
        target_count += target is not None
        if source is not None and target is not None:
            yield number, source, target
        # Past the end of one file, the other is read on only to count its lines.
    for path, count in ((source_file, source_count), (target_file, target_count)):
        if count == 0:
            raise DataError(f"{path} is empty")
    if source_count != target_count:
        raise DataError(
            f"{source_file} has {source_count} lines but {target_file} has {target_count}; "
            "parallel files must be aligned line by line"
        )


def _tsv_rows(path: PathLike) -> Iterator[tuple[int, str, str]]:
    number = 0
    for number, line in enumerate(iter_lines(path), 1):
        fields = line.split("\t")
        if len(fields) != 2:
            if not line.strip():
                fields = ["", ""]  # a blank line: skipped like an empty pair
            else:
                raise DataError(f"{path}, line {number}: expected one tab, found {len(fields) - 1}")
        yield number, fields[0], fields[1]
    if number == 0:
        raise DataError(f"{path} is empty")


def _jsonl_rows(path: PathLike, source_lang: str, target_lang: str) -> Iterator[tuple[int, str, str]]:
    number = 0
    for number, line in enumerate(iter_lines(path), 1):
        if not line.strip():
            yield number, "", ""
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataError(f"{path}, line {number}: invalid JSON ({error.msg})") from error
        translation = record.get("translation") if isinstance(record, dict) else None
        if not isinstance(translation, dict):
            raise DataError(f"{path}, line {number}: expected a JSON object with a 'translation' dict")
        for lang in (source_lang, target_lang):
            if lang not in translation:
                raise DataError(f"{path}, line {number}: the translation has no '{lang}' key")
            if not isinstance(translation[lang], str):
                raise DataError(f"{path}, line {number}: translation['{lang}'] is not a string")
        yield number, translation[source_lang], translation[target_lang]
    if number == 0:
        raise DataError(f"{path} is empty")


def _translations(rows, rows_kwargs: dict, source_lang: str, target_lang: str, source_name: str, target_name: str):
    """The `translation` records of the rows: pairs empty on both sides are skipped and counted, pairs empty on one
    side are an error."""
    skipped = kept = 0
    for number, source, target in rows(**rows_kwargs):
        source, target = source.strip(), target.strip()
        if not source and not target:
            skipped += 1
        elif not source or not target:
            empty_file, lang = (source_name, source_lang) if not source else (target_name, target_lang)
            raise DataError(f"{empty_file}, line {number}: empty '{lang}' sentence in a non-empty pair")
        else:
            kept += 1
            yield {"translation": {source_lang: source, target_lang: target}}
    if skipped:
        logger.warning(f"Skipped {skipped} empty sentence pair(s) in {_describe(source_name, target_name)}")
    if not kept:
        raise DataError(f"{_describe(source_name, target_name)} holds no sentence pairs")


def _to_dataset(rows, rows_kwargs: dict, source_lang: str, target_lang: str, files: list[PathLike]) -> datasets.Dataset:
    """The dataset of the `translation` records of `rows(**rows_kwargs)`, written to an Arrow file in the `datasets`
    cache a batch at a time, so a corpus of millions of pairs is never held in memory as Python objects and later
    steps (`map`, `filter`) read it memory-mapped. The cache is reused while the files are unchanged (same paths,
    sizes and modification times); an error reading a file is raised as the `DataError` or `OSError` that names it."""
    names = [str(path) for path in files]
    source_name, target_name = names[0], names[-1]
    features = datasets.Features({"translation": datasets.Translation(languages=[source_lang, target_lang])})
    try:
        return datasets.Dataset.from_generator(
            _translations,
            features=features,
            gen_kwargs=dict(rows=rows, rows_kwargs=rows_kwargs, source_lang=source_lang, target_lang=target_lang,
                            source_name=source_name, target_name=target_name),
            fingerprint=_files_fingerprint(rows.__name__, files, source_lang, target_lang),
        )
    except datasets.exceptions.DatasetGenerationError as error:
        if isinstance(error.__cause__, (DataError, InvalidUTF8Error, OSError, EOFError)):
            raise error.__cause__ from None
        raise


def _files_fingerprint(kind: str, files: list[PathLike], *languages: str) -> str:
    """An id for the cached dataset of `files`, new whenever one of them changes; standard input is never reused."""
    parts = [kind, *languages]
    for path in files:
        if str(path) == "-":
            return secrets.token_hex(16)
        stat = os.stat(path)  # a missing file raises FileNotFoundError, naming it
        parts += [os.path.abspath(path), str(stat.st_size), str(stat.st_mtime_ns)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _describe(source_name: PathLike, target_name: PathLike) -> str:
    return str(source_name) if source_name == target_name else f"{source_name} / {target_name}"
