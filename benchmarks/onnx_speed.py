"""ONNX Runtime decoding speed: our model exported with `export-onnx` and run by `generate()` on ONNX Runtime, in
float32 and int8, against the same model's PyTorch eager `generate()` and its CTranslate2 float32 export, in one run.

The model is randomly initialised from the same numbers as in `generate_speed.py` (weights do not change the cost of a
decoding step), saved, exported with `export_onnx` (the `export-onnx` command, float32 and `--quantize int8`) and with
`export_ctranslate2` (float32). PyTorch, ONNX Runtime and CTranslate2 each run on `--threads` intra-op threads
(default: torch's thread count). Every sentence decodes exactly N tokens (`min_new_tokens = max_new_tokens = N`, and
CTranslate2's `min_decoding_length = max_decoding_length = N`), greedy and beam 4 (transformers' length penalty,
stopping at 4 finished hypotheses, as CTranslate2 does), at batch size 1 and 32, on the first sentences of Multi30k
val (English), after a warm-up call per engine and cell; the engines alternate over the repeats, and the table gives
the median and range of generated tokens per second and two ratios of the medians: ORT float32 / PyTorch eager, and
ORT int8 / CTranslate2 float32.

    python benchmarks/onnx_speed.py --threads 2                      # base and small sizes (tens of minutes)
    python benchmarks/onnx_speed.py --sizes small --json onnx_small.json
    python benchmarks/onnx_speed.py --smoke                          # seconds: checks that the script works
"""

import argparse
import json
import tempfile
from pathlib import Path

import ctranslate2
import onnxruntime
import torch

from common import (
    SIZES,
    add_common_arguments,
    build_model,
    ct2_decode_all,
    decode_all,
    engine_batches,
    environment,
    environment_lines,
    forced_length_kwargs,
    format_rate,
    load_tokenizer,
    markdown_table,
    model_configs,
    read_lines,
    time_cells,
)

from vanilla_transformer.backends.ctranslate2.export import export_ctranslate2
from vanilla_transformer.backends.onnx.export import export_onnx
from vanilla_transformer.backends.onnx.model import VanillaTransformerORTForConditionalGeneration, default_session_options

ENGINES = ("torch", "ort_float32", "ort_int8", "ct2_float32")
ENGINE_LABELS = {"torch": "PyTorch eager", "ort_float32": "ORT float32", "ort_int8": "ORT int8",
                 "ct2_float32": "CT2 float32"}
# The targets, on 2 CPU cores: (engine, reference engine, least ratio of their medians, batch sizes).
TARGETS = (("ort_float32", "torch", 1.5, (1,)), ("ort_int8", "ct2_float32", 1.0, None))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser)
    parser.add_argument("--sizes", nargs="+", default=["base", "small"], choices=["base", "small"],
                        help="model sizes, one after the other (default: base small)")
    parser.add_argument("--sentences", type=int, default=256, help="first sentences of val.en.gz at batch size > 1")
    parser.add_argument("--sentences-bs1", type=int, default=32, help="first sentences decoded at batch size 1")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 4], help="1 is greedy search (default 1 4)")
    parser.add_argument("--new-tokens", type=int, default=32, help="N: tokens decoded per sentence (default 32)")
    parser.add_argument("--length-penalty", type=float, default=0.6, help="beam search length penalty, all engines")
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES, metavar="ENGINE",
                        help="the engines to time (default all: " + " ".join(ENGINES) + ")")
    args = parser.parse_args(argv)
    args.engines = [engine for engine in ENGINES if engine in args.engines]  # in the table's order
    if args.smoke:
        args.sizes, args.sentences, args.sentences_bs1, args.new_tokens, args.repeats = ["tiny"], 32, 4, 8, 2
        args.threads = args.threads or 1
    return args


def exported_engines(size: str, tokenizer, args, threads: int, folder: Path) -> dict:
    """Each engine of `args.engines` for a random model of `size`: a PyTorch model, ORT models, a CT2 translator."""
    model = build_model("ours", model_configs(size, tokenizer, dropout=0.1)["ours"], args.seed,
                        args.attn_implementation).eval()
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    engines = {"torch": model}
    if {"ort_float32", "ort_int8"} & set(args.engines):
        export_onnx(folder / "model", folder / "onnx")
        options = default_session_options(threads)
        options.inter_op_num_threads = 1
        engines["ort_float32"] = VanillaTransformerORTForConditionalGeneration.from_pretrained(
            folder / "onnx", session_options=options)
        if "ort_int8" in args.engines:
            export_onnx(folder / "model", folder / "int8", quantize="int8")
            engines["ort_int8"] = VanillaTransformerORTForConditionalGeneration.from_pretrained(
                folder / "int8", session_options=options)
    if "ct2_float32" in args.engines:
        export_ctranslate2(folder / "model", folder / "ct2")
        engines["ct2_float32"] = ctranslate2.Translator(str(folder / "ct2"), device="cpu", inter_threads=1,
                                                        intra_threads=threads)
    return {engine: engines[engine] for engine in args.engines}


def time_size(size: str, tokenizer, sentences: list[str], args, threads: int) -> list[dict]:
    """The results of every cell (decoding, batch size) for the model of `size`."""
    with tempfile.TemporaryDirectory() as tmp:
        engines = exported_engines(size, tokenizer, args, threads, Path(tmp))

    batches, token_batches = engine_batches(tokenizer, sentences, args)

    def run(engine, beams, batch_size, limit=None):
        if engine == "ct2_float32":
            return ct2_decode_all(engines[engine], token_batches[batch_size][:limit], beams, args.new_tokens,
                                  args.length_penalty)
        # transformers' length penalty, as CTranslate2's (our generate() defaults to GNMT's).
        kwargs = dict(forced_length_kwargs(beams, args.new_tokens, args.length_penalty),
                      length_penalty_type="transformers")
        return decode_all(engines[engine], batches[batch_size][:limit], kwargs)

    results = time_cells(run, list(engines), token_batches, args, desc=f"decode ({size})")
    for result in results:
        for engine, reference, _, _ in TARGETS:
            if engine in result and reference in result:
                result[f"{engine}_over_{reference}"] = result[engine]["median"] / result[reference]["median"]
    return results


def main(argv=None):
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    tokenizer = load_tokenizer(args)
    sentences = read_lines(args.data_dir / "val.en.gz", max(args.sentences, args.sentences_bs1))
    results = {size: time_size(size, tokenizer, sentences, args, threads) for size in args.sizes}

    env = environment()
    env.update(onnxruntime=onnxruntime.__version__, ctranslate2=ctranslate2.__version__)
    settings = dict(sizes={size: SIZES[size] for size in args.sizes}, vocab_size=len(tokenizer), threads=threads,
                    engines=args.engines, new_tokens=args.new_tokens, length_penalty=args.length_penalty,
                    attn_implementation=args.attn_implementation, repeats=args.repeats, smoke=args.smoke)
    print(report(env, settings, results))
    if args.json is not None:
        args.json.write_text(json.dumps(dict(environment=env, settings=settings, results=results), indent=2) + "\n")


def report(env: dict, settings: dict, results: dict[str, list[dict]]) -> str:
    smoke = " (smoke run)" if settings["smoke"] else ""
    engines = settings["engines"]
    ratios = [(engine, reference) for engine, reference, _, _ in TARGETS if {engine, reference} <= set(engines)]
    lines = [
        f"## ONNX Runtime speed: {', '.join(ENGINE_LABELS[engine] for engine in engines)}{smoke}",
        "",
        *environment_lines(env),
        f"- ONNX Runtime {env['onnxruntime']}, CTranslate2 {env['ctranslate2']}; {settings['threads']} intra-op "
        f"thread(s) for every engine; vocab {settings['vocab_size']:,}, random weights; PyTorch attention: "
        f"{settings['attn_implementation']}",
        f"- exactly {settings['new_tokens']} new tokens per sentence; beam search with transformers' length penalty "
        f"{settings['length_penalty']}, early_stopping=True; generated tokens/s as median (min-max) of "
        f"{settings['repeats']} repeats, engines alternating",
    ]
    for size, size_results in results.items():
        shape = settings["sizes"][size]
        lines += [
            "",
            f"### {size}: d_model {shape['d_model']}, N = {shape['layers']}+{shape['layers']}, h {shape['heads']}, "
            f"d_ff {shape['ffn_dim']}",
            "",
            markdown_table(
                ["decoding", "batch", "sentences", *(f"{ENGINE_LABELS[engine]} tok/s" for engine in engines),
                 *(f"{ENGINE_LABELS[engine]} / {ENGINE_LABELS[reference]}" for engine, reference in ratios)],
                [[result["decoding"], str(result["batch_size"]), str(result["sentences"]),
                  *(format_rate(result[engine]) for engine in engines),
                  *(f"{result[f'{engine}_over_{reference}']:.2f}" for engine, reference in ratios)]
                 for result in size_results],
            ),
        ]
        for result in size_results:
            counts = {engine: result[engine]["generated_tokens"] for engine in engines}
            if len(set(counts.values())) > 1:
                lines.append(f"\nNote: {result['decoding']}, batch {result['batch_size']}: the engines generated "
                             f"different numbers of tokens ({counts}); tokens/s counts each engine's own.")
    lines += ["", "Targets (2 CPU cores):"]
    for engine, reference, least, batch_sizes in TARGETS:
        if (engine, reference) not in ratios:
            continue
        where = "at batch size " + ", ".join(map(str, batch_sizes)) if batch_sizes else "in every cell"
        cells = [(size, result) for size, size_results in results.items() for result in size_results
                 if batch_sizes is None or result["batch_size"] in batch_sizes]
        missed = [f"{size} {result['decoding']} batch {result['batch_size']} "
                  f"({result[f'{engine}_over_{reference}']:.2f})"
                  for size, result in cells if result[f"{engine}_over_{reference}"] < least]
        verdict = "met" if not missed else "missed: " + "; ".join(missed)
        lines.append(f"- {ENGINE_LABELS[engine]} >= {least:g}x {ENGINE_LABELS[reference]} {where}: {verdict}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
