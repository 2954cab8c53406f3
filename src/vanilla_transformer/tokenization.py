"""Section 5.1's shared source/target BPE vocabulary (about 37,000 tokens for En-De) as a Hugging Face tokenizer."""

import gzip
import os
from collections.abc import Iterable, Iterator
from itertools import chain
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast


# Their order gives the ids of `VanillaTransformerConfig`: pad 0, bos (= decoder start) 1, eos 2.
PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK]


def train_tokenizer(
    texts_or_files: Iterable[str] | list[os.PathLike],
    vocab_size: int = 37000,
    min_frequency: int = 2,
    show_progress: bool = True,
) -> PreTrainedTokenizerFast:
    """
    Train one byte-level BPE vocabulary for both languages and wrap it as a `PreTrainedTokenizerFast`.

    `texts_or_files` is either a list of `pathlib.Path`s to plain-text files, one sentence a line (`.gz` read as
    gzip), or any iterable of sentences (`str`). Give it both languages, e.g. the lines of a `datasets` translation
    split with `(text for row in dataset for text in row["translation"].values())`.

    Every encoding, source or `text_target`, ends with `</s>`; `decode(ids, skip_special_tokens=True)` gives back
    the NFC form of the text exactly. `save_pretrained` writes a folder that `AutoTokenizer.from_pretrained` loads.
    """
    texts = (text for text in _texts(texts_or_files) if text)
    first_text = next(texts, None)
    if first_text is None:
        raise ValueError("No text to train the tokenizer on: every file or sentence given is empty.")
    if not isinstance(first_text, str):
        raise TypeError(
            f"Expected sentences (str), got {type(first_text).__name__}; for translation pairs pass "
            '`(text for row in dataset for text in row["translation"].values())`.'
        )

    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    # NFC only merges equivalent encodings of a character; NFKC would also turn the no-break spaces of Multi30k
    # German ("120\xa0cm") into spaces, and decoding would no longer give back the original line.
    tokenizer.normalizer = normalizers.NFC()
    # Byte-level: every string is a sequence of its UTF-8 bytes, all 256 of which are in the vocabulary, so nothing
    # is ever <unk> and the decoder restores spaces, casing and punctuation exactly. No prefix space is added, so
    # the decoded text gains none.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}",
        pair=f"$A {EOS} $B:1 {EOS}:1",
        special_tokens=[(EOS, SPECIAL_TOKENS.index(EOS))],
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        show_progress=show_progress,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(chain([first_text], texts), trainer=trainer)

    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        # The learned position table's default length; sinusoidal positions have no limit.
        model_max_length=1024,
        padding_side="right",
    )


def _texts(texts_or_files: Iterable[str] | list[os.PathLike]) -> Iterable[str]:
    """The sentences of `texts_or_files`, read lazily from its files if it is a list of paths."""
    if isinstance(texts_or_files, (str, os.PathLike)):
        raise TypeError(f"Expected a list of file paths or an iterable of sentences, got {texts_or_files!r} alone.")
    if not isinstance(texts_or_files, (list, tuple)):
        return texts_or_files
    if not texts_or_files:
        raise ValueError("No text to train the tokenizer on: the list of sentences or files is empty.")
    first = texts_or_files[0]
    if isinstance(first, str) and os.path.isfile(first):
        # Strings are sentences; reading this one as a sentence would silently train on a file name.
        raise TypeError(f"{first!r} names a file: pass file paths as `pathlib.Path`, strings are read as text.")
    if not isinstance(first, os.PathLike):
        return texts_or_files
    paths = [Path(path) for path in texts_or_files]
    # Checked before training starts, not when the reader reaches the file minutes later.
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"Tokenizer training file not found: {path}")
    return _read_lines(paths)


def _read_lines(paths: list[Path]) -> Iterator[str]:
    """The lines of each file in turn, without their line breaks."""
    for path in paths:
        with (gzip.open if path.suffix == ".gz" else open)(path, "rt", encoding="utf-8") as lines:
            yield from (line.rstrip("\n") for line in lines)


__all__ = ["SPECIAL_TOKENS", "train_tokenizer"]
