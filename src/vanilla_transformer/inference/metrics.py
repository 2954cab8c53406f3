"""Translation quality as the paper reports it: corpus BLEU, plus chrF, computed by sacreBLEU (Post, 2018) on
detokenized text with sacreBLEU's own tokenization, so that scores compare across papers. Every score comes with
sacreBLEU's signature (references, case, tokenizer, smoothing, version), to be reported with it.

Multi30k papers commonly report another BLEU, on lowercased text tokenized by the Moses tokenizer (`multi-bleu.perl -lc`
on tokenized files); `moses_lang` adds it, computed by sacreBLEU on text tokenized by sacremoses (the `train` extra). It
compares with those papers, not with sacreBLEU's scores.

```python
>>> from vanilla_transformer.inference.metrics import score_translations
>>> score_translations(["the cat sat on the mat"], ["the cat is on the mat"])["bleu"]
```
"""

from collections.abc import Sequence

from sacrebleu.metrics import BLEU, CHRF

from ..extras import require


# How `score_translations` reports the BLEU of `moses_lang`.
LC_MOSES_BLEU_NAME = "BLEU (lowercased, Moses-tokenized)"


def score_translations(
    hypotheses: Sequence[str], references: Sequence[str] | Sequence[Sequence[str]], moses_lang: str | None = None
) -> dict:
    """Corpus BLEU and chrF of `hypotheses` against `references` (for each hypothesis its reference, or a list of its
    references; hypotheses may have different numbers of them), with sacreBLEU's default settings.

    Returns `bleu` and `chrf` (0-100), BLEU's brevity penalty `bleu_bp` (0-1), `bleu_signature` and `chrf_signature`,
    and sacreBLEU's report lines `bleu_report` ("BLEU = 34.84 87.5/66.7/25.0/16.7 (BP = 0.882 ratio = 0.889 hyp_len = 8
    ref_len = 9)") and `chrf_report` ("chrF2 = 55.54").

    With `moses_lang` (the language of the references, e.g. "de"), also `bleu_lc_moses`, its signature and report
    line: BLEU on hypotheses and references tokenized by sacremoses' `MosesTokenizer(moses_lang)` (cased, without
    escaping), then lowercased, with sacreBLEU's tokenizer off. Needs sacremoses: a `MissingExtraError` otherwise.
    """
    sacremoses = require("sacremoses", extra="train") if moses_lang is not None else None
    hypotheses, references = _checked(hypotheses, references)
    # sacreBLEU takes reference streams (the i-th reference of every hypothesis); None pads hypotheses with fewer.
    streams = [
        [refs[i] if i < len(refs) else None for refs in references] for i in range(max(map(len, references)))
    ]
    bleu, chrf = BLEU(), CHRF()
    bleu_score, chrf_score = bleu.corpus_score(hypotheses, streams), chrf.corpus_score(hypotheses, streams)
    scores = dict(
        bleu=bleu_score.score,
        chrf=chrf_score.score,
        bleu_bp=bleu_score.bp,
        bleu_signature=str(bleu.get_signature()),
        chrf_signature=str(chrf.get_signature()),
        bleu_report=bleu_score.format(),
        chrf_report=chrf_score.format(),
    )
    if sacremoses is not None:
        scores.update(_lowercased_moses_bleu(sacremoses, moses_lang, hypotheses, streams))
    return scores


def _lowercased_moses_bleu(sacremoses, lang: str, hypotheses: list[str], streams: list[list[str | None]]) -> dict:
    """`bleu_lc_moses`, its signature (sacreBLEU's, with the Moses language and sacremoses' version) and report."""
    moses = sacremoses.MosesTokenizer(lang=lang)

    def tokenized(text: str | None) -> str | None:
        return None if text is None else moses.tokenize(text, escape=False, return_str=True)

    # Tokenized as cased text (the tokenizer reads case around full stops), then lowercased by sacreBLEU; `force`: the
    # text is tokenized on purpose, so sacreBLEU's warning that it looks tokenized would only be noise.
    bleu = BLEU(lowercase=True, tokenize="none", force=True)
    score = bleu.corpus_score(list(map(tokenized, hypotheses)), [list(map(tokenized, s)) for s in streams])
    return dict(
        bleu_lc_moses=score.score,
        bleu_lc_moses_signature=f"{bleu.get_signature()}|moses:{lang}|sacremoses:{sacremoses.__version__}",
        bleu_lc_moses_report=LC_MOSES_BLEU_NAME + score.format().removeprefix("BLEU"),
    )


def _checked(hypotheses, references) -> tuple[list[str], list[list[str]]]:
    """The hypotheses, and each one's references as a list, after checking that they are strings and aligned."""
    for name, value in (("hypotheses", hypotheses), ("references", references)):
        if isinstance(value, str) or not isinstance(value, Sequence):
            raise ValueError(f"`{name}` must be a list, got {type(value).__name__}.")
    if not hypotheses:
        raise ValueError("`hypotheses` is empty: there is nothing to score.")
    if len(hypotheses) != len(references):
        raise ValueError(
            f"Got {len(hypotheses)} hypotheses but {len(references)} references: give one reference (a string, or a "
            "list of strings) per hypothesis."
        )
    if not all(isinstance(hypothesis, str) for hypothesis in hypotheses):
        raise ValueError("Every hypothesis must be a string.")
    references = [[refs] if isinstance(refs, str) else list(refs) for refs in references]
    for index, refs in enumerate(references):
        if not refs or not all(isinstance(ref, str) for ref in refs):
            raise ValueError(f"The references of hypothesis {index} must be a string or a non-empty list of strings.")
    return list(hypotheses), references


__all__ = ["LC_MOSES_BLEU_NAME", "score_translations"]
