"""What the `train` command's Trainer adds to a training step: steps per second of its step against the bare step, on
the same model and the same batches, with a profile of where the difference goes; and the cost of building a batch.

- Trainer: `TokenBatchSeq2SeqTrainer` with the package's loss and the Trainer arguments the `train` command parses
  from the Multi30k recipe's flags (examples/multi30k/run.py, `--recipe cpu` by default), its data loading and
  callbacks (the time budget's) included; no evaluation, no checkpoints. Its logging every 50 steps falls outside
  rounds shorter than that.
- bare: forward under autocast when bf16, the same loss, backward, fused Adam step and zero_grad, as in
  `train_throughput.py`, on the batches the Trainer's own data loader gives (already collated and on the device).

Rounds of `--steps` steps alternate between the two, after one untimed round of each; a round's first step is not
timed (the Trainer's setup, a fresh optimizer's state). `torch.profiler` then records `--profile-steps` steps of each,
and the table lists the operators whose self time per step grows the most under the Trainer. Last, the data path alone:
fetching the pairs of a batch of ~`--collate-tokens` tokens, checking their ids and collating them, per batch, and
building an epoch's batch list.

    python benchmarks/trainer_overhead.py                                   # the cpu recipe: bf16, eager, ~2,048 tokens
    python benchmarks/trainer_overhead.py --workers 1                        # batches collated in a worker process
    python benchmarks/trainer_overhead.py --device cuda --recipe base        # base model, ~25,000 tokens, bf16
    python benchmarks/trainer_overhead.py --smoke                            # seconds: checks that the script works
"""

import argparse
import importlib.util
import json
import resource
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from itertools import islice

import datasets
import torch
import transformers
from tqdm import tqdm
from transformers import DataCollatorForSeq2Seq, PrinterCallback, TrainerCallback

from common import (
    REPO,
    SIZES,
    add_common_arguments,
    environment,
    environment_lines,
    format_rate,
    load_tokenizer,
    markdown_table,
    read_lines,
    summary,
    synchronize,
)
from vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer.training.batch_samplers import TokenBatchSampler
from vanilla_transformer.training.cpu_speedups import CPU16BitDropout, CPUSeq2SeqTrainer
from vanilla_transformer.train_run.build import cpu_speedups, new_model_config
from vanilla_transformer.train_run.parsing import parse_arguments
from vanilla_transformer.train_run.callbacks import TrainingTimeBudget
from vanilla_transformer.training.trainer import TokenBatchSeq2SeqTrainer, check_feature_token_ids, paper_learning_rate

SMOKE_PAIRS = 2000
MODES = ("Trainer", "bare")


def recipe_flags(recipe: str) -> list[str]:
    """The `train` flags of a Multi30k recipe size, as examples/multi30k/run.py gives them."""
    spec = importlib.util.spec_from_file_location("multi30k_run", REPO / "examples" / "multi30k" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.SIZES[recipe])


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser)  # --repeats is the number of timed rounds per mode
    parser.set_defaults(attn_implementation=None)
    parser.add_argument("--recipe", default="cpu", choices=["cpu", "tiny", "base"],
                        help="Multi30k recipe size (default cpu)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                        help="bf16 autocast (default: the recipe's, on)")
    parser.add_argument("--max-tokens", type=int, default=None, help="tokens per batch (default: the recipe's)")
    parser.add_argument("--workers", type=int, default=None,
                        help="the Trainer's dataloader_num_workers (default: the train command's)")
    parser.add_argument("--steps", type=int, default=20, help="steps per round (20)")
    parser.add_argument("--profile-steps", type=int, default=5, help="profiled steps per mode (5; 0: no profile)")
    parser.add_argument("--collate-tokens", type=int, default=25000, help="tokens per batch of the data path (25,000)")
    parser.add_argument("--collate-batches", type=int, default=20, help="batches timed on the data path (20)")
    parser.add_argument("--pairs", type=int, default=None, help="only the first PAIRS training pairs")
    parser.add_argument("--default-malloc", action="store_true",
                        help="on a CPU, leave glibc's malloc as it is (the train command's keep_memory speed-up "
                        "fixes its thresholds: training/cpu_speedups.py)")
    args = parser.parse_args(argv)
    args.repeats = max(args.repeats, 1)
    if args.smoke:
        args.steps, args.repeats, args.profile_steps = 3, 2, 2
        args.collate_tokens, args.collate_batches = 1024, 3
        args.pairs, args.threads = args.pairs or SMOKE_PAIRS, args.threads or 1
    return args


def trainer_arguments(args, output_dir: str):
    """The `train` command's parsed arguments for the recipe, with this benchmark's settings last (the later wins)."""
    flags = [*recipe_flags(args.recipe), "--train_file", "unused.tsv", "--output_dir", output_dir,
             "--max_steps", str(args.steps), "--save_strategy", "no", "--eval_strategy", "no", "--report_to", "none",
             "--disable_tqdm", "true", "--seed", str(args.seed), "--use_cpu", str(args.device == "cpu").lower(),
             "--torch_compile", "false"]  # the bare step is eager: on a GPU, the command's compiled model is not
    if args.smoke:
        shape = SIZES["tiny"]
        flags += ["--d_model", str(shape["d_model"]), "--layers", str(shape["layers"]), "--heads",
                  str(shape["heads"]), "--ffn_dim", str(shape["ffn_dim"]), "--max_tokens", "1024"]
    for flag, value in [("--bf16", args.bf16), ("--attn_implementation", args.attn_implementation),
                        ("--max_tokens", args.max_tokens), ("--dataloader_num_workers", args.workers)]:
        if value is not None:
            flags += [flag, str(value).lower() if isinstance(value, bool) else str(value)]
    model_args, data_args, recipe_args, training_args, _ = parse_arguments(flags)
    return model_args, data_args, recipe_args, training_args


class StepClock(TrainerCallback):
    """Times the Trainer's steps 2 to the last (the first carries the setup), and profiles steps 2 to 1 + `profile`."""

    def __init__(self, device: str, profile: int = 0):
        self.device, self.profile, self.profiler = device, profile, None
        self.start = self.seconds = self.profiled_seconds = None
        self.faults_at_start = self.faults = None

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        if step == 1:
            if self.profile:
                self.profiler = start_profiler(self.device)
            synchronize(self.device)
            self.start = time.perf_counter()
            self.faults_at_start = page_faults()
        if self.profiler is not None and step == 1 + self.profile:
            synchronize(self.device)
            self.profiled_seconds = time.perf_counter() - self.start
            self.profiler.stop()
        if step == state.max_steps:
            synchronize(self.device)
            self.seconds = time.perf_counter() - self.start
            self.faults = page_faults() - self.faults_at_start


def page_faults() -> int:
    """The process's page faults so far, minor (memory the kernel maps and zeroes) and major."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_minflt + usage.ru_majflt


def start_profiler(device: str) -> torch.profiler.profile:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(activities=activities)
    profiler.start()
    return profiler


def self_times_ms(profiler: torch.profiler.profile, seconds: float, steps: int) -> dict:
    """Per step, in ms: the profiled steps' wall time, and each operator's self CPU time (and, on a GPU, self device
    time)."""
    operators = {event.key: dict(cpu=event.self_cpu_time_total / 1e3 / steps,
                                 device=getattr(event, "self_device_time_total", 0) / 1e3 / steps)
                 for event in profiler.key_averages()}
    return dict(wall=1e3 * seconds / steps, operators=operators)


def bare_step(model, optimizer, batch: dict, loss_function, device_type: str, bf16: bool, dropout=nullcontext):
    inputs = {name: batch[name] for name in ("input_ids", "attention_mask", "decoder_input_ids")}
    with torch.autocast(device_type, dtype=torch.bfloat16) if bf16 else nullcontext(), dropout():
        outputs = model(**inputs, use_cache=False)
    labels = batch["labels"]
    loss = loss_function(outputs, labels, num_items_in_batch=(labels != -100).sum())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def main(argv=None):
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    tokenizer = load_tokenizer(args)
    sources = read_lines(args.data_dir / "train.en.gz", args.pairs)
    targets = read_lines(args.data_dir / "train.de.gz", args.pairs)
    dataset = datasets.Dataset.from_dict(dict(tokenizer(sources, text_target=targets)))
    output_dir = tempfile.mkdtemp(prefix="trainer_overhead-")
    model_args, data_args, recipe_args, training_args = trainer_arguments(args, output_dir)
    model = VanillaTransformerForConditionalGeneration(new_model_config(model_args, data_args, tokenizer))
    if args.default_malloc:
        recipe_args.cpu_speedups = [name for name in recipe_args.cpu_speedups if name != "keep_memory"]
    speedups = cpu_speedups(recipe_args, training_args)  # as the train command does
    trainer_class, options = TokenBatchSeq2SeqTrainer, {}
    if speedups:
        trainer_class, options = CPUSeq2SeqTrainer, dict(speedups=speedups)
    training_args.learning_rate = paper_learning_rate(model.config.d_model, training_args.warmup_steps,
                                                      recipe_args.lr_scale)
    collator = DataCollatorForSeq2Seq(tokenizer, model=model)
    bf16 = training_args.bf16

    def trainer(*callbacks):
        budget = [TrainingTimeBudget(recipe_args.max_train_minutes)] if recipe_args.max_train_minutes else []
        built = trainer_class(model=model, args=training_args, train_dataset=dataset, data_collator=collator,
                              processing_class=tokenizer, max_tokens=data_args.max_tokens or None,
                              callbacks=[*budget, *callbacks], **options)
        built.remove_callback(PrinterCallback)
        return built

    def trainer_round(profile: int = 0) -> StepClock:
        """The clock of a round: its seconds and page faults over steps 2 to the last."""
        clock = StepClock(args.device, profile)
        run = trainer(clock)
        run.train()
        if bf16 and "forward" not in model.__dict__:  # the round trained without accelerate's autocast
            raise RuntimeError("the Trainer's round ran without accelerate's autocast wrapper")
        run.accelerator.free_memory()
        # Undo accelerate's preparation: its autocast wrapper is not for the bare step, and a model marked as prepared
        # would not be wrapped again by the next round's Trainer, which would then train in float32.
        for name in ("forward", "_original_forward", "_is_accelerate_prepared"):
            model.__dict__.pop(name, None)
        return clock

    # The batches the Trainer trains on in every round: the first of its shuffled epoch 0, on the device.
    probe = trainer()
    batches = [dict(batch) for batch in islice(probe.get_train_dataloader(), args.steps)]
    loss_function = probe.compute_loss_func
    dropout = CPU16BitDropout if "dropout16" in speedups else nullcontext  # as the Trainer's steps
    if len(batches) < args.steps:
        raise SystemExit(f"--steps {args.steps} needs as many batches; the data gives only {len(batches)}")
    model.to(training_args.device).train()
    optimizer_class, optimizer_kwargs = probe.get_optimizer_cls_and_kwargs(training_args)  # fused Adam, as the Trainer
    optimizer = optimizer_class(model.parameters(), weight_decay=training_args.weight_decay, **optimizer_kwargs)
    del probe

    def bare_round(profile: int = 0):
        """The seconds and page faults of steps 2 to the last, or with `profile`, the profiler and seconds of steps 2
        to 1 + profile."""
        bare_step(model, optimizer, batches[0], loss_function, args.device, bf16, dropout)
        synchronize(args.device)
        profiler = start_profiler(args.device) if profile else None
        start, faults_before = time.perf_counter(), page_faults()
        for batch in batches[1: 1 + profile] if profile else batches[1:]:
            bare_step(model, optimizer, batch, loss_function, args.device, bf16, dropout)
        synchronize(args.device)
        seconds = time.perf_counter() - start
        if profiler is None:
            return seconds, page_faults() - faults_before
        profiler.stop()
        return profiler, seconds

    timed_steps = args.steps - 1
    seconds = {mode: [] for mode in MODES}
    faults = {mode: [] for mode in MODES}
    progress = tqdm(total=2 * (args.repeats + 1) + 2 * bool(args.profile_steps), desc="rounds", file=sys.stderr)
    for round_index in range(args.repeats + 1):  # round 0 warms up
        for mode in MODES if round_index % 2 == 0 else MODES[::-1]:
            if mode == "Trainer":
                clock = trainer_round()
                elapsed, round_faults = clock.seconds, clock.faults
            else:
                elapsed, round_faults = bare_round()
            if round_index:
                seconds[mode].append(elapsed)
                faults[mode].append(round_faults)
            progress.update()
    profiles = {}
    if args.profile_steps:
        steps = min(args.profile_steps, timed_steps)
        clock = trainer_round(profile=steps)
        profiles["Trainer"] = self_times_ms(clock.profiler, clock.profiled_seconds, steps)
        progress.update()
        profiles["bare"] = self_times_ms(*bare_round(profile=steps), steps)
        progress.update()
    progress.close()
    shutil.rmtree(output_dir)
    data_path = measure_data_path(args, dataset, collator, len(tokenizer))

    target_tokens = sum(int((batch["labels"] != -100).sum()) for batch in batches[1:])
    results = {mode: dict(steps_per_s=summary([timed_steps / s for s in values]),
                          ms_per_step=summary([1e3 * s / timed_steps for s in values]),
                          target_tokens_per_s=summary([target_tokens / s for s in values]),
                          page_faults_per_step=summary([count / timed_steps for count in faults[mode]]))
               for mode, values in seconds.items()}
    ratio = results["Trainer"]["steps_per_s"]["median"] / results["bare"]["steps_per_s"]["median"]
    env = environment(args.device)
    settings = dict(recipe=args.recipe, device=args.device, smoke=args.smoke, bf16=bf16,
                    default_malloc=args.default_malloc,
                    attn_implementation=model.config._attn_implementation, d_model=model.config.d_model, layers=model.config.encoder_layers,
                    parameters=model.num_parameters(), vocab_size=len(tokenizer), max_tokens=data_args.max_tokens,
                    steps_per_round=args.steps, timed_steps_per_round=timed_steps, rounds=args.repeats,
                    dataloader_num_workers=training_args.dataloader_num_workers,
                    logging_steps=training_args.logging_steps, profile_steps=args.profile_steps,
                    mean_target_tokens=target_tokens / timed_steps, collate_tokens=args.collate_tokens)
    print(report(env, settings, results, ratio, profiles, data_path))
    if args.json is not None:
        args.json.write_text(json.dumps(dict(environment=env, settings=settings, results=results, ratio=ratio,
                                             profile_ms_per_step=profiles, data_path=data_path), indent=2) + "\n")


def measure_data_path(args, dataset, collator, vocab_size: int) -> dict:
    """Per batch of ~`--collate-tokens` tokens, in ms: the DataLoader's fetch of the pairs (`__getitems__`), the
    token-id check and the collation (`DataCollatorForSeq2Seq`); and the building of an epoch's batch list."""
    sampler = TokenBatchSampler.from_dataset(dataset, args.collate_tokens, seed=args.seed)
    epoch_ms = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        start = time.perf_counter()
        epoch_batches = list(sampler)
        epoch_ms.append(1e3 * (time.perf_counter() - start))
    times = {"fetch": [], "check ids": [], "collate": []}
    pairs, tokens = [], []
    for indices in islice(epoch_batches, args.collate_batches):
        start = time.perf_counter()
        features = dataset.__getitems__(indices)
        fetched = time.perf_counter()
        check_feature_token_ids(features, vocab_size)
        checked = time.perf_counter()
        batch = collator(features)
        collated = time.perf_counter()
        for name, seconds in zip(times, (fetched - start, checked - fetched, collated - checked)):
            times[name].append(1e3 * seconds)
        pairs.append(len(indices))
        tokens.append(batch["input_ids"].numel() + batch["labels"].numel())
    times["total"] = [sum(parts) for parts in zip(*times.values())]
    return dict(ms_per_batch={name: summary(values) for name, values in times.items()},
                epoch_batch_list_ms=summary(epoch_ms), batches_per_epoch=len(epoch_batches),
                mean_pairs=statistics.mean(pairs), mean_padded_tokens=statistics.mean(tokens))


def report(env, settings, results, ratio, profiles, data_path) -> str:
    precision = "bf16 autocast" if settings["bf16"] else "fp32"
    malloc = "glibc's malloc as it is" if settings["default_malloc"] else "malloc keeping freed memory (training/cpu_speedups.py)"
    lines = [
        "## The Trainer's step against the bare step" + (" (smoke run)" if settings["smoke"] else ""),
        "",
        *environment_lines(env),
        f"- the Multi30k {settings['recipe']} recipe's arguments: d_model {settings['d_model']}, N = "
        f"{settings['layers']}, {settings['parameters'] / 1e6:.1f}M parameters, vocabulary {settings['vocab_size']:,}; "
        f"{precision}, {settings['attn_implementation']} attention; dataloader_num_workers "
        f"{settings['dataloader_num_workers']}; logging every {settings['logging_steps']} steps"
        + (f"; {malloc}" if settings["device"] == "cpu" else ""),
        f"- batches of <= {settings['max_tokens']:,} tokens ({settings['mean_target_tokens']:,.0f} real target "
        f"tokens on average); {settings['rounds']} round(s) of {settings['timed_steps_per_round']} timed steps per "
        "mode, alternating, after one untimed round each",
        "",
        markdown_table(
            ["step", "steps/s, median (min-max)", "ms per step", "target tokens/s", "page faults per step"],
            [[mode, f"{stats['steps_per_s']['median']:.3f} ({stats['steps_per_s']['min']:.3f}-"
                    f"{stats['steps_per_s']['max']:.3f})",
              f"{stats['ms_per_step']['median']:,.1f}", format_rate(stats["target_tokens_per_s"]),
              f"{stats['page_faults_per_step']['median']:,.0f}"]
             for mode, stats in results.items()],
        ),
        "",
        f"Trainer / bare: {ratio:.3f}x the steps per second; the Trainer adds "
        f"{results['Trainer']['ms_per_step']['median'] - results['bare']['ms_per_step']['median']:,.1f} ms per step.",
    ]
    if profiles:
        lines += ["", f"### Where the difference goes: self time per step ({settings['profile_steps']} profiled "
                      "steps each), the operators that grow most under the Trainer", ""]
        device = env["device"] == "cuda"
        operators = {mode: profiles[mode]["operators"] for mode in MODES}
        zero = dict(cpu=0.0, device=0.0)

        def times(mode, name):
            return operators[mode].get(name, zero)

        names = set(operators["Trainer"]) | set(operators["bare"])
        growth = sorted(names, key=lambda name: times("bare", name)["cpu"] - times("Trainer", name)["cpu"])
        rows = []
        for name in growth[:12]:
            trainer, bare = times("Trainer", name), times("bare", name)
            row = [f"`{name}`", f"{trainer['cpu']:.2f}", f"{bare['cpu']:.2f}", f"{trainer['cpu'] - bare['cpu']:+.2f}"]
            rows.append(row + ([f"{trainer['device']:.2f}", f"{bare['device']:.2f}"] if device else []))
        inside = {mode: sum(entry["cpu"] for entry in operators[mode].values()) for mode in MODES}
        outside = {mode: profiles[mode]["wall"] - inside[mode] for mode in MODES}
        for label, part in [("all operators", inside), ("outside operators (Python, waiting)", outside)]:
            rows.append([label, f"{part['Trainer']:.2f}", f"{part['bare']:.2f}",
                         f"{part['Trainer'] - part['bare']:+.2f}"] + (["", ""] if device else []))
        header = ["operator", "Trainer, self CPU ms", "bare, self CPU ms", "difference"]
        lines.append(markdown_table(header + (["Trainer, self GPU ms", "bare, self GPU ms"] if device else []), rows))
    stats = data_path["ms_per_batch"]
    lines += [
        "", f"### The data path: a batch of <= {settings['collate_tokens']:,} tokens "
            f"({data_path['mean_pairs']:,.0f} pairs, {data_path['mean_padded_tokens']:,.0f} padded source and target "
            "tokens on average), in the main process", "",
        markdown_table(["part", "ms per batch, median (min-max)"],
                       [[name, f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"] for name, s in stats.items()]),
        "", f"Building an epoch's list of {data_path['batches_per_epoch']:,} batches: "
            f"{data_path['epoch_batch_list_ms']['median']:.1f} ms.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
