"""The facts a model card is made from, each file read, written and checked here: what `vanilla-transformer train`
records of a run ([`RunRecord`], `run_arguments.json`), what `average` records of the checkpoints it averaged
([`averaged_checkpoints`]) and the results a card reports ([`CardFacts`]).

The results (a dict, or a JSON file holding one; by default the run's `card_results.json`, which `vanilla-transformer
train` writes, else its `test_results.json`, else `eval_results.json`) are either a metrics file as the Trainer writes
it (`test_results.json`: `test_bleu`, `test_chrf`, ...) or a description of the model with these optional keys
(`vanilla-transformer evaluate --json` writes `results` and `samples`):

- `results`: a list of evaluations, each `{"dataset": "Multi30k", "dataset_id": "bentrevett/multi30k",
  "split": "test_2016_flickr", "bleu": 33.99, "chrf": 57.11,
  "bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0", "chrf_signature": "...",
  "num_sentences": 1000}`; also `dataset_config` (the `load_dataset` configuration, e.g. `"de-en"` of `wmt14`)
  and `decoding` (e.g. `"greedy"`, when it differs from the saved generation config). Trainer-prefixed keys such
  as `test_bleu` work too;
- `source_lang`, `target_lang`: language codes, when the config does not carry them;
- `datasets`: Hub ids of the training data; `training_data`: the data, described to follow "Data: " in the card;
- `training`: recipe facts the training arguments do not hold, e.g. `{"max_tokens": 4096}`;
- `samples`: `[{"source": ..., "reference": ..., "hypothesis": ...}]`;
- `variants`: the first evaluation's test set scored other ways, shown as a table, e.g.
  `[{"model": "last checkpoint (step 2600)", "decoding": "greedy", "bleu": 34.77, "chrf": 58.54}]`;
- `figures`: PNG plots shown in the card, `[{"file": "plots/training.png", "caption": "..."}]`, the file relative to
  the run folder. The card names each by its file name, so `write_model_card` and `push_to_hub` put the files next
  to the card.

[`read_card_facts`] checks them before anything is loaded: a `ValueError` names the file and the entry the card cannot
show. [`run_card_facts`] gives the card what the run recorded, in its words, and [`trained_steps`] the steps that made
the weights.
"""

import json
import math
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any


# A checkpoint folder of a run, as the Trainer names it (`PREFIX_CHECKPOINT_DIR`-step), defined once for every layer
# that reads run folders.
CHECKPOINT_PATTERN = re.compile(r"checkpoint-(\d+)")


def checkpoint_step(path: str | os.PathLike) -> int | None:
    """The step of a `checkpoint-<step>` folder name; None for any other name."""
    match = CHECKPOINT_PATTERN.fullmatch(Path(path).name)
    return int(match.group(1)) if match else None


class CardFactsError(ValueError):
    """Facts for a model card (a results file, a run's records, its figures) that cannot be read or do not fit: the
    message names the file or the field."""


# What `train` records of a run in its output folder, so that --resume-from-checkpoint alone continues it.
RUN_RECORD_FILE = "run_arguments.json"
# The results `train` writes for the card (and `model-card` and `push` read first).
CARD_RESULTS_FILE = "card_results.json"
# The files of a run that record its results, in the order a card without a results file looks for them.
RUN_RESULT_FILES = (CARD_RESULTS_FILE, "test_results.json", "eval_results.json")
# What `average` records in the folder of an average: the checkpoints it averaged, with their steps.
AVERAGED_CHECKPOINTS_FILE = "averaged_checkpoints.json"
# Trainer metric prefixes, most relevant first, and the split each one names.
TRAINER_SPLITS = {"test_": "test", "predict_": "test", "eval_": "validation"}


# --- run_arguments.json ----------------------------------------------------------------------------------------------

@dataclass
class RunFacts:
    """What the model card reports of a run beyond its arguments (`run` in run_arguments.json): the pairs of each
    split, the hardware of each session, and, for the whole run (resumes included), its steps, epochs, sessions and
    training time (absent when the clock did not see all of it)."""

    pairs: dict[str, int] | None = None
    hardware: list[str] | None = None
    steps: int | None = None
    epochs: float | None = None
    sessions: int | None = None
    training_seconds: float | None = None

    @classmethod
    def from_json(cls, value) -> "RunFacts":
        value = value if isinstance(value, dict) else {}
        return cls(**{item.name: value.get(item.name) for item in fields(cls)})

    def to_json(self) -> dict:
        return {item.name: getattr(self, item.name) for item in fields(self) if getattr(self, item.name) is not None}


@dataclass
class RunRecord:
    """`run_arguments.json`: the arguments a resumed run takes from the run it continues (flag name -> value, paths
    absolute), whether the run is the number-words demo (`demo`; None in a record without it), and under `run` the
    facts the card reports ([`RunFacts`]). On disk: `{**arguments, "demo": ..., "run": {...}}`."""

    arguments: dict[str, Any]
    demo: bool | None = None
    facts: RunFacts = field(default_factory=RunFacts)

    @classmethod
    def read(cls, run_dir: str | os.PathLike) -> "RunRecord | None":
        """The record of the run in `run_dir`; None when it has none (or the file holds no JSON object). A
        `ValueError` when the file is not JSON."""
        recorded = read_json(Path(run_dir) / RUN_RECORD_FILE)
        if not isinstance(recorded, dict):
            return None
        arguments = {name: value for name, value in recorded.items() if name not in ("demo", "run")}
        return cls(arguments, recorded.get("demo"), RunFacts.from_json(recorded.get("run")))

    def write(self, run_dir: str | os.PathLike) -> None:
        path = Path(run_dir) / RUN_RECORD_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")

    def to_json(self) -> dict:
        demo = {} if self.demo is None else {"demo": self.demo}
        return {**self.arguments, **demo, "run": self.facts.to_json()}


def run_card_facts(run_dir: str | os.PathLike) -> dict:
    """What `vanilla-transformer train` recorded of the run in `run_dir` ([`RunRecord`]), as the card shows it:
    `training_data` (the data in words: file names with their pairs, or the Hub dataset with its configuration and
    split, for training, validation and test), `datasets` (Hub ids), `source_lang`, `target_lang`, `steps`, `epochs`,
    `training_seconds` and `sessions` (the whole run, resumes included: a run stopped early records the steps it
    trained), `hardware`, and the recorded `arguments`. {} for a folder without the file; a fact the run
    did not record is left out."""
    record = RunRecord.read(run_dir)
    if record is None:
        return {}
    recorded, run = record.arguments, record.facts
    pairs = run.pairs or {}
    facts = {name: recorded[name] for name in ("source_lang", "target_lang") if recorded.get(name)}
    facts["arguments"] = dict(recorded)
    facts.update({name: getattr(run, name) for name in ("steps", "epochs", "training_seconds", "sessions", "hardware")
                  if getattr(run, name)})

    def described(split: str, files: list, dataset: str | None = None) -> str | None:
        count = f"{pairs[split]:,} sentence pairs" if pairs.get(split) is not None else None
        if dataset:
            configuration = recorded.get("dataset_config_name")
            where = f"the Hub dataset `{dataset}`" + (f", configuration `{configuration}`" if configuration else "")
            return f"{where}, split `{split}`" + (f" ({count})" if count else "")
        names = [Path(name).name for name in files if name]
        if not names:
            return None
        return " and ".join(f"`{name}`" for name in names) + (f" ({count})" if count else "")

    if record.demo:
        size = pairs.get("train") or recorded.get("demo_train_size")
        train = (f"the number-words corpus the package generates ({size:,} pairs of numbers below "
                 f"10^{recorded.get('demo_max_digits', 6)})" if size else None)
    elif recorded.get("dataset_name"):
        train = described("train", [], recorded["dataset_name"])
        facts["datasets"] = [recorded["dataset_name"]]
    else:
        train = described("train", [recorded.get("source_file"), recorded.get("target_file"),
                                    recorded.get("train_file")])
    facts["split_data"] = {  # each held-out split's data as card_results.json names it: the source file's name
        split: Path(name).name for split in ("validation", "test")
        if (name := recorded.get(f"{split}_source_file") or recorded.get(f"{split}_file"))
    }
    held_out = [
        f"{text} for {purpose}" for split, purpose in (("validation", "validation"), ("test", "testing"))
        if (text := described(split, [recorded.get(f"{split}_source_file"), recorded.get(f"{split}_target_file"),
                                      recorded.get(f"{split}_file")]))
    ]
    if train:  # what follows "Data: " in the card, e.g. "`pairs.tsv` (600 sentence pairs), en -> fr, for training."
        languages = (f", {facts['source_lang']} -> {facts['target_lang']}"
                     if facts.get("source_lang") and facts.get("target_lang") else "")
        facts["training_data"] = "; ".join([f"{train}{languages}, for training", *held_out]) + "."
    return facts


def trained_steps(model_dir: str | os.PathLike, run_dir: str | os.PathLike,
                  run: dict) -> tuple[int, float | None] | None:
    """(steps, epochs or None) that made the weights of `model_dir`, from the records, never the planned `max_steps`:
    for an average ([`averaged_checkpoints`]), its last checkpoint's; else the Trainer state saved with the weights
    (the model folder's, else the run's); else the steps of the whole run as `train` recorded it (`run`:
    [`run_card_facts`]; a run stopped by SIGTERM has no final Trainer state); else the state of the run's newest
    checkpoint that has one whole (the Trainer writes it last). None when nothing recorded them."""
    averaged = averaged_checkpoints(model_dir)
    if averaged and averaged[-1]["step"] is not None:
        return averaged[-1]["step"], averaged[-1]["epoch"]
    run_dir = Path(run_dir)
    for folder in dict.fromkeys([Path(model_dir), run_dir]):
        if (state := read_json(folder / "trainer_state.json")) is not None:
            return state["global_step"], state.get("epoch")
    if run.get("steps"):
        return run["steps"], run.get("epochs")
    checkpoints = [path for path in run_dir.iterdir() if checkpoint_step(path) is not None] if run_dir.is_dir() else []
    for checkpoint in sorted(checkpoints, key=checkpoint_step, reverse=True):
        try:
            state = read_json(checkpoint / "trainer_state.json")
        except (OSError, ValueError):  # cut short: an interrupted checkpoint
            continue
        if state is not None:  # missing: an interrupted checkpoint
            return state["global_step"], state.get("epoch")
    return None


# --- averaged_checkpoints.json ----------------------------------------------------------------------------------------

def averaged_checkpoints(model_dir: str | os.PathLike) -> list[dict] | None:
    """The checkpoints whose average `model_dir` holds, oldest first, as `average` recorded them
    (`AVERAGED_CHECKPOINTS_FILE`): `{"checkpoint": "checkpoint-300", "step": 300, "epoch": 4.2}` each, the step and
    epoch None where they were not recorded. None for a folder that is not an average. A `ValueError` names a record
    that cannot be read."""
    path = Path(model_dir) / AVERAGED_CHECKPOINTS_FILE
    try:
        recorded = read_json(path)
    except ValueError as error:
        raise CardFactsError(f"{path} is not JSON ({error})") from None
    if recorded is None:
        return None
    checkpoints = recorded.get("checkpoints") if isinstance(recorded, dict) else None
    if not (isinstance(checkpoints, list) and checkpoints and all(
            isinstance(entry, dict) and isinstance(entry.get("step"), (int, type(None))) for entry in checkpoints)):
        raise CardFactsError(f"{path} does not list the averaged checkpoints (`{{\"checkpoints\": [{{\"step\": ...}}]}}`)")
    return [{"checkpoint": entry.get("checkpoint"), "step": entry.get("step"), "epoch": entry.get("epoch")}
            for entry in checkpoints]


def average_in_words(checkpoints: list[dict]) -> str:
    """An average's checkpoints in words: "the mean of the weights of the 3 checkpoints at steps 200, 250 and 300"
    (named by folder where a step was not recorded)."""
    known = all(checkpoint["step"] is not None for checkpoint in checkpoints)
    names = [f"{entry['step']:,}" if known else f"`{entry['checkpoint']}`" for entry in checkpoints]
    listed = f"{', '.join(names[:-1])} and {names[-1]}" if len(names) > 1 else names[0]
    if len(names) == 1:
        return f"none: the weights of one checkpoint{' at step ' if known else ', '}{listed}"
    return f"the mean of the weights of the {len(names)} checkpoints {'at steps ' if known else ''}{listed}"


# --- card_results.json -----------------------------------------------------------------------------------------------

@dataclass
class CardFacts:
    """The results and facts a card reports (the module's docstring describes each key): `card_results.json`
    as `train` writes it, `evaluate --json`'s file, or a Trainer's metrics file (one evaluation). Keys the card does
    not read (the demo's `exact_match_by_magnitude`) are kept in `extra`, written after the others."""

    results: list[dict] = field(default_factory=list)
    training_data: str | None = None
    datasets: list[str] | None = None
    source_lang: str | None = None
    target_lang: str | None = None
    samples: list | None = None
    training: dict | None = None
    variants: list[dict] | None = None
    figures: list[dict] | None = None
    extra: dict = field(default_factory=dict)

    # The order of the keys in the file.
    _ORDER = ("training_data", "datasets", "source_lang", "target_lang", "results", "samples", "training", "variants",
              "figures")

    @classmethod
    def from_json(cls, value, where: str = "") -> "CardFacts":
        """The facts of a JSON value: a description (a dict with any of the keys above) or a bare metrics dict (one
        evaluation). A `ValueError` naming the first entry the card cannot show (`where`: " in FILE")."""
        if not isinstance(value, dict):
            raise CardFactsError(f"expected a JSON object (`{{\"results\": [...], ...}}`){where}, found {_json_type(value)}")
        if not set(cls._ORDER) & set(value):  # a bare metrics dict (a Trainer's test_results.json) is one evaluation
            value = {"results": [value]}
        _check_facts(value, where)
        known = {name: value[name] for name in cls._ORDER if value.get(name) is not None}
        extra = {name: item for name, item in value.items() if name not in cls._ORDER}
        return cls(**{**known, "results": value.get("results") or []}, extra=extra)

    def to_json(self) -> dict:
        known = {name: getattr(self, name) for name in self._ORDER if getattr(self, name) is not None}
        return {**known, **self.extra}

    def text(self) -> str:
        """`card_results.json`'s text."""
        return json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n"

    def write(self, path: str | os.PathLike) -> None:
        Path(path).write_text(self.text(), encoding="utf-8")


def read_card_facts(results: "CardFacts | dict | str | os.PathLike | None", run_dir: str | os.PathLike) -> CardFacts:
    """The card facts: from `results` (facts, a dict, or a JSON file holding one), else from the first file of
    `RUN_RESULT_FILES` that `run_dir` holds. A `ValueError` says what is wrong with them (naming the file), a
    `FileNotFoundError` which figure is missing, before anything is loaded."""
    run_dir = Path(run_dir)
    if isinstance(results, CardFacts):
        facts = results
    else:
        source = results
        if results is None:
            source = next((run_dir / name for name in RUN_RESULT_FILES if (run_dir / name).is_file()), None)
            results = {"results": []} if source is None else source
        if not isinstance(results, dict):
            try:
                results = json.loads(Path(results).read_text(encoding="utf-8"))
            except UnicodeDecodeError:
                raise CardFactsError(f"{source} is not UTF-8 text") from None
            except json.JSONDecodeError as error:
                raise CardFactsError(f"{source} is not JSON ({error.msg}, line {error.lineno} column {error.colno})") from None
        facts = CardFacts.from_json(results, f" in {source}" if not isinstance(source, dict) else "")
    card_figures(facts, run_dir)
    return facts


def _check_facts(facts: dict, where: str) -> None:
    """A `ValueError` naming the first entry of `facts` that the card cannot show."""

    def number(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    for key in ("results", "samples", "variants", "figures", "datasets"):
        if not isinstance(facts.get(key) or [], list):
            raise CardFactsError(f"`{key}`{where} must be a list, found {_json_type(facts[key])}")
    for index, entry in enumerate(facts.get("results") or [], 1):
        if not isinstance(entry, dict):
            raise CardFactsError(f"result {index}{where} must be an object, found {_json_type(entry)}")
        prefix = score_prefix(entry)
        if f"{prefix}bleu" not in entry:
            keys = ", ".join(sorted(entry)) or "none"
            raise CardFactsError(f"result {index}{where} has no BLEU score (`bleu` or `test_bleu`); its keys: {keys}")
        for name in ("bleu", "chrf", "exact_match"):
            value = entry.get(f"{prefix}{name}")
            if value is not None and not number(value):
                raise CardFactsError(f"`{prefix}{name}` of result {index}{where} is not a number: {value!r}")
    for index, sample in enumerate(facts.get("samples") or [], 1):
        items = [sample.get(key) for key in ("source", "reference", "hypothesis")] if isinstance(sample, dict) else (
            sample if isinstance(sample, list) and len(sample) == 3 else [None])
        if not all(isinstance(item, str) for item in items):
            raise CardFactsError(f"sample {index}{where} needs the strings `source`, `reference` and `hypothesis`")
    for index, variant in enumerate(facts.get("variants") or [], 1):
        if not (isinstance(variant, dict) and number(variant.get("bleu")) and variant.get("model")):
            raise CardFactsError(f"variant {index}{where} needs a `model` and a numeric `bleu`")
        if variant.get("chrf") is not None and not number(variant["chrf"]):
            raise CardFactsError(f"`chrf` of variant {index}{where} is not a number: {variant['chrf']!r}")
    for index, figure in enumerate(facts.get("figures") or [], 1):
        if not (isinstance(figure, dict) and isinstance(figure.get("file"), str)):
            raise CardFactsError(f"figure {index}{where} needs a `file`, relative to the run folder")


def score_prefix(entry: dict) -> str:
    """The Trainer prefix of an evaluation's scores (`test_` of `test_bleu`); "" for `bleu`."""
    return "" if "bleu" in entry else next((p for p in TRAINER_SPLITS if f"{p}bleu" in entry), "")


def card_figures(facts: CardFacts, run_dir: Path) -> list[tuple[Path, str]]:
    """(file, caption) of the card's figures; a missing file is an error, not a broken image on the Hub."""
    figures = []
    for figure in facts.figures or []:
        path = run_dir / figure["file"]
        if not path.is_file():
            raise FileNotFoundError(f"The card's figure {figure['file']!r} is not in the run folder {run_dir}.")
        figures.append((path, figure.get("caption") or path.stem.replace("_", " ")))
    names = [path.name for path, _ in figures]
    if len(set(names)) < len(names):
        raise CardFactsError(f"The card's figures must have different file names (they sit side by side): {names}.")
    return figures


def read_json(path: Path):
    """The JSON value of the file `path`, or None when there is no such file."""
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _json_type(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


__all__ = [
    "AVERAGED_CHECKPOINTS_FILE",
    "CARD_RESULTS_FILE",
    "CHECKPOINT_PATTERN",
    "CardFacts",
    "CardFactsError",
    "RUN_RECORD_FILE",
    "RUN_RESULT_FILES",
    "RunFacts",
    "RunRecord",
    "average_in_words",
    "averaged_checkpoints",
    "checkpoint_step",
    "read_card_facts",
    "read_json",
    "run_card_facts",
    "trained_steps",
]
