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

With `--compile`, five engines instead of two: ours and Marian eager, ours and Marian with a static cache and their
decoding step compiled by inductor (`vanilla_transformer.inference.compiled_decoding`, sources padded to a multiple of 16
tokens; Marian compiled exactly as ours, and reported as failed if it does not compile), and our model exported to
CTranslate2 float32. Every compiled engine first decodes all the batches of a cell once, which compiles every shape:
that pass is timed apart, and its excess over a timed pass is the compile time.

    python benchmarks/generate_speed.py --compile --size small --json generate_speed_compiled_small.json
    python benchmarks/generate_speed.py --compile --smoke
"""

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from tqdm import tqdm

from common import (
    LABELS,
    MODEL_NAMES,
    SIZES,
    add_common_arguments,
    build_model,
    convert_ours,
    ct2_decode_all,
    decode_all,
    environment,
    environment_lines,
    forced_length_kwargs,
    format_rate,
    load_tokenizer,
    markdown_table,
    model_configs,
    read_lines,
    source_batches,
    summary,
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
    parser.add_argument("--compile", action="store_true",
                        help="also time both models with a compiled decoding step, and our model in CTranslate2")
    parser.add_argument("--compile-mode", default=None,
                        choices=["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"],
                        help="inductor mode of --compile (default: reduce-overhead on cuda, default on cpu)")
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES, metavar="ENGINE",
                        help="the engines --compile times (default all: " + " ".join(ENGINES) + ")")
    args = parser.parse_args(argv)
    if args.smoke:
        args.size, args.sentences, args.sentences_bs1, args.new_tokens, args.repeats = "tiny", 32, 4, 8, 2
        # One thread: on a busy machine, two OpenMP threads waiting on each other make tiny runs many times slower.
        args.threads = args.threads or 1
    return args


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


def main(argv=None):
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.compile:
        return compiled_main(args)

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


# --- --compile -----------------------------------------------------------------------------------------------------

ENGINES = ("ours", "ours_compiled", "marian", "marian_compiled", "ours_ct2")
ENGINE_LABELS = {"ours": "ours", "ours_compiled": "ours compiled", "marian": "Marian",
                 "marian_compiled": "Marian compiled", "ours_ct2": "ours, CT2 float32"}


def compiled_main(args):
    from vanilla_transformer.inference.compiled_decoding import GENERATE_KWARGS, SOURCE_BUCKET, compiled_decoding, default_mode

    mode = args.compile_mode or default_mode(args.device)
    tokenizer = load_tokenizer(args)
    sentences = read_lines(args.data_dir / "val.en.gz", max(args.sentences, args.sentences_bs1))
    configs = model_configs(args.size, tokenizer, dropout=0.1)
    models = {name: build_model(name, configs[name], args.seed, args.attn_implementation) for name in MODEL_NAMES}
    ct2_version = None
    if "ours_ct2" in args.engines:  # CTranslate2 is needed by this engine only
        import ctranslate2

        ct2_version = ctranslate2.__version__
        with tempfile.TemporaryDirectory() as tmp:  # the CTranslate2 model from ours in float32, before any dtype change
            folder = convert_ours(models["ours"].eval(), tokenizer, Path(tmp), "float32")
            ct2_device = "cuda" if args.device == "cuda" else "cpu"
            translator = ctranslate2.Translator(str(folder), device=ct2_device, inter_threads=1,
                                                intra_threads=torch.get_num_threads())
    dtype = getattr(torch, args.dtype)
    models = {name: model.to(args.device, dtype).eval() for name, model in models.items()}

    batches, bucketed, token_batches = {}, {}, {}
    for batch_size in args.batch_sizes:
        chosen = sentences[: args.sentences if batch_size > 1 else args.sentences_bs1]
        batches[batch_size] = source_batches(tokenizer, chosen, batch_size, args.device)
        bucketed[batch_size] = source_batches(tokenizer, chosen, batch_size, args.device, SOURCE_BUCKET)
        as_tokens = [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(chosen)["input_ids"]]
        starts = range(0, len(as_tokens), batch_size)
        token_batches[batch_size] = [as_tokens[start : start + batch_size] for start in starts]
    extra = {"ours": {}, "marian": {}}
    if accepts_length_penalty_type(models["ours"], batches[args.batch_sizes[0]][0]):
        extra["ours"]["length_penalty_type"] = "transformers"

    def run(engine, beams, batch_size, limit=None):
        """Seconds to decode the cell's batches (the first `limit`) with `engine`, and the tokens it generated."""
        if engine == "ours_ct2":
            chosen = token_batches[batch_size][:limit]
            return ct2_decode_all(translator, chosen, beams, args.new_tokens, args.length_penalty)
        name = engine.removesuffix("_compiled")
        generate_kwargs = {**forced_length_kwargs(beams, args.new_tokens, args.length_penalty), **extra[name]}
        if engine == name:
            return decode_all(models[name], batches[batch_size][:limit], generate_kwargs)
        with compiled_decoding(models[name], mode):
            return decode_all(models[name], bucketed[batch_size][:limit], {**generate_kwargs, **GENERATE_KWARGS})

    failed = {}  # engine -> the error that stopped it (a compiled Marian that does not compile)
    results = []
    cells = [(beams, batch_size) for beams in args.beams for batch_size in args.batch_sizes]
    progress = tqdm(total=len(cells) * (args.repeats + 1) * len(args.engines), desc="generate", file=sys.stderr)
    for beams, batch_size in cells:
        decoding = "greedy" if beams == 1 else f"beam {beams}"
        progress.set_postfix_str(f"{decoding}, batch {batch_size}")
        engines = [engine for engine in ENGINES if engine in args.engines and engine not in failed]
        first_pass = {}
        for engine in engines:
            try:
                if engine.endswith("_compiled"):  # every batch once: every shape of the cell compiles here
                    before = compile_counts()
                    elapsed = run(engine, beams, batch_size)[0]
                    graphs, breaks = (after - earlier for after, earlier in zip(compile_counts(), before))
                    first_pass[engine] = dict(first_pass_s=elapsed, graphs=graphs, graph_breaks=breaks)
                else:
                    for _ in range(args.warmup):
                        run(engine, beams, batch_size, limit=1)
            except Exception as error:  # reported in the table, the other engines go on
                failed[engine] = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300]}"
            progress.update()
        engines = [engine for engine in engines if engine not in failed]
        rates, tokens, seconds = {engine: [] for engine in engines}, {}, {engine: [] for engine in engines}
        for repeat in range(args.repeats):
            for engine in engines if repeat % 2 == 0 else engines[::-1]:
                elapsed, tokens[engine] = run(engine, beams, batch_size)
                seconds[engine].append(elapsed)
                rates[engine].append(tokens[engine] / elapsed)
                progress.update()
        stats = {engine: dict(summary(rates[engine]), generated_tokens=tokens[engine]) for engine in engines}
        for engine, compilation in first_pass.items():
            if engine in stats:
                compile_s = compilation["first_pass_s"] - statistics.median(seconds[engine])
                stats[engine].update(compilation, compile_s=compile_s)
        result = dict(decoding=decoding, num_beams=beams, batch_size=batch_size,
                      sentences=sum(len(batch["input_ids"]) for batch in batches[batch_size]), **stats)
        if "ours_compiled" in stats:
            for other in ("ours", "marian", "marian_compiled", "ours_ct2"):
                if other in stats:
                    result[f"ours_compiled_over_{other}"] = stats["ours_compiled"]["median"] / stats[other]["median"]
        results.append(result)
    progress.close()

    env = environment(args.device)
    env["ctranslate2"] = ct2_version
    settings = dict(
        size=args.size, **SIZES[args.size], vocab_size=len(tokenizer),
        trainable_parameters={name: trainable_parameters(models[name]) for name in MODEL_NAMES},
        new_tokens=args.new_tokens, length_penalty=args.length_penalty, early_stopping=True,
        attn_implementation=args.attn_implementation, dtype=args.dtype, compile_mode=mode,
        source_bucket=SOURCE_BUCKET, repeats=args.repeats, warmup=args.warmup, smoke=args.smoke, failed=failed,
    )
    print(compiled_report(env, settings, results))
    if args.json is not None:
        args.json.write_text(json.dumps(dict(environment=env, settings=settings, results=results), indent=2) + "\n")


def compile_counts() -> tuple[int, int]:
    """Graphs compiled and graph breaks met so far in this process, as torch counts them."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


def compiled_report(env: dict, settings: dict, results: list[dict]) -> str:
    smoke = " (smoke run)" if settings["smoke"] else ""
    lines = [
        f"## generate() speed with a compiled decoding step, {settings['size']} size: ours vs MarianMTModel vs "
        f"CTranslate2{smoke}",
        "",
        *environment_lines(env),
        f"- CTranslate2 {env['ctranslate2'] or '(not run)'}; models: d_model {settings['d_model']}, N = {settings['layers']}+"
        f"{settings['layers']}, h {settings['heads']}, d_ff {settings['ffn_dim']}, vocab {settings['vocab_size']:,}, "
        f"random weights; attention: {settings['attn_implementation']}; {settings['dtype']} (CTranslate2: float32)",
        f"- compiled: static cache, inductor mode {settings['compile_mode']}, sources padded to a multiple of "
        f"{settings['source_bucket']} tokens; compile s = the first pass over a cell's batches (which compiles its "
        "shapes) minus a timed pass",
        f"- decoding: exactly {settings['new_tokens']} new tokens per sentence; beam search with length_penalty "
        f"{settings['length_penalty']}, early_stopping=True; {settings['repeats']} repeat(s), engines alternating; "
        "generated tokens/s as median (min-max)",
        "",
    ]
    engines = [engine for engine in ENGINES
               if engine in settings["failed"] or any(engine in result for result in results)]
    compiled = [engine for engine in engines if engine.endswith("_compiled")]
    ratios = [other for other in ("ours", "marian", "marian_compiled", "ours_ct2")
              if any(f"ours_compiled_over_{other}" in result for result in results)]
    rows = []
    for result in results:
        rows.append([
            result["decoding"], str(result["batch_size"]), str(result["sentences"]),
            *(format_rate(result[engine]) if engine in result else "failed" for engine in engines),
            *(f"{result[engine]['compile_s']:.1f}" if engine in result else "-" for engine in compiled),
            *(f"{result[f'ours_compiled_over_{other}']:.2f}" if f"ours_compiled_over_{other}" in result else "-"
              for other in ratios),
        ])
    lines.append(markdown_table(
        ["decoding", "batch", "sentences", *(f"{ENGINE_LABELS[engine]} tok/s" for engine in engines),
         *(f"{ENGINE_LABELS[engine]} compile s" for engine in compiled),
         *(f"ours compiled / {ENGINE_LABELS[other]}" for other in ratios)],
        rows,
    ))
    for engine, error in settings["failed"].items():
        lines.append(f"\n{ENGINE_LABELS[engine]} failed: {error}")
    counts = [
        f"{result['decoding']}, batch {result['batch_size']}: "
        + ", ".join(f"{ENGINE_LABELS[engine]} {result[engine]['graphs']} ({result[engine]['graph_breaks']})"
                    for engine in compiled if engine in result)
        for result in results
    ]
    lines.append("\nGraphs compiled (graph breaks) in the first pass: " + "; ".join(counts))
    for result in results:
        counts = {engine: result[engine]["generated_tokens"] for engine in engines if engine in result}
        if len(set(counts.values())) > 1:
            lines.append(f"\nNote: {result['decoding']}, batch {result['batch_size']}: the engines generated "
                         f"different numbers of tokens ({counts}); tokens/s counts each engine's own.")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
