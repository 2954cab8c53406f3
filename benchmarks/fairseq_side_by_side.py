"""Our train command beside fairseq's, at equal updates, on the same subwords: the anchor of
docs/experiments/fairseq.md.

Both systems train Wu et al.'s (2021) tiny Transformer on Multi30k En->De with the same settings (d_model 128, 4+4
layers, 4 heads, d_ff 256, dropout 0.3, no attention or ReLU dropout, shared embeddings, Adam 0.9/0.98/1e-9, a 0.005
peak after 2,000 linear warm-up updates then inverse square root, label smoothing 0.1, ~8,192-token batches, no
clipping), on the pieces of one tokenizer: ours, trained on the training pairs and written space-separated for
`fairseq-preprocess --joined-dictionary`. fairseq runs from its own venv (`benchmarks/fairseq_install.sh`); it is
never a dependency of the package.

    python benchmarks/fairseq_side_by_side.py prepare --data-dir path/to/multi30k --work runs/fairseq-sbs
    python benchmarks/fairseq_side_by_side.py fairseq --work runs/fairseq-sbs --seed 1 --updates 500
    python benchmarks/fairseq_side_by_side.py ours --work runs/fairseq-sbs --seed 0 --updates 500 [-- TRAIN FLAGS]
    python benchmarks/fairseq_side_by_side.py compare --work runs/fairseq-sbs [--bleu]

Each run writes a checkpoint every `--save-every` updates (default 100). `compare` reads both systems' logs and
checkpoints into one table, in one unit: nats per target token (end-of-sentence included). Training windows: the
label-smoothed loss each toolkit logs over its last 50 updates (fairseq logs bits; converted). Validation: the NLL
without smoothing of every checkpoint on the full validation set (fairseq's own validation at the same updates, ours
computed here in float32, eval mode; `validation` computes a fairseq checkpoint's the same way, to show the two
measure the same thing). With `--bleu`, the last checkpoint of every run (or `--bleu-at` an update, `--average` the
mean of the last N checkpoints up to it) decodes test_2016_flickr with beam 4, length penalty 1.0 as both toolkits
define it by default (score / length), at most source length + 50 tokens, scored with sacreBLEU and the lowercased
Moses-tokenized BLEU of `vanilla_transformer.inference.metrics`.

Extra flags after `--` go to our train command, so a candidate difference is switched alone in a run of its own:
`ours --seed 0 --name ours-x -- --some_flag value`.
"""

import argparse
import gzip
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import torch


SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
SOURCE, TARGET = "en", "de"
TINY = dict(d_model=128, layers=4, heads=4, ffn_dim=256, dropout=0.3, lr=0.005, warmup=2000, max_tokens=8192,
            label_smoothing=0.1)
LOG_EVERY = 50


def read_gzip_lines(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as file:
        return [line.rstrip("\n") for line in file]


def tokenizer_of(work: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(work / "tokenizer")


# --- prepare: one tokenizer, its pieces for fairseq -----------------------------------------------------------------

def prepare(args) -> None:
    from vanilla_transformer.training.tokenization import train_tokenizer

    work, data = Path(args.work), Path(args.data_dir)
    work.mkdir(parents=True, exist_ok=True)
    if not (work / "tokenizer" / "tokenizer.json").is_file():
        tokenizer = train_tokenizer([data / f"train.{SOURCE}.gz", data / f"train.{TARGET}.gz"],
                                    vocab_size=args.vocab_size, show_progress=False)
        tokenizer.save_pretrained(work / "tokenizer")
    tokenizer = tokenizer_of(work)
    pieces = work / "pieces"
    pieces.mkdir(exist_ok=True)
    for split, name in SPLITS.items():
        for lang in (SOURCE, TARGET):
            lines = read_gzip_lines(data / f"{name}.{lang}.gz")
            (pieces / f"{split}.{lang}").write_text(
                "".join(" ".join(tokenizer.tokenize(line)) + "\n" for line in lines), encoding="utf-8")
    preprocess = Path(args.fairseq_venv) / "bin" / "fairseq-preprocess"
    if not preprocess.exists():  # our runs need the tokenizer only
        print(f"prepared {work}: tokenizer/, pieces/; no fairseq in {args.fairseq_venv} (benchmarks/"
              "fairseq_install.sh installs it), so no fairseq-bin/ yet: run prepare again once it is there")
        return
    run([preprocess, "--source-lang", SOURCE, "--target-lang", TARGET,
         "--trainpref", pieces / "train", "--validpref", pieces / "valid", "--testpref", pieces / "test",
         "--destdir", work / "fairseq-bin", "--joined-dictionary", "--workers", "1"])
    print(f"prepared {work}: tokenizer/, pieces/, fairseq-bin/")


def fairseq_bin(args, name: str) -> str:
    path = Path(args.fairseq_venv) / "bin" / name
    if not path.exists():
        sys.exit(f"{path} not found: run benchmarks/fairseq_install.sh {args.fairseq_venv}")
    return str(path)


def run(command: list, env: dict | None = None, log: Path | None = None, append: bool = False) -> None:
    command = [str(part) for part in command]
    print("+", " ".join(command), flush=True)
    if log is None:
        subprocess.run(command, check=True, env=env)
        return
    with open(log, "a" if append else "w") as file:
        subprocess.run(command, check=True, env=env, stdout=file, stderr=subprocess.STDOUT)


def one_thread() -> dict:
    return dict(os.environ, OMP_NUM_THREADS=str(1), MKL_NUM_THREADS=str(1))


# --- the two trainings -------------------------------------------------------------------------------------------------

def train_fairseq(args) -> None:
    work = Path(args.work)
    out = work / (args.name or f"fairseq-s{args.seed}")
    out.mkdir(parents=True, exist_ok=True)
    # --resume: on from the run's last checkpoint, as if it had never stopped (fairseq restores the optimizer, the
    # schedule and its place in the epoch).
    checkpoints = sorted(out.glob("checkpoint_*_*.pt"), key=lambda p: int(p.stem.split("_")[-1]))
    restore = ["--restore-file", checkpoints[-1]] if args.resume and checkpoints else []
    run([*fairseq_train_tiny(args, work / "fairseq-bin", out), "--max-update", args.updates,
         "--save-interval-updates", args.save_every, "--validate-interval-updates", args.save_every,
         "--keep-interval-updates", -1, "--no-epoch-checkpoints", "--no-last-checkpoints", *restore, *args.extra],
        env=one_thread() if args.one_thread else None, log=out / "train.log", append=args.resume)


def fairseq_train_tiny(args, data_bin: Path, out: Path) -> list:
    """fairseq-train of the tiny model with the settings both toolkits share (TINY), on `data_bin`, into `out`, on
    the CPU; the caller adds when to stop, validate and save."""
    return [fairseq_bin(args, "fairseq-train"), data_bin, "--task", "translation",
            "--source-lang", SOURCE, "--target-lang", TARGET, "--arch", "transformer", "--share-all-embeddings",
            "--encoder-layers", TINY["layers"], "--decoder-layers", TINY["layers"],
            "--encoder-embed-dim", TINY["d_model"], "--decoder-embed-dim", TINY["d_model"],
            "--encoder-ffn-embed-dim", TINY["ffn_dim"], "--decoder-ffn-embed-dim", TINY["ffn_dim"],
            "--encoder-attention-heads", TINY["heads"], "--decoder-attention-heads", TINY["heads"],
            "--dropout", TINY["dropout"], "--attention-dropout", 0, "--activation-dropout", 0,
            "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--adam-eps", 1e-9, "--clip-norm", 0,
            "--lr", TINY["lr"], "--lr-scheduler", "inverse_sqrt", "--warmup-updates", TINY["warmup"],
            "--warmup-init-lr", 0, "--criterion", "label_smoothed_cross_entropy",
            "--label-smoothing", TINY["label_smoothing"], "--max-tokens", TINY["max_tokens"],
            "--seed", args.seed, "--save-dir", out, "--log-format", "json", "--log-interval", LOG_EVERY,
            "--no-progress-bar", "--cpu", "--num-workers", 0]


def train_ours(args) -> None:
    work, data = Path(args.work), Path(args.data_dir)
    out = work / (args.name or f"ours-s{args.seed}")
    # --resume: the train command goes on from the run's last checkpoint, exactly as if it had never stopped.
    checkpoints = sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    start = (["--resume_from_checkpoint", checkpoints[-1]] if args.resume and checkpoints
             else ["--overwrite_output_dir"])
    # In process, so that the training NLL is logged beside the loss (and candidates, if any, are switched on).
    launcher = [sys.executable, __file__, "with-candidates", "--work", args.work, "--candidates", args.candidates,
                "--"]
    run([*launcher, "train",
         "--source_file", data / f"train.{SOURCE}.gz", "--target_file", data / f"train.{TARGET}.gz",
         "--source_lang", SOURCE, "--target_lang", TARGET, "--tokenizer_name", work / "tokenizer",
         "--preset", "base", "--d_model", TINY["d_model"], "--layers", TINY["layers"], "--heads", TINY["heads"],
         "--ffn_dim", TINY["ffn_dim"], "--dropout", TINY["dropout"], "--attention_dropout", 0,
         "--activation_dropout", 0, "--max_tokens", TINY["max_tokens"], "--warmup_steps", TINY["warmup"],
         "--learning_rate", TINY["lr"], "--max_steps", args.updates, "--save_steps", args.save_every,
         "--logging_steps", LOG_EVERY, "--seed", args.seed, "--output_dir", out, *start,
         "--predict_with_generate", "false", "--report_to", "none", *args.extra],
        env=one_thread() if args.one_thread else None, log=out.with_suffix(".log"), append=args.resume)


# --- equivalence: one batch through both with the same weights -----------------------------------------------------

# The start of every script run by the fairseq venv's Python (`fairseq_dump`): a checkpoint's model in eval mode, and
# in `weights` what our side needs to rebuild it (`our_model_from_fairseq`): its weights, pad and eos ids, and
# fairseq's position table.
FAIRSEQ_CHECKPOINT = """
import sys, torch
from fairseq import checkpoint_utils
from fairseq.modules.sinusoidal_positional_embedding import SinusoidalPositionalEmbedding
checkpoint, data, out = sys.argv[1], sys.argv[2], sys.argv[3]
models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides={"data": data})
model = models[0].float().eval()
weights = dict(
    state={k: v.detach().clone() for k, v in model.state_dict().items()},
    pad=task.target_dictionary.pad(), eos=task.target_dictionary.eos(),
    positions=SinusoidalPositionalEmbedding.get_embedding(1100, model.encoder.embed_tokens.embedding_dim,
                                                          task.target_dictionary.pad()),
)
"""

# The checkpoint's model and criterion on the first validation pairs (no dropout), with what our side needs to redo
# it: batch, loss, gradients.
FAIRSEQ_SIDE = FAIRSEQ_CHECKPOINT + """
pairs = int(sys.argv[4])
task.load_dataset("valid")
dataset = task.dataset("valid")
batch = dataset.collater([dataset[i] for i in range(pairs)])
criterion = task.build_criterion(cfg.criterion)
loss, sample_size, logged = criterion(model, batch)
loss.backward()
torch.save(dict(
    **weights, grads={k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None},
    loss=loss.item(), nll_loss=float(logged["nll_loss"]), sample_size=int(sample_size),
    src_tokens=batch["net_input"]["src_tokens"], prev_output_tokens=batch["net_input"]["prev_output_tokens"],
    target=batch["target"],
), out)
"""


def fairseq_dump(args, script: str, *arguments) -> dict:
    """What `script` (one of the FAIRSEQ_ scripts) saves, run by the fairseq venv's Python on `--checkpoint`."""
    work = Path(args.work)
    with tempfile.TemporaryDirectory() as tmp:
        dump = Path(tmp) / "fairseq.pt"
        subprocess.run([fairseq_bin(args, "python"), "-c", script, str(work / args.checkpoint),
                        str(work / "fairseq-bin"), str(dump), *map(str, arguments)], check=True, env=one_thread(),
                       stderr=subprocess.DEVNULL)
        return torch.load(dump)


def right_padded(tokens: torch.Tensor, pad: int) -> torch.Tensor:
    """fairseq pads sources on the left; ours on the right."""
    rows = [row[row != pad] for row in tokens]
    return torch.stack([torch.cat([row, row.new_full((tokens.shape[1] - len(row),), pad)]) for row in rows])


def our_model_from_fairseq(theirs: dict):
    """Our classes holding a fairseq checkpoint's weights (`theirs`: the state, pad and eos ids and position table a
    fairseq-side script dumped): attention biases on, fairseq's position table, float32, eval mode."""
    from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

    state = theirs["state"]
    vocab, d_model = state["encoder.embed_tokens.weight"].shape
    layers = 1 + max(int(key.split(".")[2]) for key in state if key.startswith("encoder.layers."))
    ffn_dim = state["encoder.layers.0.fc1.weight"].shape[0]
    config = VanillaTransformerConfig(
        vocab_size=vocab, d_model=d_model, encoder_layers=layers, decoder_layers=layers, encoder_ffn_dim=ffn_dim,
        decoder_ffn_dim=ffn_dim, encoder_attention_heads=TINY["heads"], decoder_attention_heads=TINY["heads"],
        attention_bias=True, pad_token_id=theirs["pad"], eos_token_id=theirs["eos"], bos_token_id=0,
        decoder_start_token_id=theirs["eos"])
    model = VanillaTransformerForConditionalGeneration(config).float().eval()
    # Left out: fairseq's copies of the encoder layers' weights for its inference fast path (in_proj_weight,
    # fc1_weight, ...: never trained, never read in training), version markers and the tied output projection.
    ours = {f"model.{key}": value for key, value in state.items()
            if key.rsplit(".", 1)[-1] not in {"in_proj_weight", "in_proj_bias", "out_proj_weight", "out_proj_bias",
                                              "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias", "version",
                                              "_float_tensor"}
            and key != "decoder.output_projection.weight"}
    ours["model.shared.weight"] = ours.pop("model.encoder.embed_tokens.weight")
    ours.pop("model.decoder.embed_tokens.weight")
    missing, unexpected = model.load_state_dict(ours, strict=False)
    assert not unexpected and set(missing) <= {"model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
                                               "lm_head.weight"}, (missing, unexpected)
    # fairseq's sinusoids: sines then cosines, first position padding_idx + 1.
    table = theirs["positions"][theirs["pad"] + 1:][:1024]
    for stack in (model.model.encoder, model.model.decoder):
        stack.embed_positions.table.copy_(table)
    return model


def check_equivalence(args) -> None:
    """The same weights, batch and loss through fairseq's model and ours: with fairseq's checkpoint mapped onto our
    classes (attention biases on, fairseq's position table), the label-smoothed loss, the NLL and every gradient
    must agree to float32 rounding. What it shows: the two compute the same function and the same gradients, so a
    difference in learning comes from initialisation, data or the update, not from the model or the loss."""
    from vanilla_transformer.training.trainer import label_smoothed_cross_entropy

    theirs = fairseq_dump(args, FAIRSEQ_SIDE, args.pairs)
    model = our_model_from_fairseq(theirs)
    pad = theirs["pad"]
    input_ids = right_padded(theirs["src_tokens"], pad)
    labels = theirs["target"].masked_fill(theirs["target"] == pad, -100)
    outputs = model(input_ids=input_ids, attention_mask=(input_ids != pad).long(),
                    decoder_input_ids=theirs["prev_output_tokens"],
                    decoder_attention_mask=(theirs["prev_output_tokens"] != pad).long())
    tokens = int((labels != -100).sum())
    # fairseq smooths over the other V - 1 classes, torch over all V: the same loss with epsilon * V / (V - 1).
    vocab = model.config.vocab_size
    epsilon = TINY["label_smoothing"] * vocab / (vocab - 1)
    loss = label_smoothed_cross_entropy(epsilon)(outputs, labels)
    nll = torch.nn.functional.cross_entropy(outputs.logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    loss.backward()
    print(f"{tokens} target tokens ({theirs['sample_size']} in fairseq's batch)")
    print(f"label-smoothed loss per token: ours {loss.item():.6f}, fairseq {theirs['loss'] / tokens:.6f}")
    print(f"NLL per token: ours {nll.item():.6f}, fairseq {theirs['nll_loss'] / tokens:.6f}")
    errors = {}
    names = {f"model.{key}": key for key in theirs["grads"]}
    names["model.shared.weight"] = "encoder.embed_tokens.weight"
    for name, parameter in model.named_parameters():
        key = names.get(name)
        # A key projection's bias adds the same score to every key of a query, which softmax cancels: its gradient
        # is zero but for rounding, in both, and has no relative difference to speak of.
        if key is None or key not in theirs["grads"] or name.endswith("k_proj.bias"):
            continue
        reference = theirs["grads"][key] / theirs["sample_size"]
        errors[name] = ((parameter.grad - reference).norm() / reference.norm().clamp_min(1e-12)).item()
    worst = max(errors, key=errors.get)
    print(f"gradients of {len(errors)} tensors: largest relative difference {errors[worst]:.2e} ({worst})")


# The checkpoint's weights, the test set's source sentences as fairseq binarized them (end of sentence included), and
# its target dictionary's symbols.
FAIRSEQ_TEST_SIDE = FAIRSEQ_CHECKPOINT + """
task.load_dataset("test")
dataset = task.dataset("test")
torch.save(dict(**weights, sources=[dataset[i]["source"] for i in range(len(dataset))],
                symbols=list(task.target_dictionary.symbols)), out)
"""


@torch.inference_mode()
def check_search(args) -> None:
    """Our beam search on a fairseq checkpoint's weights: the test set decoded by `generate()` with the settings
    `compare --bleu` gives both toolkits, scored as `compare --bleu` scores fairseq-generate's output of the same
    checkpoint. Equal scores say the two searches pick the same translations, so a difference in BLEU between the
    toolkits' runs comes from their models."""
    from vanilla_transformer.inference.metrics import score_translations

    work, data = Path(args.work), Path(args.data_dir)
    theirs = fairseq_dump(args, FAIRSEQ_TEST_SIDE)
    model, tokenizer = our_model_from_fairseq(theirs), tokenizer_of(work)
    pad, eos, sources = theirs["pad"], theirs["eos"], theirs["sources"]
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    hypotheses = {}
    for start in range(0, len(order), 64):
        rows = order[start:start + 64]
        input_ids = torch.nn.utils.rnn.pad_sequence([sources[i] for i in rows], batch_first=True, padding_value=pad)
        outputs = model.generate(input_ids=input_ids, attention_mask=(input_ids != pad).long(), num_beams=4,
                                 length_penalty=1.0, early_stopping=True, max_new_tokens=input_ids.shape[1] + 50,
                                 do_sample=False)
        for row, i in zip(outputs.tolist(), rows):
            pieces = [theirs["symbols"][token] for token in row if token not in (pad, eos, 0)]
            hypotheses[i] = tokenizer.decode(tokenizer.convert_tokens_to_ids(pieces), skip_special_tokens=True)
    references = read_gzip_lines(data / f"{SPLITS['test']}.{TARGET}.gz")
    scores = score_translations([hypotheses[i] for i in range(len(sources))], references, moses_lang=TARGET)
    ratio = re.search(r"ratio = ([0-9.]+)", scores["bleu_report"]).group(1)
    print(f"our search on {args.checkpoint}: sacreBLEU {scores['bleu']:.2f}, "
          f"lowercased Moses {scores['bleu_lc_moses']:.2f}, brevity penalty {scores['bleu_bp']:.3f}, "
          f"length ratio {ratio}")


@torch.inference_mode()
def check_validation(args) -> None:
    """A fairseq checkpoint's validation NLL computed as `compare` computes ours (`validation_nll`: our tokenizer on
    the raw validation text, batches of 100, the NLL summed over target tokens), with the checkpoint mapped onto our
    classes and our token ids mapped onto fairseq's dictionary. Equal to fairseq's own validation, it shows that the
    two toolkits' validation curves measure the same thing on the same tokens."""
    work, data = Path(args.work), Path(args.data_dir)
    theirs = fairseq_dump(args, FAIRSEQ_TEST_SIDE)
    model, tokenizer = our_model_from_fairseq(theirs), tokenizer_of(work)
    index = {symbol: i for i, symbol in enumerate(theirs["symbols"])}
    pad, eos = theirs["pad"], theirs["eos"]
    # Our pieces that never occur in the training text are not in fairseq's dictionary: fairseq reads them as <unk>.
    to_fairseq = torch.tensor([index.get(piece, index["<unk>"])
                               for piece in tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))])
    to_fairseq[tokenizer.eos_token_id] = eos

    def logits_and_labels(batch):
        input_ids = to_fairseq[batch["input_ids"]].masked_fill(batch["attention_mask"] == 0, pad)
        labels = to_fairseq[batch["labels"].clamp_min(0)].masked_fill(batch["labels"] == -100, -100)
        # fairseq's decoder input: `</s>`, then the target shifted right.
        decoder_input_ids = torch.cat([torch.full_like(labels[:, :1], eos), labels[:, :-1]], dim=1)
        decoder_input_ids = decoder_input_ids.masked_fill(decoder_input_ids == -100, pad)
        return model(input_ids=input_ids, attention_mask=batch["attention_mask"], decoder_input_ids=decoder_input_ids,
                     decoder_attention_mask=(decoder_input_ids != pad).long()).logits, labels

    nll, count = nll_per_token(map(logits_and_labels, validation_batches(tokenizer, data)))
    step = int(Path(args.checkpoint).stem.split("_")[-1])
    _, valid, _ = fairseq_curves(work / Path(args.checkpoint).parent)
    print(f"validation NLL of {args.checkpoint} ({count} target tokens): computed as compare computes ours "
          f"{nll:.4f}, fairseq's own {valid[step]:.4f}")


# --- candidate differences, switched on in our run alone ------------------------------------------------------------

def xavier_init(model) -> None:
    """The package's initialisation before it took fairseq's: every projection Xavier-uniform (gain 1) with zero
    biases, the feed-forward layers included."""
    for layer in [*model.model.encoder.layers, *model.model.decoder.layers]:
        attentions = [layer.self_attn, getattr(layer, "encoder_attn", None)]
        projections = [p for a in attentions if a is not None for p in (a.q_proj, a.k_proj, a.v_proj, a.out_proj)]
        for linear in [*projections, layer.fc1, layer.fc2]:
            torch.nn.init.xavier_uniform_(linear.weight)
            if linear.bias is not None:
                torch.nn.init.zeros_(linear.bias)


def fairseq_attention_biases(model) -> None:
    """fairseq's attention projections have biases (the paper's have none): query, key and value biases as
    nn.Linear initialises them, uniform in +-1/sqrt(d_model), the output projection's zero."""
    for layer in [*model.model.encoder.layers, *model.model.decoder.layers]:
        for attention in (layer.self_attn, getattr(layer, "encoder_attn", None)):
            if attention is None:
                continue
            for projection in (attention.q_proj, attention.k_proj, attention.v_proj):
                bound = projection.in_features**-0.5
                torch.nn.init.uniform_(projection.bias, -bound, bound)
            torch.nn.init.zeros_(attention.out_proj.bias)


def fairseq_start_symbol(config) -> None:
    """fairseq's decoder starts from `</s>`, the end-of-sentence token that also ends every source and target and is
    an output class; ours from `<s>`, a token used for nothing else (whose row of the shared embedding is then only
    ever pushed down by the tied output projection). Saved in the config, so that validation and decoding start from
    it too."""
    config.decoder_start_token_id = config.eos_token_id


def fairseq_attention_bias_config(config) -> None:
    config.attention_bias = True


def fairseq_position_table(num_positions: int, d_model: int, padding_idx: int = 1) -> torch.Tensor:
    """fairseq's sinusoids (`SinusoidalPositionalEmbedding.get_embedding`, in float32 as it computes them), row p for
    our position p: the sines of all frequencies then their cosines (section 3.5 interleaves them), wavelengths growing
    by 10000^(1 / (d_model / 2 - 1)) (the paper's by 10000^(2 / d_model)), and the first position numbered
    `padding_idx` + 1 (2 with fairseq's dictionary; the paper's is 0)."""
    half = d_model // 2
    inverse_wavelength = torch.exp(torch.arange(half, dtype=torch.float) * -(math.log(10000) / (half - 1)))
    angle = (torch.arange(num_positions, dtype=torch.float) + padding_idx + 1).unsqueeze(1) * inverse_wavelength
    table = torch.cat([torch.sin(angle), torch.cos(angle)], dim=1)
    return torch.cat([table, torch.zeros(num_positions, d_model % 2)], dim=1)


def fairseq_positions_config(config) -> None:
    """Marks the run: every model built from this config, in training and when `compare` loads a checkpoint, gets
    fairseq's position table (ours is a non-persistent buffer, rebuilt from the code at every load)."""
    config.fairseq_positions = True


@contextmanager
def position_table_of(config):
    """Builds the models made inside it with fairseq's position table if `config` (or a checkpoint's) is marked by
    the `positions` candidate, else with the paper's."""
    from vanilla_transformer.model import modeling_vanilla_transformer as modeling

    if not getattr(config, "fairseq_positions", False):
        yield
        return
    paper_table = modeling.sinusoidal_position_encoding
    modeling.sinusoidal_position_encoding = fairseq_position_table
    try:
        yield
    finally:
        modeling.sinusoidal_position_encoding = paper_table


def load_our_checkpoint(checkpoint: Path):
    """One of our runs' checkpoints in float32, with the position table it was trained with."""
    from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

    with position_table_of(VanillaTransformerConfig.from_pretrained(checkpoint)):
        return VanillaTransformerForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32)


# Each switches one difference on in our run. On the config, before the model is built (saved with every checkpoint):
# `attention_bias` gives the attention projections fairseq's biases, `start_symbol` fairseq's decoder start symbol,
# `positions` marks the config for fairseq's position table.
CONFIG_CANDIDATES = {"attention_bias": fairseq_attention_bias_config, "start_symbol": fairseq_start_symbol,
                     "positions": fairseq_positions_config}
# On the new model's weights: `xavier_init` redoes the package's former initialisation, `attention_bias` initialises
# the biases as fairseq does. Applied in this order, so that `attention_bias` sets the biases whatever `xavier_init` did.
CANDIDATES = {"xavier_init": xavier_init, "attention_bias": fairseq_attention_biases}


def fairseq_fixed_batches() -> None:
    """fairseq cuts its batches once (length ties broken by one seeded permutation) and only reorders them every
    epoch; our sampler breaks length ties anew every epoch, so its batches mix differently. Switched on: every epoch
    keeps epoch 0's batches. The order of the batches is drawn as before, so epoch 0 is the same as without it."""
    import numpy as np

    from vanilla_transformer.training.batch_samplers import TokenBatchSampler

    iterate = TokenBatchSampler.__iter__

    def fixed_batches(self):
        if not self.shuffle:
            return iterate(self)
        order = self._length_order(np.random.default_rng([self.seed, 0]))
        batches = [order[start:end].tolist() for start, end in self._bounds]
        rng = np.random.default_rng([self.seed, self.epoch])
        rng.permutation(len(self.source_lengths))  # the ties' draw, so that the batches' order is drawn as before
        return iter([batches[i] for i in rng.permutation(len(batches))])

    TokenBatchSampler.__iter__ = fixed_batches


# Switched on once, before training.
TRAINING_CANDIDATES = {"fixed_batches": fairseq_fixed_batches}
# Every name `--candidates` accepts.
ALL_CANDIDATES = tuple(dict.fromkeys([*CONFIG_CANDIDATES, *CANDIDATES, *TRAINING_CANDIDATES]))


def log_training_nll() -> None:
    """Each of our logging windows also logs `nll`: the NLL without smoothing in nats per target token over the
    window's tokens, as fairseq's `nll_loss`, from the logits the loss is computed on. The loss, its gradients and
    every random draw are untouched."""
    from vanilla_transformer.training.trainer import TokenBatchSeq2SeqTrainer

    compute_loss, log = TokenBatchSeq2SeqTrainer.compute_loss, TokenBatchSeq2SeqTrainer.log

    def compute_loss_and_nll(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, outputs = compute_loss(self, model, inputs, True, num_items_in_batch)
        if model.training:
            with torch.no_grad():
                logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
                labels = inputs["labels"].flatten()
                total = torch.nn.functional.cross_entropy(logits.flatten(0, -2).float(), labels, ignore_index=-100,
                                                          reduction="sum")
            window = self.__dict__.setdefault("nll_window", [0.0, 0])
            window[0] += total.item()
            window[1] += int((labels != -100).sum())
        return (loss, outputs) if return_outputs else loss

    def log_with_nll(self, logs, *args, **kwargs):
        window = self.__dict__.get("nll_window")
        if "loss" in logs and window and window[1]:
            logs["nll"] = window[0] / window[1]
            window[:] = [0.0, 0]
        return log(self, logs, *args, **kwargs)

    TokenBatchSeq2SeqTrainer.compute_loss = compute_loss_and_nll
    TokenBatchSeq2SeqTrainer.log = log_with_nll


def with_candidates(args) -> None:
    """Our train command with the training NLL logged and the named fairseq behaviours switched on (a new model's
    init or config)."""
    from vanilla_transformer import VanillaTransformerForConditionalGeneration
    from vanilla_transformer.cli.main import main as cli_main

    names = [name for name in args.candidates.split(",") if name]
    unknown = set(names) - set(ALL_CANDIDATES)
    if unknown:
        sys.exit(f"unknown candidates {sorted(unknown)}: choose from {sorted(ALL_CANDIDATES)}")
    for name in names:
        if name in TRAINING_CANDIDATES:
            TRAINING_CANDIDATES[name]()
    original_init = VanillaTransformerForConditionalGeneration.__init__

    def patched_init(self, config):
        for name, switch_on in CONFIG_CANDIDATES.items():
            if name in names:
                switch_on(config)
        original_init(self, config)
        with torch.no_grad():
            for name, switch_on in CANDIDATES.items():
                if name in names:
                    switch_on(self)

    VanillaTransformerForConditionalGeneration.__init__ = patched_init
    log_training_nll()
    if names:
        print(f"candidates switched on: {names}", flush=True)
    # `positions`: for the whole run, every table the model builds or rebuilds is fairseq's.
    with position_table_of(SimpleNamespace(fairseq_positions="positions" in names)):
        cli_main(args.extra)


# --- compare: one table in nats --------------------------------------------------------------------------------------

def fairseq_log_records(run_dir: Path):
    """The JSON records of a fairseq-train log (run_dir/train.log), in order: its training windows, epochs and
    validations (fairseq logs losses in bits)."""
    for line in (run_dir / "train.log").read_text(encoding="utf-8").splitlines():
        start = line.find("{")
        if start < 0:
            continue
        try:
            yield json.loads(line[start:])
        except json.JSONDecodeError:
            continue


def fairseq_curves(run_dir: Path) -> tuple[dict, dict, dict]:
    """(updates -> label-smoothed training loss over the last window, updates -> validation NLL, updates -> training
    NLL over the last window), in nats."""
    train, valid, train_nll = {}, {}, {}
    for record in fairseq_log_records(run_dir):
        if "valid_nll_loss" in record:
            valid[int(record["valid_num_updates"])] = float(record["valid_nll_loss"]) * math.log(2)
        elif "loss" in record and "num_updates" in record:
            train[int(record["num_updates"])] = float(record["loss"]) * math.log(2)
            train_nll[int(record["num_updates"])] = float(record["nll_loss"]) * math.log(2)
    return train, valid, train_nll


def ours_train_curves(run_dir: Path) -> tuple[dict, dict]:
    """(updates -> label-smoothed training loss, updates -> training NLL where logged), over the last window."""
    states = sorted(run_dir.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[1]))
    if not states:
        return {}, {}
    history = json.loads(states[-1].read_text())["log_history"]
    return ({int(entry["step"]): float(entry["loss"]) for entry in history if "loss" in entry},
            {int(entry["step"]): float(entry["nll"]) for entry in history if "nll" in entry})


def validation_batches(tokenizer, data: Path, size: int = 100):
    """The validation pairs as `compare` reads them: by source length in batches of `size`, tokenized by our
    tokenizer, padding labelled -100."""
    sources = read_gzip_lines(data / f"{SPLITS['valid']}.{SOURCE}.gz")
    targets = read_gzip_lines(data / f"{SPLITS['valid']}.{TARGET}.gz")
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    for start in range(0, len(order), size):
        rows = order[start:start + size]
        batch = tokenizer([sources[i] for i in rows], text_target=[targets[i] for i in rows], padding=True,
                          return_tensors="pt")
        batch["labels"] = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
        yield batch


def nll_per_token(logits_and_labels) -> tuple[float, int]:
    """(NLL in nats per target token, target tokens) over (logits, labels) pairs, labels -100 where padded."""
    total, count = 0.0, 0
    for logits, labels in logits_and_labels:
        total += torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(),
                                                   ignore_index=-100, reduction="sum").item()
        count += int((labels != -100).sum())
    return total / count, count


@torch.inference_mode()
def validation_nll(checkpoint: Path, tokenizer, data: Path) -> float:
    """NLL in nats per target token (end of sentence included) of `checkpoint` on the validation pairs, float32, eval
    mode."""
    model = load_our_checkpoint(checkpoint).eval()
    return nll_per_token((model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                labels=batch["labels"]).logits, batch["labels"])
                         for batch in validation_batches(tokenizer, data))[0]


def ours_validation_curve(run_dir: Path, work: Path, data: Path, cache: dict) -> dict:
    tokenizer = tokenizer_of(work)
    curve = {}
    for checkpoint in run_dir.glob("checkpoint-*"):
        step = int(checkpoint.name.split("-")[1])
        key = f"{run_dir.name}/{step}"
        if key not in cache:
            cache[key] = validation_nll(checkpoint, tokenizer, data)
        curve[step] = cache[key]
    return curve


def compare(args) -> None:
    work, data = Path(args.work), Path(args.data_dir)
    cache_file = work / "validation_nll.json"
    cache = json.loads(cache_file.read_text()) if cache_file.is_file() else {}
    runs = {}
    for run_dir in sorted(p for p in work.iterdir() if p.is_dir() and re.match(r"(fairseq|ours)", p.name)
                          and re.search(args.runs or "", p.name)):
        if run_dir.name.startswith("fairseq"):
            if (run_dir / "train.log").is_file():
                runs[run_dir.name] = fairseq_curves(run_dir)
        elif any(run_dir.glob("checkpoint-*")):
            train, train_nll = ours_train_curves(run_dir)
            runs[run_dir.name] = (train, ours_validation_curve(run_dir, work, data, cache), train_nll)
            cache_file.write_text(json.dumps(cache, indent=1))
    names = sorted(runs)
    for title, index in (("training loss, label-smoothed (nats, mean of the last 50 updates)", 0),
                         ("training NLL (nats per target token, the last 50 updates)", 2),
                         ("validation NLL (nats per target token)", 1)):
        steps = sorted({step for name in names for step in runs[name][index]})
        if not steps:
            continue
        if title.startswith("training"):
            steps = [s for s in steps if s in (50, 100, 200, 300, 500, 1000, 1500, 2000) or s % 1000 == 0]
        print(f"\n{title}\n\n| updates | " + " | ".join(names) + " |\n| --- |" + " --- |" * len(names))
        for step in steps:
            cells = [f"{runs[name][index][step]:.3f}" if step in runs[name][index] else "" for name in names]
            print(f"| {step} | " + " | ".join(cells) + " |")
    print_seed_spread(runs)
    if args.bleu:
        which = f"update {args.bleu_at}" if args.bleu_at else "last checkpoint"
        if args.average > 1:
            which = f"the mean of the last {args.average} checkpoints up to the {which}"
        print(f"\ntest_2016_flickr, {which}, beam 4, length penalty 1.0 (score / length), source + 50\n")
        print("| run | updates | sacreBLEU | BLEU lowercased Moses | brevity penalty | length ratio |\n"
              "| --- | --- | --- | --- | --- | --- |")
        for name in names:
            print(bleu_row(args, work, data, work / name), flush=True)


def seed_spread(runs: dict) -> dict:
    """{update: {system: (mean, lowest, highest, seeds)}} of validation NLL, at the updates every run validated."""
    systems = {}
    for name, (_, valid, _) in runs.items():
        systems.setdefault(name.split("-")[0], []).append(valid)
    common = set.intersection(*(set(valid) for curves in systems.values() for valid in curves)) if systems else set()
    return {step: {system: (sum(c[step] for c in curves) / len(curves), min(c[step] for c in curves),
                            max(c[step] for c in curves), len(curves))
                   for system, curves in sorted(systems.items())}
            for step in sorted(common)}


def print_seed_spread(runs: dict) -> None:
    spread = seed_spread(runs)
    if not spread:
        return
    systems = list(next(iter(spread.values())))
    print("\nover seeds: each system's mean (lowest-highest, seeds) of the NLL above, where every run validated\n\n"
          "| updates | " + " | ".join(systems) + " |\n| --- |" + " --- |" * len(systems))
    for step, row in spread.items():
        print(f"| {step} | " + " | ".join(f"{mean:.3f} ({low:.3f}-{high:.3f}, {n})"
                                         for mean, low, high, n in row.values()) + " |")


def bleu_row(args, work: Path, data: Path, run_dir: Path) -> str:
    from vanilla_transformer.inference.metrics import score_translations
    from vanilla_transformer.training.averaging import average_checkpoints

    references = read_gzip_lines(data / f"{SPLITS['test']}.{TARGET}.gz")
    fairseq = run_dir.name.startswith("fairseq")
    checkpoints = {int(p.stem.split("_")[-1]) if fairseq else int(p.name.split("-")[1]): p
                   for p in run_dir.glob("checkpoint_*_*.pt" if fairseq else "checkpoint-*")}
    step = args.bleu_at if args.bleu_at else max(checkpoints, default=None)
    if step not in checkpoints:
        return f"| {run_dir.name} | {step} | no checkpoint | | | |"
    translate = partial(fairseq_translations, args) if fairseq else partial(our_translations, data=data)
    # --average N: the mean of the last N checkpoints up to `step` (Wu et al.'s and the paper's last-checkpoint
    # averaging), made the way each toolkit's own averaging makes it.
    steps = sorted(s for s in checkpoints if s <= step)[-args.average:]
    last = [checkpoints[s] for s in steps]
    with tempfile.TemporaryDirectory() as tmp:
        if len(last) > 1:
            checkpoint = (average_fairseq_checkpoints(args, last, Path(tmp) / "averaged.pt") if fairseq else
                          average_checkpoints(last, Path(tmp) / "averaged"))
        else:
            checkpoint = last[0]
        hypotheses = translate(work, checkpoint)
    scores = score_translations(hypotheses, references, moses_lang=TARGET)
    ratio = re.search(r"ratio = ([0-9.]+)", scores["bleu_report"]).group(1)
    updates = f"{steps[0]}-{step}" if len(last) > 1 else step
    return (f"| {run_dir.name} | {updates} | {scores['bleu']:.2f} | {scores['bleu_lc_moses']:.2f} | "
            f"{scores['bleu_bp']:.3f} | {ratio} |")


# Run by the fairseq venv's Python: the element-wise mean of fairseq checkpoints' weights (float ones summed in float64),
# the rest of the last one's state kept, as fairseq's scripts/average_checkpoints.py writes it.
FAIRSEQ_AVERAGE = """
import sys, torch
paths, out = sys.argv[1:-1], sys.argv[-1]
states = [torch.load(path, map_location="cpu") for path in paths]
averaged = states[-1]
for key, value in averaged["model"].items():
    if value.is_floating_point():
        averaged["model"][key] = (sum(state["model"][key].double() for state in states) / len(states)).to(value.dtype)
torch.save(averaged, out)
"""


def average_fairseq_checkpoints(args, checkpoints: list[Path], out: Path) -> Path:
    subprocess.run([fairseq_bin(args, "python"), "-c", FAIRSEQ_AVERAGE, *map(str, checkpoints), str(out)], check=True,
                   env=one_thread())
    return out


def fairseq_translations(args, work: Path, checkpoint: Path, subset: str = "test", beam: int = 4,
                         lenpen: float = 1.0, max_len: tuple[int, int] = (1, 50)) -> list[str]:
    """fairseq-generate's best translation of each sentence of `subset`, its pieces decoded by our tokenizer (by
    default as `compare` decodes: beam 4, length penalty 1.0, at most source length + 50 tokens)."""
    tokenizer = tokenizer_of(work)
    output = subprocess.run(
        [fairseq_bin(args, "fairseq-generate"), str(work / "fairseq-bin"), "--path", str(checkpoint),
         "--gen-subset", subset, "--source-lang", SOURCE, "--target-lang", TARGET, "--beam", str(beam),
         "--lenpen", str(lenpen), "--max-len-a", str(max_len[0]), "--max-len-b", str(max_len[1]),
         "--batch-size", "64", "--cpu"],
        check=True, capture_output=True, text=True).stdout
    hypotheses = {}
    for line in output.splitlines():
        if line.startswith("H-"):
            key, _, pieces = line.split("\t", 2)
            ids = tokenizer.convert_tokens_to_ids(pieces.split())
            hypotheses[int(key[2:])] = tokenizer.decode(ids, skip_special_tokens=True)
    return [hypotheses[i] for i in range(len(hypotheses))]


def our_translations(work: Path, checkpoint: Path, data: Path) -> list[str]:
    from vanilla_transformer.inference.translate import translate_lines

    model = load_our_checkpoint(checkpoint)
    sources = read_gzip_lines(data / f"{SPLITS['test']}.{SOURCE}.gz")
    return translate_lines(model, tokenizer_of(work), sources, batch_size=64, num_beams=4, length_penalty=1.0,
                           length_penalty_type="transformers", early_stopping=True, show_progress=False)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["prepare", "fairseq", "ours", "compare", "with-candidates", "equivalence",
                                            "search", "validation"])
    parser.add_argument("--work", required=True, help="Folder of the tokenizer, the data and every run.")
    parser.add_argument("--data-dir", default="../shared/data/multi30k", help="Multi30k's gzip files.")
    parser.add_argument("--fairseq-venv", default=".venv-fairseq")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--updates", type=int, default=500)
    parser.add_argument("--save-every", type=int, default=100)
    parser.add_argument("--name", help="The run's folder under --work (default: SYSTEM-sSEED).")
    parser.add_argument("--resume", action="store_true", help="fairseq, ours: go on from the run's last checkpoint "
                                                               "to --updates.")
    parser.add_argument("--one-thread", action="store_true", help="OMP_NUM_THREADS=1 (two runs side by side).")
    parser.add_argument("--candidates", default="", help=f"ours: fairseq behaviours to switch on, comma-separated: "
                                                          f"{', '.join(ALL_CANDIDATES)}.")
    parser.add_argument("--checkpoint", help="equivalence, search, validation: a fairseq checkpoint, relative to "
                                                        "--work.")
    parser.add_argument("--pairs", type=int, default=64, help="equivalence: validation pairs in the batch.")
    parser.add_argument("--bleu", action="store_true", help="compare: decode and score the test set too.")
    parser.add_argument("--bleu-at", type=int, help="compare --bleu: the checkpoint of this update (default: each "
                                                    "run's last).")
    parser.add_argument("--average", type=int, default=1, help="compare --bleu: decode the mean of the last N "
                                                               "checkpoints up to that update.")
    parser.add_argument("--runs", help="compare: only the runs whose folder names match this regular expression.")
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    args.extra = extra
    commands = {"prepare": prepare, "fairseq": train_fairseq, "ours": train_ours, "compare": compare,
                "with-candidates": with_candidates, "equivalence": check_equivalence,
                "search": check_search, "validation": check_validation}
    commands[args.command](args)


if __name__ == "__main__":
    main()
