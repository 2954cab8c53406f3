"""What a `train` run reports: its validation schedule, the averaged checkpoints it saves, the validation or test
results it prints and saves, and the model card it writes with them."""

import tempfile
from pathlib import Path

import numpy as np

from ..hub.card import write_model_card
from ..hub.card_facts import CARD_RESULTS_FILE, CardFacts, checkpoint_step, run_card_facts
from ..hub.evaluation import decoding_in_words
from ..inference.metrics import score_translations
from ..training.averaging import average_checkpoints, find_checkpoints
from .profile import print_pair
from ..training.trainer import VALIDATION_DECODING, translation_metrics


def validation_schedule(training_args) -> str:
    """When the run validates and what it reports, in words (for the log)."""
    strategy = training_args.eval_strategy.value
    when = dict(epoch="at the end of every epoch", no="never (--eval-strategy no)").get(strategy)
    when = when or f"every {training_args.eval_steps:g} steps"
    what = "loss"
    if training_args.predict_with_generate:
        what = "loss, BLEU and chrF" + (f" ({validation_decoding(training_args)})" if strategy != "no" else "")
    return f"validation: {what} {when}"


def validation_decoding(training_args) -> str:
    """The decoding of validation BLEU, in words."""
    return decoding_flags(training_args) or (
        f"greedy, at most source length + {VALIDATION_DECODING['max_length_over_source']} tokens")


def decoding_flags(training_args) -> str | None:
    """The decoding that `--generation-num-beams` / `--generation-max-length` set for validation and test, in words;
    None when neither is given (validation: `VALIDATION_DECODING`, test: the model's generation config)."""
    return decoding_in_words(training_args.generation_num_beams or None, training_args.generation_max_length or None)


def average_last_checkpoints(trainer, last_n: int) -> str:
    """Section 6.1: give the model the average of the weights of the run's last `last_n` checkpoints. Returns what it
    averaged, in words."""
    trainer.accelerator.wait_for_everyone()  # the last checkpoint is written
    checkpoints = find_checkpoints(trainer.args.output_dir, last_n)
    with tempfile.TemporaryDirectory() as folder:
        average_checkpoints(checkpoints, folder, force=True)
        trainer.model.load_state_dict(type(trainer.model).from_pretrained(folder).state_dict())
    steps = [checkpoint_step(path) for path in checkpoints]
    return f"the average of the last {last_n} checkpoints (steps {steps[0]:,}-{steps[-1]:,})"


def save_run(trainer, result) -> None:
    """The model, tokenizer and generation config in the output folder, with the training metrics and the Trainer's
    state."""
    trainer.save_model()
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()


def report_validation_results(trainer) -> None:
    """Without a test split to translate: the validation loss (and BLEU and chrF with --predict-with-generate)."""
    metrics = trainer.evaluate(metric_key_prefix="eval")
    if "eval_bleu" in metrics:  # what the model card reports with the scores
        signatures = score_translations(["."], ["."])  # sacreBLEU's signature depends on its settings only
        metrics.update(eval_bleu_signature=signatures["bleu_signature"],
                       eval_chrf_signature=signatures["chrf_signature"])
        metrics["eval_decoding"] = validation_decoding(trainer.args)
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)


def report_test_results(trainer, splits, tokenized, data_args, tokenizer, profile, averaged: str | None = None):
    """Translate the test splits of `profile` (`test`; the demo's `seen` too) with the model's generation config
    (section 6.1's beam search) unless `--generation-num-beams` / `--generation-max-length` say otherwise, whatever
    `--predict-with-generate` says for validation; print samples, exact-match accuracy, sacreBLEU (with its
    signature) and chrF on the detokenized text, with what the profile adds, and save them. `averaged` says which
    checkpoints the model averages, if it does. Returns the metrics and each split's translations."""
    if not trainer.args.predict_with_generate:
        # --predict-with-generate false keeps generate() out of validation; test files are still translated and scored.
        trainer.args.predict_with_generate = True
        trainer.compute_metrics = translation_metrics(tokenizer)
    metrics, hypotheses = {}, {}
    for name in profile.test_splits():
        metrics_of_split, hypotheses[name] = translate_and_score(trainer, splits[name], tokenized[name],
                                                                 data_args.target_lang, tokenizer, prefix=name)
        metrics.update(metrics_of_split)
    metrics.update(profile.test_metrics(splits, hypotheses, data_args.target_lang))
    if trainer.is_world_process_zero():
        print_test_results(trainer, splits, hypotheses, metrics, data_args, profile, averaged)
    trainer.log_metrics("test", metrics)
    trainer.save_metrics("test", metrics)
    return metrics, hypotheses


def translate_and_score(trainer, pairs, tokenized, target_lang: str, tokenizer, prefix: str):
    """The beam-search translations of one split and its `{prefix}_` metrics: the Trainer's (loss, BLEU, chrF),
    exact match and the sacreBLEU signatures."""
    output = trainer.predict(tokenized, metric_key_prefix=prefix)
    predictions = np.where(output.predictions < 0, tokenizer.pad_token_id, output.predictions)
    hypotheses = [text.strip() for text in tokenizer.batch_decode(predictions, skip_special_tokens=True)]
    references = [pair[target_lang] for pair in pairs["translation"]]
    scores = score_translations(hypotheses, references)
    metrics = dict(output.metrics)
    metrics[f"{prefix}_exact_match"] = 100.0 * float(np.mean([h == r for h, r in zip(hypotheses, references)]))
    metrics[f"{prefix}_bleu_signature"] = scores["bleu_signature"]
    metrics[f"{prefix}_chrf_signature"] = scores["chrf_signature"]
    return metrics, hypotheses


def print_test_results(trainer, splits, hypotheses, metrics, data_args, profile, averaged):
    source_lang, target_lang = data_args.source_lang, data_args.target_lang
    test = splits["test"]
    print(f"\nSample translations ({source_lang} -> {target_lang}) of held-out data:")
    for index in profile.sample_indices(test, 8):
        print_pair(test[index]["translation"], hypotheses["test"][index], source_lang, target_lang)
    beams = trainer.args.generation_num_beams or trainer.model.generation_config.num_beams
    print(f"\nHeld-out ({len(test)} pairs, beam {beams}): "
          f"exact match {metrics['test_exact_match']:.1f}%, BLEU {metrics['test_bleu']:.2f}, "
          f"chrF {metrics['test_chrf']:.2f}")
    profile.print_test_results(splits, hypotheses, metrics, source_lang, target_lang)
    print(f"sacreBLEU signature: {metrics['test_bleu_signature']}")
    if averaged:
        print(f"Model: {averaged}")
    print(f"Model folder (loads with from_pretrained): {trainer.args.output_dir}")


def card_results(metrics, splits, hypotheses, data_args, profile, averaged=None,
                 decoding: str | None = None) -> CardFacts:
    """The test results as the model card takes them: scores with their signatures, the data, samples and the
    recipe facts the training arguments do not hold, with what `profile` adds (the demo: the numbers below 1,000
    seen in training, exact match per magnitude); `decoding`: how the test was decoded, where flags changed the
    model's generation config."""
    test = splits["test"]
    results = [
        dict(
            **data,
            split=split,
            bleu=metrics[f"{prefix}_bleu"],
            chrf=metrics[f"{prefix}_chrf"],
            bleu_signature=metrics[f"{prefix}_bleu_signature"],
            chrf_signature=metrics[f"{prefix}_chrf_signature"],
            num_sentences=len(hypotheses[prefix]),
            **({"decoding": decoding} if decoding else {}),
        )
        for prefix, split, data in profile.card_evaluations(metrics, data_args)
    ]
    samples = [
        dict(source=test[index]["translation"][data_args.source_lang],
             reference=test[index]["translation"][data_args.target_lang], hypothesis=hypotheses["test"][index])
        for index in profile.sample_indices(test, 5)
    ]
    training = dict(max_tokens=data_args.max_tokens, bpe_dropout=data_args.bpe_dropout,
                    bpe_dropout_target=data_args.bpe_dropout_target)
    # An averaged model: the card names the weights in its table of models.
    variants = [dict(model=averaged, decoding=decoding or "the defaults above", bleu=metrics["test_bleu"],
                     chrf=metrics["test_chrf"])] if averaged else None
    extras = profile.card_extras(splits, hypotheses, data_args.target_lang)
    return CardFacts(results=results, samples=samples, training=training, variants=variants,
                     training_data=extras.pop("training_data", None), extra=extras)


def write_card(output_dir, results: CardFacts) -> None:
    """The output folder's model card, from the saved model and the test `results`, which card_results.json keeps for
    `vanilla-transformer model-card` and `push`."""
    output_dir = Path(output_dir)
    # The data and languages as the run recorded them (run_arguments.json) where the results do not name them.
    run = run_card_facts(output_dir)
    for name in ("training_data", "datasets", "source_lang", "target_lang"):
        if getattr(results, name) is None and name in run:
            setattr(results, name, run[name])
    results.write(output_dir / CARD_RESULTS_FILE)
    write_model_card(output_dir, output_dir / "README.md", results)
