"""Multi30k English -> German (or any pair of its languages) end to end with the package: train with the paper's recipe, average the last
checkpoints, evaluate on test_2016_flickr (last vs averaged, greedy vs beam 4), draw the plots, write the model card.

    python examples/multi30k/run.py --data-dir path/to/multi30k --output-dir runs/multi30k-en-de            # 2 CPU cores
    python examples/multi30k/run.py --data-dir path/to/multi30k --output-dir runs/multi30k-base --size base  # a GPU
    python examples/multi30k/run.py --data-dir path/to/multi30k --output-dir runs/multi30k-tiny --size tiny  # 2 cores
    python examples/multi30k/run.py ... --skip-training   # only the steps after training, on an existing run
    python examples/multi30k/run.py ... --lr-scale 0.5     # any `vanilla-transformer train` option overrides the size's
    python examples/multi30k/run.py ... --seeds 0,1,2      # one run per seed, then their mean and range (seeds.md)
    python examples/multi30k/run.py ... --size wu2021      # Wu et al.'s run on their preparation of the text
    python examples/multi30k/run.py ... --source-lang de --target-lang en  # German -> English

The data folder holds Multi30k task 1 as gzip files (train.{en,de}.gz, val.*, test_2016_flickr.*), read where it is.
Sizes: "cpu", a scaled-down model trained a fixed number of steps on 2 CPU cores in about an hour (60 minutes as a
guard); "tiny", Wu et al.'s (2021) Transformer-tiny for Multi30k, also an hour on 2 CPU cores, its length penalty
chosen on the validation set; "wu2021", the same model trained, averaged, decoded and scored as Wu et al. did it, on
their preparation of the text (lowercased and Moses-tokenized: `--preparation`); "base", Table 3's base model for a
GPU; "smoke", for the tests. Outputs in --output-dir (and prepared/, the prepared text, with --preparation wu2021):
the run (checkpoints, trainer_state.json, TensorBoard logs), averaged/ (the model to share, with its card and plots),
results.json, results.md, plots/ and, when the length penalty is chosen, length_penalty.json; with --seeds, one such
run per seed in seed-N/, and seeds.md, the mean and range of their test scores. The recipe is described in
docs/training.md; docs/experiments/multi30k.md records every run and why the recipe is what it is.
"""

import argparse
import gzip
import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, GenerationConfig  # noqa: E402
from transformers.hf_argparser import string_to_bool  # noqa: E402

from vanilla_transformer.paths import text_files  # noqa: E402
from vanilla_transformer.inference.attention_plots import attention_weights, plot_attention  # noqa: E402
from vanilla_transformer.training.averaging import average_checkpoints, find_checkpoints  # noqa: E402
from vanilla_transformer.backends.table import torch_translator  # noqa: E402
from vanilla_transformer.hub.card import write_model_card  # noqa: E402
from vanilla_transformer.inference.metrics import score_translations  # noqa: E402
from vanilla_transformer.training.cpu_speedups import cpu_computes_bfloat16  # noqa: E402
from vanilla_transformer.train_run.run import main as train  # noqa: E402

# An hour on 2 CPU cores: checkpoints every 100 steps, 60 minutes as a guard, bf16 with eager attention where the CPU
# computes bfloat16, float32 where it emulates it, many times slower (docs/speed.md).
CPU_HOUR = ["--save_steps", "100", "--max_train_minutes", "60", "--predict_with_generate", "false",
            "--bf16", str(cpu_computes_bfloat16()).lower(), "--use_cpu", "true", "--attn_implementation", "eager"]
SIZES = {
    # 2 CPU cores, about an hour: a scaled-down model (docs/training.md).
    "cpu": ["--preset", "base", "--d_model", "256", "--layers", "3", "--heads", "4", "--ffn_dim", "1024",
            "--max_tokens", "2048", "--warmup_steps", "800", "--max_steps", "7000", *CPU_HOUR,
            "--attention_dropout", "0.1", "--activation_dropout", "0.1"],
    # A GPU: Table 3's base model, section 5.1's ~25,000-token batches, warm-up 4,000.
    "base": ["--preset", "base", "--max_tokens", "25000", "--warmup_steps", "4000", "--max_steps", "20000",
             "--save_steps", "1000", "--bf16",
             # Batches of ~25,000 tokens collated in worker processes while the GPU computes (docs/speed.md).
             "--dataloader_num_workers", "2", "--dataloader_persistent_workers", "true"],
    # 2 CPU cores, an hour: Wu et al.'s (2021) text-only Transformer-tiny for Multi30k (docs/experiments/multi30k.md):
    # d_model 128, 4+4 layers, 4 heads, d_ff 256, dropout 0.3 on the residual paths only, a peak rate of 0.005 after
    # 2,000 warm-up steps, ~8,192-token batches, 8,000 updates (the guard stops it earlier on 2 cores).
    "tiny": ["--preset", "base", "--d_model", "128", "--layers", "4", "--heads", "4", "--ffn_dim", "256",
             "--dropout", "0.3", "--attention_dropout", "0", "--activation_dropout", "0",
             "--max_tokens", "8192", "--warmup_steps", "2000", "--learning_rate", "0.005", "--max_steps", "8000",
             *CPU_HOUR],
    # Wu et al.'s run itself (LividWo/Revisit-MMT, README-baseline.md): the tiny model on their prepared text (below),
    # a validation loss every epoch over the whole validation set, stopped after 10 epochs without a better one
    # (fairseq's --patience 10) or at 8,000 updates, a checkpoint every epoch (11 kept: the trainer keeps the best one
    # beside the newest, and the last 10 epochs are averaged); a shared BPE of about their joined
    # dictionary's size (9,709 types from 10,000 merges).
    "wu2021": ["--preset", "base", "--d_model", "128", "--layers", "4", "--heads", "4", "--ffn_dim", "256",
               "--dropout", "0.3", "--attention_dropout", "0", "--activation_dropout", "0",
               "--max_tokens", "8192", "--warmup_steps", "2000", "--learning_rate", "0.005", "--max_steps", "8000",
               *CPU_HOUR, "--max_train_minutes", "600", "--vocab_size", "10000", "--save_strategy", "epoch",
               "--eval_strategy", "epoch", "--max_eval_samples", "1000000", "--save_total_limit", "11",
               "--patience", "10"],
    # The tests: a tiny model, a few steps.
    "smoke": ["--preset", "tiny", "--max_tokens", "512", "--warmup_steps", "4", "--max_steps", "6", "--save_steps", "1",
              "--predict_with_generate", "false"],
}
# After training: how many of the last checkpoints to average and the beam's length penalty alpha. Section 6.1 averages
# the last 5 (base models) and uses alpha = 0.6, both "chosen after experimentation on the development set"; for the
# cpu run the same was done on Multi30k's full validation set (docs/experiments): the last 20 and alpha = 1.0. The
# tiny run averages its last 10, as Wu et al. do, and each run chooses its alpha on the full validation set from
# LENGTH_PENALTIES: its outputs are short at 1.0 (brevity penalty ~0.93 on validation), and past ~1.8 some beams
# run on to the length limit.
# wu2021 decodes as their evaluate.sh: the last 10 epoch checkpoints averaged, beam 5, fairseq's length normalisation
# (log P / |Y| ** alpha, transformers' own), alpha chosen on the validation set (fairseq's default is 1.0).
LENGTH_PENALTIES = [1.0, 1.25, 1.5, 1.75, 2.0]
PAPER_AFTER_TRAINING = dict(average_last=5, length_penalty=[0.6], num_beams=4, length_penalty_type="gnmt")
AFTER_TRAINING = {"cpu": dict(PAPER_AFTER_TRAINING, average_last=20, length_penalty=[1.0]),
                  "tiny": dict(PAPER_AFTER_TRAINING, average_last=10, length_penalty=LENGTH_PENALTIES),
                  "wu2021": dict(average_last=10, length_penalty=LENGTH_PENALTIES, num_beams=5,
                                 length_penalty_type="transformers")}
# How the text is prepared before the tokenizer learns its BPE: "raw", Multi30k as it is (cased, detokenized); "wu2021",
# as Wu et al.'s files are (the WMT16 multimodal task's preparation): lowercased, punctuation normalised and
# Moses-tokenized with Moses' escapes (`&apos;`), BLEU then computed on that text as fairseq computes it.
PREPARATIONS = ("raw", "wu2021")
SPLITS = ("train", "val", "test_2016_flickr")
LANGUAGES = {"en": "English", "de": "German", "fr": "French"}  # Multi30k task 1's


def flag_value(flags: list[str], name: str, type=str):
    """The value `train` reads for option `name` (e.g. "--max_tokens") from `flags` (the last one given), spelled
    with underscores or dashes."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument(*dict.fromkeys([name, name.replace("_", "-")]), dest="value", type=type)
    return parser.parse_known_args(flags)[0].value


def read_lines(path: Path, limit: int | None = None) -> list[str]:
    """The first `limit` lines of a corpus file (all without a limit)."""
    lines = text_files.read_lines(path)
    return lines[:limit] if limit else lines


def prepare_like_wu2021(lines: list[str], lang: str) -> list[str]:
    """`lines` as Wu et al.'s files hold them: lowercased, then punctuation normalised and Moses-tokenized (sacremoses,
    the Moses scripts' port), Moses' escapes kept, no aggressive hyphen splitting. Lowercasing first is what their files
    show: in the other order a few sentence-final periods stay attached ("bart.")."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    normalizer, tokenizer = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
    return [tokenizer.tokenize(normalizer.normalize(line.lower()), escape=True, return_str=True) for line in lines]


def prepared_data(data: Path, out: Path, limit: int | None) -> Path:
    """The folder `out`, made to hold every split of the Multi30k folder `data` (its first `limit` lines) prepared
    as Wu et al. prepared theirs, in the same layout. A file that already holds the same text is left as it is, and
    a new one is written without a time stamp: the command run again (to continue a stopped run) finds the bytes its
    run trained on, which `train` checks before it resumes."""
    out.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        for lang in ("en", "de"):
            path = out / f"{split}.{lang}.gz"
            text = "".join(line + "\n" for line in prepare_like_wu2021(read_lines(data / path.name, limit), lang))
            if path.is_file() and gzip.decompress(path.read_bytes()).decode("utf-8") == text:
                continue
            with gzip.GzipFile(path, "wb", mtime=0) as file:
                file.write(text.encode("utf-8"))
    return out


def train_run(args, data: Path, limit: int | None):
    source, target = args.source_lang, args.target_lang
    files = {f"{split}.{lang}": data / f"{split}.{lang}.gz" for split in SPLITS for lang in (source, target)}
    if limit:  # smoke: a slice of the corpus, written next to the run
        sliced = args.output_dir / "data"
        sliced.mkdir(parents=True, exist_ok=True)
        for name, path in files.items():
            files[name] = sliced / f"{name}.gz"
            with gzip.open(files[name], "wt", encoding="utf-8") as file:
                file.write("".join(line + "\n" for line in read_lines(path, limit)))
    train([
        "--source_file", str(files[f"train.{source}"]), "--target_file", str(files[f"train.{target}"]),
        "--validation_source_file", str(files[f"val.{source}"]),
        "--validation_target_file", str(files[f"val.{target}"]),
        # No test files: the test set is translated after averaging, below, not by `train` with the last weights.
        "--source_lang", source, "--target_lang", target, "--vocab_size", "8000", "--seed", str(args.seed),
        "--eval_strategy", "steps", "--eval_steps", str(args.eval_steps), "--max_eval_samples", "200",
        "--per_device_eval_batch_size", "64", "--output_dir", str(args.output_dir), "--disable_tqdm", "true",
        *args.train_flags,
    ])


def evaluate(model_dir: Path, sources: list[str], references: list[str], num_beams: int, target_lang: str = "de",
             **generate_kwargs) -> dict:
    translate = torch_translator(model_dir)  # on CUDA when available
    hypotheses = translate(sources, batch_size=64, num_beams=num_beams, **generate_kwargs)
    scores = score_translations(hypotheses, references, moses_lang=target_lang)
    return dict(**{key: scores[key] for key in ("bleu", "chrf", "bleu_bp", "bleu_lc_moses", "bleu_signature",
                                                 "chrf_signature", "bleu_lc_moses_signature")},
                bleu_tokenized=tokenized_bleu(hypotheses, references), hypotheses=hypotheses)


def tokenized_bleu(hypotheses: list[str], references: list[str]) -> float:
    """BLEU on the text as it is, split at spaces: fairseq-generate's BLEU4, which Wu et al. report on their
    tokenized, lowercased text (sacreBLEU's formula with its tokenizer off; no n-gram order is empty on a test set)."""
    import sacrebleu

    return sacrebleu.corpus_bleu(hypotheses, [references], tokenize="none", force=True).score


def validation_bleu_from_checkpoints(run_dir: Path, sources: list[str], references: list[str], every: int,
                                     num_beams: int = 4, **generate_kwargs):
    """[(step, BLEU)] of the saved checkpoints every `every` steps on the validation sentences, beam 4 (section
    6.1) unless `num_beams` says otherwise, recomputed after training: the curve of a run whose validation during
    training is not to be trusted."""
    last_step = int(find_checkpoints(run_dir, 1)[0].name.split("-")[1])
    curve = []
    for step in range(every, last_step + 1, every):
        checkpoint = run_dir / f"checkpoint-{step}"
        if checkpoint.is_dir():
            curve.append((step, evaluate(checkpoint, sources, references, num_beams, **generate_kwargs)["bleu"]))
            print(f"validation BLEU at step {step}: {curve[-1][1]:.2f}", flush=True)
    return curve


def choose_length_penalty(model_dir: Path, sources: list[str], references: list[str], candidates: list[float],
                          num_beams: int = 4, **generate_kwargs) -> tuple[float, list[dict]]:
    """The length penalty alpha among `candidates` whose beam-search translations (beam 4 by default) of the validation sentences score the
    highest BLEU (the first of equals), and every candidate's scores: alpha "chosen after experimentation on the
    development set" (section 6.1), per run."""
    trials = []
    for alpha in candidates:
        result = evaluate(model_dir, sources, references, num_beams, length_penalty=alpha, **generate_kwargs)
        trials.append(dict(length_penalty=alpha, **{key: result[key] for key in ("bleu", "bleu_bp", "chrf",
                                                                                 "bleu_lc_moses")}))
        print(f"validation, beam {num_beams}, length penalty {alpha:g}: BLEU {result['bleu']:.2f}, "
              f"brevity penalty {result['bleu_bp']:.3f}", flush=True)
    best = max(trials, key=lambda trial: trial["bleu"])
    return best["length_penalty"], trials


def plot_training(run_dir: Path, out: Path, validation_bleu: list[tuple[int, float]] | None = None,
                  num_beams: int = 4):
    """Training and validation loss, learning rate and validation BLEU against steps, from trainer_state.json (the
    BLEU curve from `validation_bleu` instead, when given)."""
    history = json.loads((run_dir / "trainer_state.json").read_text())["log_history"]
    series = {key: [(entry["step"], entry[key]) for entry in history if key in entry]
              for key in ("loss", "eval_loss", "learning_rate", "eval_bleu")}
    if validation_bleu is not None:
        series["eval_bleu"] = validation_bleu
    figure, axes = plt.subplots(1, 3, figsize=(15, 4), layout="constrained")
    for key, label in (("loss", "training (label-smoothed)"), ("eval_loss", "validation")):
        if series[key]:
            axes[0].plot(*zip(*series[key]), label=label, marker="." if key == "eval_loss" else None)
    axes[0].set(title="loss", xlabel="step")
    axes[0].legend()
    if series["learning_rate"]:
        axes[1].plot(*zip(*series["learning_rate"]))
    axes[1].set(title="learning rate (section 5.3)", xlabel="step")
    if series["eval_bleu"]:
        axes[2].plot(*zip(*series["eval_bleu"]), marker="o")
    else:
        axes[2].text(0.5, 0.5, "no validation during this run", ha="center", va="center", transform=axes[2].transAxes)
    rescored = ",\nrecomputed from the checkpoints" if validation_bleu is not None else ""
    axes[2].set(title=f"validation BLEU (200 sentences, beam {num_beams}{rescored})", xlabel="step")
    figure.savefig(out, dpi=120)
    plt.close(figure)


def run(args, limit: int | None):
    """Train (unless --skip-training), average, evaluate, plot and write the card of one run, in args.output_dir."""
    if args.preparation == "wu2021":  # from here on, the prepared text stands for the corpus
        args.data_dir = prepared_data(args.data_dir, args.output_dir / "prepared", limit)
    if not args.skip_training:
        train_run(args, args.data_dir, limit)

    run_dir, averaged = args.output_dir, args.output_dir / "averaged"
    checkpoints = find_checkpoints(run_dir, args.average_last)
    average_checkpoints(checkpoints, averaged, force=True)  # the run's own averaged model, made anew
    smoke_lengths = dict(max_new_tokens=12) if args.size == "smoke" else {}
    smoke_lengths["length_penalty_type"] = args.length_penalty_type  # with the smoke lengths: every beam search's
    smoke_lengths["target_lang"] = args.target_lang  # and every score's (the Moses tokenizer's language)
    source, target = args.source_lang, args.target_lang
    (length_penalty, *others), trials = args.length_penalty, []
    if others:  # several candidates: the best on the whole validation set
        length_penalty, trials = choose_length_penalty(
            averaged, read_lines(args.data_dir / f"val.{source}.gz", limit),
            read_lines(args.data_dir / f"val.{target}.gz", limit),
            args.length_penalty, args.num_beams, **smoke_lengths)
        (run_dir / "length_penalty.json").write_text(json.dumps(dict(chosen=length_penalty, validation=trials),
                                                                indent=2) + "\n")
    generation_config = GenerationConfig.from_pretrained(averaged)
    # What the card reports and pipeline() then uses.
    generation_config.update(length_penalty=length_penalty, num_beams=args.num_beams,
                             length_penalty_type=args.length_penalty_type)
    generation_config.save_pretrained(averaged)
    sources = read_lines(args.data_dir / f"test_2016_flickr.{source}.gz", limit)
    references = read_lines(args.data_dir / f"test_2016_flickr.{target}.gz", limit)
    steps = [int(path.name.split("-")[1]) for path in checkpoints]
    rows = []
    averaged_name = f"average of the last {args.average_last} checkpoints (steps {steps[0]}-{steps[-1]})"
    for name, model_dir in ((averaged_name, averaged),
                            (f"last checkpoint (step {steps[-1]})", checkpoints[-1])):
        for decoding, num_beams in ((f"beam {args.num_beams}, length penalty {length_penalty:g}", args.num_beams),
                                    ("greedy", 1)):
            beam_kwargs = dict(length_penalty=length_penalty) if num_beams > 1 else {}
            result = evaluate(model_dir, sources, references, num_beams, **beam_kwargs, **smoke_lengths)
            rows.append(dict(model=name, decoding=decoding, **result))
            print(f"{name}, {decoding}: BLEU {result['bleu']:.2f}, chrF {result['chrf']:.2f}, "
                  f"BLEU (lowercased, Moses-tokenized) {result['bleu_lc_moses']:.2f}, "
                  f"BLEU on the text as it is {result['bleu_tokenized']:.2f}", flush=True)
    best = rows[0]  # the averaged model with beam search: the one to share
    (run_dir / "results.json").write_text(json.dumps([{k: v for k, v in row.items() if k != "hypotheses"}
                                                      for row in rows], indent=2) + "\n")
    # On prepared text (already lowercased and tokenized), the BLEU Wu et al. report: fairseq's, on the text as it is.
    prepared = args.preparation == "wu2021"
    table = ["| model | decoding | BLEU | chrF | BLEU (lowercased, Moses-tokenized) |"
             + (" BLEU (the tokenized text as it is, fairseq's) |" if prepared else ""),
             "| --- | --- | --- | --- | --- |" + (" --- |" if prepared else "")]
    table += [f"| {row['model']} | {row['decoding']} | {row['bleu']:.2f} | {row['chrf']:.2f} | "
              f"{row['bleu_lc_moses']:.2f} |" + (f" {row['bleu_tokenized']:.2f} |" if prepared else "")
              for row in rows]
    if trials:
        table += ["", f"The length penalty {length_penalty:g}, chosen on the validation set (the averaged model, "
                  f"beam {args.num_beams}):", "", "| length penalty | BLEU | brevity penalty |", "| --- | --- | --- |"]
        table += [f"| {trial['length_penalty']:g} | {trial['bleu']:.2f} | {trial['bleu_bp']:.3f} |" for trial in trials]
    (run_dir / "results.md").write_text("\n".join(table) + f"\n\nSignatures: BLEU `{best['bleu_signature']}`, "
                                        f"chrF `{best['chrf_signature']}`, lowercased Moses-tokenized BLEU "
                                        f"`{best['bleu_lc_moses_signature']}`.\n")

    validation_bleu = None
    history = json.loads((run_dir / "trainer_state.json").read_text())["log_history"]
    by_steps = flag_value(args.train_flags, "--save_strategy") in (None, "steps")  # epoch checkpoints: no curve
    if by_steps and (args.rescore_validation or not any("eval_bleu" in entry for entry in history)):
        validation_bleu = validation_bleu_from_checkpoints(
            run_dir, read_lines(args.data_dir / f"val.{source}.gz", limit or 200),
            read_lines(args.data_dir / f"val.{target}.gz", limit or 200), args.eval_steps, args.num_beams,
            length_penalty=length_penalty, **smoke_lengths)
        (run_dir / "validation_bleu.json").write_text(json.dumps(validation_bleu) + "\n")
    plots = run_dir / "plots"
    plots.mkdir(exist_ok=True)
    plot_training(run_dir, plots / "training.png", validation_bleu, args.num_beams)
    model = AutoModelForSeq2SeqLM.from_pretrained(averaged)
    weights = attention_weights(model, AutoTokenizer.from_pretrained(averaged), sources[0], best["hypotheses"][0])
    attention_kinds = {"encoder": "encoder self-attention", "decoder": "decoder (masked) self-attention",
                       "cross": "encoder-decoder attention"}
    for kind in attention_kinds:
        plot_attention(weights, kind=kind, out_path=plots / f"attention_{kind}.png")
    figures = [dict(file="plots/training.png", caption="Training and validation loss, learning rate and validation "
                    "BLEU against steps")]
    figures += [dict(file=f"plots/attention_{kind}.png", caption=f"The {name} of the last layer, every head, for the "
                     "first test sentence and the model's translation") for kind, name in attention_kinds.items()]

    card_results = dict(
        results=[dict(dataset="Multi30k (task 1)", dataset_id="bentrevett/multi30k", split="test_2016_flickr",
                      num_sentences=len(sources),
                      **{key: best[key] for key in ("bleu", "chrf", "bleu_signature", "chrf_signature")})],
        samples=[dict(source=s, reference=r, hypothesis=h)
                 for s, r, h in list(zip(sources, references, best["hypotheses"]))[:5]],
        training_data=f"the {len(read_lines(args.data_dir / f'train.{source}.gz', limit)):,} Multi30k task-1 "
                      f"training pairs (Flickr30k image descriptions, {LANGUAGES[source]} -> {LANGUAGES[target]})"
                      + (", lowercased and Moses-tokenized as Wu et al. (2021) prepared them" if prepared else ""),
        training={"max_tokens": flag_value(args.train_flags, "--max_tokens", int),
                  "bpe_dropout": flag_value(args.train_flags, "--bpe_dropout", float),
                  "bpe_dropout_target": flag_value(args.train_flags, "--bpe_dropout_target", string_to_bool) is not False},
        variants=[{key: row[key] for key in ("model", "decoding", "bleu", "chrf")} for row in rows],
        figures=figures,
    )
    (run_dir / "card_results.json").write_text(json.dumps(card_results, indent=2, ensure_ascii=False) + "\n")
    write_model_card(averaged, averaged / "README.md", card_results, run_dir=run_dir)
    print(f"model card: {averaged / 'README.md'}; results: {run_dir / 'results.md'}; plots: {plots}")


# The test scores summed up over seeds, with their names and decimals.
SEED_METRICS = {"bleu": ("sacreBLEU", 2), "chrf": ("chrF", 2),
                "bleu_lc_moses": ("BLEU (lowercased, Moses-tokenized)", 2),
                "bleu_tokenized": ("BLEU (the tokenized text as it is, fairseq's)", 2),
                "bleu_bp": ("brevity penalty", 3)}


def seeds_table(run_dirs: list[Path]) -> str:
    """The mean and range (min-max) over runs of the shared model's test scores (the first row of each run's
    results.json: the averaged model with beam search), as a Markdown table; a score some run lacks is left out."""
    results = [json.loads((run_dir / "results.json").read_text())[0] for run_dir in run_dirs]
    lines = [f"test_2016_flickr, {results[0]['decoding']}, over {len(run_dirs)} runs "
             f"({', '.join(run_dir.name for run_dir in run_dirs)}):", "",
             "| score | mean | range | each run |", "| --- | --- | --- | --- |"]
    for key, (name, decimals) in SEED_METRICS.items():
        if all(key in result for result in results):
            values = [result[key] for result in results]
            mean, low, high = statistics.mean(values), min(values), max(values)
            each = ", ".join(f"{value:.{decimals}f}" for value in values)
            lines.append(f"| {name} | {mean:.{decimals}f} | {low:.{decimals}f}-{high:.{decimals}f} | {each} |")
    return "\n".join(lines) + "\n"


def length_penalties(text: str) -> list[float]:
    """The alphas of "--length-penalty 1.0,1.5" (argparse names this function in its error for a bad value)."""
    return [float(alpha) for alpha in text.split(",")]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                     epilog="Any other option is `vanilla-transformer train`'s and overrides the "
                                            "size's (e.g. --dropout 0.15, --d_model 384).")
    parser.add_argument("--data-dir", type=Path, required=True, help="The Multi30k folder (read, never copied).")
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--size", choices=list(SIZES), default="cpu")
    parser.add_argument("--eval-steps", type=int, default=400,
                        help="Validation loss every N steps, and the steps of the validation BLEU curve (400).")
    seeds = parser.add_mutually_exclusive_group()
    seeds.add_argument("--seed", type=int, default=0)
    seeds.add_argument("--seeds", type=lambda text: [int(seed) for seed in text.split(",")], metavar="0,1,2",
                       help="One run per seed, each in OUTPUT_DIR/seed-N, then the mean and range of their test "
                            "scores in OUTPUT_DIR/seeds.md.")
    parser.add_argument("--average-last", type=int,
                        help="Average the last N checkpoints (default: see AFTER_TRAINING).")
    parser.add_argument("--length-penalty", type=length_penalties, metavar="ALPHA[,ALPHA...]",
                        help="Beam search's length penalty alpha, saved in the averaged model's generation config; "
                             "several: the one whose beam-4 translations of the validation set score the highest "
                             "BLEU, each one's scores in length_penalty.json (default: see AFTER_TRAINING).")
    parser.add_argument("--num-beams", type=int, help="Beam size (default: see AFTER_TRAINING).")
    parser.add_argument("--source-lang", choices=list(LANGUAGES), default="en")
    parser.add_argument("--target-lang", choices=list(LANGUAGES), default="de")
    parser.add_argument("--preparation", choices=PREPARATIONS,
                        help="raw: Multi30k as it is; wu2021: lowercased and Moses-tokenized as Wu et al.'s files, "
                             "written to OUTPUT_DIR/prepared (default: wu2021 for --size wu2021, else raw).")
    parser.add_argument("--skip-training", action="store_true", help="Only average, evaluate, plot and write the card.")
    parser.add_argument("--rescore-validation", action="store_true",
                        help="Recompute the validation BLEU curve from the checkpoints every --eval-steps steps "
                             "(saved as validation_bleu.json) even when training logged it (--size base does).")
    args, overrides = parser.parse_known_args(argv)
    args.train_flags = [*SIZES[args.size], *overrides]  # the later of two values wins
    for name, value in AFTER_TRAINING.get(args.size, PAPER_AFTER_TRAINING).items():
        setattr(args, name, value if getattr(args, name, None) is None else getattr(args, name))
    args.preparation = args.preparation or ("wu2021" if args.size == "wu2021" else "raw")
    limit = 40 if args.size == "smoke" else None
    if args.size == "smoke":
        args.eval_steps = 3
    if args.seeds is None:
        run(args, limit)
        return
    run_dirs = [args.output_dir / f"seed-{seed}" for seed in args.seeds]
    for seed, run_dir in zip(args.seeds, run_dirs):
        run(argparse.Namespace(**{**vars(args), "seed": seed, "output_dir": run_dir}), limit)
    table = seeds_table(run_dirs)
    (args.output_dir / "seeds.md").write_text(table)
    print(table, end="")


if __name__ == "__main__":
    main(sys.argv[1:])
