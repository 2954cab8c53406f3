"""The Hub model card of a saved model, generated from the folder, never written by hand.

```python
>>> from vanilla_transformer.hub.card import model_card
>>> model_card("runs/multi30k-en-de/averaged", results="card.json").save("model_cards/multi30k-en-de.md")
```

Its metadata (languages, license, datasets, a `model-index` with BLEU and chrF) and body (hyper-parameters, recipe,
results with their sacreBLEU signature, samples, usage, license, citation) come from the saved config and generation
config, the training run (`trainer_state.json`, the training arguments that the TensorBoard callback logs, what `train`
recorded: `card_facts.run_card_facts`), what `average` recorded of the checkpoints it averaged
(`card_facts.averaged_checkpoints`) and the evaluation results (`card_facts.CardFacts`), rendered with
`model_card_template.md`. The card invents nothing: an evaluation without `dataset` is shown as "data not named" and
left out of the `model-index`, and without samples the usage examples translate a placeholder that says so.
`push.py` writes the repository folder the card goes into and uploads it.
"""

import json
import math
import os
import re
import shutil
from pathlib import Path

import torch
from huggingface_hub import EvalResult, ModelCard, ModelCardData
from transformers import GenerationConfig

from ..extras import require
from ..model.configuration_vanilla_transformer import VanillaTransformerConfig
from ..model.modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from ..schedule import paper_learning_rate
from ..paths.text_files import output_file
from .card_facts import (TRAINER_SPLITS, CardFacts, average_in_words, averaged_checkpoints, card_figures,
                         read_card_facts, read_json, run_card_facts, score_prefix, trained_steps)

CARD_TEMPLATE_PATH = Path(__file__).with_name("model_card_template.md")
TAGS = ["translation", "vanilla-transformer", "transformer", "seq2seq", "encoder-decoder"]
PAPER_CITATION = """\
@inproceedings{vaswani2017attention,
  title     = {Attention Is All You Need},
  author    = {Vaswani, Ashish and Shazeer, Noam and Parmar, Niki and Uszkoreit, Jakob and Jones, Llion and
               Gomez, Aidan N. and Kaiser, {\\L}ukasz and Polosukhin, Illia},
  booktitle = {Advances in Neural Information Processing Systems},
  volume    = {30},
  pages     = {5998--6008},
  year      = {2017},
  url       = {https://arxiv.org/abs/1706.03762}
}"""


def model_card(
    model_dir: str | os.PathLike,
    results: CardFacts | dict | str | os.PathLike | None = None,
    *,
    run_dir: str | os.PathLike | None = None,
    repo_id: str | None = None,
    license: str = "apache-2.0",
    demo_space: str | None = None,
) -> ModelCard:
    """The Hub model card of the model saved in `model_dir`. `results` describes the evaluation
    (`card_facts.CardFacts`); without it the card reports what `run_dir` recorded: `card_results.json` (written by `vanilla-transformer train`), else the Trainer's `test_results.json`,
    else its `eval_results.json`. `run_dir` is the training run (default: `model_dir`, where `train` writes both); its
    records give the recipe and the steps of these weights (`card_facts.trained_steps`). Give the results of exactly
    these weights: an averaged model's scores are not those of the run's last checkpoint. `repo_id` ("USER/NAME")
    goes into the usage examples, `license` (a Hub license id) into the metadata and the body, the Space `demo_space`
    (USER/NAME: `push --space`) into a link to its page. Needs the `train` extra (jinja2 renders the template)."""
    require("jinja2", extra="train")
    model_dir, run_dir = Path(model_dir), Path(run_dir) if run_dir is not None else Path(model_dir)
    facts = read_card_facts(results, run_dir)
    run = run_card_facts(run_dir)
    config = VanillaTransformerConfig.from_pretrained(model_dir)
    source_lang = facts.source_lang or getattr(config, "source_lang", None) or run.get("source_lang")
    target_lang = facts.target_lang or getattr(config, "target_lang", None) or run.get("target_lang")
    model_name = (repo_id or model_dir.resolve().name).split("/")[-1]
    evaluations = [_evaluation(entry, source_lang, target_lang, run.get("split_data") or {}) for entry in facts.results]
    # The arguments the Trainer logged to TensorBoard, else those the `train` command recorded.
    training_args = {**_recorded_training_arguments(run, config), **_logged_training_arguments(run_dir)}
    trainer_state = read_json(run_dir / "trainer_state.json")
    samples = [_sample(sample) for sample in facts.samples or []]
    figures = [dict(name=path.name, caption=caption) for path, caption in card_figures(facts, run_dir)]
    datasets = (facts.datasets or run.get("datasets")
                or sorted({e["dataset_id"] for e in evaluations if e["dataset_id"]}) or None)

    return ModelCard.from_template(
        _card_data(model_name, (source_lang, target_lang), license, datasets, evaluations),
        template_path=str(CARD_TEMPLATE_PATH),
        model_name=model_name,
        repo_id=repo_id or "USER/NAME",
        demo_space=demo_space,
        source_lang=source_lang,
        target_lang=target_lang,
        architecture=_architecture_rows(config),
        position_embedding_type=config.position_embedding_type,
        code_files=sorted(path.name for path in model_dir.glob("*.py")),
        decoding=_decoding(model_dir),
        recipe=_recipe_rows(config, training_args, trainer_state, facts.training or {}, run,
                            trained=trained_steps(model_dir, run_dir, run), averaged=averaged_checkpoints(model_dir)),
        arguments_recorded=bool(training_args or facts.training),
        training_data=facts.training_data or run.get("training_data"),
        datasets=datasets,
        evaluations=evaluations,
        unnamed_data=any(evaluation["dataset"] is None for evaluation in evaluations),
        samples=samples,
        variants=facts.variants or [],
        figures=figures,
        example=repr(samples[0]["source"] if samples else _placeholder_sentence(source_lang)),  # a Python literal
        license=license,
        citation=PAPER_CITATION,
    )


def _placeholder_sentence(source_lang: str | None) -> str:
    """The usage examples' input when no sample was recorded: a placeholder that says so, not an invented sentence."""
    return f"<a sentence in {source_lang}>" if source_lang else "<a sentence in the source language>"


def _card_data(model_name: str, languages, license: str, datasets: list[str] | None, evaluations: list[dict]):
    """The card's metadata: languages, license, datasets, and a `model-index` of each evaluation's BLEU and chrF."""
    return ModelCardData(
        language=[lang for lang in languages if lang] or None,
        license=license,
        library_name="transformers",
        pipeline_tag="translation",
        tags=TAGS,
        datasets=datasets,
        metrics=["bleu", "chrf"] if evaluations else None,
        model_name=model_name,
        eval_results=[result for evaluation in evaluations for result in evaluation["eval_results"]] or None,
    )


def write_model_card(
    model_dir: str | os.PathLike,
    out: str | os.PathLike,
    results: CardFacts | dict | str | os.PathLike | None = None,
    *,
    run_dir: str | os.PathLike | None = None,
    repo_id: str | None = None,
    license: str = "apache-2.0",
    demo_space: str | None = None,
) -> ModelCard:
    """[`model_card`] saved as `out` (e.g. `model_cards/NAME/README.md`), with the figures it shows copied next to it."""
    out, run_dir = Path(out), Path(run_dir or model_dir)
    facts = read_card_facts(results, run_dir)
    card = model_card(model_dir, facts, run_dir=run_dir, repo_id=repo_id, license=license, demo_space=demo_space)
    out.parent.mkdir(parents=True, exist_ok=True)
    with output_file(out) as file:  # whole or not at all
        file.write(str(card))
    for path, _ in card_figures(facts, run_dir):
        copy = out.parent / path.name
        if not (copy.exists() and copy.samefile(path)):
            shutil.copyfile(path, copy)
    return card


def _evaluation(entry: dict, source_lang: str | None, target_lang: str | None, split_data: dict | None = None) -> dict:
    """One evaluation's scores, dataset and sacreBLEU signatures, with its `EvalResult`s for the model-index.
    `split_data`: the data of each split where the entry names none (a Trainer's metrics; `run_card_facts`)."""
    prefix = score_prefix(entry)

    def value(name):
        return entry.get(f"{prefix}{name}", entry.get(name))

    split = entry.get("split") or TRAINER_SPLITS.get(prefix, "test")
    # No name is made up for unnamed data: the card says it is not named, and its model-index, which names the data
    # of every score it lists, leaves these scores out.
    dataset = entry.get("dataset") or entry.get("dataset_id") or (split_data or {}).get(split)
    dataset_id = entry.get("dataset_id")
    scores = {"bleu": value("bleu"), "chrf": value("chrf"), "exact_match": value("exact_match")}
    languages = f" ({source_lang} -> {target_lang})" if source_lang and target_lang else ""
    eval_results = [
        EvalResult(
            task_type="translation",
            task_name=f"Translation{languages}",
            dataset_type=dataset_id or re.sub(r"[^a-z0-9]+", "-", dataset.lower()).strip("-"),
            dataset_name=dataset,
            dataset_config=entry.get("dataset_config"),
            dataset_split=split,
            metric_type=metric,
            metric_name=name,
            metric_value=round(float(scores[metric]), 2),
        )
        for metric, name in (("bleu", "sacreBLEU"), ("chrf", "chrF"))
        if scores[metric] is not None and dataset is not None
    ]
    return dict(
        dataset=dataset,
        dataset_id=dataset_id,
        split=split,
        scores={name: round(float(score), 2) for name, score in scores.items() if score is not None},
        bleu_signature=value("bleu_signature"),
        chrf_signature=value("chrf_signature"),
        num_sentences=entry.get("num_sentences"),
        decoding=value("decoding"),
        eval_results=eval_results,
    )


def _sample(sample) -> dict:
    if isinstance(sample, dict):
        return {key: sample[key] for key in ("source", "reference", "hypothesis")}
    source, reference, hypothesis = sample
    return dict(source=source, reference=reference, hypothesis=hypothesis)


def _architecture_rows(config: VanillaTransformerConfig) -> list[tuple[str, str, str]]:
    """(what, paper symbol, value) rows of the hyper-parameters table."""
    with torch.device("meta"):  # counts the parameters without allocating or reading weights
        num_parameters = VanillaTransformerForConditionalGeneration(config).num_parameters()
    positions = {
        "sinusoidal": "sinusoidal, sin/cos interleaved (section 3.5)",
        "learned": f"learned, up to {config.max_position_embeddings} (Table 3 row E)",
    }[config.position_embedding_type]
    embeddings = "one matrix for source, target and pre-softmax" if config.tie_word_embeddings else "separate"
    if config.scale_embedding:
        embeddings += ", times sqrt(d_model)"

    attention_relu_dropout = f"{config.attention_dropout:g} / {config.activation_dropout:g}"
    if config.attention_dropout or config.activation_dropout:  # section 5.4 has residual dropout only
        attention_relu_dropout += " (not in the paper: tensor2tensor's attention_dropout / relu_dropout)"

    def pair(encoder, decoder):
        return f"{encoder}" if encoder == decoder else f"{encoder} / {decoder} (encoder / decoder)"

    return [
        ("layers", "N", pair(config.encoder_layers, config.decoder_layers)),
        ("model width", "d_model", f"{config.d_model}"),
        ("attention heads", "h", pair(config.encoder_attention_heads, config.decoder_attention_heads)),
        _head_sizes_row(config),
        ("feed-forward inner size", "d_ff", pair(config.encoder_ffn_dim, config.decoder_ffn_dim)),
        ("residual dropout", "P_drop", f"{config.dropout:g}"),
        ("attention / ReLU dropout", "", attention_relu_dropout),
        ("activation", "", config.activation_function),
        ("positions", "PE", positions),
        ("normalisation", "", "pre-LN, final LayerNorm per stack" if config.normalize_before else "post-LN (paper)"),
        ("embeddings", "", embeddings),
        ("vocabulary", "", f"{config.vocab_size:,} tokens, shared by both languages"),
        ("parameters", "", f"{num_parameters:,}"),
    ]


def _head_sizes_row(config: VanillaTransformerConfig) -> tuple[str, str, str]:
    """The card's row of the query/key and value sizes per head (section 3.2.2): one number where they are equal, as
    in the paper's base and big models; both where a config sets them apart (Table 3 row (B))."""
    sizes = [config.head_sizes(heads) for heads in (config.encoder_attention_heads, config.decoder_attention_heads)]
    equal = all(d_k == d_v for d_k, d_v in sizes)
    words = [f"{d_k}" if equal else f"{d_k} / {d_v}" for d_k, d_v in sizes]
    text = words[0] if sizes[0] == sizes[1] else f"{words[0]} (encoder), {words[1]} (decoder)"
    return "key / value size per head", "d_k = d_v" if equal else "d_k / d_v", text


def _decoding(model_dir: Path) -> dict | None:
    if not (model_dir / "generation_config.json").is_file():
        return None
    generation = GenerationConfig.from_pretrained(model_dir)
    return dict(
        num_beams=generation.num_beams,
        length_penalty=generation.length_penalty,
        # Section 6.1's settings that transformers lacks (see decoding_vanilla_transformer.py); absent in folders
        # saved before they existed, which then decode with transformers' own length penalty and limits.
        gnmt=getattr(generation, "length_penalty_type", "transformers") == "gnmt",
        max_length_over_source=getattr(generation, "max_length_over_source", None),
        early_stopping=generation.early_stopping,
        max_length=generation.max_length,
        max_new_tokens=generation.max_new_tokens,
    )



def _recorded_training_arguments(run: dict, config) -> dict:
    """The training arguments `train` recorded (`run_card_facts`), with `--learning-rate 0` read as the command reads
    it: the section 5.3 peak, `lr_scale * (d_model * warmup)^-0.5`."""
    arguments = dict(run.get("arguments") or {})
    if arguments.get("learning_rate") == 0 and arguments.get("warmup_steps"):
        arguments["learning_rate"] = paper_learning_rate(config.d_model, arguments["warmup_steps"],
                                                         arguments.get("lr_scale", 1.0))
    return arguments


def _logged_training_arguments(run_dir: Path) -> dict:
    """The `TrainingArguments` of the run as the Trainer's TensorBoard callback logs them (`args` text), or `{}`.

    Read from the event files rather than `training_args.bin`, which only unpickling (running code) could read."""
    event_files = sorted(run_dir.glob("runs/*/events.out.tfevents.*"), key=lambda path: path.stat().st_mtime)
    if not event_files:
        return {}
    require("tensorboard", extra="train")
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    arguments = {}
    for path in event_files:  # the last run's arguments win (a resumed run logs them again)
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.tag == "args/text_summary":
                    arguments = json.loads(value.tensor.string_val[0].decode("utf-8"))
    return arguments


def _duration(seconds: float) -> str:
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _recipe_rows(config, training_args: dict, trainer_state: dict | None, training: dict,
                 run: dict | None = None, *, trained: tuple[int, float | None] | None = None,
                 averaged: list[dict] | None = None) -> list[tuple[str, str]]:
    """(what, value) rows of the training table, from the logged arguments, the Trainer state, `training`, what
    the run recorded (`run_card_facts`: the training time and hardware of the whole run, resumes included), the steps
    of the weights (`trained`: `card_facts.trained_steps`) and the checkpoints averaged (`averaged`)."""
    run = run or {}
    args = {**training_args, **training}
    rows = []
    if "adam_beta1" in args:
        optimizer = f"Adam, beta1 {args['adam_beta1']:g}, beta2 {args['adam_beta2']:g}, eps {args['adam_epsilon']:g}"
        if args.get("weight_decay"):
            optimizer += f", weight decay {args['weight_decay']:g}"
        rows.append(("optimizer (5.3)", f"{optimizer} (`{args.get('optim', 'adamw_torch')}`)"))
    if "learning_rate" in args:
        rows.append(("learning rate (5.3)", _learning_rate(config.d_model, args)))
    if "label_smoothing_factor" in args:
        rows.append(("label smoothing (5.4)", f"{args['label_smoothing_factor']:g}"))
    if "max_grad_norm" in args:
        rows.append(("gradient clipping", f"max norm {args['max_grad_norm']:g}" if args["max_grad_norm"] else "none"))
    if args.get("max_tokens"):  # a `train` option, not a TrainingArguments field: given in `training`
        rows.append(("batch (5.1)", f"~{args['max_tokens']:,} tokens of pairs of similar length"))
    if args.get("bpe_dropout"):  # a `train` option too
        sides = "pairs" if args.get("bpe_dropout_target", True) else "sources"
        rows.append(("BPE-dropout", f"{args['bpe_dropout']:g} on the training {sides}, drawn anew every epoch "
                                    "(not in the paper: Provilkov et al., 2020)"))
    if args.get("gradient_accumulation_steps", 1) > 1:
        rows.append(("gradient accumulation", f"{args['gradient_accumulation_steps']} steps"))
    rows += _progress_rows(args, trainer_state, run, trained, averaged)
    if run.get("hardware"):
        rows.append(("hardware", "; ".join(run["hardware"])))
    if "bf16" in args:
        # The Trainer's --bf16 / --fp16 are mixed precision: autocast products, float32 weights and optimizer.
        mixed = "bf16" if args["bf16"] else "fp16" if args.get("fp16") else None
        rows.append(("precision", f"{mixed} mixed precision (float32 weights)" if mixed else "fp32"))
    if "seed" in args:
        rows.append(("seed", f"{args['seed']}"))
    return rows


def _progress_rows(args: dict, trainer_state: dict | None, run: dict, trained, averaged) -> list[tuple[str, str]]:
    """The rows of the steps, the checkpoints averaged, the training time and the training loss (`_recipe_rows`)."""
    rows = []
    if trained is None and trainer_state:
        trained = trainer_state["global_step"], trainer_state.get("epoch")
    if trained:
        steps, epochs = trained
        rows.append(("steps", f"{steps:,}" + (f" ({epochs:.1f} epochs)" if epochs is not None else "")))
    elif args.get("max_steps", 0) > 0:  # the plan, not what was trained: a run may stop early
        rows.append(("steps", f"not recorded (`max_steps` {args['max_steps']:,} was planned)"))
    if averaged:
        rows.append(("checkpoint averaging (6.1)", average_in_words(averaged)))
    final = next((entry for entry in reversed(trainer_state["log_history"]) if "train_runtime" in entry),
                 None) if trainer_state else None
    sessions = run.get("sessions", 1)
    # The run's time when it trained on past the weights' steps (an average of earlier checkpoints).
    whole = f" (the run's {run['steps']:,} steps)" if trained and run.get("steps", trained[0]) != trained[0] else ""
    if run.get("training_seconds"):  # the whole run; the Trainer's train_runtime is its last session's only
        resumed = f", {sessions} sessions (resumed)" if sessions > 1 else ""
        rows.append(("training time", f"{_duration(run['training_seconds'])}{resumed}{whole}"))
    elif final:  # a run resumed from a checkpoint saved before the clock counted only its last session
        last = " (its last session: the time before it was resumed was not recorded)" if sessions > 1 else ""
        rows.append(("training time", f"{_duration(final['train_runtime'])}{last}"))
    if final:
        smoothed = " (label-smoothed)" if args.get("label_smoothing_factor") else ""
        over = "the run" if sessions == 1 else "its last session"
        rows.append((f"training loss, mean over {over}", f"{final['train_loss']:.3f}{smoothed}"))
    return rows


def _learning_rate(d_model: int, args: dict) -> str:
    rate = args["learning_rate"]
    warmup = args.get("warmup_steps") or 0
    if float(warmup).is_integer():  # transformers 5 stores warmup_steps as a float (it also takes a ratio)
        warmup = int(warmup)
    if args.get("lr_scheduler_type") == "inverse_sqrt" and warmup >= 1:
        # transformers' inverse_sqrt with peak (d_model * warmup)^-0.5 is exactly section 5.3's formula.
        scale = rate * math.sqrt(d_model * warmup)
        factor = "" if math.isclose(scale, 1.0, rel_tol=1e-6) else f"{scale:.3g} * "
        return (
            f"{factor}d_model^-0.5 * min(step^-0.5, step * {warmup}^-1.5): warm-up {warmup:,} steps, "
            f"peak {rate:.3g} (`inverse_sqrt`)"
        )
    return f"peak {rate:.3g}, `{args.get('lr_scheduler_type', 'linear')}` schedule, warm-up {warmup:,} steps"

__all__ = [
    "CARD_TEMPLATE_PATH",
    "PAPER_CITATION",
    "TAGS",
    "model_card",
    "write_model_card",
]
