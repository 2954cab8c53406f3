"""Attention maps of one translation, drawn like the paper's appendix figures (3-5): which tokens each position
attends to, per layer and head, in the encoder self-attention, the decoder's masked self-attention and the
encoder-decoder attention.

```python
>>> weights = attention_weights(model, tokenizer, "The law will never be perfect.")
>>> plot_attention(weights, kind="cross", out_path="cross.png")  # all heads of the last layer, in a grid
```
"""

import math
from pathlib import Path
from typing import TYPE_CHECKING

from ..extras import require

# torch and transformers are imported where the weights are computed: the command line lists KINDS without them.
if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


KINDS = {
    "encoder": "Encoder self-attention",
    "decoder": "Decoder masked self-attention",
    "cross": "Encoder-decoder attention",
}


def attention_weights(
    model: "PreTrainedModel", tokenizer: "PreTrainedTokenizerBase", source: str, translation: str | None = None
) -> dict:
    """
    The attention weights of every layer and head for `source` and its `translation` (default: the model's own,
    from `model.generate()` with the model's decoding defaults), from one teacher-forced forward pass.

    Returns a dict with
    - `source_tokens`: the source tokens, `</s>` included;
    - `target_tokens`: the tokens the decoder positions predict (the translation, then `</s>`);
    - `decoder_input_tokens`: what the decoder reads at those positions: `<s>`, then the translation shifted right;
    - `translation`: the translation as text;
    - `encoder`, `decoder`, `cross`: one float tensor per layer, (heads, source_len, source_len),
      (heads, target_len, target_len) and (heads, target_len, source_len), rows attending to columns.

    Only the eager attention kernel forms the weights (sdpa and flash attention never do), so the model runs with
    it for this pass, in eval mode; its attention implementation and mode are restored afterwards.
    """
    import torch

    was_training, implementation = model.training, model.config._attn_implementation
    model.eval()
    try:
        with torch.no_grad():
            encoded = tokenizer(source, return_tensors="pt").to(model.device)
            if translation is None:
                generated = model.generate(**encoded)[0, 1:]  # without the decoder start token
                eos = (generated == model.config.eos_token_id).nonzero()
                labels = generated[: int(eos[0]) + 1] if len(eos) else generated  # nothing after </s>
            else:
                labels = tokenizer(text_target=translation, return_tensors="pt")["input_ids"][0].to(model.device)
            decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels[None])
            model.set_attn_implementation("eager")
            outputs = model(**encoded, decoder_input_ids=decoder_input_ids, output_attentions=True)
    finally:
        model.set_attn_implementation(implementation)
        model.train(was_training)

    def per_layer(attentions):
        return [layer[0].float().cpu() for layer in attentions]  # (heads, query_len, key_len)

    return {
        "source_tokens": readable_tokens(tokenizer, encoded["input_ids"][0]),
        "target_tokens": readable_tokens(tokenizer, labels),
        "decoder_input_tokens": readable_tokens(tokenizer, decoder_input_ids[0]),
        "translation": tokenizer.decode(labels, skip_special_tokens=True),
        "encoder": per_layer(outputs.encoder_attentions),
        "decoder": per_layer(outputs.decoder_attentions),
        "cross": per_layer(outputs.cross_attentions),
    }


def readable_tokens(tokenizer: "PreTrainedTokenizerBase", ids) -> list[str]:
    """Each token as the text it decodes to, a space shown as "▁" ("Ġcat" of byte-level BPE becomes "▁cat") and other
    invisible characters escaped ("\\t"). A token holding part of a multi-byte character has no text of its own and is
    shown as the tokenizer spells it."""
    tokens = []
    for token_id in [int(i) for i in ids]:
        piece = tokenizer.decode([token_id])
        if "\ufffd" in piece:
            piece = tokenizer.convert_ids_to_tokens(token_id)
        piece = piece.replace(" ", "▁")
        tokens.append(piece if piece.isprintable() else piece.encode("unicode_escape").decode("ascii"))
    return tokens


# Rows and columns of each kind of map: (row tokens, column tokens, row label, column label).
_AXES = {
    "encoder": ("source_tokens", "source_tokens", "source (attending)", "source (attended to)"),
    "decoder": ("target_tokens", "decoder_input_tokens", "target (predicted)", "decoder input (attended to)"),
    "cross": ("target_tokens", "source_tokens", "target (predicted)", "source (attended to)"),
}


def plot_attention(
    weights: dict,
    kind: str = "cross",
    layer: int | None = None,
    head: int | None = None,
    out_path: str | Path | None = None,
) -> "Figure":
    """
    Heatmaps of one layer of `weights` (from `attention_weights`): head `head` alone, or by default all heads of the
    layer in a grid (2 x 4 for the paper's 8). `kind` is "encoder", "decoder" or "cross" (encoder-decoder). Layers
    and heads are numbered from 1, as in the paper's "layer 5 of 6"; `layer` defaults to the last.

    Rows are the attending positions, columns what they attend to, each labelled with its token. A decoder row is
    labelled with the token that position predicts, so it reads "while producing this token"; the columns of decoder
    self-attention are the decoder's inputs (`<s>`, then the target shifted right). All heatmaps of a figure share
    one colour scale. The figure is a plain matplotlib `Figure` (no pyplot, no window; the Agg renderer draws it),
    saved to `out_path` when given, in the format its suffix names (".png"). Needs the `plots` extra.
    """
    matplotlib_figure = require("matplotlib.figure", extra="plots")
    if kind not in KINDS:
        raise ValueError(f"Unknown attention kind {kind!r}; choose one of {list(KINDS)}")
    layers = weights[kind]
    layer = len(layers) if layer is None else layer
    if not 1 <= layer <= len(layers):
        raise ValueError(f"No layer {layer}: the {kind} attention has layers 1 to {len(layers)}")
    maps = layers[layer - 1]  # (heads, rows, columns)
    num_heads = maps.shape[0]
    if head is not None and not 1 <= head <= num_heads:
        raise ValueError(f"No head {head}: layer {layer} has heads 1 to {num_heads}")
    heads = [head] if head is not None else list(range(1, num_heads + 1))
    row_key, column_key, row_label, column_label = _AXES[kind]
    row_tokens, column_tokens = weights[row_key], weights[column_key]

    grid_rows = math.isqrt(len(heads))
    grid_columns = math.ceil(len(heads) / grid_rows)
    # About 0.2 inch per token, so that tick labels in 8 points do not overlap, and room for the labels themselves.
    panel = max(3.5, 0.2 * max(len(row_tokens), len(column_tokens)) + 1.5)
    figure = matplotlib_figure.Figure(
        figsize=(grid_columns * panel + 1.0, grid_rows * panel + 0.5), layout="constrained"
    )
    axes = figure.subplots(grid_rows, grid_columns, squeeze=False).ravel()
    for unused in axes[len(heads) :]:
        figure.delaxes(unused)
    largest = float(maps[[h - 1 for h in heads]].max())
    title = f"{KINDS[kind]}, layer {layer} of {len(layers)}"
    for ax, h in zip(axes, heads):
        image = ax.imshow(maps[h - 1].numpy(), cmap="viridis", vmin=0.0, vmax=largest)
        # parse_math=False: a "$" in a token is text, not the start of a formula.
        ax.set_xticks(range(len(column_tokens)), column_tokens, rotation=90, fontsize=8, parse_math=False)
        ax.set_yticks(range(len(row_tokens)), row_tokens, fontsize=8, parse_math=False)
        ax.set_xlabel(column_label)
        ax.set_ylabel(row_label)
        ax.set_title(f"head {h} of {num_heads}" if head is not None else f"head {h}")
    figure.suptitle(title if head is not None else f"{title}, all {num_heads} heads")
    figure.colorbar(image, ax=axes[: len(heads)].tolist(), shrink=0.8, label="attention weight")
    if out_path is not None:
        figure.savefig(out_path)
    return figure


__all__ = ["KINDS", "attention_weights", "plot_attention", "readable_tokens"]
