"""Translation metrics shipped with the package as `evaluate` modules, so they load offline from the installed files.

`evaluate.load("sacrebleu")` would fetch its script from the Hugging Face Hub; `load_bleu()` and `load_chrf()` load the
module in `sacrebleu_metric/` instead. Both score with sacreBLEU, the tool behind comparable BLEU numbers.

```python
>>> from vanilla_transformer.metrics import load_bleu
>>> bleu = load_bleu()
>>> bleu.compute(predictions=["the cat sat on the mat"], references=[["the cat is on the mat"]], tokenize="13a")
```
"""

from pathlib import Path

import evaluate


# evaluate.load takes a folder holding a script of the same name: `sacrebleu_metric/sacrebleu_metric.py`.
SACREBLEU_METRIC_PATH = str(Path(__file__).parent / "sacrebleu_metric")


def load_metric(name: str, **load_kwargs) -> evaluate.EvaluationModule:
    """The sacreBLEU metric `"bleu"` or `"chrf"` as an `evaluate` module; `load_kwargs` go to `evaluate.load`."""
    if name not in ("bleu", "chrf"):
        raise ValueError(f"Unknown metric {name!r}; choose 'bleu' or 'chrf'.")
    return evaluate.load(SACREBLEU_METRIC_PATH, config_name=name, **load_kwargs)


def load_bleu(**load_kwargs) -> evaluate.EvaluationModule:
    """Corpus BLEU computed by sacreBLEU (`score`, `counts`, `totals`, `precisions`, `bp`, lengths, `signature`)."""
    return load_metric("bleu", **load_kwargs)


def load_chrf(**load_kwargs) -> evaluate.EvaluationModule:
    """Corpus chrF computed by sacreBLEU (`score`, `char_order`, `word_order`, `beta`, `signature`)."""
    return load_metric("chrf", **load_kwargs)


__all__ = ["SACREBLEU_METRIC_PATH", "load_bleu", "load_chrf", "load_metric"]
