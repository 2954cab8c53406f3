"""What the benchmarks share: the model sizes, the joint BPE tokenizer, our model and a MarianMTModel of the same
size built from the same numbers, decoding timed with `generate()` and with CTranslate2, the machine's description,
and the formatting of measurements."""

import argparse
import gzip
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
from tqdm import tqdm
from transformers import AutoTokenizer, MarianConfig, MarianMTModel

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.model.configuration_vanilla_transformer import PRESETS
from vanilla_transformer.training.tokenization import train_tokenizer


REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA_DIR = (REPO / ".." / "shared" / "data" / "multi30k").resolve()

# The paper's base model (the package's preset), the scaled-down model of the Multi30k recipe, and a size for --smoke
# runs only.
SHAPE = ("d_model", "layers", "heads", "ffn_dim")
SIZES = {
    "base": {key: PRESETS["base"][key] for key in SHAPE},
    "small": dict(d_model=256, layers=3, heads=4, ffn_dim=1024),
    "tiny": dict(d_model=64, layers=2, heads=4, ffn_dim=256),
}
MODEL_NAMES = ("ours", "marian")
LABELS = {"ours": "ours", "marian": "Marian"}

# --smoke: the tokenizer is trained on the first lines of each training file only.
SMOKE_TOKENIZER_LINES, SMOKE_VOCAB_SIZE = 2000, 1000


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR,
                        help="Multi30k folder with train.{en,de}.gz and val.{en,de}.gz (default: %(default)s)")
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="a saved tokenizer folder; default: train a joint BPE on Multi30k train en+de")
    parser.add_argument("--vocab-size", type=int, default=8000, help="BPE vocabulary when training (default 8000)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per model, alternating (default 3)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's default)")
    parser.add_argument("--attn-implementation", default="sdpa", choices=["sdpa", "eager"],
                        help="attention kernel for both models (default sdpa)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write the results to this JSON file")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny model and data, two repeats, one thread unless --threads: checks that the script "
                        "works, measures nothing")


def read_lines(path: Path, limit: int | None = None) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8") as file:
        lines = []
        for line in file:
            if limit is not None and len(lines) == limit:
                break
            lines.append(line.rstrip("\n"))
    return lines


def load_tokenizer(args):
    """The saved tokenizer of `--tokenizer`, or the joint en+de BPE trained on the Multi30k training files."""
    if args.tokenizer is not None:
        return AutoTokenizer.from_pretrained(args.tokenizer)
    files = [args.data_dir / "train.en.gz", args.data_dir / "train.de.gz"]
    if args.smoke:
        texts = [line for path in files for line in read_lines(path, SMOKE_TOKENIZER_LINES)]
        return train_tokenizer(texts, vocab_size=SMOKE_VOCAB_SIZE, show_progress=False)
    return train_tokenizer(files, vocab_size=args.vocab_size, show_progress=False)


def model_configs(size: str, tokenizer, dropout: float, max_position_embeddings: int = 1024) -> dict[str, dict]:
    """Keyword arguments of `VanillaTransformerConfig.from_preset("base", ...)` and of `MarianConfig(...)` that give
    the two models the same shape, vocabulary, special ids and dropout. Marian's own defaults that differ from the
    paper are overridden: ReLU, embeddings times sqrt(d_model), one shared embedding matrix, no forced `</s>`."""
    shape = SIZES[size]
    common = dict(
        vocab_size=len(tokenizer),
        d_model=shape["d_model"],
        encoder_layers=shape["layers"],
        decoder_layers=shape["layers"],
        encoder_attention_heads=shape["heads"],
        decoder_attention_heads=shape["heads"],
        encoder_ffn_dim=shape["ffn_dim"],
        decoder_ffn_dim=shape["ffn_dim"],
        dropout=dropout,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.bos_token_id,
    )
    marian = dict(
        common,
        activation_function="relu",
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        # MarianConfig defaults to forcing token 0 (our <pad>) as the last token; ours forces nothing.
        forced_eos_token_id=None,
        max_position_embeddings=max_position_embeddings,
    )
    # Marian's attention projections have biases; ours get them too, so the two models have the same parameters.
    return {"ours": dict(common, attention_bias=True), "marian": marian}


def build_model(name: str, config_kwargs: dict, seed: int, attn_implementation: str) -> torch.nn.Module:
    """A randomly initialised model (the weights do not matter for speed), the same seed for both."""
    torch.manual_seed(seed)
    if name == "ours":
        config = VanillaTransformerConfig.from_preset("base", **config_kwargs)
        model = VanillaTransformerForConditionalGeneration(config)
    else:
        model = MarianMTModel(MarianConfig(**config_kwargs))
    model.set_attn_implementation(attn_implementation)
    return model


def source_batches(
    tokenizer, sentences: list[str], batch_size: int, device: str = "cpu", pad_to_multiple_of: int | None = None
) -> list[dict]:
    """Consecutive sentences in file order, each batch padded to its longest sentence (rounded up to a multiple of
    `pad_to_multiple_of`), on `device`."""
    encoded = tokenizer(sentences)["input_ids"]
    return [
        tokenizer.pad(
            {"input_ids": encoded[start : start + batch_size]}, pad_to_multiple_of=pad_to_multiple_of,
            return_tensors="pt",
        ).to(device)
        for start in range(0, len(encoded), batch_size)
    ]


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


def convert_ours(model, tokenizer, folder: Path, quantization: str) -> Path:
    """`model` saved with `tokenizer` in `folder`/hf and exported to CTranslate2 in `folder`/ct2 (`export-ct2`)."""
    from vanilla_transformer.backends.ctranslate2.export import export_ctranslate2  # needs the ct2 extra

    model.save_pretrained(folder / "hf")
    tokenizer.save_pretrained(folder / "hf")
    return export_ctranslate2(folder / "hf", folder / "ct2", quantization=quantization, force=True)


def ct2_decode_all(translator, token_batches: list[list[list[str]]], beams: int, new_tokens: int, alpha: float):
    """Seconds to decode every batch with CTranslate2, and the number of generated tokens."""
    tokens = 0
    start = time.perf_counter()
    for batch in token_batches:
        results = translator.translate_batch(
            batch, beam_size=beams, length_penalty=alpha, min_decoding_length=new_tokens,
            max_decoding_length=new_tokens, max_batch_size=len(batch),
        )
        tokens += sum(len(result.hypotheses[0]) for result in results)
    return time.perf_counter() - start, tokens


def engine_batches(tokenizer, sentences: list[str], args) -> tuple[dict, dict]:
    """For each of `args.batch_sizes`: `generate()`'s tokenized batches and CTranslate2's token batches of the same
    sentences (`args.sentences`, or `args.sentences_bs1` at batch size 1)."""
    batches, token_batches = {}, {}
    for batch_size in args.batch_sizes:
        count = args.sentences if batch_size > 1 else args.sentences_bs1
        batches[batch_size] = source_batches(tokenizer, sentences[:count], batch_size)
        encoded = tokenizer(sentences[:count])["input_ids"]
        as_tokens = [tokenizer.convert_ids_to_tokens(ids) for ids in encoded]  # </s> included, as generate() sees it
        token_batches[batch_size] = [as_tokens[start : start + batch_size] for start in range(0, count, batch_size)]
    return batches, token_batches


def time_cells(run, engines: list[str], token_batches: dict, args, desc: str) -> list[dict]:
    """Every cell (decoding, batch size) of `args.beams` x `args.batch_sizes`, timed with `run(engine, beams,
    batch_size, limit=None)` -> (seconds, generated tokens): a warm-up batch per engine, then `args.repeats` rounds
    with the engines alternating in order. One dict per cell: its decoding, sizes, and each engine's tokens/s."""
    cells = [(beams, batch_size) for beams in args.beams for batch_size in args.batch_sizes]
    results = []
    progress = tqdm(total=len(cells) * args.repeats * len(engines), desc=desc, file=sys.stderr)
    for beams, batch_size in cells:
        decoding = "greedy" if beams == 1 else f"beam {beams}"
        progress.set_postfix_str(f"{decoding}, batch {batch_size}")
        for engine in engines:
            run(engine, beams, batch_size, limit=1)  # warm-up
        rates, tokens = {engine: [] for engine in engines}, {}
        for repeat in range(args.repeats):
            for engine in engines if repeat % 2 == 0 else engines[::-1]:
                seconds, tokens[engine] = run(engine, beams, batch_size)
                rates[engine].append(tokens[engine] / seconds)
                progress.update()
        stats = {engine: dict(summary(rates[engine]), generated_tokens=tokens[engine]) for engine in engines}
        results.append(dict(decoding=decoding, num_beams=beams, batch_size=batch_size,
                            sentences=sum(len(batch) for batch in token_batches[batch_size]), **stats))
    progress.close()
    return results


def trainable_parameters(model: torch.nn.Module) -> int:
    """Marian's sinusoidal position tables are frozen `nn.Embedding`s: counted by `num_parameters()`, not here."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: str = "cpu") -> dict:
    info = dict(
        cpu=cpu_model(),
        torch_threads=torch.get_num_threads(),
        torch=torch.__version__,
        transformers=transformers.__version__,
        python=platform.python_version(),
        device=device,
    )
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


def synchronize(device) -> None:
    """Wait for the GPU's queued work, so that a timer read next measures it; nothing on a CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def summary(values: list[float]) -> dict:
    return dict(values=values, median=statistics.median(values), min=min(values), max=max(values))


def format_rate(stats: dict) -> str:
    """`median (min-max)`, e.g. `1,234 (1,200-1,250)`."""
    return f"{stats['median']:,.0f} ({stats['min']:,.0f}-{stats['max']:,.0f})"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def environment_lines(env: dict) -> list[str]:
    device = env["gpu"] if env["device"] == "cuda" else env["cpu"]
    return [
        f"- machine: {device}; torch threads: {env['torch_threads']}",
        f"- torch {env['torch']}, transformers {env['transformers']}, Python {env['python']}",
    ]
