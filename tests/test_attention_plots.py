"""`attention_weights`, `plot_attention` and the `plot-attention` command, on a tiny random model (2 layers, 4 heads)
whose tokenizer has no merges, so that every token is one character."""

import pytest
import torch
from conftest import tiny_config_for

from vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer.inference.attention_plots import attention_weights, plot_attention
from vanilla_transformer.cli.main import main
from vanilla_transformer.training.tokenization import train_tokenizer


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SOURCE, TRANSLATION = "the cat sat", "le chat"


@pytest.fixture(scope="module")
def model_and_tokenizer():
    # A vocabulary smaller than the 256 bytes + 4 special tokens learns no merges: one token per character.
    tokenizer = train_tokenizer(["the cat sat on the mat", "le chat est assis"], vocab_size=260, show_progress=False)
    config = tiny_config_for(tokenizer)
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(config).eval()
    return model, tokenizer


@pytest.fixture(scope="module")
def weights(model_and_tokenizer):
    return attention_weights(*model_and_tokenizer, SOURCE, TRANSLATION)


def heatmaps(figure):
    return [ax for ax in figure.axes if ax.get_label() != "<colorbar>"]


def tick_labels(ticks) -> list[str]:
    return [tick.get_text() for tick in ticks]


# --- attention_weights ---------------------------------------------------------------------------------------------


def test_weights_come_with_readable_tokens(weights):
    assert weights["source_tokens"] == ["t", "h", "e", "▁", "c", "a", "t", "▁", "s", "a", "t", "</s>"]
    assert weights["target_tokens"] == ["l", "e", "▁", "c", "h", "a", "t", "</s>"]
    assert weights["decoder_input_tokens"] == ["<s>", "l", "e", "▁", "c", "h", "a", "t"]
    assert weights["translation"] == TRANSLATION


def test_weights_have_one_map_per_layer_and_head(weights):
    source_len, target_len = 12, 8
    for kind, shape in [
        ("encoder", (4, source_len, source_len)),
        ("decoder", (4, target_len, target_len)),
        ("cross", (4, target_len, source_len)),
    ]:
        assert len(weights[kind]) == 2
        for layer in weights[kind]:
            assert layer.shape == shape
            torch.testing.assert_close(layer.sum(-1), torch.ones(shape[:2]))  # each row a distribution
    future = torch.ones(target_len, target_len, dtype=torch.bool).triu(1)
    assert all(float(layer[:, future].abs().max()) == 0 for layer in weights["decoder"])  # masked (section 3.2.3)


def test_weights_are_those_of_the_teacher_forced_pass(model_and_tokenizer, weights):
    model, tokenizer = model_and_tokenizer
    assert model.config._attn_implementation == "sdpa"  # switched to eager for the pass, then restored
    encoded = tokenizer(SOURCE, return_tensors="pt")
    decoder_input_ids = torch.tensor([[tokenizer.bos_token_id, *tokenizer(TRANSLATION)["input_ids"][:-1]]])
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            outputs = model(**encoded, decoder_input_ids=decoder_input_ids, output_attentions=True)
    finally:
        model.set_attn_implementation("sdpa")
    torch.testing.assert_close(weights["cross"][1], outputs.cross_attentions[1][0])
    torch.testing.assert_close(weights["encoder"][0], outputs.encoder_attentions[0][0])


def test_default_translation_is_the_models_own(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    generated = model.generate(**tokenizer(SOURCE, return_tensors="pt"))[0, 1:].tolist()
    if tokenizer.eos_token_id in generated:
        generated = generated[: generated.index(tokenizer.eos_token_id) + 1]
    weights = attention_weights(model, tokenizer, SOURCE)
    assert len(weights["target_tokens"]) == len(generated)
    assert weights["translation"] == tokenizer.decode(generated, skip_special_tokens=True)
    assert weights["cross"][0].shape[1] == len(generated)


# --- plot_attention ------------------------------------------------------------------------------------------------


def test_one_head_is_one_heatmap_with_the_tokens_on_its_axes(weights, tmp_path):
    path = tmp_path / "cross.png"
    figure = plot_attention(weights, kind="cross", layer=1, head=3, out_path=path)
    assert path.read_bytes().startswith(PNG_SIGNATURE)
    [ax] = heatmaps(figure)
    assert tick_labels(ax.get_xticklabels()) == weights["source_tokens"]
    assert tick_labels(ax.get_yticklabels()) == weights["target_tokens"]
    assert (ax.images[0].get_array() == weights["cross"][0][2].numpy()).all()  # layer 1, head 3
    assert figure.get_suptitle() == "Encoder-decoder attention, layer 1 of 2"
    assert ax.get_title() == "head 3 of 4"


def test_all_heads_of_the_last_layer_by_default(weights, tmp_path):
    path = tmp_path / "encoder.png"
    figure = plot_attention(weights, kind="encoder", out_path=path)
    assert path.read_bytes().startswith(PNG_SIGNATURE)
    axes = heatmaps(figure)
    assert len(axes) == 4
    assert {ax.get_subplotspec().get_geometry()[:2] for ax in axes} == {(2, 2)}
    for head, ax in enumerate(axes):
        assert ax.get_title() == f"head {head + 1}"
        assert (ax.images[0].get_array() == weights["encoder"][1][head].numpy()).all()
        assert tick_labels(ax.get_xticklabels()) == tick_labels(ax.get_yticklabels()) == weights["source_tokens"]
    assert figure.get_suptitle() == "Encoder self-attention, layer 2 of 2, all 4 heads"


def test_decoder_self_attention_columns_are_the_decoder_inputs(weights):
    [ax] = heatmaps(plot_attention(weights, kind="decoder", head=1))
    assert tick_labels(ax.get_xticklabels()) == weights["decoder_input_tokens"]
    assert tick_labels(ax.get_yticklabels()) == weights["target_tokens"]


def test_eight_heads_make_a_two_by_four_grid():
    tokens = ["a", "$b$", "</s>"]  # "$" stays text, not mathematics
    maps = torch.rand(8, 3, 3).softmax(-1)
    weights = {"source_tokens": tokens, "encoder": [maps]}
    axes = heatmaps(plot_attention(weights, kind="encoder"))
    assert len(axes) == 8
    assert {ax.get_subplotspec().get_geometry()[:2] for ax in axes} == {(2, 4)}
    assert tick_labels(axes[0].get_xticklabels()) == tokens


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(kind="self"), "Unknown attention kind 'self'"),
        (dict(layer=0), "No layer 0: the cross attention has layers 1 to 2"),
        (dict(layer=3), "No layer 3"),
        (dict(head=5), "No head 5: layer 2 has heads 1 to 4"),
    ],
)
def test_layers_and_heads_are_numbered_from_one(weights, options, message):
    with pytest.raises(ValueError, match=message):
        plot_attention(weights, **options)


# --- The command ---------------------------------------------------------------------------------------------------


def test_plot_attention_command_writes_the_png(model_and_tokenizer, tmp_path, capsys):
    model, tokenizer = model_and_tokenizer
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    path = tmp_path / "plot.png"
    main(["plot-attention", "--model", str(tmp_path / "model"), "--source", SOURCE, "--translation", TRANSLATION,
          "--kind", "decoder", "--layer", "1", "--out", str(path)])
    assert path.read_bytes().startswith(PNG_SIGNATURE)
    assert capsys.readouterr().out == f"translation: {TRANSLATION}\nattention plot written to {path}\n"

    with pytest.raises(SystemExit) as exit_info:
        main(["plot-attention", "--model", str(tmp_path / "model"), "--source", SOURCE, "--head", "9",
              "--out", str(tmp_path / "other.png")])
    assert exit_info.value.code == 2
    assert "No head 9: layer 2 has heads 1 to 4" in capsys.readouterr().err
    assert not (tmp_path / "other.png").exists()
