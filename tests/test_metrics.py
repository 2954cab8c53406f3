"""`score_translations`, the package's one scorer: sacreBLEU's corpus BLEU and chrF, with their signatures."""

import logging
import math
import sys

import pytest
import sacrebleu
from sacrebleu.metrics import BLEU, CHRF

from vanilla_transformer.extras import MissingExtraError
from vanilla_transformer.inference.metrics import score_translations


HYPOTHESES = [
    "The cat sat on the mat.",
    "There is a dog in the garden today.",
    "He read the book that she gave him yesterday.",
    "We will meet at the station at noon.",
]
# Two references per hypothesis, given per hypothesis.
REFERENCES = [
    ["The cat sat on the mat.", "A cat was sitting on the mat."],
    ["A dog is in the garden today.", "Today there is a dog in the garden."],
    ["He read the book she gave him yesterday.", "Yesterday he read the book that she had given him."],
    ["We meet at the station at noon.", "We will meet at noon at the station."],
]
# sacreBLEU takes reference streams instead: the i-th reference of every hypothesis.
REFERENCE_STREAMS = [list(stream) for stream in zip(*REFERENCES)]


def test_scores_equal_sacrebleu_with_multiple_references():
    scores = score_translations(HYPOTHESES, REFERENCES)

    bleu, chrf = BLEU(), CHRF()
    expected_bleu = bleu.corpus_score(HYPOTHESES, REFERENCE_STREAMS)
    expected_chrf = chrf.corpus_score(HYPOTHESES, REFERENCE_STREAMS)
    assert scores["bleu"] == expected_bleu.score and 0 < scores["bleu"] < 100
    assert scores["chrf"] == expected_chrf.score and 0 < scores["chrf"] < 100
    assert scores["bleu_signature"] == str(bleu.get_signature())
    assert scores["bleu_signature"].startswith("nrefs:2|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert scores["chrf_signature"] == str(chrf.get_signature())
    assert scores["chrf_signature"].startswith("nrefs:2|case:mixed|eff:yes|nc:6|nw:0|space:no|version:")
    assert scores["bleu_bp"] == expected_bleu.bp and 0 < scores["bleu_bp"] <= 1
    assert "bleu_lc_moses" not in scores  # only with moses_lang


def test_report_lines_are_sacrebleus():
    scores = score_translations(HYPOTHESES, REFERENCES)

    bleu = sacrebleu.corpus_bleu(HYPOTHESES, REFERENCE_STREAMS)
    precisions = "/".join(f"{precision:.1f}" for precision in bleu.precisions)
    assert scores["bleu_report"] == (
        f"BLEU = {bleu.score:.2f} {precisions} (BP = {bleu.bp:.3f} ratio = {bleu.sys_len / bleu.ref_len:.3f} "
        f"hyp_len = {bleu.sys_len} ref_len = {bleu.ref_len})"
    )
    assert scores["chrf_report"] == f"chrF2 = {sacrebleu.corpus_chrf(HYPOTHESES, REFERENCE_STREAMS).score:.2f}"


def test_one_reference_string_per_hypothesis():
    references = [refs[0] for refs in REFERENCES]

    scores = score_translations(HYPOTHESES, references)

    assert scores["bleu"] == sacrebleu.corpus_bleu(HYPOTHESES, [references]).score
    assert scores["chrf"] == sacrebleu.corpus_chrf(HYPOTHESES, [references]).score
    assert scores == score_translations(HYPOTHESES, [[reference] for reference in references])
    assert scores["bleu_signature"].startswith("nrefs:1|")


def test_hypotheses_may_have_different_numbers_of_references():
    references = [REFERENCES[0], REFERENCES[1][:1], REFERENCES[2], REFERENCES[3][:1]]

    scores = score_translations(HYPOTHESES, references)

    second_stream = [refs[1] if len(refs) > 1 else None for refs in references]
    expected = sacrebleu.corpus_bleu(HYPOTHESES, [[refs[0] for refs in references], second_stream])
    assert scores["bleu"] == expected.score
    assert scores["bleu_signature"].startswith("nrefs:var|")


@pytest.mark.parametrize(
    "hypotheses, references, message",
    [
        ([], [], "empty"),
        (HYPOTHESES, REFERENCES[:3], "4 hypotheses but 3 references"),
        (HYPOTHESES[0], REFERENCES[0], "must be a list"),
        (HYPOTHESES[:1], [[]], "non-empty list"),
        ([1], ["one"], "must be a string"),
    ],
)
def test_bad_inputs_are_refused_clearly(hypotheses, references, message):
    with pytest.raises(ValueError, match=message):
        score_translations(hypotheses, references)


# --- BLEU on lowercased, Moses-tokenized text ------------------------------------------------------------------------


def test_lowercased_moses_bleu_worked_by_hand():
    hypothesis, reference = "L'homme fährt Rad.", "l'homme fährt heute Rad."
    # German Moses tokens, lowercased: the apostrophe and the full stop stand alone.
    #   hypothesis  l ' homme fährt rad .          (6 tokens)
    #   reference   l ' homme fährt heute rad .    (7 tokens)
    # Matching n-grams: 6/6; 4/5, all but "fährt rad"; 2/4, "l ' homme" and "' homme fährt"; 1/3, "l ' homme fährt".
    expected = 100 * math.exp(1 - 7 / 6) * (6 / 6 * 4 / 5 * 2 / 4 * 1 / 3) ** (1 / 4)

    scores = score_translations([hypothesis], [reference], moses_lang="de")

    assert scores["bleu_lc_moses"] == pytest.approx(expected, abs=1e-9)
    assert scores["bleu_lc_moses"] == pytest.approx(51.15, abs=0.01)
    assert scores["bleu_lc_moses_report"].startswith("BLEU (lowercased, Moses-tokenized) = 51.15 100.0/80.0/50.0/33.3 ")
    # sacreBLEU's own lowercased 13a keeps "l'homme" whole: l'homme fährt rad . scores otherwise.
    lowercased_13a = sacrebleu.corpus_bleu([hypothesis], [[reference]], tokenize="13a", lowercase=True)
    assert lowercased_13a.precisions[:2] == [100.0, pytest.approx(200 / 3)]
    assert abs(lowercased_13a.score - scores["bleu_lc_moses"]) > 10
    # The cased score is sacreBLEU's, unchanged.
    assert scores["bleu"] == sacrebleu.corpus_bleu([hypothesis], [[reference]]).score


def test_lowercased_moses_bleu_is_sacrebleu_on_moses_tokens_with_multiple_references():
    from sacremoses import MosesTokenizer

    moses = MosesTokenizer(lang="en")

    def lowercased_tokens(text):
        return None if text is None else moses.tokenize(text, escape=False, return_str=True).lower()

    references = [REFERENCES[0], REFERENCES[1][:1], REFERENCES[2], REFERENCES[3]]
    streams = [[refs[i] if i < len(refs) else None for refs in references] for i in range(2)]

    scores = score_translations(HYPOTHESES, references, moses_lang="en")

    expected = sacrebleu.corpus_bleu([lowercased_tokens(h) for h in HYPOTHESES],
                                     [[lowercased_tokens(r) for r in stream] for stream in streams], tokenize="none")
    assert scores["bleu_lc_moses"] == expected.score and 0 < expected.score < 100
    assert scores["bleu_lc_moses_signature"].startswith("nrefs:var|case:lc|eff:no|tok:none|smooth:exp|version:")
    assert scores["bleu_lc_moses_signature"].endswith("|moses:en|sacremoses:" + sys.modules["sacremoses"].__version__)


def test_lowercased_moses_bleu_does_not_warn_that_its_own_tokens_look_tokenized(caplog):
    # sacreBLEU warns once 100 lines end in a split-off full stop, as every Moses-tokenized sentence does.
    hypotheses = [hypothesis for hypothesis in HYPOTHESES for _ in range(30)]
    references = [reference for reference in REFERENCES for _ in range(30)]

    with caplog.at_level(logging.WARNING, logger="sacrebleu"):
        scores = score_translations(hypotheses, references, moses_lang="en")

    assert 0 < scores["bleu_lc_moses"] < 100
    assert [record.getMessage() for record in caplog.records if record.name.startswith("sacrebleu")] == []
    with caplog.at_level(logging.WARNING, logger="sacrebleu"):  # the check sees the warning where there is one
        BLEU(tokenize="none").corpus_score([hypothesis.replace(".", " .") for hypothesis in hypotheses],
                                           [[references[0][0].replace(".", " .")] * len(hypotheses)])
    assert any("tokenized period" in record.getMessage() for record in caplog.records)


def test_lowercased_moses_bleu_without_sacremoses_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "sacremoses", None)  # not installed
    with pytest.raises(MissingExtraError, match=r"pip install 'vanilla-transformer\[train\]'"):
        score_translations(HYPOTHESES, REFERENCES, moses_lang="de")
    assert "bleu" in score_translations(HYPOTHESES, REFERENCES)
