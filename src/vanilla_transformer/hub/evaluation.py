"""An evaluation's results as card facts: what `vanilla-transformer evaluate --json` writes, and `model-card
--results` and `push --card-results` read."""

from .card_facts import CardFacts


# How many sample translations an evaluation's results file keeps for the model card.
CARD_SAMPLES = 5


def decoding_in_words(num_beams: int | None = None, max_length: int | None = None,
                      max_new_tokens: int | None = None) -> str | None:
    """The decoding chosen where it differs from the model's generation config, in the card's words: the beams, the
    length limit (in all, or new tokens); None when nothing differs."""
    words = []
    if num_beams is not None:
        words.append("greedy search" if num_beams == 1 else f"beam size {num_beams}")
    if max_length is not None:
        words.append(f"at most {max_length} tokens")
    if max_new_tokens is not None:
        words.append(f"at most {max_new_tokens} new tokens")
    return ", ".join(words) or None


def evaluation_card_facts(dataset: str | None, split: str, scores: dict, sources, references, hypotheses,
                          decoding: str | None = None) -> CardFacts:
    """The card facts of one evaluation (`vanilla-transformer evaluate --json`): its scores (`inference.metrics.
    score_translations`, the lowercased Moses-tokenized BLEU where it was computed), the `decoding` where it differs
    from the model's generation config, and the first `CARD_SAMPLES` pairs with a source as samples."""
    result = dict(
        dataset=dataset,
        split=split,
        bleu=scores["bleu"],
        chrf=scores["chrf"],
        bleu_signature=scores["bleu_signature"],
        chrf_signature=scores["chrf_signature"],
        num_sentences=len(hypotheses),
        decoding=decoding,
    )
    if "bleu_lc_moses" in scores:  # with the train extra
        result.update(bleu_lc_moses=scores["bleu_lc_moses"], bleu_lc_moses_signature=scores["bleu_lc_moses_signature"])
    pairs = [(s, r, h) for s, r, h in zip(sources, references, hypotheses, strict=True) if s.strip()]
    samples = [dict(source=s, reference=r, hypothesis=h) for s, r, h in pairs[:CARD_SAMPLES]]
    return CardFacts(results=[result], samples=samples)


__all__ = ["CARD_SAMPLES", "decoding_in_words", "evaluation_card_facts"]
