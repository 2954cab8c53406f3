"""Section 5.4's dropout on a CPU: the train command's `dropout16` speed-up (training/cpu_speedups.py: 16 random bits per
element, one 64-bit draw per four elements) against torch's `nn.functional.dropout` (one random float per element), in our
model's full training step.

One process, one model, the same batches: rounds alternate between the two kernels (steps run inside
`CPU16BitDropout` or not), so machine noise hits both alike. A step is forward, label-smoothed cross-entropy (0.1),
backward, Adam(0.9, 0.98, 1e-9) step and zero_grad, with P_drop 0.1, as in `train_throughput.py`. Also timed: the
dropout alone, forward and backward, on a (tokens x d_ff) tensor.

    python benchmarks/dropout_speed.py --bf16 --attn-implementation eager --max-tokens 2048   # bf16, the paper's dropout
    python benchmarks/dropout_speed.py --max-tokens 4096                                     # fp32, sdpa
    python benchmarks/dropout_speed.py ... --attention-dropout 0.1                            # + attention/ReLU dropout
    python benchmarks/dropout_speed.py --smoke
"""

import argparse
import contextlib
import json
import statistics
import sys
import time

import torch
from tqdm import tqdm

from common import (
    SIZES,
    add_common_arguments,
    build_model,
    environment,
    environment_lines,
    load_tokenizer,
    markdown_table,
    model_configs,
)
from train_throughput import ADAM, DROPOUT, SMOKE_PAIRS, train_step, training_batches


from vanilla_transformer.training.cpu_speedups import CPU16BitDropout, cpu_16bit_dropout

# Each kernel: the context its training steps run in, and the dropout alone.
KERNELS = {
    "cpu_16bit": (CPU16BitDropout, lambda x, p: cpu_16bit_dropout(x, p)),
    "torch": (contextlib.nullcontext, lambda x, p: torch.nn.functional.dropout(x, p, training=True)),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser)  # --repeats is the number of rounds per kernel
    parser.add_argument("--size", default="small", choices=["base", "small"], help="(default small)")
    parser.add_argument("--max-tokens", type=int, default=4096, help="tokens per batch, padding included (4096)")
    parser.add_argument("--steps", type=int, default=10, help="steps per round, on as many batches (10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (3)")
    parser.add_argument("--pairs", type=int, default=None, help="bucket only the first PAIRS training pairs")
    parser.add_argument("--bf16", action="store_true", help="torch.autocast to bfloat16 for the forward and loss")
    parser.add_argument("--attention-dropout", type=float, default=0.0,
                        help="dropout on the attention weights and after the ReLU too (not the paper's; default 0)")
    args = parser.parse_args(argv)
    args.repeats = max(args.repeats, 2) if not args.smoke else 2
    if args.smoke:
        args.size, args.max_tokens, args.steps, args.warmup = "tiny", 1024, 2, 1
        args.pairs, args.threads = args.pairs or SMOKE_PAIRS, args.threads or 1
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(args)
    batches = [{k: torch.from_numpy(v) for k, v in b.items()} for b in training_batches(args, tokenizer)]
    config = dict(model_configs(args.size, tokenizer, DROPOUT)["ours"],
                  attention_dropout=args.attention_dropout, activation_dropout=args.attention_dropout)
    model = build_model("ours", config, args.seed, args.attn_implementation).train()
    optimizer = torch.optim.Adam(model.parameters(), **ADAM)

    step_ms = {name: [] for name in KERNELS}
    progress = tqdm(total=2 * args.repeats, desc="rounds", file=sys.stderr)
    try:
        for batch in batches[: args.warmup]:
            train_step(model, optimizer, batch, "cpu", args.bf16)
        for round_index in range(args.repeats):
            order = list(KERNELS) if round_index % 2 == 0 else list(KERNELS)[::-1]
            for name in order:
                start = time.perf_counter()
                with KERNELS[name][0]():
                    for batch in batches:
                        train_step(model, optimizer, batch, "cpu", args.bf16)
                step_ms[name].append((time.perf_counter() - start) / len(batches) * 1e3)
                progress.update()
    finally:
        progress.close()

    # The dropout alone on one batch's feed-forward activations, forward and backward.
    tokens = int(sum(b["labels"].numel() for b in batches) / len(batches))
    activations = torch.randn(tokens, model.config.encoder_ffn_dim, requires_grad=True,
                              dtype=torch.bfloat16 if args.bf16 else torch.float32)
    alone_ms = {}
    for name, (_, kernel) in KERNELS.items():
        times = []
        for _ in range(max(5, args.repeats)):
            start = time.perf_counter()
            kernel(activations, DROPOUT).sum().backward()
            times.append((time.perf_counter() - start) * 1e3)
        alone_ms[name] = statistics.median(times)

    target_tokens = sum(int((b["labels"] != -100).sum()) for b in batches) / len(batches)
    medians = {name: statistics.median(times) for name, times in step_ms.items()}
    rows = [[name, f"{medians[name]:.1f} ({min(step_ms[name]):.1f}-{max(step_ms[name]):.1f})",
             f"{target_tokens / medians[name] * 1e3:,.0f}", f"{alone_ms[name]:.2f}"] for name in KERNELS]
    env = environment()
    settings = dict(size=SIZES[args.size], bf16=args.bf16, attn_implementation=args.attn_implementation,
                    dropout=DROPOUT, attention_and_relu_dropout=args.attention_dropout, max_tokens=args.max_tokens,
                    steps=args.steps, rounds=args.repeats, mean_target_tokens=target_tokens,
                    dropout_alone_shape=list(activations.shape), smoke=args.smoke)
    speedup = medians["torch"] / medians["cpu_16bit"]
    print("## Dropout on a CPU: the train command's cpu_16bit kernel vs torch's, in our model's training step\n")
    print("\n".join(environment_lines(env)))
    print(f"- {args.size}, {'bf16 autocast' if args.bf16 else 'fp32'}, {args.attn_implementation} attention, "
          f"P_drop {DROPOUT}, attention/ReLU dropout {args.attention_dropout}; {args.steps} batches of <= "
          f"{args.max_tokens:,} tokens, {args.repeats} rounds per kernel, alternating\n")
    print(markdown_table(["dropout", "ms per step, median (min-max)", "target tok/s",
                          f"dropout alone, fwd+bwd on {tokens} x {model.config.encoder_ffn_dim}, ms"], rows))
    print(f"\nstep speed-up of the cpu_16bit kernel: {speedup:.3f}x")
    if args.json is not None:
        args.json.write_text(json.dumps(dict(environment=env, settings=settings, step_ms=step_ms,
                                             dropout_alone_ms=alone_ms, speedup=speedup), indent=2) + "\n")


if __name__ == "__main__":
    main()
