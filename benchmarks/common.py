"""What both benchmarks share: the model sizes, the joint BPE tokenizer, our model and a MarianMTModel of the same
size built from the same numbers, the machine's description, and the formatting of measurements."""

import argparse
import gzip
import platform
import statistics
from pathlib import Path

import torch
import transformers
from transformers import AutoTokenizer, MarianConfig, MarianMTModel

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.training.tokenization import train_tokenizer


REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA_DIR = (REPO / ".." / "shared" / "data" / "multi30k").resolve()

# The paper's base model, the scaled-down model of the Multi30k recipe, and a size for --smoke runs only.
SIZES = {
    "base": dict(d_model=512, layers=6, heads=8, ffn_dim=2048),
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
