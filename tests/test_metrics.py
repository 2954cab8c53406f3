import socket

import pytest
import sacrebleu
from sacrebleu.metrics import BLEU, CHRF

from vanilla_transformer.metrics import load_bleu, load_chrf, load_metric


PREDICTIONS = [
    "The cat sat on the mat.",
    "There is a dog in the garden today.",
    "He read the book that she gave him yesterday.",
    "We will meet at the station at noon.",
]
# Two references per segment, given per segment as the `evaluate` metric takes them.
REFERENCES = [
    ["The cat sat on the mat.", "A cat was sitting on the mat."],
    ["A dog is in the garden today.", "Today there is a dog in the garden."],
    ["He read the book she gave him yesterday.", "Yesterday he read the book that she had given him."],
    ["We meet at the station at noon.", "We will meet at noon at the station."],
]
# sacreBLEU takes reference streams instead: the i-th reference of every segment.
REFERENCE_STREAMS = [list(stream) for stream in zip(*REFERENCES)]


@pytest.fixture(scope="module")
def bleu():
    return load_bleu()


@pytest.fixture(scope="module")
def chrf():
    return load_chrf()


def test_bleu_equals_sacrebleu_with_multiple_references(bleu):
    result = bleu.compute(predictions=PREDICTIONS, references=REFERENCES)

    expected = sacrebleu.corpus_bleu(PREDICTIONS, REFERENCE_STREAMS)
    assert result["score"] == expected.score
    assert 0 < result["score"] < 100
    for key in ["counts", "totals", "precisions", "bp", "sys_len", "ref_len"]:
        assert result[key] == getattr(expected, key), key
    metric = BLEU()
    metric.corpus_score(PREDICTIONS, REFERENCE_STREAMS)
    assert result["signature"] == str(metric.get_signature())
    assert result["signature"].startswith("nrefs:2|case:mixed|eff:no|tok:13a|smooth:exp|version:")


def test_bleu_takes_one_reference_string_per_prediction(bleu):
    references = [refs[0] for refs in REFERENCES]

    result = bleu.compute(predictions=PREDICTIONS, references=references)

    assert result["score"] == sacrebleu.corpus_bleu(PREDICTIONS, [references]).score
    assert result == bleu.compute(predictions=PREDICTIONS, references=[[ref] for ref in references])
    assert result["signature"].startswith("nrefs:1|")


def test_bleu_passes_sacrebleu_options(bleu):
    result = bleu.compute(predictions=PREDICTIONS, references=REFERENCES, tokenize="char", lowercase=True)

    expected = sacrebleu.corpus_bleu(PREDICTIONS, REFERENCE_STREAMS, tokenize="char", lowercase=True)
    assert result["score"] == expected.score
    assert "|case:lc|" in result["signature"] and "|tok:char|" in result["signature"]


def test_bleu_takes_a_variable_number_of_references(bleu):
    references = [REFERENCES[0], REFERENCES[1][:1], REFERENCES[2], REFERENCES[3][:1]]

    result = bleu.compute(predictions=PREDICTIONS, references=references)

    second_stream = [refs[1] if len(refs) > 1 else None for refs in references]
    expected = sacrebleu.corpus_bleu(PREDICTIONS, [[refs[0] for refs in references], second_stream])
    assert result["score"] == expected.score
    assert result["signature"].startswith("nrefs:var|")


def test_bleu_accumulates_batches(bleu):
    bleu.add_batch(predictions=PREDICTIONS[:2], references=REFERENCES[:2])
    bleu.add(prediction=PREDICTIONS[2], reference=REFERENCES[2])

    result = bleu.compute(predictions=PREDICTIONS[3:], references=REFERENCES[3:])

    assert result["score"] == sacrebleu.corpus_bleu(PREDICTIONS, REFERENCE_STREAMS).score


@pytest.mark.parametrize("word_order", [0, 2])
def test_chrf_equals_sacrebleu(chrf, word_order):
    result = chrf.compute(predictions=PREDICTIONS, references=REFERENCES, word_order=word_order)

    assert result["score"] == sacrebleu.corpus_chrf(PREDICTIONS, REFERENCE_STREAMS, word_order=word_order).score
    metric = CHRF(word_order=word_order)
    metric.corpus_score(PREDICTIONS, REFERENCE_STREAMS)
    assert result["signature"] == str(metric.get_signature())
    assert (result["char_order"], result["word_order"], result["beta"]) == (6, word_order, 2)


def test_metrics_load_offline_from_the_package(monkeypatch):
    import evaluate

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_EVALUATE_OFFLINE", "1")
    # evaluate reads its offline flag at import: set it too, and make any network access fail loudly.
    monkeypatch.setattr(evaluate.config, "HF_EVALUATE_OFFLINE", True)

    def no_network(*args, **kwargs):
        raise AssertionError("the metric tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)

    bleu, chrf = load_bleu(), load_chrf()

    assert bleu.compute(predictions=PREDICTIONS, references=REFERENCES)["score"] > 0
    assert chrf.compute(predictions=PREDICTIONS, references=REFERENCES)["score"] > 0
    assert "Post" in bleu.citation and "BLEU" in bleu.description
    assert (bleu.config_name, chrf.config_name) == ("bleu", "chrf")


@pytest.mark.parametrize(
    "inputs, message",
    [
        (dict(predictions=[], references=[]), "empty"),
        (dict(predictions=PREDICTIONS, references=REFERENCES[:3]), "4 predictions but 3 references"),
        (dict(predictions=PREDICTIONS[0], references=REFERENCES[0]), "list of strings"),
        (dict(predictions=PREDICTIONS[:1], references=[[]]), "non-empty list"),
        (dict(predictions=PREDICTIONS, references=REFERENCES, smooth="exp"), "Unknown BLEU options"),
    ],
)
def test_bleu_refuses_bad_inputs_clearly(bleu, inputs, message):
    with pytest.raises(ValueError, match=message):
        bleu.compute(**inputs)
    # The module stays usable after a refusal.
    assert bleu.compute(predictions=PREDICTIONS, references=REFERENCES)["score"] > 0


def test_load_metric_refuses_unknown_names():
    with pytest.raises(ValueError, match="'bleu' or 'chrf'"):
        load_metric("rouge")
