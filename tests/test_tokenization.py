import gzip
import json
import random
from collections import Counter

import numpy as np
import pytest
from conftest import MULTI30K
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from vanilla_transformer import VanillaTransformerConfig
from vanilla_transformer.paths.text_files import InvalidUTF8Error, read_lines
from vanilla_transformer.training.tokenization import SPECIAL_TOKENS, BPEDropout, train_tokenizer


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


def bpe_model(tokenizer):
    return json.loads(tokenizer.backend_tokenizer.to_str())["model"]


@pytest.fixture(scope="module")
def tokenizer():
    """This module's own BPE, learnt from CORPUS (it stands in for conftest's number-words `tokenizer` here)."""
    return train_tokenizer(CORPUS, vocab_size=300, show_progress=False)


@pytest.fixture(scope="module")
def multi30k_tokenizer(multi30k):
    """A BPE of 2,000 tokens learnt from the first 5,000 Multi30k training sentences of each side (skipped without
    Multi30k)."""
    train = read_lines(multi30k / "train.en.gz")[:5000] + read_lines(multi30k / "train.de.gz")[:5000]
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
    broken = tmp_path / "broken.en"
    broken.write_bytes(b"A man.\nTwo \xe9 dogs.\n")
    with pytest.raises(InvalidUTF8Error, match=r"broken\.en: line 2 is not valid UTF-8 \(byte 0xe9 at column 5\)"):
        train_tokenizer([broken], show_progress=False)


@pytest.mark.parametrize("language", ["en", "de"])
def test_multi30k_val_round_trip_is_exact(multi30k_tokenizer, language):
    lines = read_lines(MULTI30K / f"val.{language}.gz")
    assert len(lines) == 1014
    encoded = multi30k_tokenizer(lines)["input_ids"]
    assert all(ids[-1] == multi30k_tokenizer.eos_token_id for ids in encoded)
    decoded = multi30k_tokenizer.batch_decode(encoded, skip_special_tokens=True)
    assert [(line, text) for line, text in zip(lines, decoded) if line != text] == []


# BPE-dropout (Provilkov et al., 2020): not in the paper, an option of the training pairs.


def toy_bpe_tokenizer():
    """A byte-level BPE over "a", "b", "c" with the merges a+b (rank 0), b+c (rank 1) and ab+c (rank 2)."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + ["a", "b", "c", "ab", "bc", "abc"])}
    backend = Tokenizer(models.BPE(vocab, [("a", "b"), ("b", "c"), ("ab", "c")], unk_token="<unk>"))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", pad_token="<pad>")


def test_bpe_dropout_draws_segmentations_with_the_probabilities_of_algorithm_1():
    # Algorithm 1: each step drops every applicable merge with probability p and applies the best one left; the
    # word is done when none is left. For "abc": a+b kept (1 - p), then ab+c kept (1 - p) -> abc, (1 - p)^2;
    # a+b kept, ab+c dropped -> ab c, (1 - p) p; a+b dropped, b+c kept -> a bc (no merge left), p (1 - p);
    # both dropped -> a b c, p^2.
    tokenizer, p, draws = toy_bpe_tokenizer(), 0.3, 20000
    segmentations = BPEDropout(tokenizer, p).encode(["abc"] * draws, np.random.default_rng(0))
    counts = Counter(tuple(tokenizer.convert_ids_to_tokens(ids[:-1])) for ids in segmentations)
    expected = {("abc",): (1 - p) ** 2, ("ab", "c"): (1 - p) * p, ("a", "bc"): p * (1 - p), ("a", "b", "c"): p**2}
    assert set(counts) == set(expected)
    for segmentation, probability in expected.items():
        standard_error = (probability * (1 - probability) / draws) ** 0.5
        assert abs(counts[segmentation] / draws - probability) < 5 * standard_error, segmentation
    assert all(ids[-1] == tokenizer.eos_token_id for ids in segmentations)


def algorithm_1(word: str, ranks: dict, p: float, rng: random.Random) -> tuple[str, ...]:
    """Provilkov et al.'s Algorithm 1 as written: each step draws for every applicable merge, applies the best one
    kept (lowest rank, leftmost), and stops when none is kept."""
    symbols = list(word)
    while True:
        kept = [(ranks[pair], i) for i, pair in enumerate(zip(symbols, symbols[1:])) if pair in ranks
                and rng.random() >= p]
        if not kept:
            return tuple(symbols)
        _, i = min(kept)
        symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]


def test_bpe_dropout_draws_real_words_as_a_direct_algorithm_1_does(multi30k_tokenizer):
    merges = bpe_model(multi30k_tokenizer)["merges"]
    ranks = {tuple(merge.split(" ") if isinstance(merge, str) else merge): rank for rank, merge in enumerate(merges)}
    dropout, draws = BPEDropout(multi30k_tokenizer, 0.1), 5000
    for word in (" Schwimmbecken", " Straßenmusiker", " skateboarding", " Feuerwehrleute"):
        (byte_level_word, _), = multi30k_tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(word)
        rng = random.Random(word)
        expected = Counter(algorithm_1(byte_level_word, ranks, 0.1, rng) for _ in range(draws))
        ids = dropout.encode([word] * draws, np.random.default_rng(0))
        drawn = Counter(tuple(multi30k_tokenizer.convert_ids_to_tokens(segmentation[:-1])) for segmentation in ids)
        total_variation = sum(abs(drawn[s] - expected[s]) for s in expected.keys() | drawn.keys()) / (2 * draws)
        assert total_variation < 0.04, word
        assert len(expected) > 3  # dropout shows on these words


def test_bpe_dropout_without_dropout_is_the_tokenizers_own_segmentation(multi30k_tokenizer):
    texts = read_lines(MULTI30K / "val.en.gz") + read_lines(MULTI30K / "val.de.gz") + HARD_TEXTS
    encoded = BPEDropout(multi30k_tokenizer, 0.0).encode(texts, np.random.default_rng(0))
    assert encoded == multi30k_tokenizer(texts)["input_ids"]


def test_bpe_dropout_segmentations_decode_to_the_text_and_follow_the_seed(multi30k_tokenizer):
    texts = read_lines(MULTI30K / "val.de.gz")[:300] + HARD_TEXTS
    dropout = BPEDropout(multi30k_tokenizer, 0.1)
    first = dropout.encode(texts, np.random.default_rng(1))
    assert first == dropout.encode(texts, np.random.default_rng(1))
    assert first != dropout.encode(texts, np.random.default_rng(2))
    for text, ids in zip(texts, first):
        assert multi30k_tokenizer.decode(ids, skip_special_tokens=True) == text
        assert max(ids) < len(multi30k_tokenizer) and ids[-1] == multi30k_tokenizer.eos_token_id
    # Fewer merges, so more tokens than without dropout, but never more than bytes.
    plain = multi30k_tokenizer(texts)["input_ids"]
    assert sum(map(len, first)) > 1.1 * sum(map(len, plain))
    assert all(len(ids) <= len(text.encode("utf-8")) + 1 for text, ids in zip(texts, first))


def test_bpe_dropout_refuses_a_bad_probability_and_a_tokenizer_that_is_not_byte_level_bpe(tokenizer):
    for p in (-0.1, 1.0, 1.5):
        with pytest.raises(ValueError, match="BPE-dropout probability must be in \\[0, 1\\)"):
            BPEDropout(tokenizer, p)
    word_level = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>"))
    word_level.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    with pytest.raises(ValueError, match="needs a byte-level BPE tokenizer.*WordLevel model"):
        BPEDropout(PreTrainedTokenizerFast(tokenizer_object=word_level), 0.1)


def test_a_vocabulary_smaller_than_the_alphabet_and_specials_is_refused():
    with pytest.raises(ValueError, match="vocab_size 259 is too small: the byte alphabet \\(256\\) and the 4 special"):
        train_tokenizer(["a b c"], vocab_size=259, show_progress=False)
    assert len(train_tokenizer(["a b c"], vocab_size=260, show_progress=False)) == 260
