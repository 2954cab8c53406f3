"""Section 5.1's shared source/target BPE vocabulary (about 37,000 tokens for En-De) as a Hugging Face tokenizer."""

import json
import os
from collections.abc import Iterable
from itertools import chain
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from ..paths.text_files import iter_lines


# Their order gives the ids of `VanillaTransformerConfig`: pad 0, bos (= decoder start) 1, eos 2.
PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK]
# The smallest vocabulary: the 256 bytes of the byte-level alphabet and the special tokens, before any merge.
SMALLEST_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)


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
    if vocab_size < SMALLEST_VOCAB_SIZE:  # the trainer would quietly give the alphabet and specials anyway
        raise ValueError(
            f"vocab_size {vocab_size} is too small: the byte alphabet (256) and the {len(SPECIAL_TOKENS)} special "
            f"tokens need {SMALLEST_VOCAB_SIZE}, and merges come on top"
        )
    texts = (text for text in _texts(texts_or_files) if text)
    first_text = next(texts, None)
    if first_text is None:
        raise ValueError("No text to train the tokenizer on: every file or sentence given is empty.")
    if not isinstance(first_text, str):
        raise TypeError(
            f"Expected sentences (str), got {type(first_text).__name__}; for translation pairs pass "
            '`(text for row in dataset for text in row["translation"].values())`.'
        )

    tokenizer = _byte_level_bpe()
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


def _byte_level_bpe() -> Tokenizer:
    """An untrained byte-level BPE whose encodings end with `</s>`."""
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
    return tokenizer


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
    return chain.from_iterable(iter_lines(path) for path in paths)


class BPEDropout:
    """BPE-dropout (Provilkov et al., 2020; not in the paper): a subword regularisation for small corpora. Each time
    a word is segmented, every merge that could apply is dropped with probability `p` at each step, the best of the
    merges left is applied, and the word is done when no merge is left; so a word is seen in many segmentations over
    the epochs, all of them made of the vocabulary's tokens. `p = 0` is the tokenizer's own segmentation.

    Works on a byte-level BPE tokenizer as `train_tokenizer` makes it (its normalizer, pre-tokenizer, vocabulary,
    merges and closing `</s>`). `tokenizers` has BPE dropout too, but draws from an unseeded generator, and gives a
    dropped merge a new draw whenever an outdated queue entry comes up, so long words keep more merges than p says
    (" Schwimmbecken" at p = 0.1 keeps its full segmentation 98% of the time, against 86% under Algorithm 1). Here
    every draw comes from the numpy `Generator` given, so a seed gives the same segmentations on any machine.

    ```python
    >>> dropout = BPEDropout(tokenizer, p=0.1)
    >>> dropout.encode(["Two dogs play."], np.random.default_rng(0))  # ids ending in </s>, like tokenizer(...)
    ```
    """

    def __init__(self, tokenizer: PreTrainedTokenizerFast, p: float):
        if not 0 <= p < 1:
            raise ValueError(f"BPE-dropout probability must be in [0, 1), got {p!r}.")
        state = json.loads(tokenizer.backend_tokenizer.to_str())
        model = state["model"]
        if model["type"] != "BPE" or (state["pre_tokenizer"] or {}).get("type") != "ByteLevel":
            raise ValueError(
                f"BPE-dropout needs a byte-level BPE tokenizer as `train_tokenizer` makes it; this one has a "
                f"{model['type']} model and a {(state['pre_tokenizer'] or {}).get('type')} pre-tokenizer."
            )
        self.p = p
        self._backend = tokenizer.backend_tokenizer
        self._vocab = model["vocab"]
        merges = [merge.split(" ") if isinstance(merge, str) else merge for merge in model["merges"]]
        # (left id, right id) -> (rank, merged id); a lower rank merges first.
        self._merges = {
            (self._vocab[left], self._vocab[right]): (rank, self._vocab[left + right])
            for rank, (left, right) in enumerate(merges)
        }
        self._eos_id = tokenizer.eos_token_id
        # P(at least m of a step's candidate merges are dropped before one is kept) = p^m, m = 1, 2, ...
        self._drop_at_least = [p**m for m in range(1, 64)] + [0.0]
        self._next_segmentations = {}  # segmentation -> the segmentations one merge away, best merge first
        self._words = {}  # pre-tokenized word -> its bytes' ids

    def words(self, text: str) -> list[tuple[int, ...]]:
        """The byte ids of each word of `text` after the tokenizer's normalizer and pre-tokenizer, before merges."""
        normalized = self._backend.normalizer.normalize_str(text) if self._backend.normalizer else text
        return [self._word(word) for word, _ in self._backend.pre_tokenizer.pre_tokenize_str(normalized)]

    def encode(
        self, texts: list[str] | list[list[tuple[int, ...]]], rng: np.random.Generator | None
    ) -> list[list[int]]:
        """The ids of each text, segmented with dropout and closed by `</s>` (as `tokenizer(texts)["input_ids"]`).
        `texts` may also be the output of `words` for each text, to skip pre-tokenizing the same texts every epoch.
        `rng` may be None when p = 0."""
        texts = [self.words(text) if isinstance(text, str) else text for text in texts]
        # One uniform draw a merge step; a word of n bytes takes at most n steps (n - 1 merges and a last step).
        draws = rng.random(sum(len(word) for words in texts for word in words)).tolist() if self.p else None
        position, encoded = 0, []
        for words in texts:
            ids = []
            for word in words:
                segmentation, position = self._segment(word, draws, position)
                ids.extend(segmentation)
            ids.append(self._eos_id)
            encoded.append(ids)
        return encoded

    def _word(self, word: str) -> tuple[int, ...]:
        ids = self._words.get(word)
        if ids is None:
            ids = self._words[word] = tuple(self._vocab[byte] for byte in word)
        return ids

    def _segment(self, segmentation: tuple[int, ...], draws: list[float] | None, position: int):
        """Apply merges to one word until none is left: a merge step keeps the j-th best candidate (j = 0, 1, ...)
        with probability p^j (1 - p) and stops with probability p^k when all k candidates are dropped."""
        while True:
            candidates = self._next_segmentations.get(segmentation)
            if candidates is None:
                candidates = self._next_segmentations[segmentation] = self._merge_candidates(segmentation)
            if not candidates:
                return segmentation, position
            kept = 0
            if draws is not None:
                draw = draws[position]
                position += 1
                while draw < self._drop_at_least[kept]:
                    kept += 1
                if kept >= len(candidates):
                    return segmentation, position
            segmentation = candidates[kept]

    def _merge_candidates(self, segmentation: tuple[int, ...]) -> list[tuple[int, ...]]:
        """The segmentations one merge away, in the order BPE prefers the merges: by rank, then leftmost first."""
        ranked = sorted(
            (*self._merges[pair], position)
            for position, pair in enumerate(zip(segmentation, segmentation[1:]))
            if pair in self._merges
        )
        return [segmentation[:position] + (merged,) + segmentation[position + 2:] for _, merged, position in ranked]


__all__ = ["SPECIAL_TOKENS", "BPEDropout", "train_tokenizer"]
