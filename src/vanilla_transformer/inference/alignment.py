"""Word alignments read off the encoder-decoder attention (section 3.2.3: each target position attends over the source):
the weights of one decoder layer, its heads averaged, with subword pieces merged into the whitespace words of the
source and of the translation. `hard` gives Pharaoh `i-j` pairs (source word i, target word j, from 0), as fairseq's
`--print-alignment` and Marian's `--alignment hard` print them; `soft` the word-by-word matrix.

The weights come from the teacher-forced pass that scores the hypotheses (`scoring.teacher_forced_pass`, with the eager
kernel whatever kernel the model was loaded with). The row of target token y_t is the attention of the decoder position
that predicted it.
"""

from collections.abc import Sequence

import torch

from .hypotheses import pharaoh, strongest_links
# The pieces that begin a word: byte-level BPE marks a space before a token with "Ġ", SentencePiece with "▁".
WORD_STARTS = ("Ġ", "▁")


def word_indices(tokens: Sequence[str]) -> list[int]:
    """The whitespace word of each of `tokens` (subword pieces of one sentence, special tokens left out), from 0: a
    piece that begins with a space marker starts the next word, any other continues the word before it."""
    indices, word = [], -1
    for position, token in enumerate(tokens):
        if position == 0 or token.startswith(WORD_STARTS):
            word += 1
        indices.append(word)
    return indices


def word_alignment(weights: torch.Tensor, source_words: list[int], target_words: list[int]) -> torch.Tensor:
    """The (target words, source words) matrix of a (target tokens, source tokens) attention matrix: for each target
    word, the mean over its pieces of the weight each source word's pieces receive together."""
    target_count, source_count = max(target_words) + 1, max(source_words) + 1
    by_source = torch.zeros(weights.shape[0], source_count).index_add_(1, torch.tensor(source_words), weights)
    summed = torch.zeros(target_count, source_count).index_add_(0, torch.tensor(target_words), by_source)
    pieces = torch.bincount(torch.tensor(target_words), minlength=target_count)
    return summed / pieces[:, None]


def hard_links(matrix: torch.Tensor) -> list[tuple[int, int]]:
    """Pharaoh links (source word, target word) of a word matrix: each target word to the source word it attends to
    most."""
    return strongest_links(matrix.tolist())


def align(tokenizer, source_ids, target_ids, weights: list[torch.Tensor], kind: str) -> list:
    """The word alignment of each (source, target) pair of token ids from its attention `weights` (target tokens,
    source tokens; `scoring.teacher_forced_pass`): Pharaoh links (`hard`) or the word matrix as nested lists (`soft`),
    special tokens left out on both sides."""
    special = set(tokenizer.all_special_ids)
    found = []
    for source, target, pair_weights in zip(source_ids, target_ids, weights):
        rows = [t for t, token in enumerate(target) if token not in special]
        columns = [s for s, token in enumerate(source) if token not in special]
        if not rows or not columns:
            found.append([])
            continue
        source_words = word_indices(tokenizer.convert_ids_to_tokens([source[s] for s in columns]))
        target_words = word_indices(tokenizer.convert_ids_to_tokens([target[t] for t in rows]))
        matrix = word_alignment(pair_weights[rows][:, columns], source_words, target_words)
        found.append(hard_links(matrix) if kind == "hard" else matrix.tolist())
    return found


__all__ = ["align", "hard_links", "pharaoh", "word_alignment", "word_indices"]
