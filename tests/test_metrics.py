"""`score_translations`, the package's one scorer: sacreBLEU's corpus BLEU and chrF, with their signatures."""

import pytest
import sacrebleu
from sacrebleu.metrics import BLEU, CHRF

from vanilla_transformer.metrics import score_translations


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
