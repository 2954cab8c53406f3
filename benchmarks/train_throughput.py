"""Target tokens per second of a full training step: our model side by side with transformers' `MarianMTModel` of
the same size, in the same run, on the same batches.

A step is forward, label-smoothed cross-entropy (0.1, computed identically outside both models from their logits),
backward, Adam(0.9, 0.98, 1e-9) step and zero_grad, with dropout 0.1 in both models. Batches are Multi30k
training pairs of ~`--max-tokens` tokens bucketed by length with `TokenBatchSampler` and padded by
`DataCollatorForSeq2Seq`; the first `--steps` batches of the shuffled epoch are the timed work of every repeat.
Each model trains in its own process (so its peak memory is its own); the processes take turns, never running at
the same time: warm-up steps, then `--repeats` repeats in alternating order. The table gives the median and range
of target tokens (real, not padding) per second, the ratio of the medians, the achieved matmul GFLOP/s counted
analytically from the padded batch shapes (training = 3 x forward) as a share of a measured `torch.mm` ceiling,
and peak memory.

    python benchmarks/train_throughput.py                    # base and small sizes, the full measurement
    python benchmarks/train_throughput.py --size small --bf16 --json train_throughput.json
    python benchmarks/train_throughput.py --device cuda --compile
    python benchmarks/train_throughput.py --smoke            # seconds: checks that the script works
"""

import argparse
import json
import multiprocessing
import resource
import sys
import time
import traceback
from contextlib import nullcontext
from itertools import islice
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from common import (
    LABELS,
    MODEL_NAMES,
    SIZES,
    add_common_arguments,
    build_model,
    environment,
    environment_lines,
    format_rate,
    load_tokenizer,
    markdown_table,
    model_configs,
    read_lines,
    summary,
    synchronize,
    trainable_parameters,
)
from vanilla_transformer.model.modeling_vanilla_transformer import shift_tokens_right


LABEL_SMOOTHING = 0.1
DROPOUT = 0.1
# Section 5.3's Adam; the learning rate does not change the cost of a step.
ADAM = dict(lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
SMOKE_PAIRS = 2000


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser)
    parser.add_argument("--size", default="both", choices=["base", "small", "both"], help="(default both)")
    parser.add_argument("--max-tokens", type=int, default=4096, help="tokens per batch, padding included (4096)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per repeat, on as many batches (20)")
    parser.add_argument("--warmup", type=int, default=5,
                        help="untimed steps per model first (default 5; with --compile every batch is also run once)")
    parser.add_argument("--pairs", type=int, default=None, help="bucket only the first PAIRS training pairs")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--bf16", action="store_true", help="torch.autocast to bfloat16 for the forward and loss")
    parser.add_argument("--compile", action="store_true", help="torch.compile both models")
    parser.add_argument("--matmul-size", type=int, default=2048, help="square torch.mm timed for the ceiling (2048)")
    args = parser.parse_args(argv)
    args.sizes = ["base", "small"] if args.size == "both" else [args.size]
    if args.smoke:
        args.sizes, args.max_tokens, args.steps, args.warmup, args.repeats = ["tiny"], 1024, 3, 1, 2
        args.pairs, args.matmul_size = args.pairs or SMOKE_PAIRS, 256
        # One thread: on a busy machine, two OpenMP threads waiting on each other make tiny runs many times slower.
        args.threads = args.threads or 1
    return args


# --- The batches, the same for both models -----------------------------------------------------------------------


def training_batches(args, tokenizer) -> list[dict]:
    """The first `args.steps` token batches of the shuffled epoch 0, as numpy arrays (sent to the worker processes):
    `input_ids`, `attention_mask`, `decoder_input_ids` (labels shifted right) and `labels` (-100 on padding)."""
    # Only the main process batches: imported here, the model processes skip loading accelerate and pyarrow.
    from transformers import DataCollatorForSeq2Seq

    from vanilla_transformer.training.batch_samplers import TokenBatchSampler

    sources = read_lines(args.data_dir / "train.en.gz", args.pairs)
    targets = read_lines(args.data_dir / "train.de.gz", args.pairs)
    encoded = tokenizer(sources, text_target=targets)
    features = [dict(zip(encoded, row)) for row in zip(*encoded.values())]
    sampler = TokenBatchSampler(
        [len(f["input_ids"]) for f in features], [len(f["labels"]) for f in features], args.max_tokens, seed=args.seed
    )
    if len(sampler) < args.steps:
        raise SystemExit(f"--steps {args.steps} needs as many batches; the data gives only {len(sampler)}")
    collator = DataCollatorForSeq2Seq(tokenizer, return_tensors="np")
    batches = []
    for indices in islice(sampler, args.steps):
        batch = collator([features[i] for i in indices])
        labels = torch.from_numpy(batch["labels"])
        batch["decoder_input_ids"] = shift_tokens_right(labels, tokenizer.pad_token_id, tokenizer.bos_token_id).numpy()
        batches.append({name: batch[name] for name in ("input_ids", "attention_mask", "decoder_input_ids", "labels")})
    return batches


def forward_flops(shape: dict, vocab_size: int, batch_size: int, source_len: int, target_len: int) -> int:
    """Matmul FLOPs of one forward pass over padded (batch, source_len) and (batch, target_len) tensors."""
    d, d_ff, layers = shape["d_model"], shape["ffn_dim"], shape["layers"]
    source_tokens, target_tokens = batch_size * source_len, batch_size * target_len
    # Per encoder token and layer: Q, K, V, output projections, the FFN, then Q K^T and weights x V over the source.
    encoder = layers * source_tokens * (2 * (4 * d * d + 2 * d * d_ff) + 2 * 2 * source_len * d)
    # Per decoder token and layer: self-attention's 4 projections, cross-attention's Q and output projections, the
    # FFN, attention over the target and over the source; cross-attention's K and V are projected per source token.
    decoder = layers * (
        target_tokens * (2 * (6 * d * d + 2 * d * d_ff) + 2 * 2 * target_len * d + 2 * 2 * source_len * d)
        + source_tokens * 2 * 2 * d * d
    )
    return encoder + decoder + target_tokens * 2 * d * vocab_size


def training_flops(shape: dict, vocab_size: int, batches: list[dict]) -> int:
    """Forward plus backward (twice the forward's matmuls) over all batches."""
    return sum(
        3 * forward_flops(shape, vocab_size, len(b["input_ids"]), b["input_ids"].shape[1], b["labels"].shape[1])
        for b in batches
    )


def matmul_ceiling(size: int, device: str, dtype: torch.dtype, repeats: int = 5) -> float:
    """The best GFLOP/s of a square `torch.mm`, with this process's thread count."""
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    out = torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


# --- One process per model ---------------------------------------------------------------------------------------


def current_rss_mib() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 2**20


def train_step(forward, optimizer, batch: dict, device_type: str, bf16: bool) -> torch.Tensor:
    """One full training step: forward, label-smoothed cross-entropy from the logits, backward, Adam step, zero_grad."""
    with torch.autocast(device_type, dtype=torch.bfloat16) if bf16 else nullcontext():
        logits = forward(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            decoder_input_ids=batch["decoder_input_ids"],
            use_cache=False,
        ).logits
        loss = F.cross_entropy(
            logits.float().flatten(0, 1), batch["labels"].flatten(), ignore_index=-100, label_smoothing=LABEL_SMOOTHING
        )
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def train_worker(connection, name: str, config_kwargs: dict, batches: list[dict], options: dict) -> None:
    """Builds one model and its optimizer, then runs the steps it is told to, answering with their time."""
    try:
        if options["threads"] is not None:
            torch.set_num_threads(options["threads"])
        device = torch.device(options["device"])
        baseline_rss = current_rss_mib()
        model = build_model(name, config_kwargs, options["seed"], options["attn_implementation"]).to(device).train()
        optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], **ADAM)
        forward = torch.compile(model) if options["compile"] else model
        batches = [{key: torch.from_numpy(value).to(device) for key, value in b.items()} for b in batches]

        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        ready = dict(trainable_parameters=trainable_parameters(model), baseline_rss_mib=baseline_rss)
        connection.send(("ready", ready))
        while True:
            command, indices = connection.recv()
            if command == "stop":
                break
            synchronize(device)
            start = time.perf_counter()
            for index in indices:
                loss = train_step(forward, optimizer, batches[index], device.type, options["bf16"])
            synchronize(device)
            connection.send(("done", dict(seconds=time.perf_counter() - start, loss=float(loss))))
        if device.type == "cuda":
            memory = dict(peak_cuda_allocated_mib=torch.cuda.max_memory_allocated() / 2**20)
        else:  # ru_maxrss is in KiB on Linux: the peak of this process alone
            memory = dict(peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10)
        connection.send(("memory", memory))
    except BaseException:
        connection.send(("error", traceback.format_exc()))


class Worker:
    """The main process's end of one `train_worker` process."""

    def __init__(self, context, name: str, config_kwargs: dict, batches: list[dict], options: dict):
        self.name = name
        self.connection, child = context.Pipe()
        self.process = context.Process(
            target=train_worker, args=(child, name, config_kwargs, batches, options), daemon=True
        )
        self.process.start()
        child.close()

    def receive(self, expected: str) -> dict:
        try:
            kind, payload = self.connection.recv()
        except EOFError:
            self.process.join(5)
            raise RuntimeError(f"the {self.name} process died (exit code {self.process.exitcode})") from None
        if kind == "error":
            raise RuntimeError(f"the {self.name} process failed:\n{payload}")
        assert kind == expected, (kind, expected)
        return payload

    def run(self, indices: list[int]) -> dict:
        self.connection.send(("run", indices))
        return self.receive("done")

    def stop(self) -> dict:
        self.connection.send(("stop", None))
        memory = self.receive("memory")
        self.process.join()
        return memory

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.terminate()
            self.process.join()


# --- The measurement ---------------------------------------------------------------------------------------------


def measure_size(args, size, tokenizer, batches, options, context, progress) -> dict:
    configs = model_configs(size, tokenizer, dropout=DROPOUT)
    workers = {name: Worker(context, name, configs[name], batches, options) for name in MODEL_NAMES}
    try:
        info = {name: workers[name].receive("ready") for name in MODEL_NAMES}
        warmup = list(range(args.steps)) if args.compile else []
        warmup += [i % args.steps for i in range(args.warmup)]
        for name in MODEL_NAMES:
            progress.set_postfix_str(f"{size}, {LABELS[name]} warm-up")
            workers[name].run(warmup)
        timed = list(range(args.steps))
        runs = {name: [] for name in MODEL_NAMES}
        for repeat in range(args.repeats):
            for name in MODEL_NAMES if repeat % 2 == 0 else MODEL_NAMES[::-1]:
                progress.set_postfix_str(f"{size}, {LABELS[name]}")
                runs[name].append(workers[name].run(timed))
                progress.update()
        for name in MODEL_NAMES:
            info[name].update(workers[name].stop())
    finally:
        for worker in workers.values():
            worker.kill()

    target_tokens = sum(int((b["labels"] != -100).sum()) for b in batches)
    flops = training_flops(SIZES[size], len(tokenizer), batches)
    result = dict(size=size)
    for name in MODEL_NAMES:
        seconds = [run["seconds"] for run in runs[name]]
        result[name] = dict(
            info[name],
            tokens_per_s=summary([target_tokens / s for s in seconds]),
            ms_per_step=summary([1000 * s / args.steps for s in seconds]),
            gflops_per_s=summary([flops / s / 1e9 for s in seconds]),
            last_loss=runs[name][-1]["loss"],
        )
        result[name]["fraction_of_matmul_ceiling"] = result[name]["gflops_per_s"]["median"] / options["ceiling"]
    result["ratio"] = result["ours"]["tokens_per_s"]["median"] / result["marian"]["tokens_per_s"]["median"]
    result["training_gflop_per_repeat"] = flops / 1e9
    return result


def main(argv=None):
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    tokenizer = load_tokenizer(args)
    batches = training_batches(args, tokenizer)
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    ceiling = matmul_ceiling(args.matmul_size, args.device, dtype)
    options = dict(
        threads=torch.get_num_threads(),
        device=args.device,
        seed=args.seed,
        attn_implementation=args.attn_implementation,
        bf16=args.bf16,
        compile=args.compile,
        ceiling=ceiling,
    )
    # spawn: a fresh interpreter per model (CUDA needs it too), so each process's peak memory is its model's.
    context = multiprocessing.get_context("spawn")
    progress = tqdm(total=len(args.sizes) * args.repeats * len(MODEL_NAMES), desc="train", file=sys.stderr)
    results = [measure_size(args, size, tokenizer, batches, options, context, progress) for size in args.sizes]
    progress.close()

    env = environment(args.device)
    settings = dict(
        sizes={size: SIZES[size] for size in args.sizes},
        vocab_size=len(tokenizer),
        dropout=DROPOUT,
        label_smoothing=LABEL_SMOOTHING,
        adam=ADAM,
        max_tokens=args.max_tokens,
        steps=args.steps,
        warmup=args.warmup,
        repeats=args.repeats,
        bf16=args.bf16,
        compile=args.compile,
        attn_implementation=args.attn_implementation,
        matmul_size=args.matmul_size,
        matmul_ceiling_gflops=ceiling,
        batches=batch_statistics(batches),
        smoke=args.smoke,
    )
    print(report(env, settings, results))
    if args.json is not None:
        args.json.write_text(json.dumps(dict(environment=env, settings=settings, results=results), indent=2) + "\n")


def batch_statistics(batches: list[dict]) -> dict:
    count = len(batches)
    return dict(
        count=count,
        mean_pairs=sum(len(b["labels"]) for b in batches) / count,
        mean_target_tokens=sum(int((b["labels"] != -100).sum()) for b in batches) / count,
        mean_source_tokens=sum(int(b["attention_mask"].sum()) for b in batches) / count,
        mean_padded_target_tokens=sum(b["labels"].size for b in batches) / count,
        mean_padded_source_tokens=sum(b["input_ids"].size for b in batches) / count,
    )


def report(env: dict, settings: dict, results: list[dict]) -> str:
    stats = settings["batches"]
    precision = "bf16 autocast" if settings["bf16"] else "fp32"
    lines = [
        "## Training throughput: ours vs MarianMTModel" + (" (smoke run)" if settings["smoke"] else ""),
        "",
        *environment_lines(env),
        f"- {precision}{', torch.compile' if settings['compile'] else ''}; attention: "
        f"{settings['attn_implementation']}; vocab {settings['vocab_size']:,}; dropout {settings['dropout']}; "
        f"label smoothing {settings['label_smoothing']}; Adam(0.9, 0.98, 1e-9)",
        f"- {stats['count']} Multi30k batches of <= {settings['max_tokens']:,} tokens (mean {stats['mean_pairs']:.0f} "
        f"pairs, {stats['mean_target_tokens']:.0f} real / {stats['mean_padded_target_tokens']:.0f} padded target "
        f"tokens), the same for both models; {settings['warmup']} warm-up step(s), then {settings['repeats']} "
        f"repeat(s) of {settings['steps']} steps, models alternating",
        f"- target tokens/s as median (min-max); GFLOP/s: analytic matmul FLOPs of the padded batches over the "
        f"median time, as a share of the best {settings['matmul_size']}x{settings['matmul_size']} torch.mm "
        f"({settings['matmul_ceiling_gflops']:,.1f} GFLOP/s)",
        "",
    ]
    memory_key = "peak_cuda_allocated_mib" if env["device"] == "cuda" else "peak_rss_mib"

    def memory(stats):
        if memory_key == "peak_rss_mib":  # the process's own peak, and its growth after the imports
            return f"{stats[memory_key]:,.0f} (+{stats[memory_key] - stats['baseline_rss_mib']:,.0f})"
        return f"{stats[memory_key]:,.0f}"

    def gflops(stats):
        return f"{stats['gflops_per_s']['median']:,.1f} ({100 * stats['fraction_of_matmul_ceiling']:.0f}%)"

    rows = []
    for result in results:
        shape = SIZES[result["size"]]
        ours, marian = result["ours"], result["marian"]
        rows.append([
            f"{result['size']} ({shape['d_model']}/{shape['layers']}+{shape['layers']}/{shape['heads']}/"
            f"{shape['ffn_dim']}, {ours['trainable_parameters'] / 1e6:.1f}M)",
            format_rate(ours["tokens_per_s"]),
            format_rate(marian["tokens_per_s"]),
            f"{result['ratio']:.2f}",
            gflops(ours),
            gflops(marian),
            memory(ours),
            memory(marian),
        ])
    memory_label = "peak CUDA MiB" if memory_key != "peak_rss_mib" else "peak RSS MiB (+ since imports)"
    lines.append(markdown_table(
        ["size (d/N/h/d_ff, params)", "ours tok/s", "Marian tok/s", "ours/Marian", "ours GFLOP/s (% mm)",
         "Marian GFLOP/s (% mm)", f"ours {memory_label}", f"Marian {memory_label}"],
        rows,
    ))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
