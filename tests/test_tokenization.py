import gzip
import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from vanilla_transformer import VanillaTransformerConfig
from vanilla_transformer.tokenization import SPECIAL_TOKENS, train_tokenizer


# Multi30k sits beside the repository, here and in CI: gzip, one sentence a line.
MULTI30K = Path(__file__).parents[1].parent / "shared" / "data" / "multi30k"

CORPUS = [
    "A man rides a bike down the street.",
    "Ein Mann fährt mit dem Fahrrad die Straße hinunter.",
    "Two dogs play in the snow.",
    "Zwei Hunde spielen im Schnee.",
    "A woman in a red dress is singing.",
    "Eine Frau in einem roten Kleid singt.",
] * 3

# Spacing, casing and characters the corpus never shows: byte-level BPE must give all of them back.
HARD_TEXTS = [
    "  Two  spaces, a tab\tand a trailing space ",
    "UPPER lower MiXeD , spaced out .",
    "Der Durchmesser beträgt ca. 120\xa0cm.",
    "Ünïcödé ß, 中文, emoji 🙂 and an apostrophe: don't",
    "x",
]


def read_lines(path):
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        return lines.read().splitlines()


def bpe_model(tokenizer):
    return json.loads(tokenizer.backend_tokenizer.to_str())["model"]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(CORPUS, vocab_size=300, show_progress=False)


@pytest.fixture(scope="module")
def multi30k_tokenizer():
    if not MULTI30K.is_dir():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    train = read_lines(MULTI30K / "train.en.gz")[:5000] + read_lines(MULTI30K / "train.de.gz")[:5000]
    return train_tokenizer(train, vocab_size=2000, show_progress=False)


def test_special_tokens_have_the_config_ids(tokenizer):
    config = VanillaTransformerConfig()
    assert tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS) == [0, 1, 2, 3]
    assert tokenizer.pad_token_id == config.pad_token_id == 0
    assert tokenizer.bos_token_id == config.bos_token_id == config.decoder_start_token_id == 1
    assert tokenizer.eos_token_id == config.eos_token_id == 2
    assert tokenizer.unk_token_id == 3
    assert len(tokenizer) == 300


def test_eos_ends_source_and_target(tokenizer):
    encoding = tokenizer("Two dogs play.", text_target="Zwei Hunde spielen.")
    for ids in [encoding["input_ids"], encoding["labels"]]:
        assert ids[-1] == tokenizer.eos_token_id
        assert ids.count(tokenizer.eos_token_id) == 1
        assert tokenizer.bos_token_id not in ids


def test_text_target_batch_pads_with_pad_id(tokenizer):
    sources = ["A man.", "Two dogs play in the snow."]
    targets = ["Zwei Hunde spielen im Schnee.", "Ein Mann."]
    batch = tokenizer(sources, text_target=targets, padding=True, return_tensors="pt")

    for ids, mask in [
        (batch["input_ids"], batch["attention_mask"]),
        (batch["labels"], batch["labels"] != tokenizer.pad_token_id),
    ]:
        lengths = mask.sum(dim=1)
        assert lengths[0] != lengths[1] and ids.shape[1] == lengths.max()
        for row, length in zip(ids, lengths):
            assert row[length - 1] == tokenizer.eos_token_id
            assert (row[length:] == 0).all()
    assert tokenizer.batch_decode(batch["labels"], skip_special_tokens=True) == targets


def test_round_trip_is_exact_without_unk(tokenizer):
    for text in CORPUS + HARD_TEXTS:
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.unk_token_id not in ids
        assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_truncation_keeps_eos(tokenizer):
    ids = tokenizer("snow " * 2000, truncation=True)["input_ids"]
    assert len(ids) == tokenizer.model_max_length == 1024
    assert ids[-1] == tokenizer.eos_token_id


def test_save_and_auto_load_behave_identically(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)

    texts = CORPUS[:4] + HARD_TEXTS
    expected = tokenizer(texts, text_target=texts[::-1], padding=True)
    assert loaded(texts, text_target=texts[::-1], padding=True) == expected
    assert loaded.batch_decode(expected["input_ids"], skip_special_tokens=True) == texts
    assert loaded.convert_tokens_to_ids(SPECIAL_TOKENS) == [0, 1, 2, 3]
    assert loaded.all_special_ids == tokenizer.all_special_ids
    assert loaded.get_vocab() == tokenizer.get_vocab()
    assert (loaded.model_max_length, loaded.padding_side) == (1024, "right")


def test_files_iterables_and_dataset_pairs_give_the_same_tokenizer(tokenizer, tmp_path):
    from datasets import Dataset

    english, german = CORPUS[0::2], CORPUS[1::2]
    (tmp_path / "train.en").write_text("\n".join(english) + "\n", encoding="utf-8")
    with gzip.open(tmp_path / "train.de.gz", "wt", encoding="utf-8") as lines:
        lines.write("\n".join(german) + "\n")
    pairs = Dataset.from_dict({"translation": [{"en": en, "de": de} for en, de in zip(english, german)]})

    trained = [
        train_tokenizer([tmp_path / "train.en", tmp_path / "train.de.gz"], vocab_size=300, show_progress=False),
        train_tokenizer((text for text in english + german), vocab_size=300, show_progress=False),
        train_tokenizer(
            (text for row in pairs for text in row["translation"].values()), vocab_size=300, show_progress=False
        ),
    ]
    for other in trained:
        # The BPE model is the vocabulary and its merges, in order.
        assert bpe_model(other) == bpe_model(tokenizer)


def test_bad_input_raises_clear_errors(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    missing = tmp_path / "missing.de.gz"

    with pytest.raises(ValueError, match="empty"):
        train_tokenizer([], show_progress=False)
    with pytest.raises(ValueError, match="empty"):
        train_tokenizer([empty], show_progress=False)
    with pytest.raises(ValueError, match="empty"):
        train_tokenizer(iter(["", ""]), show_progress=False)
    with pytest.raises(FileNotFoundError, match="missing.de.gz"):
        train_tokenizer([empty, missing], show_progress=False)
    with pytest.raises(TypeError, match="pathlib.Path"):
        train_tokenizer([str(empty)], show_progress=False)
    with pytest.raises(TypeError, match="alone"):
        train_tokenizer(empty, show_progress=False)
    with pytest.raises(TypeError, match='row\\["translation"\\]'):
        train_tokenizer([{"en": "A man.", "de": "Ein Mann."}], show_progress=False)


@pytest.mark.parametrize("language", ["en", "de"])
def test_multi30k_val_round_trip_is_exact(multi30k_tokenizer, language):
    lines = read_lines(MULTI30K / f"val.{language}.gz")
    assert len(lines) == 1014
    encoded = multi30k_tokenizer(lines)["input_ids"]
    assert all(ids[-1] == multi30k_tokenizer.eos_token_id for ids in encoded)
    decoded = multi30k_tokenizer.batch_decode(encoded, skip_special_tokens=True)
    assert [(line, text) for line, text in zip(lines, decoded) if line != text] == []
