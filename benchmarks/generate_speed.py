"""Generated tokens per second of `generate()`: our model side by side with transformers' `MarianMTModel` of the same
size, in the same run.

Both models are randomly initialised (weights do not change the cost of a decoding step), in eval mode, and decode
exactly N new tokens per sentence (`min_new_tokens = max_new_tokens = N`, so `</s>` never ends a sentence early),
greedy and beam 4, at batch size 1 and 32, on the first sentences of Multi30k val (English), tokenized with a joint
en+de BPE trained on the fly. After a warm-up call, the two models alternate over several repeats; the table gives
the median and the range of generated tokens per second, and the ratio of the medians.

    python benchmarks/generate_speed.py                 # base size, the full measurement (minutes)
    python benchmarks/generate_speed.py --size small --json generate_speed.json
    python benchmarks/generate_speed.py --device cuda --dtype bfloat16   # a GPU, both models in bf16
    python benchmarks/generate_speed.py --smoke         # seconds: checks that the script works
"""

import argparse
import json
import sys
import time

import torch
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


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser)
    parser.add_argument("--size", default="base", choices=["base", "small"], help="model size (default base)")
    parser.add_argument("--sentences", type=int, default=256,
                        help="first sentences of val.en.gz decoded at batch sizes > 1 (default 256)")
    parser.add_argument("--sentences-bs1", type=int, default=32,
                        help="first sentences decoded at batch size 1 (default 32)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 4], help="1 is greedy search (default 1 4)")
    parser.add_argument("--new-tokens", type=int, default=32,
                        help="N: every sentence decodes exactly N new tokens (default 32)")
    parser.add_argument("--length-penalty", type=float, default=0.6,
                        help="transformers' length_penalty for beam search, the same for both (default 0.6)")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up generate() calls per model and cell")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="weights and activations of both models (default float32)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.size, args.sentences, args.sentences_bs1, args.new_tokens, args.repeats = "tiny", 32, 4, 8, 2
        # One thread: on a busy machine, two OpenMP threads waiting on each other make tiny runs many times slower.
        args.threads = args.threads or 1
    return args


def source_batches(tokenizer, sentences: list[str], batch_size: int, device: str = "cpu") -> list[dict]:
    """Consecutive sentences in file order, each batch padded to its longest sentence, on `device`."""
    encoded = tokenizer(sentences)["input_ids"]
    return [
        tokenizer.pad({"input_ids": encoded[start : start + batch_size]}, return_tensors="pt").to(device)
        for start in range(0, len(encoded), batch_size)
    ]


def accepts_length_penalty_type(model, batch) -> bool:
    """Whether our `generate()` takes `length_penalty_type` (transformers' own rejects unknown keyword arguments)."""
    try:
        with torch.inference_mode():
            model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=1, length_penalty_type="transformers")
    except (TypeError, ValueError) as error:
        if "length_penalty_type" in str(error):
            return False
        raise
    return True


def forced_length_kwargs(beams: int, new_tokens: int, length_penalty: float) -> dict:
    """generate() settings that decode exactly `new_tokens` tokens per sentence, greedy or with `beams` beams."""
    kwargs = dict(num_beams=beams, do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    if beams > 1:  # beam-search settings; given to greedy search they only raise warnings
        kwargs.update(length_penalty=length_penalty, early_stopping=True)
    return kwargs


def decode_all(model, batches: list[dict], generate_kwargs: dict) -> tuple[float, int]:
    """Seconds to decode every batch, and the number of generated tokens (decoder start token excluded)."""
    tokens = 0
    synchronize(model.device)
    start = time.perf_counter()
    with torch.inference_mode():
        for batch in batches:
            sequences = model.generate(**batch, **generate_kwargs)
            tokens += sequences.shape[0] * (sequences.shape[1] - 1)
    synchronize(model.device)
    return time.perf_counter() - start, tokens


def main(argv=None):
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    tokenizer = load_tokenizer(args)
    sentences = read_lines(args.data_dir / "val.en.gz", max(args.sentences, args.sentences_bs1))
    configs = model_configs(args.size, tokenizer, dropout=0.1)
    models = {name: build_model(name, configs[name], args.seed, args.attn_implementation) for name in MODEL_NAMES}
    dtype = getattr(torch, args.dtype)
    models = {name: model.to(args.device, dtype).eval() for name, model in models.items()}

    cells = [(beams, batch_size) for beams in args.beams for batch_size in args.batch_sizes]
    batches = {}
    for batch_size in args.batch_sizes:
        count = args.sentences if batch_size > 1 else args.sentences_bs1
        batches[batch_size] = source_batches(tokenizer, sentences[:count], batch_size, args.device)
    # Our generate() may take `length_penalty_type`, whose default (GNMT) transformers' beam search does not have.
    extra = {"ours": {}, "marian": {}}
    ours_takes_type = accepts_length_penalty_type(models["ours"], batches[args.batch_sizes[0]][0])
    if ours_takes_type:
        extra["ours"]["length_penalty_type"] = "transformers"

    results = []
    progress = tqdm(total=len(cells) * args.repeats * len(MODEL_NAMES), desc="generate", file=sys.stderr)
    for beams, batch_size in cells:
        decoding = "greedy" if beams == 1 else f"beam {beams}"
        progress.set_postfix_str(f"{decoding}, batch {batch_size}")
        generate_kwargs = forced_length_kwargs(beams, args.new_tokens, args.length_penalty)
        cell_batches = batches[batch_size]
        for name in MODEL_NAMES:
            for _ in range(args.warmup):
                decode_all(models[name], cell_batches[:1], {**generate_kwargs, **extra[name]})
        rates, tokens = {name: [] for name in MODEL_NAMES}, {}
        for repeat in range(args.repeats):
            order = MODEL_NAMES if repeat % 2 == 0 else MODEL_NAMES[::-1]
            for name in order:
                seconds, tokens[name] = decode_all(models[name], cell_batches, {**generate_kwargs, **extra[name]})
                rates[name].append(tokens[name] / seconds)
                progress.update()
        stats = {name: dict(summary(rates[name]), generated_tokens=tokens[name]) for name in MODEL_NAMES}
        results.append(dict(
            decoding=decoding,
            num_beams=beams,
            batch_size=batch_size,
            sentences=sum(len(batch["input_ids"]) for batch in cell_batches),
            **stats,
            ratio=stats["ours"]["median"] / stats["marian"]["median"],
        ))
    progress.close()

    env = environment(args.device)
    shape = SIZES[args.size]
    settings = dict(
        size=args.size,
        **shape,
        vocab_size=len(tokenizer),
        trainable_parameters={name: trainable_parameters(models[name]) for name in MODEL_NAMES},
        new_tokens=args.new_tokens,
        length_penalty=args.length_penalty,
        early_stopping=True,
        ours_length_penalty_type="transformers" if ours_takes_type else None,
        attn_implementation=args.attn_implementation,
        dtype=args.dtype,
        repeats=args.repeats,
        warmup=args.warmup,
        smoke=args.smoke,
    )
    print(report(env, settings, results))
    if args.json is not None:
        args.json.write_text(json.dumps(dict(environment=env, settings=settings, results=results), indent=2) + "\n")


def report(env: dict, settings: dict, results: list[dict]) -> str:
    params = settings["trainable_parameters"]
    type_note = (
        'ours given `length_penalty_type="transformers"`'
        if settings["ours_length_penalty_type"]
        else "ours' generate() takes no `length_penalty_type`"
    )
    smoke = " (smoke run)" if settings["smoke"] else ""
    lines = [
        f"## generate() speed, {settings['size']} size: ours vs MarianMTModel{smoke}",
        "",
        *environment_lines(env),
        f"- models: d_model {settings['d_model']}, N = {settings['layers']}+{settings['layers']}, "
        f"h {settings['heads']}, d_ff {settings['ffn_dim']}, vocab {settings['vocab_size']:,}, random weights; "
        f"trainable parameters: ours {params['ours']:,}, Marian {params['marian']:,}; "
        f"attention: {settings['attn_implementation']}; {settings['dtype']}",
        f"- decoding: exactly {settings['new_tokens']} new tokens per sentence (min_new_tokens = max_new_tokens); "
        f"beam search with length_penalty {settings['length_penalty']}, early_stopping=True; {type_note}",
        f"- Multi30k val.en, first sentences in file order; {settings['warmup']} warm-up call(s), then "
        f"{settings['repeats']} repeat(s), models alternating; generated tokens/s as median (min-max)",
        "",
    ]
    rows = [
        [result["decoding"], str(result["batch_size"]), str(result["sentences"]), format_rate(result["ours"]),
         format_rate(result["marian"]), f"{result['ratio']:.2f}"]
        for result in results
    ]
    lines.append(markdown_table(
        ["decoding", "batch", "sentences", f"{LABELS['ours']} tok/s", f"{LABELS['marian']} tok/s", "ours/Marian"], rows
    ))
    # min_new_tokens = max_new_tokens should make both decode the same number of tokens; say so if they did not.
    for result in results:
        counts = {name: result[name]["generated_tokens"] for name in MODEL_NAMES}
        if len(set(counts.values())) > 1:
            lines.append(f"\nNote: {result['decoding']}, batch {result['batch_size']}: the models generated "
                         f"different numbers of tokens ({counts}); tokens/s counts each model's own.")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
