"""Behaviour of the model as a Hugging Face model: masking, caching, attention backends, outputs, loss, saving,
loading, Auto classes, remote code and clear errors. Formula-level fidelity lives in test_fidelity.py."""

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_config
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

from vanilla_transformer import (
    VanillaTransformerConfig,
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerModel,
)


def build(config, attn_implementation="sdpa", seed=0):
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    return VanillaTransformerForConditionalGeneration(config).eval()


def shared_storage(model):
    return {
        model.model.shared.weight.data_ptr(),
        model.model.encoder.embed_tokens.weight.data_ptr(),
        model.model.decoder.embed_tokens.weight.data_ptr(),
        model.lm_head.weight.data_ptr(),
    }


# --- Masking ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_changing_decoder_token_t_never_changes_earlier_logits(tiny_config, batch, attn_implementation):
    model = build(tiny_config, attn_implementation)
    inputs = {k: v[:1] for k, v in batch.items()}
    with torch.no_grad():
        reference = model(**inputs).logits
        for t in range(1, inputs["decoder_input_ids"].shape[1]):
            changed = inputs["decoder_input_ids"].clone()
            changed[0, t] = 4 + (changed[0, t] + 1) % 124
            logits = model(**{**inputs, "decoder_input_ids": changed}).logits
            torch.testing.assert_close(logits[:, :t], reference[:, :t], atol=1e-6, rtol=0)
            assert (logits[:, t] - reference[:, t]).abs().max() > 1e-4  # the change is visible from t on


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_padding_never_changes_real_token_outputs(tiny_config, attn_implementation):
    model = build(tiny_config, attn_implementation)
    source, target = torch.tensor([[5, 9, 17, 2]]), torch.tensor([[1, 33, 8]])
    longer_source, longer_target = torch.randint(4, 128, (1, 9)), torch.randint(4, 128, (1, 7))
    with torch.no_grad():
        alone = model(input_ids=source, decoder_input_ids=target).logits
        padded = model(
            input_ids=torch.cat([torch.nn.functional.pad(source, (0, 5)), longer_source]),
            attention_mask=torch.tensor([[1] * 4 + [0] * 5, [1] * 9]),
            decoder_input_ids=torch.cat([torch.nn.functional.pad(target, (0, 4)), longer_target]),
            decoder_attention_mask=torch.tensor([[1] * 3 + [0] * 4, [1] * 7]),
        ).logits
    torch.testing.assert_close(padded[:1, :3], alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_all_padding_rows_give_no_nan(tiny_config, batch, attn_implementation):
    model = build(tiny_config, attn_implementation)
    attention_mask = batch["attention_mask"].clone()
    attention_mask[1] = 0
    decoder_attention_mask = batch["decoder_attention_mask"].clone()
    decoder_attention_mask[1] = 0
    with torch.no_grad():
        out = model(**{**batch, "attention_mask": attention_mask, "decoder_attention_mask": decoder_attention_mask})
    assert torch.isfinite(out.logits).all()
    assert torch.isfinite(out.encoder_last_hidden_state).all()


# --- Incremental decoding and attention backends -----------------------------------------------------------------


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_cached_step_by_step_decoding_equals_full_forward(tiny_config, batch, attn_implementation):
    from transformers.cache_utils import EncoderDecoderCache

    model = build(tiny_config, attn_implementation)
    targets = batch["decoder_input_ids"]
    with torch.no_grad():
        full = model(**batch).logits
        encoder_outputs = model.get_encoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        cache, steps = None, []
        for t in range(targets.shape[1]):
            out = model(
                encoder_outputs=encoder_outputs,
                attention_mask=batch["attention_mask"],
                decoder_input_ids=targets[:, t : t + 1],
                decoder_attention_mask=batch["decoder_attention_mask"][:, : t + 1],
                cache=cache,
                use_cache=True,
            )
            cache = out.cache
            steps.append(out.logits)
    assert isinstance(cache, EncoderDecoderCache)
    assert cache.self_attention_cache.get_seq_length() == targets.shape[1]
    assert cache.cross_attention_cache.get_seq_length() == batch["input_ids"].shape[1]  # projected once, not grown
    real = batch["decoder_attention_mask"].bool()
    torch.testing.assert_close(torch.cat(steps, dim=1)[real], full[real], atol=1e-5, rtol=0)


def test_cross_attention_keys_and_values_are_projected_once(tiny_config, batch):
    model = build(tiny_config)
    calls = []
    for layer in model.model.decoder.layers:
        layer.encoder_attn.k_proj.register_forward_hook(lambda *args: calls.append(1))
    model.generate(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=5, min_new_tokens=5,
        num_beams=1, do_sample=False,
    )
    assert len(calls) == tiny_config.decoder_layers


# Head sizes of the tiny model (d_model 32, h 4): d_model / h = 8 for all; Table 3 row (B)'s shape, queries and keys
# smaller than the values (d_k 4, d_v 8, as 16 or 32 against 64); and both set apart from d_model / h.
HEAD_SIZES = {"d_model/h": {}, "row-B": dict(d_k=4), "d_k-4-d_v-12": dict(d_k=4, d_v=12)}


@pytest.mark.parametrize("head_sizes", HEAD_SIZES)
def test_eager_and_sdpa_agree(batch, head_sizes):
    tiny_config = make_tiny_config(**HEAD_SIZES[head_sizes])
    eager = build(tiny_config, "eager")
    sdpa = build(tiny_config, "sdpa")
    with torch.no_grad():
        torch.testing.assert_close(sdpa(**batch).logits, eager(**batch).logits, atol=1e-5, rtol=0)


def test_attn_implementation_is_chosen_at_load_time(tiny_model, tmp_path):
    tiny_model.save_pretrained(tmp_path)
    for implementation in ["eager", "sdpa"]:
        loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, attn_implementation=implementation)
        assert loaded.config._attn_implementation == implementation


# --- Outputs, loss, training plumbing ----------------------------------------------------------------------------


def test_output_attentions_and_hidden_states_shapes(tiny_config, batch):
    model = build(tiny_config, "eager")
    out = model(**batch, output_attentions=True, output_hidden_states=True)
    batch_size, source_len = batch["input_ids"].shape
    target_len = batch["decoder_input_ids"].shape[1]
    heads, layers = tiny_config.encoder_attention_heads, tiny_config.encoder_layers
    assert len(out.encoder_hidden_states) == len(out.decoder_hidden_states) == layers + 1
    assert [a.shape for a in out.encoder_attentions] == [(batch_size, heads, source_len, source_len)] * layers
    assert [a.shape for a in out.decoder_attentions] == [(batch_size, heads, target_len, target_len)] * layers
    assert [a.shape for a in out.cross_attentions] == [(batch_size, heads, target_len, source_len)] * layers
    torch.testing.assert_close(out.encoder_hidden_states[-1], out.encoder_last_hidden_state)
    # Each attention row is a distribution that gives no weight to padding or to the future.
    torch.testing.assert_close(out.cross_attentions[0].sum(-1), torch.ones(batch_size, heads, target_len))
    assert out.cross_attentions[0][1, :, :, 4:].abs().max() == 0
    assert torch.triu(out.decoder_attentions[0][0], diagonal=1).abs().max() == 0


def test_return_dict_false_gives_a_tuple(tiny_model, batch):
    out = tiny_model(**batch, return_dict=False)
    assert isinstance(out, tuple)
    torch.testing.assert_close(out[0], tiny_model(**batch).logits)


def test_labels_give_cross_entropy_ignoring_minus_100_and_shifted_decoder_inputs(tiny_model):
    labels = torch.tensor([[7, 8, 9, 2], [10, 2, -100, -100]])
    out = tiny_model(input_ids=torch.tensor([[5, 6, 2], [7, 2, 0]]), labels=labels)
    expected_decoder_inputs = torch.tensor([[1, 7, 8, 9], [1, 10, 2, 0]])  # start token, then labels[:-1]; -100 -> pad
    torch.testing.assert_close(tiny_model.prepare_decoder_input_ids_from_labels(labels), expected_decoder_inputs)
    explicit = tiny_model(
        input_ids=torch.tensor([[5, 6, 2], [7, 2, 0]]), decoder_input_ids=expected_decoder_inputs
    ).logits
    torch.testing.assert_close(out.logits, explicit)
    log_probs = explicit.log_softmax(-1)
    kept = labels != -100
    expected_loss = -log_probs[kept].gather(-1, labels[kept].unsqueeze(-1)).mean()
    torch.testing.assert_close(out.loss, expected_loss)


@pytest.mark.parametrize("dropout", [0.0, 0.1], ids=["no-dropout", "dropout"])
def test_gradient_checkpointing_gives_the_same_gradients(batch, dropout):
    # With dropout the recomputed forward must draw the same masks (checkpointing restores the RNG state).
    config = VanillaTransformerConfig.from_preset(
        "tiny", dropout=dropout, attention_dropout=dropout, activation_dropout=dropout
    )
    labels = batch["decoder_input_ids"].masked_fill(batch["decoder_attention_mask"] == 0, -100)
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "labels": labels}
    gradients = []
    for checkpointing in [False, True]:
        model = build(config).train()
        if checkpointing:
            model.activation_checkpointing_enable()
            assert model.is_activation_checkpointing
        model(**inputs).loss.backward()
        gradients.append({name: p.grad.clone() for name, p in model.named_parameters()})
    for name, gradient in gradients[0].items():
        torch.testing.assert_close(gradients[1][name], gradient, msg=name)


def test_dropout_is_active_in_training_only():
    config = VanillaTransformerConfig.from_preset("tiny")  # P_drop = 0.1
    model = build(config).train()
    inputs = dict(input_ids=torch.tensor([[5, 6, 7, 2]]), decoder_input_ids=torch.tensor([[1, 9, 10]]))
    assert not torch.equal(model(**inputs).logits, model(**inputs).logits)
    model.eval()
    assert torch.equal(model(**inputs).logits, model(**inputs).logits)


def test_generate_greedy_and_beam(tiny_model, batch):
    for num_beams in [1, 4]:
        generated = tiny_model.generate(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], num_beams=num_beams,
            max_new_tokens=6,
        )
        assert generated.shape[0] == 2 and generated.shape[1] <= 7
        assert (generated[:, 0] == tiny_model.config.decoder_start_token_id).all()


# --- Table 3 row (B): queries and keys of d_k, values of d_v dimensions per head ----------------------------------


@pytest.mark.parametrize("head_sizes", ["row-B", "d_k-4-d_v-12"])
def test_a_model_with_its_own_head_sizes_trains_saves_reloads_and_generates(batch, tmp_path, head_sizes):
    sizes = HEAD_SIZES[head_sizes]
    config = make_tiny_config(**sizes)
    heads, (d_k, d_v) = config.decoder_attention_heads, config.head_sizes(config.decoder_attention_heads)
    assert d_k == 4 and d_v == sizes.get("d_v", 8)
    model = build(config).train()
    attention = model.model.decoder.layers[0].encoder_attn
    assert (attention.q_proj.out_features, attention.k_proj.out_features) == (heads * d_k, heads * d_k)
    assert (attention.v_proj.out_features, attention.out_proj.in_features) == (heads * d_v, heads * d_v)

    labels = batch["decoder_input_ids"].masked_fill(batch["decoder_attention_mask"] == 0, -100)
    source = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(5):
        loss = model(**source, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]

    model.eval().save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert (saved["d_k"], saved["d_v"]) == (sizes.get("d_k"), sizes.get("d_v"))
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).logits, model(**batch).logits, atol=0, rtol=0)

    # Decoding with the cache (keys of d_k and values of d_v per head) gives the tokens of recomputing every step.
    for num_beams in [1, 4]:
        length = dict(num_beams=num_beams, min_new_tokens=8, max_new_tokens=8)
        cached = loaded.generate(**source, **length)
        assert torch.equal(loaded.generate(**source, **length, use_cache=False), cached)
    cache = loaded(**batch, use_cache=True).cache
    assert cache.self_attention_cache.layers[0].keys.shape == (2, heads, 6, d_k)
    assert cache.cross_attention_cache.layers[0].values.shape == (2, heads, 7, d_v)

    generated = loaded.generate(
        **source, num_beams=1, max_new_tokens=3, output_attentions=True, return_dict_in_generate=True
    )
    assert generated.cross_attentions[0][0].shape == (2, heads, 1, 7)  # first step, first layer
    loaded.set_attn_implementation("eager")
    out = loaded(**batch, output_attentions=True)
    assert [a.shape for a in out.cross_attentions] == [(2, heads, 6, 7)] * config.decoder_layers


def test_flash_attention_refuses_keys_smaller_than_values_naming_both(monkeypatch):
    """transformers' flash kernels pad values up to the query size, not queries up to the value size."""
    from transformers import PreTrainedModel

    def installed(self, implementation, *args, **kwargs):  # as if a flash kernel were installed
        return implementation

    monkeypatch.setattr(PreTrainedModel, "_check_and_adjust_attn_implementation", installed)
    row_b = VanillaTransformerForConditionalGeneration(make_tiny_config(d_k=4))
    with pytest.raises(ValueError, match=r"d_k=4, d_v=8.*'sdpa'"):
        row_b._check_and_adjust_attn_implementation("flash_attention_2")
    assert row_b._check_and_adjust_attn_implementation("sdpa") == "sdpa"
    wider_keys = VanillaTransformerForConditionalGeneration(make_tiny_config(d_k=12))
    assert wider_keys._check_and_adjust_attn_implementation("flash_attention_2") == "flash_attention_2"


# --- Saving, loading, tying, Auto classes, remote code -----------------------------------------------------------


def test_save_and_load_round_trip_keeps_outputs_and_one_tied_matrix(tiny_model, batch, tmp_path):
    from safetensors import safe_open

    tiny_model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    assert not (tmp_path / "pytorch_model.bin").exists()
    with safe_open(tmp_path / "model.safetensors", "pt") as checkpoint:
        keys = set(checkpoint.keys())
    assert [k for k in keys if "embed" in k or "shared" in k or "lm_head" in k] == ["model.shared.weight"]
    assert not any("embed_positions" in k for k in keys)  # sinusoids are computed, not stored

    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is VanillaTransformerForConditionalGeneration
    assert len(shared_storage(loaded)) == 1
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).logits, tiny_model(**batch).logits, atol=0, rtol=0)


def test_presets_and_a_new_config_build_attention_without_biases():
    """Section 3.2.2's projections W^Q, W^K, W^V, W^O have no biases (nor has tensor2tensor)."""
    for config in [VanillaTransformerConfig(), VanillaTransformerConfig.from_preset("tiny")]:
        model = VanillaTransformerForConditionalGeneration(config)
        attentions = [m for m in model.modules() if m.__class__.__name__ == "VanillaTransformerAttention"]
        assert len(attentions) == 3 * config.encoder_layers  # encoder self, decoder self and encoder-decoder
        for attention in attentions:
            assert all(p.bias is None for p in (attention.q_proj, attention.k_proj, attention.v_proj, attention.out_proj))
        assert not any(name.endswith("_proj.bias") for name, _ in model.named_parameters())


def test_a_folder_saved_with_attention_biases_loads_exactly_as_saved(batch, tmp_path):
    """A config.json written before `attention_bias` existed (no such key) describes projections with biases: the
    folder loads with them, every weight used, and gives the outputs it gave when saved."""
    config = VanillaTransformerConfig.from_preset("tiny", dropout=0.0, attention_bias=True)
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(config).eval()
    with torch.no_grad():  # non-zero biases, so that dropping them would change the outputs
        for name, parameter in model.named_parameters():
            if name.endswith("_proj.bias"):
                parameter.normal_()
    model.save_pretrained(tmp_path)
    saved_config = json.loads((tmp_path / "config.json").read_text())
    del saved_config["attention_bias"]
    (tmp_path / "config.json").write_text(json.dumps(saved_config))

    loaded, info = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path, output_loading_info=True)
    assert loaded.config.attention_bias is True
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(**batch).logits, model(**batch).logits, atol=0, rtol=0)
    assert AutoConfig.from_pretrained(tmp_path).attention_bias is True
    # A bias-free folder saved now says so and stays bias-free.
    VanillaTransformerForConditionalGeneration(VanillaTransformerConfig.from_preset("tiny")).save_pretrained(tmp_path)
    assert VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path).config.attention_bias is False


def test_resize_token_embeddings_keeps_the_three_way_tie(tiny_model, batch, tmp_path):
    tiny_model.resize_token_embeddings(140)
    assert tiny_model.config.vocab_size == 140
    assert tiny_model.lm_head.weight.shape == (140, 32)
    assert len(shared_storage(tiny_model)) == 1
    logits = tiny_model(**batch).logits
    assert logits.shape[-1] == 140
    tiny_model.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    assert len(shared_storage(loaded)) == 1
    torch.testing.assert_close(loaded.eval()(**batch).logits, logits)


def test_auto_classes_know_the_model(tiny_model, tmp_path):
    tiny_model.save_pretrained(tmp_path)
    config = AutoConfig.from_pretrained(tmp_path)
    assert type(config) is VanillaTransformerConfig
    assert type(AutoModel.from_pretrained(tmp_path)) is VanillaTransformerModel
    assert type(AutoModelForSeq2SeqLM.from_config(config)) is VanillaTransformerForConditionalGeneration
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "vanilla_transformer"
    assert saved["auto_map"] == {
        "AutoConfig": "configuration_vanilla_transformer.VanillaTransformerConfig",
        "AutoModelForSeq2SeqLM": "modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration",
    }
    assert (tmp_path / "modeling_vanilla_transformer.py").exists()
    assert (tmp_path / "configuration_vanilla_transformer.py").exists()


def test_bfloat16_loading(tiny_model, batch, tmp_path):
    tiny_model.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert loaded.dtype == torch.bfloat16
    with torch.no_grad():
        logits = loaded(**batch).logits
    assert logits.dtype == torch.bfloat16
    torch.testing.assert_close(logits.float(), tiny_model(**batch).logits, atol=0.1, rtol=0.05)


@pytest.mark.slow
def test_trust_remote_code_loads_where_the_package_is_not_importable(tiny_model, batch, tmp_path):
    model_dir = tmp_path / "model"
    tiny_model.save_pretrained(model_dir)
    expected = tiny_model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                   max_new_tokens=5, num_beams=1)
    script = textwrap.dedent(
        f"""
        import importlib.abc, sys
        class HidePackage(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "vanilla_transformer":
                    raise ModuleNotFoundError(name)
        sys.meta_path.insert(0, HidePackage())
        try:
            import vanilla_transformer
            raise SystemExit("the package is still importable")
        except ModuleNotFoundError:
            pass
        import torch
        from transformers import AutoConfig, AutoModelForSeq2SeqLM
        config = AutoConfig.from_pretrained({str(model_dir)!r}, trust_remote_code=True)
        model = AutoModelForSeq2SeqLM.from_pretrained({str(model_dir)!r}, trust_remote_code=True)
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        out = model.generate(input_ids=torch.tensor({batch["input_ids"].tolist()}),
                             attention_mask=torch.tensor({batch["attention_mask"].tolist()}),
                             max_new_tokens=5, num_beams=1)
        print(out.tolist())
        """
    )
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == expected.tolist()


# --- Clear errors ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(d_model=30, encoder_attention_heads=4), "d_model"),
        (dict(decoder_attention_heads=5), "decoder_attention_heads"),
        (dict(encoder_layers=0), "encoder_layers"),
        (dict(decoder_ffn_dim=-1), "decoder_ffn_dim"),
        (dict(vocab_size=0), "vocab_size"),
        (dict(dropout=1.0), "dropout"),
        (dict(attention_dropout=-0.1), "attention_dropout"),
        (dict(pad_token_id=128), "pad_token_id"),
        (dict(eos_token_id=-1), "eos_token_id"),
        (dict(decoder_start_token_id=500), "decoder_start_token_id"),
        (dict(activation_function="nope"), "activation_function"),
        (dict(d_k=0), "d_k"),
        (dict(d_v=-8), "d_v"),
        (dict(d_model=30, d_k=8), "d_model"),  # d_v left to d_model / h
    ],
)
def test_invalid_config_values_name_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        VanillaTransformerConfig.from_preset("tiny", **overrides)


def test_d_model_need_not_divide_by_h_when_d_k_and_d_v_are_set(batch):
    config = make_tiny_config(d_model=30, d_k=8, d_v=8)
    assert config.head_sizes(4) == (8, 8)
    assert build(config)(**batch).logits.shape == (2, 6, 128)


def test_unknown_preset_is_refused():
    with pytest.raises(ValueError, match="huge"):
        VanillaTransformerConfig.from_preset("huge")


def test_presets_are_the_papers_table_3_rows():
    base, big = VanillaTransformerConfig.from_preset("base"), VanillaTransformerConfig.from_preset("big")
    assert (base.d_model, base.encoder_layers, base.encoder_ffn_dim, base.encoder_attention_heads, base.dropout) == (
        512, 6, 2048, 8, 0.1)
    assert (big.d_model, big.decoder_layers, big.decoder_ffn_dim, big.decoder_attention_heads, big.dropout) == (
        1024, 6, 4096, 16, 0.3)
    assert VanillaTransformerConfig() == base  # the defaults are the base model
    assert (base.hidden_size, base.num_attention_heads, base.num_hidden_layers) == (512, 8, 6)


@pytest.mark.parametrize("bad_id", [128, 1000, -3])
def test_generate_refuses_out_of_vocabulary_ids_naming_the_id_and_vocab_size(tiny_model, bad_id):
    """Checked where users pass ids (generate(), the pipeline, the commands, the training collator), not in forward,
    which stays the paper's computation and never reads values back to the host."""
    with pytest.raises(ValueError, match=rf"{bad_id}.*128"):
        tiny_model.generate(input_ids=torch.tensor([[5, bad_id, 2]]), max_new_tokens=2)
    with pytest.raises(ValueError, match=rf"decoder_input_ids.*{bad_id}"):
        tiny_model.generate(input_ids=torch.tensor([[5, 6, 2]]), decoder_input_ids=torch.tensor([[1, bad_id]]),
                            max_new_tokens=2)


def test_generate_refuses_empty_input_clearly(tiny_model):
    with pytest.raises(ValueError, match="empty"):
        tiny_model.generate(input_ids=torch.zeros(1, 0, dtype=torch.long), max_new_tokens=2)


def test_learned_positions_refuse_inputs_longer_than_their_table():
    config = VanillaTransformerConfig.from_preset("tiny", position_embedding_type="learned", max_position_embeddings=8)
    model = build(config)
    with pytest.raises(ValueError, match="max_position_embeddings=8"):
        model(input_ids=torch.randint(4, 128, (1, 9)), decoder_input_ids=torch.tensor([[1]]))


@pytest.mark.parametrize("mask_length", [5, 9])
def test_generate_refuses_an_attention_mask_of_the_wrong_shape_naming_both_shapes(tiny_model, batch, mask_length):
    """All ones it would be ignored, with zeros broadcast or fail deep in torch: either way refused, naming shapes."""
    wrong = torch.ones(2, mask_length, dtype=torch.long)
    with pytest.raises(ValueError, match=rf"`attention_mask` has shape \(2, {mask_length}\) but `input_ids`"):
        tiny_model.generate(input_ids=batch["input_ids"], attention_mask=wrong, num_beams=1)


@pytest.mark.parametrize("model_class", [VanillaTransformerModel, VanillaTransformerForConditionalGeneration])
def test_a_checkpoint_without_the_shared_embedding_reports_it_missing(tiny_config, tmp_path, model_class):
    """transformers' convention: a weight the checkpoint lacks is listed in `missing_keys` (and warned about), for
    every model class, instead of loading random embeddings silently."""
    from safetensors.torch import load_file, save_file

    model_class(tiny_config).save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    save_file({k: v for k, v in weights.items() if "shared" not in k}, tmp_path / "model.safetensors", {"format": "pt"})
    for loader in [VanillaTransformerModel, VanillaTransformerForConditionalGeneration]:
        loaded, info = loader.from_pretrained(tmp_path, output_loading_info=True)
        prefix = "" if loader is VanillaTransformerModel else "model."
        assert f"{prefix}shared.weight" in info["missing_keys"], loader.__name__
        base = loaded.model if prefix else loaded
        assert base.encoder.embed_tokens.weight is base.shared.weight is base.decoder.embed_tokens.weight


PREVIOUS_RELEASE = Path(__file__).parent / "data" / "previous-release"


@pytest.mark.parametrize("folder", ["cpu-trained", "attention-bias"])
def test_a_folder_saved_by_the_previous_release_loads_and_translates_exactly_as_before(folder, tmp_path):
    """tests/data/previous-release/README.md: one folder with the speed-only `dropout_implementation` field, one
    from before `attention_bias` existed (projections with biases)."""
    saved = PREVIOUS_RELEASE / folder
    expected = json.loads((saved / "expected_translations.json").read_text())
    model = AutoModelForSeq2SeqLM.from_pretrained(saved).eval()
    assert isinstance(model, VanillaTransformerForConditionalGeneration)
    assert model.config.attention_bias is (folder == "attention-bias")
    assert (model.config.d_k, model.config.d_v) == (None, None)  # d_model / h, as these folders were trained
    sources = torch.tensor(expected["input_ids"])
    mask = (sources != model.config.pad_token_id).long()
    with CaptureLogger(logging.get_logger("transformers.generation.utils")) as captured:
        greedy = model.generate(sources, attention_mask=mask, num_beams=1, max_new_tokens=12)
        beam = model.generate(sources, attention_mask=mask, max_new_tokens=12)
    assert greedy.tolist() == expected["greedy"]
    assert beam.tolist() == expected["beam_4"]
    assert "max_length" not in captured.out  # no warning about two lengths
    model.save_pretrained(tmp_path)  # saved again: the model's fields only, and only the model's code
    assert "dropout_implementation" not in json.loads((tmp_path / "config.json").read_text())
    assert not {"dropout.py", "input_checks.py"} & {path.name for path in tmp_path.iterdir()}


# The initialisation: fairseq's for this post-norm model (docs/experiments/fairseq.md), recomputed from its formulas.


@pytest.mark.parametrize("head_sizes", [{}, dict(d_k=16, d_v=48)], ids=["d_model/h", "d_k-16-d_v-48"])
@pytest.mark.parametrize("attention_bias", [False, True])
def test_initialisation_is_fairseqs(attention_bias, head_sizes):
    """Embeddings N(0, d_model^-0.5); query, key and value projections Xavier-uniform with gain 1/sqrt(2); output
    projections Xavier-uniform with zero biases; feed-forward weights and biases uniform in +-1/sqrt(fan_in) (torch's
    nn.Linear default); LayerNorms ones and zeros. Checked by bounds and by the standard deviation a uniform
    distribution on those bounds has, on a model large enough for the statistics to be tight. Xavier's bound,
    sqrt(6 / (fan_in + fan_out)), follows the projections' shapes where d_k and d_v are not d_model / h."""
    torch.manual_seed(0)
    d_model, d_ff = 256, 512
    config = make_tiny_config(d_model=d_model, encoder_ffn_dim=d_ff, decoder_ffn_dim=d_ff, vocab_size=4000,
                              attention_bias=attention_bias, **head_sizes)
    model = VanillaTransformerForConditionalGeneration(config)

    def assert_uniform(tensor, bound):
        assert tensor.abs().max() <= bound
        assert tensor.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05)

    heads = config.encoder_attention_heads
    d_k, d_v = head_sizes.get("d_k", d_model // heads), head_sizes.get("d_v", d_model // heads)
    xavier_k, xavier_v = math.sqrt(6 / (d_model + heads * d_k)), math.sqrt(6 / (d_model + heads * d_v))
    layer = model.model.decoder.layers[0]
    for attention in (layer.self_attn, layer.encoder_attn, model.model.encoder.layers[0].self_attn):
        assert_uniform(attention.q_proj.weight, xavier_k / math.sqrt(2))
        assert_uniform(attention.k_proj.weight, xavier_k / math.sqrt(2))
        assert_uniform(attention.v_proj.weight, xavier_v / math.sqrt(2))
        assert_uniform(attention.out_proj.weight, xavier_v)
        if attention_bias:
            assert not attention.out_proj.bias.any()
    for fc, fan_in in ((layer.fc1, d_model), (layer.fc2, d_ff)):
        assert_uniform(fc.weight, fan_in**-0.5)
        assert_uniform(fc.bias, fan_in**-0.5)
    embedding = model.get_input_embeddings().weight
    assert embedding[1:].std().item() == pytest.approx(d_model**-0.5, rel=0.02)
    assert not embedding[config.pad_token_id].any()
    assert torch.equal(layer.final_layer_norm.weight, torch.ones(d_model))
    assert not layer.final_layer_norm.bias.any()
