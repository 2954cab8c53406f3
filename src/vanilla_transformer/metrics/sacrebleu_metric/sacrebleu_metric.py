"""Corpus BLEU and chrF computed by sacreBLEU, as an `evaluate` metric module that loads from a local path, offline.

`evaluate` copies this file into its module cache and imports it on its own, so it imports nothing from the package.
"""

import inspect

import datasets
import evaluate
from sacrebleu.metrics import BLEU, CHRF


_CITATION = """\
@inproceedings{post-2018-call,
    title = "A Call for Clarity in Reporting {BLEU} Scores",
    author = "Post, Matt",
    booktitle = "Proceedings of the Third Conference on Machine Translation: Research Papers",
    year = "2018",
    publisher = "Association for Computational Linguistics",
    url = "https://aclanthology.org/W18-6319",
    pages = "186--191",
}
@inproceedings{papineni-etal-2002-bleu,
    title = "{B}leu: a Method for Automatic Evaluation of Machine Translation",
    author = "Papineni, Kishore and Roukos, Salim and Ward, Todd and Zhu, Wei-Jing",
    booktitle = "Proceedings of the 40th Annual Meeting of the Association for Computational Linguistics",
    year = "2002",
    url = "https://aclanthology.org/P02-1040",
    pages = "311--318",
}
@inproceedings{popovic-2015-chrf,
    title = "chr{F}: character n-gram {F}-score for automatic {MT} evaluation",
    author = "Popovi{\\'c}, Maja",
    booktitle = "Proceedings of the Tenth Workshop on Statistical Machine Translation",
    year = "2015",
    url = "https://aclanthology.org/W15-3049",
    pages = "392--395",
}
"""

_DESCRIPTION = """\
Corpus-level BLEU (Papineni et al., 2002), the score of "Attention Is All You Need" (section 6), or chrF
(Popovic, 2015), computed by sacreBLEU (Post, 2018) on detokenized text with sacreBLEU's own tokenization, so scores
are comparable across papers. The result carries sacreBLEU's signature (number of references, case, tokenizer,
smoothing, version): report it with the score. Choose the metric with `config_name`: "bleu" (the default) or "chrf".
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list[str]`): the system's detokenized translations, one per segment.
    references (`list[list[str]]` or `list[str]`): for each segment its reference translations, or one reference
        string. Segments may have different numbers of references.
    **options: keyword arguments of `sacrebleu.metrics.BLEU` (config "bleu": `tokenize` ("13a" by default, "intl",
        "char", "zh", "ja-mecab", "none", ...), `lowercase`, `smooth_method`, `smooth_value`, `force`,
        `max_ngram_order`, `effective_order`, `trg_lang`) or of `sacrebleu.metrics.CHRF` (config "chrf":
        `char_order`, `word_order` (2 gives chrF++), `beta`, `lowercase`, `whitespace`, `eps_smoothing`).
Returns:
    config "bleu": `score` (0-100), `counts`, `totals` and `precisions` (per n-gram order), `bp` (brevity penalty),
        `sys_len`, `ref_len`, `signature`.
    config "chrf": `score` (0-100), `char_order`, `word_order`, `beta`, `signature`.
Example:
    >>> from vanilla_transformer.metrics import load_bleu
    >>> bleu = load_bleu()
    >>> bleu.compute(predictions=["the cat sat on the mat"], references=[["the cat sat on the mat"]])["score"]
    100.00000000000004
"""

# The sacreBLEU class computing each configuration; "default" is what `evaluate.load` passes without a config_name.
_METRICS = {"bleu": BLEU, "chrf": CHRF, "default": BLEU}


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class SacrebleuMetric(evaluate.Metric):
    def _info(self):
        if self.config_name not in _METRICS:
            raise ValueError(f"Unknown config_name {self.config_name!r}; choose 'bleu' or 'chrf'.")
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "predictions": datasets.Value("string"),
                    "references": datasets.Sequence(datasets.Value("string")),
                }
            ),
            homepage="https://github.com/mjpost/sacrebleu",
            codebase_urls=["https://github.com/mjpost/sacrebleu"],
            reference_urls=["https://aclanthology.org/W18-6319", "https://aclanthology.org/W15-3049"],
        )

    def compute(self, *, predictions=None, references=None, **options):
        """Score the predictions added so far plus these ones; `options` configure sacreBLEU."""
        # Built before any data is touched: a bad option raised inside `_compute` would leave the module unusable.
        metric = _sacrebleu_metric(self.config_name, options)
        return super().compute(predictions=predictions, references=references, sacrebleu_metric=metric)

    def add_batch(self, *, predictions=None, references=None, **kwargs):
        """Add a batch of predictions and their references (checked, and a lone reference string made a list)."""
        predictions, references = _checked(predictions, references)
        super().add_batch(predictions=predictions, references=references, **kwargs)

    def add(self, *, prediction=None, reference=None, **kwargs):
        """Add one prediction and its references (a string or a list of strings)."""
        (prediction,), (reference,) = _checked([prediction], [reference])
        super().add(prediction=prediction, reference=reference, **kwargs)

    def _compute(self, predictions, references, sacrebleu_metric):
        # sacreBLEU takes reference streams (the i-th reference of every segment); None pads segments with fewer.
        n_streams = max(len(refs) for refs in references)
        streams = [[refs[i] if i < len(refs) else None for refs in references] for i in range(n_streams)]
        result = sacrebleu_metric.corpus_score(predictions, streams)
        signature = str(sacrebleu_metric.get_signature())
        if isinstance(sacrebleu_metric, CHRF):
            return {
                "score": result.score,
                "char_order": result.char_order,
                "word_order": result.word_order,
                "beta": result.beta,
                "signature": signature,
            }
        return {
            "score": result.score,
            "counts": result.counts,
            "totals": result.totals,
            "precisions": result.precisions,
            "bp": result.bp,
            "sys_len": result.sys_len,
            "ref_len": result.ref_len,
            "signature": signature,
        }


def _sacrebleu_metric(config_name, options):
    """The sacreBLEU `BLEU` or `CHRF` object for these options, as `sacrebleu.corpus_bleu` / `corpus_chrf` build it."""
    metric_class = _METRICS[config_name]
    accepted = set(inspect.signature(metric_class).parameters) - {"references"}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise ValueError(f"Unknown {metric_class.__name__} options {unknown}; accepted: {sorted(accepted)}.")
    return metric_class(**options)


def _checked(predictions, references):
    """Validated predictions and references, each reference given as a list of strings."""
    if isinstance(predictions, str) or not isinstance(predictions, (list, tuple)):
        raise ValueError(f"`predictions` must be a list of strings, got {type(predictions).__name__}.")
    if isinstance(references, str) or not isinstance(references, (list, tuple)):
        raise ValueError(
            f"`references` must be a list of strings or of lists of strings, got {type(references).__name__}."
        )
    if not predictions:
        raise ValueError("`predictions` is empty: there is nothing to score.")
    if len(predictions) != len(references):
        raise ValueError(
            f"Got {len(predictions)} predictions but {len(references)} references: give one entry of references "
            "(a string, or a list of strings) per prediction."
        )
    for index, prediction in enumerate(predictions):
        if not isinstance(prediction, str):
            raise ValueError(f"Prediction {index} is a {type(prediction).__name__}, not a string.")
    references = [[refs] if isinstance(refs, str) else list(refs) for refs in references]
    for index, refs in enumerate(references):
        if not refs or not all(isinstance(ref, str) for ref in refs):
            raise ValueError(f"References of segment {index} must be a string or a non-empty list of strings: {refs}.")
    return list(predictions), references
