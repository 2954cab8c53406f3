"""The `train` command's own flags (three dataclasses beside transformers' `Seq2SeqTrainingArguments`), the paper's
recipe as defaults of the Trainer's flags, and `train --help`, all without importing torch or transformers: the help
shows the package's flags in full and the Trainer's flags that the command gives defaults of its own, and
`train --help-trainer` (`parsing.trainer_help`) lists every Trainer flag with transformers' own help.
"""

import argparse
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from ..training.recipe import CPU_SPEEDUPS, PAPER_RECIPE


# The model's presets (`PRESETS` of model/configuration_vanilla_transformer.py), named here so that --help does not
# import transformers; a test keeps the two equal.
PRESET_NAMES = ("base", "big", "tiny")
# The flags that give the training data: without any, the `train` command runs the number-words demo.
DATA_FLAGS = ("--source_file", "--train_file", "--dataset_name")


@dataclass
class ModelArguments:
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "A saved model folder to fine-tune; its tokenizer and config are reused."}
    )
    preset: str = field(default="base", metadata={"help": f"Size of a new model: one of {sorted(PRESET_NAMES)}."})
    d_model: int | None = field(default=None, metadata={"help": "Override the preset's d_model."})
    layers: int | None = field(default=None, metadata={"help": "Override the preset's N (encoder and decoder)."})
    heads: int | None = field(default=None, metadata={"help": "Override the preset's h."})
    ffn_dim: int | None = field(default=None, metadata={"help": "Override the preset's d_ff."})
    dropout: float | None = field(default=None, metadata={"help": "Override the preset's P_drop."})
    attention_dropout: float | None = field(
        default=None, metadata={"help": "Dropout on the attention weights (not in the paper; default 0)."}
    )
    activation_dropout: float | None = field(
        default=None, metadata={"help": "Dropout after the feed-forward ReLU (not in the paper; default 0)."}
    )
    tokenizer_name: str | None = field(default=None, metadata={"help": "A saved tokenizer folder to use."})
    vocab_size: int = field(default=37000, metadata={"help": "Size of the shared BPE vocabulary to train."})
    tokenizer_train_pairs: int = field(
        default=1_000_000, metadata={"help": "Learn the vocabulary from at most this many training pairs, drawn at "
                                             "random (0: all)."}
    )
    attn_implementation: str | None = field(
        default=None,
        metadata={"help": "Attention kernel (eager, sdpa, flash_attention_2, ...); default: transformers' choice. "
                          "With --bf16 on a CPU, eager trains faster than sdpa (docs/speed.md)."},
    )


@dataclass
class DataArguments:
    source_lang: str = field(default="en")
    target_lang: str = field(default="fr")
    source_file: str | None = field(default=None, metadata={"help": "Training sources, one a line (.gz ok)."})
    target_file: str | None = field(default=None, metadata={"help": "Training targets, aligned with sources."})
    train_file: str | None = field(default=None, metadata={"help": "Training pairs as .tsv or .jsonl(.gz)."})
    dataset_name: str | None = field(default=None, metadata={"help": "A Hub dataset, e.g. wmt14."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Its configuration, e.g. de-en."})
    validation_source_file: str | None = None
    validation_target_file: str | None = None
    validation_file: str | None = None
    test_source_file: str | None = field(default=None, metadata={"help": "Held-out sources, translated at the end."})
    test_target_file: str | None = None
    test_file: str | None = None
    max_source_length: int = field(default=256, metadata={"help": "Longer pairs are dropped (and counted)."})
    max_target_length: int = field(default=256)
    max_tokens: int | None = field(
        default=4096, metadata={"help": "Tokens per training batch (section 5.1); 0 batches by sentences."}
    )
    max_sentences: int | None = field(
        default=None, metadata={"help": "With --max_tokens, at most this many pairs a batch (fairseq's "
                                        "--max-sentences); default: no limit."}
    )
    pad_to_multiple_of: int = field(
        default=1, metadata={"help": "Pad training batches to source and target lengths rounded up to a multiple of "
                                     "N, and batch pairs by those lengths: a few batch shapes, the same every epoch, "
                                     "which a compiled step reuses (docs/training.md#bucketed-shapes). Default 8 on "
                                     "a GPU, 1 (each batch padded to its longest pair) elsewhere."}
    )
    max_eval_samples: int | None = field(default=None)
    preprocessing_num_workers: int | None = field(
        default=None, metadata={"help": "Processes that tokenize and filter the data; default: one per core for "
                                        "100,000 training pairs and more, else one."}
    )
    bpe_dropout: float = field(
        default=0.0, metadata={"help": "BPE-dropout probability for the training pairs, segmented anew every epoch "
                                       "(Provilkov et al., 2020; not in the paper; default 0)."}
    )
    bpe_dropout_target: bool = field(
        default=True, metadata={"help": "With --bpe_dropout, segment the targets with dropout too (false: sources "
                                        "only)."}
    )
    demo_train_size: int = field(default=60000, metadata={"help": "Number-words demo: training pairs."})
    demo_max_digits: int = field(default=6, metadata={"help": "Number-words demo: numbers below 10**digits."})


@dataclass
class RecipeArguments:
    lr_scale: float = field(
        default=1.0, metadata={"help": "Multiplies the section 5.3 rate d_model^-0.5 * min(...). Ignored when "
                                       "--learning_rate is given."}
    )
    max_train_minutes: float | None = field(
        default=None, metadata={"help": "Stop training (with a checkpoint) at the first step that ends after this "
                                       "many minutes, even if --max_steps is not reached."}
    )
    patience: int | None = field(
        default=None, metadata={"help": "Stop training after N validations in a row without a lower validation loss "
                                        "(fairseq's --patience; the last weights stay the run's). Needs validation."}
    )
    average_last: int = field(
        default=0, metadata={"help": "Save the average of the weights of the run's last N checkpoints as the model "
                                     "(section 6.1), and test it; 0 saves the last weights."}
    )
    cpu_speedups: list[str] = field(
        default_factory=lambda: list(CPU_SPEEDUPS),
        metadata={"help": "Training on a CPU, the speed-ups to use (docs/training.md#cpu-speed-ups): any of "
                          f"{', '.join(CPU_SPEEDUPS)}, or none. None is saved with the model. keep_memory makes "
                          "glibc's malloc keep freed memory for the whole process."},
    )
    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "Replace the run --output_dir holds (its checkpoints, weights, Trainer "
                                         "state, results and logs are deleted first); without it, or "
                                         "--resume_from_checkpoint, a folder holding a finished run is refused."}
    )
    overwrite_finished_run: bool = field(
        default=False, metadata={"help": "Replace the run --output_dir holds if it finished; one that did not is "
                                         "continued, as without the flag (`make demo` trains so)."}
    )
    resume_weights_only: bool = field(
        default=False, metadata={"help": "Resume from a checkpoint that lacks its optimizer, schedule or random "
                                         "generator state, with what it holds: the run will not match an "
                                         "uninterrupted one. Without it such a checkpoint is refused."}
    )
    resume_on_changed_data: bool = field(
        default=False, metadata={"help": "Resume although a training file changed since the run trained on it (its "
                                         "size, lines or first MiB): the run will not match an uninterrupted one. "
                                         "Without it such a resume is refused."}
    )


# The paper's recipe (sections 5.3-5.4) as defaults for the Trainer's own flags; --learning_rate 0 means
# "use d_model^-0.5 * warmup^-0.5 * lr_scale", the peak of the section 5.3 schedule.
PAPER_DEFAULTS = dict(
    PAPER_RECIPE,
    learning_rate=0.0,
    report_to=["tensorboard"],
    eval_strategy="no",
    save_strategy="steps",
    save_steps=1000,
    logging_steps=50,
    ddp_find_unused_parameters=False,  # every parameter takes part in every step
)


# Defaults on a CUDA GPU, where the step must not wait for the host (docs/training.md#on-a-gpu): bucketed shapes, a
# compiled model, batches collated by two worker processes kept from epoch to epoch. Elsewhere the Trainer's own
# defaults stay (no compilation, batches collated in the training process) with exact lengths: the fastest on a CPU.
# Fused Adam (`adamw_torch_fused`) is the recipe's on every device.
GPU_DEFAULTS = dict(
    pad_to_multiple_of=8,
    torch_compile=True,
    dataloader_num_workers=2,
    dataloader_persistent_workers=True,
)
# Defaults on a machine without CUDA: pinned memory speeds copies to a GPU only, and torch warns at every evaluation's
# loader without an accelerator.
NO_CUDA_DEFAULTS = dict(dataloader_pin_memory=False)
# transformers' own defaults of the Trainer flags that --help shows beside a default of the command or of a profile,
# so that --help shows them without importing transformers; a test keeps them equal to `Seq2SeqTrainingArguments`'s.
TRAINER_DEFAULTS = dict(
    output_dir=None,
    max_steps=-1,
    bf16=False,
    per_device_eval_batch_size=8,
    use_cpu=False,
    torch_compile=False,
    dataloader_num_workers=0,
    dataloader_persistent_workers=False,
    dataloader_pin_memory=True,
)
TRAINER_HELP = {"learning_rate": "0: the peak of the section 5.3 schedule, lr_scale * (d_model * warmup_steps)^-0.5."}
ARGUMENT_CLASSES = (ModelArguments, DataArguments, RecipeArguments)


def given_flags(argv: list[str]) -> set[str]:
    """The flags of `argv`, spelled with underscores (`--max-tokens=8` gives `--max_tokens`)."""
    return {argument.split("=")[0].replace("-", "_").replace("__", "--", 1) for argument in argv}


def train_help(description: str, beside: Mapping[str, Any] = {}, label: str = "") -> str:
    """`train --help`: the package's flags as transformers' parser shows them, then the Trainer's flags that the
    command gives defaults of its own; a flag in `beside` (a profile's defaults) says so after its own default,
    `(default: VALUE; LABEL: VALUE)`. Imports neither torch nor transformers."""
    parser = argparse.ArgumentParser(
        prog="vanilla-transformer train", usage="%(prog)s [--help] [options]", description=description,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog="Every other flag of transformers' Seq2SeqTrainingArguments is accepted too (--gradient-accumulation-"
        "steps, --report-to, ...), with transformers' default; --help-trainer lists them all, with their help.",
    )
    parser.add_argument("--help-trainer", action="store_true",
                        help="List every flag, the Trainer's with transformers' help (slower: imports transformers).")
    for item in (item for cls in ARGUMENT_CLASSES for item in fields(cls)):
        _add_field(parser, item, beside.get(item.name, MISSING), label)
    ours = {item.name for cls in ARGUMENT_CLASSES for item in fields(cls)}
    group = parser.add_argument_group(
        "Trainer flags with this command's defaults (transformers' Seq2SeqTrainingArguments)",
        "The paper's recipe (sections 5.3-5.4), and the defaults on a CUDA GPU and without CUDA.")
    devices = {"on a CUDA GPU": GPU_DEFAULTS, "without CUDA": NO_CUDA_DEFAULTS, label: beside}
    for name in dict.fromkeys([*PAPER_DEFAULTS, *GPU_DEFAULTS, *NO_CUDA_DEFAULTS, *beside]):
        if name in ours:
            continue
        default = PAPER_DEFAULTS.get(name, TRAINER_DEFAULTS.get(name, "transformers'"))
        others = "".join(f"; {where}: {values[name]}" for where, values in devices.items() if name in values)
        help = f"{TRAINER_HELP.get(name, '')} (default: %(default)s{others})".strip()
        names = dict.fromkeys([f"--{name}", f"--{name.replace('_', '-')}"])
        if isinstance(default, bool):
            group.add_argument(*names, nargs="?", metavar=name.upper(), default=default, help=help)
        else:
            group.add_argument(*names, metavar=name.upper(), default=default, help=help)
    return parser.format_help()


def _add_field(parser: argparse.ArgumentParser, item, beside, label: str) -> None:
    """One dataclass field as transformers' `HfArgumentParser` shows it: `--name` and `--name-with-dashes`, a boolean
    with an optional value and, when true by default, `--no-name`."""
    names = list(dict.fromkeys([f"--{item.name}", f"--{item.name.replace('_', '-')}"]))
    default = item.default_factory() if item.default_factory is not MISSING else item.default
    help = item.metadata.get("help")
    if beside is not MISSING:
        help = f"{help or ''} (default: %(default)s; {label}: {beside})".strip()
    if item.type is bool:
        parser.add_argument(*names, nargs="?", metavar=item.name.upper(), default=default, help=help)
        if default is True:
            no = list(dict.fromkeys([f"--no_{item.name}", f"--no-{item.name.replace('_', '-')}"]))
            parser.add_argument(*no, action="store_false", dest=f"no_{item.name}", default=False,
                                help=help)
    elif isinstance(default, list):
        parser.add_argument(*names, nargs="+", metavar=item.name.upper(), default=default, help=help)
    else:
        parser.add_argument(*names, metavar=item.name.upper(), default=default, help=help)


__all__ = [
    "DATA_FLAGS",
    "GPU_DEFAULTS",
    "PAPER_DEFAULTS",
    "PAPER_RECIPE",
    "DataArguments",
    "ModelArguments",
    "RecipeArguments",
    "given_flags",
    "train_help",
]
