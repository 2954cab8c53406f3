"""The model on a GPU: the same numbers as on the CPU in float32, sane numbers in bfloat16, SDPA's fused kernels equal
to eager attention, cached decoding equal to uncached, and a bf16 Adam step like the float32 one. Skipped without
CUDA (CI has none); run by hand on a GPU machine with `pytest tests/test_cuda.py`."""

import pytest
import torch
import torch.nn.functional as F

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

VOCAB = 1000


@pytest.fixture(autouse=True)
def exact_float32():
    """float32 products in float32 (no TF32), so that the GPU can be compared with the CPU to 1e-4."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def small_model(attn_implementation="sdpa"):
    """d_model 128, 2+2 layers, 4 heads (head size 32, which flash and memory-efficient SDPA kernels take)."""
    config = VanillaTransformerConfig.from_preset(
        "tiny", d_model=128, encoder_ffn_dim=512, decoder_ffn_dim=512, dropout=0.0, vocab_size=VOCAB
    )
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(config).eval()
    model.set_attn_implementation(attn_implementation)
    return model


def padded_batch(batch_size=6, source_length=23, target_length=17):
    """Random sentences, every other one padded to a different length, on the CPU."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(4, VOCAB, (batch_size, source_length), generator=generator)
    decoder_input_ids = torch.randint(4, VOCAB, (batch_size, target_length), generator=generator)
    decoder_input_ids[:, 0] = 1
    attention_mask = torch.ones_like(input_ids)
    decoder_attention_mask = torch.ones_like(decoder_input_ids)
    for row in range(1, batch_size, 2):
        attention_mask[row, source_length - 3 * row :] = 0
        decoder_attention_mask[row, target_length - 2 * row :] = 0
    input_ids[attention_mask == 0] = 0
    decoder_input_ids[decoder_attention_mask == 0] = 0
    return dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
                decoder_attention_mask=decoder_attention_mask)


def on(batch, device):
    return {key: value.to(device) for key, value in batch.items()}


def real_positions(batch):
    """Logit positions of real (not padding) target tokens."""
    return batch["decoder_attention_mask"].bool()


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_float32_logits_on_the_gpu_equal_the_cpus(attn_implementation):
    model, batch = small_model(attn_implementation), padded_batch()
    with torch.inference_mode():
        cpu = model(**batch).logits
        gpu = model.to("cuda")(**on(batch, "cuda")).logits.cpu()
    mask = real_positions(batch)
    torch.testing.assert_close(gpu[mask], cpu[mask], atol=1e-4, rtol=1e-4)


def test_sdpa_fused_kernels_equal_eager_attention_in_bfloat16():
    """No padding mask and a causal decoder: the case where SDPA may pick its flash kernel on a GPU."""
    batch = padded_batch()
    batch = {key: value for key, value in batch.items() if "mask" not in key}
    batch["input_ids"][batch["input_ids"] == 0] = 5
    batch["decoder_input_ids"][batch["decoder_input_ids"] == 0] = 5
    logits = {}
    for implementation in ("eager", "sdpa"):
        model = small_model(implementation).to("cuda", torch.bfloat16)
        with torch.inference_mode():
            logits[implementation] = model(**on(batch, "cuda")).logits.float()
    assert torch.isfinite(logits["sdpa"]).all()
    torch.testing.assert_close(logits["sdpa"], logits["eager"], atol=0.1, rtol=0.05)
    agree = (logits["sdpa"].argmax(-1) == logits["eager"].argmax(-1)).float().mean()
    assert agree > 0.95


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_bfloat16_autocast_keeps_the_float32_predictions(attn_implementation):
    """Padding masks in bf16 must not turn into NaN (a -inf fill) nor flip the model's choices."""
    model, batch = small_model(attn_implementation).to("cuda"), on(padded_batch(), "cuda")
    with torch.inference_mode():
        exact = model(**batch).logits
        with torch.autocast("cuda", dtype=torch.bfloat16):
            mixed = model(**batch).logits.float()
    mask = real_positions(batch)
    assert torch.isfinite(mixed[mask]).all()
    similarity = F.cosine_similarity(mixed[mask], exact[mask], dim=-1)
    assert similarity.min() > 0.999
    assert (mixed[mask].argmax(-1) == exact[mask].argmax(-1)).float().mean() > 0.95


@pytest.mark.parametrize("num_beams", [1, 4])
def test_cached_generation_on_the_gpu_equals_uncached(num_beams):
    model = small_model().to("cuda")
    batch = padded_batch()
    inputs = on(dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]), "cuda")
    forced = dict(num_beams=num_beams, do_sample=False, max_new_tokens=20, min_new_tokens=20,
                  return_dict_in_generate=True, output_scores=True)
    with torch.inference_mode():
        cached = model.generate(**inputs, **forced)
        uncached = model.generate(**inputs, **forced, use_cache=False)
    assert torch.equal(cached.sequences, uncached.sequences)
    torch.testing.assert_close(torch.stack(cached.scores), torch.stack(uncached.scores), atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("num_beams", [1, 4])
def test_compiled_decoding_with_cuda_graphs_gives_eagers_tokens(num_beams):
    """compiled_decoding's GPU mode, reduce-overhead: CUDA graphs replaying the static cache's step, call after call."""
    from vanilla_transformer.inference.compiled_decoding import GENERATE_KWARGS, compiled_decoding

    model, batch = small_model().to("cuda"), padded_batch(source_length=16)
    inputs = on(dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]), "cuda")
    forced = dict(num_beams=num_beams, max_new_tokens=20, min_new_tokens=20)
    with torch.inference_mode():
        eager = model.generate(**inputs, **forced)
        with compiled_decoding(model):
            compiled = [model.generate(**inputs, **forced, **GENERATE_KWARGS) for _ in range(2)]
    assert all(torch.equal(tokens, eager) for tokens in compiled)


def test_gpu_generation_equals_the_cpus():
    model, batch = small_model(), padded_batch()
    inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    forced = dict(num_beams=4, max_new_tokens=15, min_new_tokens=15, return_dict_in_generate=True, output_scores=True)
    with torch.inference_mode():
        cpu = model.generate(**inputs, **forced)
        gpu = model.to("cuda").generate(**on(inputs, "cuda"), **forced)
    assert torch.equal(gpu.sequences.cpu(), cpu.sequences)
    torch.testing.assert_close(gpu.sequences_scores.cpu(), cpu.sequences_scores, atol=1e-4, rtol=1e-4)


def test_a_bfloat16_training_step_on_the_gpu_follows_the_float32_one():
    """One Adam step under bf16 autocast moves the weights like the float32 step does."""
    batch = on(padded_batch(), "cuda")
    labels = batch["decoder_input_ids"][:, 1:].clone()
    labels[batch["decoder_attention_mask"][:, 1:] == 0] = -100
    inputs = dict(batch, decoder_input_ids=batch["decoder_input_ids"][:, :-1],
                  decoder_attention_mask=batch["decoder_attention_mask"][:, :-1])
    updates, losses = {}, {}
    for bf16 in (False, True):
        model = small_model().to("cuda").train()
        before = model.model.shared.weight.detach().clone()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = model(**inputs, labels=labels).loss
        loss.backward()
        optimizer.step()
        losses[bf16], updates[bf16] = loss.item(), (model.model.shared.weight.detach() - before).flatten()
    assert losses[True] == pytest.approx(losses[False], rel=0.02)
    assert F.cosine_similarity(updates[True], updates[False], dim=0) > 0.95
