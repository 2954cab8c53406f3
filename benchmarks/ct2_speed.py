"""CTranslate2 decoding speed: our `export-ct2` conversion side by side with CTranslate2's own conversion of a
`MarianMTModel` of the same size, and both against `MarianMTModel.generate()`, in the same run.

Both models are randomly initialised from the same numbers as in `generate_speed.py` (weights do not change the cost
of a decoding step). Ours is saved and converted with `export_ctranslate2` (the `export-ct2` command), Marian's with
`ctranslate2.converters.TransformersConverter`, both to the same weight type (`--quantization`, default float32).
Each translator runs on `--threads` intra-op threads (default: torch's thread count), one batch at a time. Every
sentence decodes exactly N tokens (`min_decoding_length = max_decoding_length = N`; `min_new_tokens =
max_new_tokens = N` for `generate()`), greedy and beam 4, at batch size 1 and 32, on the first sentences of Multi30k
val (English), after a warm-up call per engine and cell; the engines alternate over the repeats and the table gives
the median and range of generated tokens per second and two ratios of the medians.

    python benchmarks/ct2_speed.py                          # base size, float32 (minutes)
    python benchmarks/ct2_speed.py --quantization int8 --json ct2_int8.json
    python benchmarks/ct2_speed.py --skip-generate --repeats 7   # only the two CTranslate2 models
    python benchmarks/ct2_speed.py --smoke                  # seconds: checks that the script works
"""

import argparse
import json
import tempfile
from pathlib import Path

import ctranslate2
import torch
from ctranslate2.converters import TransformersConverter
from ctranslate2.converters import transformers as ct2_transformers

from common import (
    SIZES,
    add_common_arguments,
    build_model,
    convert_ours,
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

from vanilla_transformer.backends.ctranslate2 import QUANTIZATIONS

ENGINES = ("ours_ct2", "marian_ct2", "marian_generate")
ENGINE_LABELS = {"ours_ct2": "ours, CT2", "marian_ct2": "Marian, CT2", "marian_generate": "MarianMTModel.generate"}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser)
    parser.add_argument("--size", default="base", choices=["base", "small"], help="model size (default base)")
    parser.add_argument("--quantization", default="float32", choices=QUANTIZATIONS,
                        help="weight type of both CTranslate2 models (default float32)")
    parser.add_argument("--sentences", type=int, default=256, help="first sentences of val.en.gz at batch size > 1")
    parser.add_argument("--sentences-bs1", type=int, default=32, help="first sentences decoded at batch size 1")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 4], help="1 is greedy search (default 1 4)")
    parser.add_argument("--new-tokens", type=int, default=32, help="N: tokens decoded per sentence (default 32)")
    parser.add_argument("--length-penalty", type=float, default=0.6, help="beam search length penalty, all engines")
    parser.add_argument("--skip-generate", action="store_true",
                        help="time only the two CTranslate2 models (more repeats in less time)")
    args = parser.parse_args(argv)
    args.engines = ENGINES[:2] if args.skip_generate else ENGINES
    if args.smoke:
        args.size, args.sentences, args.sentences_bs1, args.new_tokens, args.repeats = "tiny", 32, 4, 8, 2
        args.threads = args.threads or 1
    return args


class SharedVocabularyMarianLoader(ct2_transformers.MarianMTLoader):
    """CTranslate2's Marian conversion, for a vocabulary with `<pad>` where ours has it. Marian's own vocabularies
    end with a `<pad>` that transformers appended, which the converter drops from the weights; our shared BPE has
    `<pad>` at id 0, so nothing is dropped and both CTranslate2 models keep the same 8,000 output rows."""

    def _remove_pad_weights(self, spec):
        pass


def convert_marian(model, tokenizer, folder: Path, quantization: str) -> Path:
    model.save_pretrained(folder / "hf")
    tokenizer.save_pretrained(folder / "hf")
    converter = TransformersConverter(str(folder / "hf"))
    loaders = ct2_transformers._MODEL_LOADERS  # CTranslate2 picks the loader by configuration class name
    original = loaders["MarianConfig"]
    loaders["MarianConfig"] = SharedVocabularyMarianLoader()
    try:
        return Path(converter.convert(str(folder / "ct2"), quantization=quantization, force=True))
    finally:
        loaders["MarianConfig"] = original


def main(argv=None):
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()

    tokenizer = load_tokenizer(args)
    sentences = read_lines(args.data_dir / "val.en.gz", max(args.sentences, args.sentences_bs1))
    configs = model_configs(args.size, tokenizer, dropout=0.1)
    models = {name: build_model(name, configs[name], args.seed, args.attn_implementation).eval()
              for name in ("ours", "marian")}

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        folders = {
            "ours_ct2": convert_ours(models["ours"], tokenizer, tmp / "ours", args.quantization),
            "marian_ct2": convert_marian(models["marian"], tokenizer, tmp / "marian", args.quantization),
        }
        translators = {name: ctranslate2.Translator(str(folder), device="cpu", inter_threads=1, intra_threads=threads)
                       for name, folder in folders.items()}

    batches, token_batches = engine_batches(tokenizer, sentences, args)

    def run(engine, beams, batch_size, limit=None):
        if engine == "marian_generate":
            kwargs = forced_length_kwargs(beams, args.new_tokens, args.length_penalty)
            return decode_all(models["marian"], batches[batch_size][:limit], kwargs)
        return ct2_decode_all(translators[engine], token_batches[batch_size][:limit], beams, args.new_tokens,
                              args.length_penalty)

    results = time_cells(run, args.engines, token_batches, args, desc="decode")
    for result in results:
        result["ours_ct2_over_marian_ct2"] = result["ours_ct2"]["median"] / result["marian_ct2"]["median"]
        if "marian_generate" in result:
            ratio = result["ours_ct2"]["median"] / result["marian_generate"]["median"]
            result["ours_ct2_over_marian_generate"] = ratio

    env = environment()
    env["ctranslate2"] = ctranslate2.__version__
    settings = dict(size=args.size, **SIZES[args.size], vocab_size=len(tokenizer), quantization=args.quantization,
                    threads=threads, new_tokens=args.new_tokens, length_penalty=args.length_penalty,
                    repeats=args.repeats, smoke=args.smoke)
    print(report(env, settings, results))
    if args.json is not None:
        args.json.write_text(json.dumps(dict(environment=env, settings=settings, results=results), indent=2) + "\n")


def report(env: dict, settings: dict, results: list[dict]) -> str:
    smoke = " (smoke run)" if settings["smoke"] else ""
    lines = [
        f"## CTranslate2 speed, {settings['size']} size, {settings['quantization']}: our export vs Marian's "
        f"conversion vs MarianMTModel.generate(){smoke}",
        "",
        *environment_lines(env),
        f"- CTranslate2 {env['ctranslate2']}, {settings['threads']} intra-op thread(s); models: d_model "
        f"{settings['d_model']}, N = {settings['layers']}+{settings['layers']}, h {settings['heads']}, d_ff "
        f"{settings['ffn_dim']}, vocab {settings['vocab_size']:,}, random weights",
        f"- exactly {settings['new_tokens']} new tokens per sentence; beam search with length penalty "
        f"{settings['length_penalty']}; generated tokens/s as median (min-max) of {settings['repeats']} repeats",
        "",
    ]
    engines = [engine for engine in ENGINES if engine in results[0]]
    with_generate = "marian_generate" in engines
    rows = [
        [result["decoding"], str(result["batch_size"]), str(result["sentences"]),
         *(format_rate(result[engine]) for engine in engines), f"{result['ours_ct2_over_marian_ct2']:.2f}",
         *([f"{result['ours_ct2_over_marian_generate']:.2f}"] if with_generate else [])]
        for result in results
    ]
    lines.append(markdown_table(
        ["decoding", "batch", "sentences", *(f"{ENGINE_LABELS[engine]} tok/s" for engine in engines),
         "ours CT2 / Marian CT2", *(["ours CT2 / MarianMTModel"] if with_generate else [])],
        rows,
    ))
    for result in results:
        counts = {engine: result[engine]["generated_tokens"] for engine in engines}
        if len(set(counts.values())) > 1:
            lines.append(f"\nNote: {result['decoding']}, batch {result['batch_size']}: the engines generated "
                         f"different numbers of tokens ({counts}); tokens/s counts each engine's own.")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
