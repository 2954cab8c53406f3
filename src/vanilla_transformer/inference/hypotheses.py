"""What a translation is beyond its text, the same from every backend: `Hypothesis`, one of a source's n best
translations with its scores, and `PairScore`, the log-probability a model gives a translation it is handed. Standard
library only: CTranslate2's backend returns them without torch.

Scores are natural logarithms. A translation's tokens end with `</s>`, which is scored: log P(Y|X) is the sum of
log P(y_t | y_<t, X) over Y's tokens and `</s>` (section 3.4's softmax over the shared vocabulary).
"""

from collections.abc import Sequence
from dataclasses import dataclass

from ..model.decoding_vanilla_transformer import gnmt_length_penalty
from .batching import length_sorted_batches


@dataclass(frozen=True)
class Hypothesis:
    """One of the translations a search found for a source, best first among its n best.

    `score` ranks it as the search ranked finished hypotheses: log P(Y|X) divided by the length penalty of the
    decoding settings (GNMT's ((5 + |Y|) / 6) ** alpha for section 6.1's decoding, or transformers' |Y| ** alpha; |Y|
    counts `</s>`), the same formula in greedy search. `log_probability` is log P(Y|X) itself. With token scores,
    `tokens` are Y's subword tokens (`</s>` last) and `token_scores` their log-probabilities. With an alignment,
    `alignment` holds its Pharaoh links (source word, target word) or its word matrix (`inference.alignment`). An empty
    source gives one empty hypothesis, unscored (None)."""

    text: str
    score: float | None
    log_probability: float | None
    tokens: tuple[str, ...] | None = None
    token_scores: tuple[float, ...] | None = None
    alignment: list | None = None


@dataclass(frozen=True)
class PairScore:
    """The log-probability a model gives a target sentence for its source (`score_pairs`): `log_probability` is
    log P(Y|X), `tokens` Y's subword tokens (`</s>` last) and `token_scores` their log-probabilities."""

    log_probability: float
    tokens: tuple[str, ...]
    token_scores: tuple[float, ...]

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def per_token(self) -> float:
        """log P(Y|X) over Y's tokens, `</s>` included: comparable between sentences of different lengths."""
        return self.log_probability / self.num_tokens


def ranking_score(log_probability: float, length: int, settings: dict) -> float:
    """`log_probability` of a translation of `length` tokens (`</s>` included) divided by the length penalty of the
    resolved decoding `settings` (`resolve_decoding_settings`): the score by which beam search ranks it."""
    alpha = 1.0 if settings["length_penalty"] is None else settings["length_penalty"]
    if settings["length_penalty_type"] == "gnmt":
        return log_probability / gnmt_length_penalty(length, alpha)
    return log_probability / length**alpha


class TooManyHypothesesError(ValueError):
    """An n-best list longer than the search has beams (`nbest`, `num_beams`): a search keeps no more finished
    hypotheses than it has beams."""

    def __init__(self, nbest: int, num_beams: int):
        super().__init__(f"nbest must be between 1 and the number of beams ({num_beams}), got {nbest}")
        self.nbest, self.num_beams = nbest, num_beams


def check_nbest(nbest: int | None, num_beams: int | None) -> None:
    """A `TooManyHypothesesError` unless `nbest` (None: the best translation's text only) is at most the `num_beams`
    that the decoding settings give."""
    if nbest is not None and not 1 <= nbest <= (num_beams or 1):
        raise TooManyHypothesesError(nbest, num_beams or 1)


def hypothesis(text: str, tokens: Sequence[str], token_scores: Sequence[float], settings: dict,
               with_tokens: bool, alignment: list | None = None) -> Hypothesis:
    """The `Hypothesis` of a translation `text` from its `tokens` and their log-probabilities."""
    log_probability = float(sum(token_scores))
    return Hypothesis(
        text,
        ranking_score(log_probability, len(tokens), settings),
        log_probability,
        tuple(tokens) if with_tokens else None,
        tuple(float(score) for score in token_scores) if with_tokens else None,
        alignment,
    )


EMPTY = Hypothesis("", None, None)


# The decoder layer whose encoder-decoder attention (heads averaged) aligns words by default, counted from 0, negative
# from the last: fairseq's choice, the last layer (docs/decoding.md measures each layer against eflomal).
ALIGNMENT_LAYER = -1


class AlignmentUnavailableError(ValueError):
    """An alignment asked of a backend's export that cannot give it: `exported_layer` is the decoder layer whose
    averaged heads the export returns (None where it returns no such attention), `asked_layer` the layer asked for."""

    def __init__(self, backend: str, exported_layer: int | None, asked_layer: int | None):
        self.backend, self.exported_layer, self.asked_layer = backend, exported_layer, asked_layer
        if exported_layer is None:
            problem = "keeps no encoder-decoder attention with its heads averaged: export the model again"
        else:
            problem = (f"returns decoder layer {exported_layer}'s attention, chosen when it was exported, not layer "
                       f"{asked_layer}'s: export the model again with alignment_layer={asked_layer}, or align with "
                       f"layer {exported_layer}")
        super().__init__(f"this {backend} export {problem}")


class AlignmentLayerError(ValueError):
    """An alignment asked of a decoder layer the model does not have (`layer`, of `layers`)."""

    def __init__(self, layer: int, layers: int):
        self.layer, self.layers = layer, layers
        super().__init__(f"alignment_layer {layer} is not a layer of the model's {layers}-layer decoder")


def alignment_layer_of(alignment: str | None, nbest: int | None, layer: int | None, layers: int) -> int | None:
    """The decoder layer (from 0) whose attention aligns, for a call that asks for an `alignment` ("hard" or "soft";
    None: no layer) of its `nbest` hypotheses with `layer` (negative from the last; None: `ALIGNMENT_LAYER`) of a
    decoder of `layers` layers. A ValueError for an unknown kind, no `nbest` (the hypotheses carry the alignment) or a
    layer the decoder lacks."""
    if alignment is None:
        return None
    if alignment not in ("hard", "soft"):
        raise ValueError(f"alignment must be 'hard' or 'soft', not {alignment!r}")
    if nbest is None:
        raise ValueError("an alignment belongs to a hypothesis: ask for nbest hypotheses (1 or more)")
    layer = ALIGNMENT_LAYER if layer is None else layer
    if not -layers <= layer < layers:
        raise AlignmentLayerError(layer, layers)
    return layer % layers


def strongest_links(matrix: Sequence[Sequence[float]]) -> list[tuple[int, int]]:
    """Pharaoh links (source word, target word) of a soft word alignment (`matrix[target word][source word]`): each
    target word to the source word it attends to most (the first, on a tie)."""
    return [(max(range(len(row)), key=row.__getitem__), target) for target, row in enumerate(matrix)]


def pharaoh(links: Sequence[tuple[int, int]]) -> str:
    """Alignment links (source word, target word) as fairseq and Marian print them: `0-0 1-2`."""
    return " ".join(f"{source}-{target}" for source, target in links)


def pair_batches(tokenizer, sources: Sequence[str], targets: Sequence[str], batch_size: int, max_tokens: int | None):
    """What every backend's `score_pairs` does first: the pairs checked (one target a source, positive batch bounds),
    each side tokenized as training tokenized it (`</s>` appended), and the pairs' indices sorted by the longer side
    and batched as `translate_lines` batches sources."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets: give one target per source")
    if batch_size < 1 or (max_tokens is not None and max_tokens < 1):
        raise ValueError(f"batch_size ({batch_size}) and max_tokens ({max_tokens}) must be positive")
    if not sources:
        return [], [], []
    source_ids = tokenizer([text.strip() for text in sources], verbose=False)["input_ids"]
    target_ids = tokenizer(text_target=[text.strip() for text in targets], verbose=False)["input_ids"]
    lengths = [max(len(source), len(target)) for source, target in zip(source_ids, target_ids)]
    return source_ids, target_ids, length_sorted_batches(lengths, max_tokens, batch_size)


__all__ = ["ALIGNMENT_LAYER", "AlignmentLayerError", "AlignmentUnavailableError", "EMPTY", "Hypothesis", "PairScore", "TooManyHypothesesError",
           "alignment_layer_of", "check_nbest", "hypothesis", "pair_batches", "pharaoh", "ranking_score",
           "strongest_links"]
