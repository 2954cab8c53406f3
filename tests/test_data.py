"""Loading parallel corpora into the WMT `translation` layout, and the warning of over-long pairs dropped. Every test
writes its own small files in tmp_path, except one that reads the real Multi30k validation split when present."""

import gzip
import json
import logging
import os
from pathlib import Path

import pytest
from conftest import MULTI30K, requires_multi30k
from datasets import Dataset, Features, Translation

from vanilla_transformer.training import data
from vanilla_transformer.training.data import (
    check_translation_languages,
    log_dropped_pairs,
    load_hub_dataset,
    load_jsonl,
    load_parallel_corpus,
    load_parallel_files,
    load_tsv,
    pair_texts,
    sample_pairs,
)




def write(path: Path, text: str) -> Path:
    """Write UTF-8 text, gzipped when the name ends in .gz."""
    encoded = text.encode("utf-8")
    path.write_bytes(gzip.compress(encoded) if path.suffix == ".gz" else encoded)
    return path


def pairs(dataset, source_lang="en", target_lang="de"):
    return [(row[source_lang], row[target_lang]) for row in dataset["translation"]]


# --- Plain parallel files ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_parallel_files_give_the_wmt_layout(tmp_path, suffix):
    source = write(tmp_path / f"train.en{suffix}", "A dog runs.\nTwo cats\r\n")
    target = write(tmp_path / f"train.de{suffix}", "Ein Hund rennt.\nZwei Katzen\r\n")
    dataset = load_parallel_files(source, target, "en", "de")
    assert dataset.column_names == ["translation"]
    assert isinstance(dataset.features["translation"], Translation)
    assert pairs(dataset) == [("A dog runs.", "Ein Hund rennt."), ("Two cats", "Zwei Katzen")]


def test_unicode_line_separators_do_not_split_lines(tmp_path):
    # str.splitlines would cut this line in two and misalign the corpus.
    source = write(tmp_path / "s.en", "one\u2028still one\ntwo\n")
    target = write(tmp_path / "s.de", "eins\nzwei\n")
    assert pairs(load_parallel_files(source, target, "en", "de")) == [("one\u2028still one", "eins"), ("two", "zwei")]


def test_mismatched_line_counts_name_both_files_and_counts(tmp_path):
    source = write(tmp_path / "s.en", "a\nb\nc\n")
    target = write(tmp_path / "s.de", "a\nb\n")
    with pytest.raises(ValueError, match=r"s\.en has 3 lines but .*s\.de has 2"):
        load_parallel_files(source, target, "en", "de")


@pytest.mark.parametrize("empty_side", ["en", "de"])
def test_empty_file_is_named(tmp_path, empty_side):
    files = {lang: write(tmp_path / f"s.{lang}", "" if lang == empty_side else "a\n") for lang in ("en", "de")}
    with pytest.raises(ValueError, match=rf"s\.{empty_side} is empty"):
        load_parallel_files(files["en"], files["de"], "en", "de")


def test_invalid_utf8_names_file_and_line(tmp_path):
    source = write(tmp_path / "s.en", "a\nb\nc\n")
    target = tmp_path / "s.de"
    target.write_bytes(b"a\nb\n\xff\xfe broken\n")
    with pytest.raises(ValueError, match=r"s\.de: line 3 is not valid UTF-8 \(byte 0xff at column 1\)"):
        load_parallel_files(source, target, "en", "de")


def test_one_sided_empty_pair_names_file_and_line(tmp_path):
    source = write(tmp_path / "s.en", "a\nb\n")
    target = write(tmp_path / "s.de", "a\n  \n")
    with pytest.raises(ValueError, match=r"s\.de, line 2: empty 'de' sentence"):
        load_parallel_files(source, target, "en", "de")


def test_pairs_empty_on_both_sides_are_skipped_and_counted(tmp_path, caplog):
    source = write(tmp_path / "s.en", "a\n\nb\n\n")
    target = write(tmp_path / "s.de", "x\n\ny\n\n")
    with caplog.at_level(logging.WARNING, logger="vanilla_transformer.training.data"):
        dataset = load_parallel_files(source, target, "en", "de")
    assert pairs(dataset) == [("a", "x"), ("b", "y")]
    assert "Skipped 2 empty sentence pair(s)" in caplog.text


def test_corpus_is_read_into_arrow_on_disk_and_reread_when_a_file_changes(tmp_path):
    source = write(tmp_path / "s.en", "a\nb\n")
    target = write(tmp_path / "s.de", "x\ny\n")
    dataset = load_parallel_files(source, target, "en", "de")
    # Memory-mapped from the datasets cache, not held as Python objects: a WMT-sized corpus fits in memory.
    assert dataset.cache_files and all(Path(file["filename"]).is_file() for file in dataset.cache_files)
    assert pairs(load_parallel_files(source, target, "en", "de")) == [("a", "x"), ("b", "y")]
    write(target, "x\nz\n")  # same path, new content: never the stale cached copy
    assert pairs(load_parallel_files(source, target, "en", "de")) == [("a", "x"), ("b", "z")]
    write(source, "a\nb\nc\n")
    with pytest.raises(ValueError, match="has 3 lines but"):
        load_parallel_files(source, target, "en", "de")


# --- TSV and JSON lines --------------------------------------------------------------------------------------------


def test_tsv(tmp_path):
    path = write(tmp_path / "train.tsv.gz", "A dog.\tEin Hund.\nA cat.\tEine Katze.\n")
    assert pairs(load_tsv(path, "en", "de")) == [("A dog.", "Ein Hund."), ("A cat.", "Eine Katze.")]


@pytest.mark.parametrize("bad_line", ["no tab here", "one\ttwo\tthree"])
def test_tsv_line_without_exactly_one_tab_names_file_and_line(tmp_path, bad_line):
    path = write(tmp_path / "train.tsv", f"a\tb\n{bad_line}\n")
    with pytest.raises(ValueError, match=r"train\.tsv, line 2: expected one tab"):
        load_tsv(path, "en", "de")


def test_jsonl(tmp_path):
    records = [{"translation": {"de": "Ein Hund.", "en": "A dog."}}, {"translation": {"de": "Katze", "en": "Cat"}}]
    path = write(tmp_path / "train.jsonl", "".join(json.dumps(record) + "\n" for record in records))
    assert pairs(load_jsonl(path, "en", "de")) == [("A dog.", "Ein Hund."), ("Cat", "Katze")]


def test_jsonl_missing_language_names_file_line_and_key(tmp_path):
    lines = [{"translation": {"de": "a", "en": "a"}}, {"translation": {"de": "b", "fr": "b"}}]
    path = write(tmp_path / "train.jsonl", "\n".join(json.dumps(line) for line in lines))
    with pytest.raises(ValueError, match=r"train\.jsonl, line 2: the translation has no 'en' key"):
        load_jsonl(path, "en", "de")


@pytest.mark.parametrize("bad_line", ["{not json", '{"text": "a"}', "[1, 2]"])
def test_jsonl_malformed_line_names_file_and_line(tmp_path, bad_line):
    path = write(tmp_path / "train.jsonl", '{"translation": {"en": "a", "de": "b"}}\n' + bad_line + "\n")
    with pytest.raises(ValueError, match=r"train\.jsonl, line 2"):
        load_jsonl(path, "en", "de")


# --- Hub datasets (never downloaded here) --------------------------------------------------------------------------


def local_wmt_like(languages=("de", "en")):
    rows = [{lang: f"{lang} sentence" for lang in languages}]
    return Dataset.from_dict({"translation": rows}, features=Features({"translation": Translation(list(languages))}))


def test_language_check_names_the_missing_key():
    check_translation_languages(local_wmt_like(), "en", "de", description="wmt14 (de-en, train)")
    with pytest.raises(ValueError, match=r"wmt14 \(de-en, train\) has no 'fr' language"):
        check_translation_languages(local_wmt_like(), "en", "fr", description="wmt14 (de-en, train)")
    # Datasets whose translation column is a plain struct rather than a `Translation` feature are checked too.
    plain = Dataset.from_dict({"translation": [{"de": "a", "en": "b"}]})
    with pytest.raises(ValueError, match="has no 'fr' language"):
        check_translation_languages(plain, "fr", "de", description="local")
    with pytest.raises(ValueError, match="has no 'translation' column"):
        check_translation_languages(Dataset.from_dict({"text": ["a"]}), "en", "de", description="local")


def test_hub_dataset_goes_through_load_dataset_and_the_check(monkeypatch):
    calls = []

    def fake_load_dataset(name, config_name, split):
        calls.append((name, config_name, split))
        return local_wmt_like()

    monkeypatch.setattr(data.datasets, "load_dataset", fake_load_dataset)
    assert pairs(load_hub_dataset("wmt14", "de-en", "validation", "en", "de")) == [("en sentence", "de sentence")]
    with pytest.raises(ValueError, match=r"wmt14 \(de-en, train\) has no 'fr' language"):
        load_hub_dataset("wmt14", "de-en", "train", "fr", "de")
    assert calls == [("wmt14", "de-en", "validation"), ("wmt14", "de-en", "train")]


# --- The one entry point of the training command --------------------------------------------------------------------


def test_load_parallel_corpus_dispatches_on_its_arguments(tmp_path, monkeypatch):
    expected = [("A dog.", "Ein Hund.")]
    source, target = write(tmp_path / "s.en", "A dog.\n"), write(tmp_path / "s.de", "Ein Hund.\n")
    tsv = write(tmp_path / "train.tsv", "A dog.\tEin Hund.\n")
    jsonl = write(tmp_path / "train.jsonl.gz", json.dumps({"translation": {"en": "A dog.", "de": "Ein Hund."}}))
    monkeypatch.setattr(data.datasets, "load_dataset", lambda name, config, split: local_wmt_like())

    assert pairs(load_parallel_corpus("en", "de", source_file=source, target_file=target)) == expected
    assert pairs(load_parallel_corpus("en", "de", pairs_file=tsv)) == expected
    assert pairs(load_parallel_corpus("en", "de", pairs_file=jsonl)) == expected
    assert pairs(load_parallel_corpus("en", "de", dataset_name="wmt14", dataset_config_name="de-en")) == [
        ("en sentence", "de sentence")
    ]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "exactly one of"),
        ({"pairs_file": "a.tsv", "dataset_name": "wmt14"}, "exactly one of"),
        ({"source_file": "a.en"}, "go together"),
        ({"pairs_file": "train.csv"}, r"train\.csv: expected a \.tsv or \.jsonl"),
    ],
)
def test_load_parallel_corpus_rejects_unclear_requests(kwargs, message):
    with pytest.raises(ValueError, match=message):
        load_parallel_corpus("en", "de", **kwargs)


# --- Over-long pairs dropped ---------------------------------------------------------------------------------------


def test_dropped_pairs_are_counted_in_a_warning_and_none_dropped_is_silent(caplog):
    with caplog.at_level(logging.WARNING, logger="vanilla_transformer.training.data"):
        log_dropped_pairs(4, 2, max_source_length=5, max_target_length=6)
    assert "Dropped 2 of 4 sentence pairs longer than 5 source or" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vanilla_transformer.training.data"):
        log_dropped_pairs(4, 4, 5, 6)
    assert caplog.text == ""


# --- The pairs the vocabulary is learnt from ------------------------------------------------------------------------


def numbered_pairs(count):
    return Dataset.from_dict({"translation": [{"en": f"one {n}", "de": f"eins {n}"} for n in range(count)]})


def test_sample_pairs_draws_distinct_pairs_in_corpus_order():
    corpus = numbered_pairs(1000)
    sample = sample_pairs(corpus, 100, seed=3)
    numbers = [int(pair["en"].split()[1]) for pair in sample["translation"]]
    assert len(numbers) == 100 and numbers == sorted(set(numbers))
    assert numbers != list(range(100))  # drawn across the corpus, not its head
    assert pairs(sample) == pairs(sample_pairs(corpus, 100, seed=3))  # the seed decides
    assert pairs(sample) != pairs(sample_pairs(corpus, 100, seed=4))
    assert sample_pairs(corpus, 1000) is corpus and sample_pairs(corpus, None) is corpus


def test_pair_texts_gives_source_then_target_of_each_pair_in_order():
    corpus = numbered_pairs(25)
    expected = [text for pair in corpus["translation"] for text in (pair["en"], pair["de"])]
    assert list(pair_texts(corpus, "en", "de", batch_size=7)) == expected
    # Through a selection (an indices mapping), as `sample_pairs` gives it.
    selected = corpus.select([20, 3, 11])
    assert list(pair_texts(selected, "en", "de", batch_size=2)) == ["one 20", "eins 20", "one 3", "eins 3",
                                                                    "one 11", "eins 11"]
    assert list(pair_texts(corpus, "de", "en"))[:2] == ["eins 0", "one 0"]


# --- The real corpus -------------------------------------------------------------------------------------------------


@requires_multi30k
def test_real_multi30k_validation_split():
    dataset = load_parallel_files(MULTI30K / "val.en.gz", MULTI30K / "val.de.gz", "en", "de")
    assert len(dataset) == 1014
    assert dataset[0]["translation"] == {
        "en": "A group of men are loading cotton onto a truck",
        "de": "Eine Gruppe von Männern lädt Baumwolle auf einen Lastwagen",
    }


# --- Several processes tokenizing -----------------------------------------------------------------------------------


@pytest.mark.parametrize("before", [None, "true"])
def test_single_threaded_tokenizers_sets_and_restores_the_variable(monkeypatch, before):
    if before is None:
        monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    else:
        monkeypatch.setenv("TOKENIZERS_PARALLELISM", before)
    for num_proc in (None, 1):  # one process keeps the tokenizer's own threads
        with data.single_threaded_tokenizers(num_proc):
            assert os.environ.get("TOKENIZERS_PARALLELISM") == before
    with pytest.raises(RuntimeError):
        with data.single_threaded_tokenizers(2):
            assert os.environ["TOKENIZERS_PARALLELISM"] == "false"
            raise RuntimeError("the block fails")
    assert os.environ.get("TOKENIZERS_PARALLELISM") == before


def test_the_train_command_tokenizes_in_several_processes_one_thread_each(tokenizer_dir, tmp_path, monkeypatch):
    """A tokenizer loaded from a folder has not used its threads in this process, so `tokenizers` would leave them on
    in the forked processes: the command turns them off while its processes tokenize."""
    from num2words import num2words

    import vanilla_transformer.train_run.run as train_command

    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    seen = []
    original_map = Dataset.map

    def map_recording(self, function=None, *args, num_proc=None, **kwargs):
        seen.append((num_proc, os.environ.get("TOKENIZERS_PARALLELISM")))
        return original_map(self, function, *args, num_proc=num_proc, **kwargs)

    monkeypatch.setattr(Dataset, "map", map_recording)
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"{num2words(n)}\t{num2words(n, lang='fr')}\n" for n in range(1200)), encoding="utf-8")
    train_command.main([
        "--train_file", str(pairs), "--source_lang", "en", "--target_lang", "fr", "--tokenizer_name",
        str(tokenizer_dir), "--preset", "tiny", "--max_tokens", "256", "--warmup_steps", "1", "--max_steps", "1",
        "--save_strategy", "no", "--predict_with_generate", "false", "--use_cpu", "true", "--report_to", "none",
        "--preprocessing_num_workers", "2", "--output_dir", str(tmp_path / "run"), "--disable_tqdm", "true",
    ])
    assert (2, "false") in seen
    assert all(variable == "false" for num_proc, variable in seen if num_proc and num_proc > 1)
    assert "TOKENIZERS_PARALLELISM" not in os.environ
