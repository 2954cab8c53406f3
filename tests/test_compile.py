"""Compiled decoding: a cached decoding step on a static cache compiles with `fullgraph=True` (no graph break) into one
graph reused at every position, and gives eager's logits; `generate()` inside `compiled_decoding` gives eager's tokens
in greedy and beam search, call after call, with one compiled graph per shape."""

import pytest
import torch
import torch.nn.functional as F
from conftest import make_tiny_config, tiny_config_for
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters
from transformers import DataCollatorForSeq2Seq
from transformers.cache_utils import EncoderDecoderCache, StaticCache

from vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer.training.batch_samplers import TokenBatchSampler
from vanilla_transformer.inference.compiled_decoding import GENERATE_KWARGS, bucket_length, compiled_decoding, default_mode
from vanilla_transformer.training.trainer import label_smoothed_cross_entropy
from vanilla_transformer.inference.translate import translate_lines


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Graphs compiled by another test (same model class and shapes) would hide a compilation from the counts."""
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def static_cache(config, max_length: int, source_length: int) -> EncoderDecoderCache:
    return EncoderDecoderCache(
        StaticCache(config=config, max_cache_len=max_length), StaticCache(config=config, max_cache_len=source_length)
    )


@pytest.mark.slow
def test_a_cached_decoding_step_compiles_without_graph_breaks_and_equals_eager(tiny_model, batch):
    source = dict(attention_mask=batch["attention_mask"])
    targets = batch["decoder_input_ids"][:1].repeat(2, 1)  # unpadded: the step takes no decoder mask, as in generate()
    with torch.no_grad():
        full = tiny_model(input_ids=batch["input_ids"], **source, decoder_input_ids=targets).logits
        source["encoder_outputs"] = tiny_model.get_encoder()(input_ids=batch["input_ids"], **source)
        cache = static_cache(tiny_model.config, max_length=8, source_length=batch["input_ids"].shape[1])
        # The first step runs eagerly: it allocates the static cache and projects the encoder output into it.
        tiny_model(**source, decoder_input_ids=targets[:, :1], cache=cache, use_cache=True)

        counter = CompileCounterWithBackend("inductor")
        step = torch.compile(tiny_model.forward, backend=counter, fullgraph=True, dynamic=False)
        for position in range(1, targets.shape[1]):
            out = step(**source, decoder_input_ids=targets[:, position : position + 1], cache=cache, use_cache=True)
            torch.testing.assert_close(out.logits[:, 0], full[:, position], atol=1e-5, rtol=1e-5)
    assert counter.frame_count == 1  # one graph, for every position: the position is a tensor, not a constant
    assert int(cache.get_seq_length()) == targets.shape[1]


def bucketed(input_ids: torch.Tensor) -> dict:
    """Sources padded (with id 0) to the next multiple of 16 tokens, as translate_lines(compile=True) pads them."""
    padding = (0, bucket_length(input_ids.shape[1]) - input_ids.shape[1])
    return dict(input_ids=F.pad(input_ids, padding), attention_mask=F.pad(torch.ones_like(input_ids), padding))


@pytest.mark.slow
@pytest.mark.parametrize("num_beams", [1, 4])
def test_generate_with_compiled_steps_gives_eagers_tokens_call_after_call(tiny_model, num_beams):
    """Two calls of the same shapes (the second reuses the first's graph) and a third of another source length."""
    generator = torch.Generator().manual_seed(3)
    sources = [torch.randint(4, 128, (3, length), generator=generator) for length in (9, 11, 20)]
    forced = dict(num_beams=num_beams, min_new_tokens=10, max_new_tokens=10)
    eager = [tiny_model.generate(input_ids=ids, **forced) for ids in sources]
    with torch.inference_mode(), compiled_decoding(tiny_model, mode="default"):
        compiled = [tiny_model.generate(**bucketed(ids), **forced, **GENERATE_KWARGS) for ids in sources]
    for eager_tokens, compiled_tokens in zip(eager, compiled):
        assert torch.equal(compiled_tokens, eager_tokens)
    assert counters["stats"]["unique_graphs"] == 2  # sources of 9 and 11 tokens share the 16-token graph
    assert "forward" not in vars(tiny_model)  # the eager forward is back


@pytest.mark.parametrize("num_beams", [1, 4])
def test_the_static_cache_holds_keys_and_values_of_their_own_sizes(num_beams):
    """Table 3 row (B)'s shape (d_k 4 < d_v 8): a static cache sizes its keys and values apart, from the first
    step's, and decodes as the dynamic cache does."""
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(make_tiny_config(d_k=4)).eval()
    source = torch.randint(4, 128, (3, 9), generator=torch.Generator().manual_seed(3))
    forced = dict(num_beams=num_beams, min_new_tokens=10, max_new_tokens=10)
    dynamic = model.generate(input_ids=source, **forced)
    static = model.generate(input_ids=source, **forced, **GENERATE_KWARGS, return_dict_in_generate=True)
    assert torch.equal(static.sequences, dynamic)
    self_attention = static.cache.self_attention_cache.layers[0]
    assert (self_attention.keys.shape[-1], self_attention.values.shape[-1]) == (4, 8)


@pytest.mark.slow
def test_compiled_steps_of_a_model_with_keys_smaller_than_values_give_eagers_tokens():
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(make_tiny_config(d_k=4, d_v=12)).eval()
    source = torch.randint(4, 128, (3, 9), generator=torch.Generator().manual_seed(3))
    forced = dict(num_beams=4, min_new_tokens=10, max_new_tokens=10)
    eager = model.generate(input_ids=source, **forced)
    with torch.inference_mode(), compiled_decoding(model, mode="default"):
        compiled = model.generate(**bucketed(source), **forced, **GENERATE_KWARGS)
    assert torch.equal(compiled, eager)


def test_the_default_mode_uses_cuda_graphs_on_a_gpu_only():
    assert default_mode("cuda:0") == "reduce-overhead"
    assert default_mode("cpu") == "default"


# --- A trained model ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def number_words_model(number_words_model_dir):
    """conftest's trained number-words model: trained weights make peaked, length-dependent scores, where beam
    search's choices and early ends differ from a random model's."""
    return VanillaTransformerForConditionalGeneration.from_pretrained(number_words_model_dir).eval()


@pytest.mark.slow
@pytest.mark.parametrize("num_beams", [1, 4])
def test_a_trained_model_translates_alike_with_the_static_cache_and_compiled(number_words_model, tokenizer, corpus,
                                                                              num_beams):
    """The number-words model on held-out numbers: the static cache, and compiled steps on it (`translate_lines(...,
    compile=True)`, as `translate --compile` runs), give the default cache's translations, which are mostly right."""
    pairs = corpus["test"]["translation"]
    sources, references = [pair["en"] for pair in pairs], [pair["fr"] for pair in pairs]
    decoding = dict(batch_size=8, num_beams=num_beams)
    dynamic = translate_lines(number_words_model, tokenizer, sources, **decoding)
    static = translate_lines(number_words_model, tokenizer, sources, **decoding, cache_implementation="static")
    compiled = translate_lines(number_words_model, tokenizer, sources, **decoding, compile=True)
    assert static == dynamic
    assert compiled == dynamic
    exact = sum(hypothesis == reference for hypothesis, reference in zip(dynamic, references))
    assert exact >= len(references) // 2, (exact, list(zip(dynamic, references))[:5])


# --- Training on bucketed shapes ------------------------------------------------------------------------------------


def compilations_per_epoch(tokenized, tokenizer, sampler_multiple, collator_multiple, epochs=2) -> list[int]:
    """The graphs compiled by the end of each epoch of training steps on token batches: forward (compiled with
    static shapes, one graph per batch shape, as dynamo's tracing sees them), the recipe's label-smoothed loss,
    backward and an Adam step, as the Trainer runs them. A tiny model of one layer each side: dynamo's tracing,
    which decides recompilation, takes long on a CPU; the counting backend runs the traced graphs eagerly."""
    torch.manual_seed(0)
    config = tiny_config_for(tokenizer, encoder_layers=1, decoder_layers=1)
    model = VanillaTransformerForConditionalGeneration(config).train()
    counter = CompileCounterWithBackend("eager")
    step = torch.compile(model, backend=counter, dynamic=False)
    loss_function = label_smoothed_cross_entropy(0.1)
    optimizer = torch.optim.Adam(model.parameters())
    sampler = TokenBatchSampler.from_dataset(tokenized, max_tokens=512, seed=0, pad_to_multiple_of=sampler_multiple)
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, pad_to_multiple_of=collator_multiple)
    compiled = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for indices in sampler:
            batch = collator([tokenized[index] for index in indices])
            labels = batch.pop("labels")
            loss_function(step(**batch, use_cache=False), labels).backward()
            optimizer.step()
            optimizer.zero_grad()
        compiled.append(counter.frame_count)
    return compiled


@pytest.mark.slow
def test_a_compiled_training_step_compiles_nothing_after_the_first_epoch_on_bucketed_shapes(tokenized, tokenizer):
    """Lengths rounded up to multiples of 8 by the sampler and the collator alike (the train command's batches on a
    GPU): one graph per bucketed shape, all of them in the first epoch. With the same batches padded to their longest
    pair instead, every epoch mixes the pairs of a bucket anew and brings shapes not seen before: the second epoch
    compiles again."""
    train = tokenized["train"]
    with torch._dynamo.config.patch(recompile_limit=64):
        bucketed = compilations_per_epoch(train, tokenizer, sampler_multiple=8, collator_multiple=8)
        unbucketed = compilations_per_epoch(train, tokenizer, sampler_multiple=8, collator_multiple=None)
    assert bucketed[1] == bucketed[0] <= 8, bucketed
    assert unbucketed[1] > unbucketed[0] > bucketed[0], unbucketed
    assert counters["graph_break"] == {}  # one graph per step: the model traces whole
