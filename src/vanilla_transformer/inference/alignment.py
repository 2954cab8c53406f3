"""Word alignments read off the encoder-decoder attention (section 3.2.3: each target position attends over the source):
the weights of one decoder layer, its heads averaged, with subword pieces merged into the whitespace words of the
source and of the translation. `hard` gives Pharaoh `i-j` pairs (source word i, target word j, from 0), as fairseq's
`--print-alignment` and Marian's `--alignment hard` print them; `soft` the word-by-word matrix.

The weights come from one teacher-forced pass with the eager kernel, the formula of section 3.2.1 written out, whatever
kernel the model was loaded with (sdpa and flash attention never form them). The row of target token y_t is the
attention of the decoder position that predicted it.
"""

from collections.abc import Sequence

import torch

from ..model.generation_vanilla_transformer import attention_kernel

ALIGNMENTS = ("hard", "soft")
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
    return [(int(source), target) for target, source in enumerate(matrix.argmax(-1).tolist())]


def pharaoh(links: list[tuple[int, int]]) -> str:
    return " ".join(f"{source}-{target}" for source, target in links)


def cross_attention(model, source_ids: Sequence[Sequence[int]], target_ids: Sequence[Sequence[int]],
                    layer: int) -> list[torch.Tensor]:
    """The encoder-decoder attention of decoder `layer` (from 0; negative from the last), heads averaged, for each
    pair: a (target tokens, source tokens) matrix, from one padded teacher-forced batch with the eager kernel."""
    config = model.config
    pad, start, device = config.pad_token_id, config.decoder_start_token_id, model.device
    width = max(len(source) for source in source_ids)
    sources = torch.tensor([[*s, *[pad] * (width - len(s))] for s in source_ids], device=device)
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in source_ids], device=device)
    length = max(len(target) for target in target_ids)
    decoder_inputs = torch.tensor([[start, *t[:-1], *[pad] * (length - len(t))] for t in target_ids], device=device)
    with attention_kernel(model, "eager"), torch.inference_mode():
        attentions = model(input_ids=sources, attention_mask=mask, decoder_input_ids=decoder_inputs,
                           output_attentions=True, use_cache=False).cross_attentions
    weights = attentions[layer].float().mean(1).cpu()  # (batch, target, source)
    return [weights[k, : len(t), : len(s)] for k, (s, t) in enumerate(zip(source_ids, target_ids))]


def align(tokenizer, model, source_ids, target_ids, layer: int, kind: str) -> list:
    """The word alignment of each (source, target) pair of token ids: Pharaoh links (`hard`) or the word matrix as
    nested lists (`soft`), special tokens left out on both sides."""
    special = set(tokenizer.all_special_ids)
    found = []
    for (source, target), weights in zip(zip(source_ids, target_ids), cross_attention(model, source_ids, target_ids,
                                                                                       layer)):
        rows = [t for t, token in enumerate(target) if token not in special]
        columns = [s for s, token in enumerate(source) if token not in special]
        if not rows or not columns:
            found.append([])
            continue
        source_words = word_indices(tokenizer.convert_ids_to_tokens([source[s] for s in columns]))
        target_words = word_indices(tokenizer.convert_ids_to_tokens([target[t] for t in rows]))
        matrix = word_alignment(weights[rows][:, columns], source_words, target_words)
        found.append(hard_links(matrix) if kind == "hard" else matrix.tolist())
    return found


__all__ = ["ALIGNMENTS", "align", "cross_attention", "hard_links", "pharaoh", "word_alignment", "word_indices"]
