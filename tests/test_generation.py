"""generate(): every decoding mode, the cache, and section 6.1's decoding (beam 4, GNMT length penalty 0.6,
maximum output length source + 50), checked against brute force and against single-sentence decoding."""

import itertools
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from conftest import make_tiny_config
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

from vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer.model.generation_vanilla_transformer import (
    MaxLengthOverSourceLogitsProcessor,
    gnmt_length_penalty,
)

EOS = 2


class DiscourageEOS(LogitsProcessor):
    """Makes </s> very unlikely but not impossible, so only a length limit ends a sentence."""

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        scores[:, EOS] = -1e4
        return scores


def generated_lengths(sequences):
    """Generated tokens per row up to and including the first </s> (the decoder start token excluded)."""
    generated = sequences[:, 1:]
    is_eos = generated == EOS
    return torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, generated.shape[1])


def strip(sequence):
    """A generated row without its padding after </s>."""
    tokens = sequence.tolist()
    return tokens[: tokens.index(EOS) + 1] if EOS in tokens else tokens


def test_saved_generation_config_is_the_papers_decoding(tiny_model, tmp_path):
    tiny_model.save_pretrained(tmp_path)
    loaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path).generation_config
    assert (loaded.num_beams, loaded.length_penalty, loaded.early_stopping) == (4, 0.6, "never")
    assert (loaded.length_penalty_type, loaded.max_length_over_source) == ("gnmt", 50)
    assert loaded.max_length is None and loaded.max_new_tokens is None


def generate_warnings(model, **kwargs) -> tuple[torch.Tensor, str]:
    """`model.generate(**kwargs)` and what transformers' generation module logged meanwhile."""
    generation_logger = logging.get_logger("transformers.generation.utils")
    with CaptureLogger(generation_logger) as captured:
        out = model.generate(**kwargs)
    return out, captured.out


@pytest.mark.parametrize("num_beams", [1, 4])
def test_a_stored_max_length_neither_warns_nor_changes_what_decides_the_length(tiny_model, batch, num_beams):
    """Folders saved by `train` runs before the trainer kept the generation config carry transformers' default
    `max_length` 20: the source + 50 limit, or the call's `max_new_tokens`, still decides, and transformers says
    nothing about two lengths."""
    inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], num_beams=num_beams,
                  logits_processor=LogitsProcessorList([DiscourageEOS()]))
    clean = [generate_warnings(tiny_model, **inputs, **length) for length in ({}, dict(max_new_tokens=30))]
    tiny_model.generation_config.max_length = 20
    stored = [generate_warnings(tiny_model, **inputs, **length) for length in ({}, dict(max_new_tokens=30))]
    for (clean_out, clean_logged), (stored_out, stored_logged) in zip(clean, stored):
        assert "max_length" not in clean_logged + stored_logged
        assert torch.equal(stored_out, clean_out)
    assert generated_lengths(stored[0][0]).tolist() == (batch["attention_mask"].sum(1) + 50).tolist()
    assert stored[1][0].shape[1] == 1 + 30


@pytest.mark.parametrize("num_beams", [1, 4])
def test_default_maximum_length_is_source_length_plus_50(tiny_model, batch, num_beams):
    inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    out = tiny_model.generate(**inputs, num_beams=num_beams, logits_processor=LogitsProcessorList([DiscourageEOS()]))
    source_lengths = batch["attention_mask"].sum(1)  # 7 and 4 tokens
    assert generated_lengths(out).tolist() == (source_lengths + 50).tolist()
    assert (out[:, 1:].gather(1, (source_lengths + 49)[:, None]) == EOS).all()


def test_a_length_set_in_the_call_replaces_source_plus_50(tiny_model, batch):
    inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    out = tiny_model.generate(**inputs, max_new_tokens=9, logits_processor=[DiscourageEOS()])
    assert out.shape[1] == 1 + 9
    off = tiny_model.generate(**inputs, max_length_over_source=None, max_new_tokens=12, logits_processor=[DiscourageEOS()])
    assert off.shape[1] == 1 + 12


@pytest.mark.parametrize(
    "decoding",
    [dict(num_beams=1), dict(num_beams=4), dict(num_beams=4, length_penalty_type="transformers"), dict(num_beams=3)],
)
def test_batched_generation_equals_generating_each_sentence_alone(tiny_model, decoding):
    generator = torch.Generator().manual_seed(3)
    lengths = [9, 3, 6, 1]
    input_ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, length in enumerate(lengths):
        input_ids[row, :length] = torch.randint(4, 128, (length,), generator=generator)
        attention_mask[row, :length] = 1
    batched = tiny_model.generate(input_ids=input_ids, attention_mask=attention_mask, **decoding)
    for row, length in enumerate(lengths):
        alone = tiny_model.generate(input_ids=input_ids[row : row + 1, :length], **decoding)
        assert strip(batched[row]) == strip(alone[0])


def test_decoding_modes(tiny_model, batch):
    inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    greedy = tiny_model.generate(**inputs, num_beams=1, max_new_tokens=8)
    greedy_uncached = tiny_model.generate(**inputs, num_beams=1, max_new_tokens=8, use_cache=False)
    assert torch.equal(greedy, greedy_uncached)
    # The cache generate() hands the model (named `cache` since transformers 5.24) is the one the model extends:
    # 40 forced steps, greedy and beam, give what re-running the whole prefix at every step gives.
    # The scores, not just the tokens: a random model's arg-max barely depends on the context.
    for num_beams in (1, 4):
        forced = dict(num_beams=num_beams, min_new_tokens=40, max_new_tokens=40, return_dict_in_generate=True,
                      output_scores=True)
        cached = tiny_model.generate(**inputs, **forced)
        uncached = tiny_model.generate(**inputs, **forced, use_cache=False)
        assert cached.sequences.shape[1] == 41 and torch.equal(cached.sequences, uncached.sequences)
        torch.testing.assert_close(torch.stack(cached.scores), torch.stack(uncached.scores), atol=1e-4, rtol=1e-4)
    # Greedy picks the arg-max of the model's own next-token distribution at every step.
    logits = tiny_model(**inputs, decoder_input_ids=greedy[:, :-1]).logits
    alive = torch.ones(2, dtype=torch.bool)
    for step in range(greedy.shape[1] - 1):
        assert torch.equal(logits[alive, step].argmax(-1), greedy[alive, step + 1])
        alive &= greedy[:, step + 1] != EOS

    beams = tiny_model.generate(**inputs, num_return_sequences=4, return_dict_in_generate=True, output_scores=True)
    assert beams.sequences.shape[0] == 8 and beams.sequences_scores.shape == (8,)
    assert (beams.sequences_scores.view(2, 4).diff(dim=1) <= 1e-6).all()  # best first

    torch.manual_seed(0)
    sampled = tiny_model.generate(**inputs, do_sample=True, num_beams=1, top_k=10, num_return_sequences=3)
    torch.manual_seed(0)
    again = tiny_model.generate(**inputs, do_sample=True, num_beams=1, top_k=10, num_return_sequences=3)
    assert sampled.shape[0] == 6 and torch.equal(sampled, again)

    scored = tiny_model.generate(**inputs, num_beams=1, max_new_tokens=5, return_dict_in_generate=True, output_scores=True)
    assert len(scored.scores) == scored.sequences.shape[1] - 1 and scored.scores[0].shape == (2, 128)


def test_encoder_runs_once_and_cross_attention_projects_once(tiny_model, batch):
    calls = {"encoder": 0, "cross_k": 0, "self_k": 0}

    def count(name):
        def hook(*_):
            calls[name] += 1

        return hook

    tiny_model.model.encoder.register_forward_hook(count("encoder"))
    tiny_model.model.decoder.layers[0].encoder_attn.k_proj.register_forward_hook(count("cross_k"))
    tiny_model.model.decoder.layers[0].self_attn.k_proj.register_forward_hook(count("self_k"))
    out = tiny_model.generate(input_ids=batch["input_ids"], num_beams=4, max_new_tokens=6, min_new_tokens=6)
    assert out.shape[1] == 7
    assert calls == {"encoder": 1, "cross_k": 1, "self_k": 6}


def test_beam_search_reorders_only_the_self_attention_cache(tiny_model, batch, monkeypatch):
    """transformers' beam search hands the cache to the model's `_reorder_cache` after every step (fails if it stops):
    ours reorders the self-attention cache only, the encoder-decoder attention's keys and values are never copied,
    and the beams are those of decoding without a cache."""
    inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], num_beams=4, max_new_tokens=8,
                  return_dict_in_generate=True, output_scores=True)
    model_class = type(tiny_model)
    ours = model_class._reorder_cache
    cross_keys_kept = []

    def watched(self, cache, beam_idx):
        keys = [layer.keys for layer in cache.cross_attention_cache.layers]
        cache = ours(self, cache, beam_idx)
        cross_keys_kept.append(all(layer.keys is key for layer, key in zip(cache.cross_attention_cache.layers, keys)))
        return cache

    monkeypatch.setattr(model_class, "_reorder_cache", watched)
    kept = tiny_model.generate(**inputs)
    assert len(cross_keys_kept) >= 7 and all(cross_keys_kept)  # called at every step, and never copied
    uncached = tiny_model.generate(**inputs, use_cache=False)
    assert torch.equal(kept.sequences, uncached.sequences)
    torch.testing.assert_close(kept.sequences_scores, uncached.sequences_scores, atol=1e-5, rtol=1e-5)

    # transformers' default for a cache without the hook: reorder every layer, cross-attention included.
    monkeypatch.setattr(model_class, "_reorder_cache", lambda self, cache, beam_idx: cache.reorder_cache(beam_idx) or cache)
    copied = tiny_model.generate(**inputs)
    assert torch.equal(kept.sequences, copied.sequences)
    torch.testing.assert_close(kept.sequences_scores, copied.sequences_scores)


def all_finished_hypotheses(model, input_ids, max_tokens):
    """Brute force: every output of at most max_tokens tokens ending with </s>, with its log-probability."""
    words = [token for token in range(model.config.vocab_size) if token != EOS]
    hypotheses = [list(prefix) + [EOS] for n in range(max_tokens) for prefix in itertools.product(words, repeat=n)]
    scores = []
    for hypothesis in hypotheses:
        decoder_input_ids = torch.tensor([[1] + hypothesis[:-1]])
        log_probs = model(input_ids=input_ids, decoder_input_ids=decoder_input_ids).logits.log_softmax(-1)
        scores.append(log_probs[0].gather(1, torch.tensor(hypothesis)[:, None]).sum().item())
    return hypotheses, torch.tensor(scores)


@pytest.mark.parametrize("length_penalty_type", ["gnmt", "transformers"])
def test_length_penalty_matches_brute_force_rescoring(length_penalty_type):
    torch.manual_seed(0)
    config = make_tiny_config(vocab_size=6)
    model = VanillaTransformerForConditionalGeneration(config).eval()
    input_ids = torch.tensor([[4, 5, 5, 4, 2]])
    max_tokens, alpha = 3, 0.6

    hypotheses, log_probs = all_finished_hypotheses(model, input_ids, max_tokens)
    lengths = torch.tensor([len(hypothesis) for hypothesis in hypotheses], dtype=torch.float)
    penalties = {"gnmt": gnmt_length_penalty(lengths, alpha), "transformers": lengths**alpha}
    rankings = {name: (log_probs / penalty).sort(descending=True) for name, penalty in penalties.items()}
    # The two penalties rank these hypotheses differently: beam search must apply the one asked for (for GNMT, through
    # the `_update_finished_beams` hook), or this test fails.
    assert rankings["gnmt"].indices[:5].tolist() != rankings["transformers"].indices[:5].tolist()
    expected = rankings[length_penalty_type]

    # A beam wider than the number of prefixes makes beam search exhaustive: it must rank like brute force.
    out = model.generate(
        input_ids=input_ids,
        num_beams=32,
        num_return_sequences=5,
        length_penalty=alpha,
        length_penalty_type=length_penalty_type,
        max_new_tokens=max_tokens,
        logits_processor=[MaxLengthOverSourceLogitsProcessor(torch.tensor([max_tokens]), EOS)],
        return_dict_in_generate=True,
        output_scores=True,
    )
    assert [strip(row)[1:] for row in out.sequences] == [hypotheses[i] for i in expected.indices[:5]]
    torch.testing.assert_close(out.sequences_scores, expected.values[:5], atol=1e-5, rtol=1e-5)


class ShortOrLong(LogitsProcessor):
    """Two candidate outputs: `[7, </s>]` with log-probability -1.0, and `[7, 8, 8, 8, 8, 8, 8, </s>]` with -2.0."""

    def __call__(self, input_ids, scores):
        position = input_ids.shape[1] - 1
        step = -1.5 / 7
        scores = torch.full_like(scores, -30.0)
        if position == 0:
            scores[:, 7] = -0.5
        elif position == 1:
            scores[:, EOS], scores[:, 8] = -0.5, step
        else:
            scores[:, EOS if position == 7 else 8] = step
        return scores


def test_gnmt_and_transformers_penalties_rank_lengths_differently(tiny_model):
    """transformers: -1.0 / 2^0.6 = -0.66 < -2.0 / 8^0.6 = -0.57, the long output wins. GNMT: -1.0 / (7/6)^0.6 = -0.91
    > -2.0 / (13/6)^0.6 = -1.26, the short one wins."""
    input_ids = torch.tensor([[5, 6, 2]])
    gnmt = tiny_model.generate(input_ids=input_ids, logits_processor=[ShortOrLong()])
    theirs = tiny_model.generate(input_ids=input_ids, length_penalty_type="transformers", logits_processor=[ShortOrLong()])
    assert strip(gnmt[0])[1:] == [7, EOS]
    assert strip(theirs[0])[1:] == [7, 8, 8, 8, 8, 8, 8, EOS]


def test_gnmt_scores_equal_rescored_log_probabilities(tiny_model, batch):
    inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    out = tiny_model.generate(**inputs, max_new_tokens=10, return_dict_in_generate=True, output_scores=True)
    for row, sequence in enumerate(out.sequences):
        hypothesis = strip(sequence)
        log_probs = tiny_model(
            input_ids=inputs["input_ids"][row : row + 1],
            attention_mask=inputs["attention_mask"][row : row + 1],
            decoder_input_ids=torch.tensor([hypothesis[:-1]]),
        ).logits.log_softmax(-1)
        total = log_probs[0].gather(1, torch.tensor(hypothesis[1:])[:, None]).sum()
        expected = total / ((5 + (len(hypothesis) - 1)) / 6) ** 0.6  # Wu et al. (2016), eq. 14
        torch.testing.assert_close(out.sequences_scores[row], expected, atol=1e-5, rtol=1e-5)


class ConfidentModel(LogitsProcessor):
    """A model sure of one translation: each next target token has log-probability -0.01, ending early -5, anything
    else -14 (like a trained model on a deterministic task)."""

    target = [17, 42, 9, 77, 31, 56, 23]

    def __call__(self, input_ids, scores):
        position = input_ids.shape[1] - 1
        scores = torch.full_like(scores, -14.0)
        scores[:, EOS] = -5.0
        scores[:, self.target[position] if position < len(self.target) else EOS] = -0.01
        return scores


@pytest.mark.parametrize("length_penalty_type", ["gnmt", "transformers"])
def test_paper_decoding_does_not_stop_at_short_hypotheses_of_a_confident_model(tiny_model, length_penalty_type):
    """The full translation scores -0.08 and ending after k tokens about -5: the search must keep going until no
    running hypothesis can win (tensor2tensor's rule), not stop once four early endings are finished."""
    input_ids = torch.tensor([[5, 6, 7, 2]])
    out = tiny_model.generate(input_ids=input_ids, length_penalty_type=length_penalty_type, logits_processor=[ConfidentModel()])
    assert strip(out[0])[1:] == ConfidentModel.target + [EOS]
    stopped_at_four = tiny_model.generate(
        input_ids=input_ids, early_stopping=True, length_penalty_type=length_penalty_type, logits_processor=[ConfidentModel()]
    )
    assert len(strip(stopped_at_four[0])) < len(ConfidentModel.target) + 2  # transformers' True: a short one wins


def test_unknown_length_penalty_type_is_refused(tiny_model, batch):
    with pytest.raises(ValueError, match="length_penalty_type"):
        tiny_model.generate(input_ids=batch["input_ids"], length_penalty_type="fairseq")


@pytest.mark.parametrize("bad_id", [128, 1000, -3])
def test_generate_refuses_token_ids_outside_the_vocabulary_naming_them(tiny_model, bad_id):
    with pytest.raises(ValueError, match=rf"`input_ids` contains token id {bad_id}, outside the vocabulary \[0, 128\)"):
        tiny_model.generate(input_ids=torch.tensor([[5, bad_id, 2]]), num_beams=1)
    with pytest.raises(ValueError, match=rf"`input_ids` contains token id {bad_id}"):
        tiny_model.generate(torch.tensor([[5, bad_id, 2]]))  # the ids as `inputs`
    with pytest.raises(ValueError, match=rf"`decoder_input_ids` contains token id {bad_id}"):
        tiny_model.generate(input_ids=torch.tensor([[5, 6, 2]]), decoder_input_ids=torch.tensor([[1, bad_id]]))


def test_generate_refuses_an_empty_source(tiny_model):
    with pytest.raises(ValueError, match=r"`input_ids` is empty \(shape \(1, 0\)\)"):
        tiny_model.generate(input_ids=torch.zeros(1, 0, dtype=torch.long))


@pytest.mark.parametrize("mask_length", [5, 9])
def test_generate_refuses_a_mask_of_the_wrong_shape_naming_both_shapes(tiny_model, batch, mask_length):
    """All ones, a wrong mask would be ignored; with zeros, broadcast or fail deep in torch: refused before decoding."""
    wrong = torch.ones(2, mask_length, dtype=torch.long)
    message = rf"`attention_mask` has shape \(2, {mask_length}\) but `input_ids` has shape \(2, 7\)"
    with pytest.raises(ValueError, match=message):
        tiny_model.generate(input_ids=batch["input_ids"], attention_mask=wrong, num_beams=1)
    with pytest.raises(ValueError, match=message):
        tiny_model.generate(batch["input_ids"], attention_mask=wrong)
    embeds = tiny_model.get_input_embeddings()(batch["input_ids"])
    with pytest.raises(ValueError, match=r"`attention_mask` has shape .* but `inputs_embeds` has shape \(2, 7\)"):
        tiny_model.generate(inputs_embeds=embeds, attention_mask=wrong)
    encoder_outputs = tiny_model.get_encoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    with pytest.raises(ValueError, match=r"`attention_mask` has shape .* but `encoder_outputs` has shape \(2, 7\)"):
        tiny_model.generate(encoder_outputs=encoder_outputs, attention_mask=wrong)
    with pytest.raises(ValueError, match=r"`decoder_attention_mask` has shape \(2, 5\) but `decoder_input_ids`"):
        tiny_model.generate(
            input_ids=batch["input_ids"], decoder_input_ids=batch["decoder_input_ids"], decoder_attention_mask=wrong[:, :5]
        )


# Settings whose outputs differ on ShortOrLong: the short output wins under the first and last, the long one otherwise.
PENALTY_SETTINGS = [("gnmt", 0.6), ("transformers", 0.6), ("gnmt", 2.0), ("transformers", 0.0)]


def test_concurrent_generate_calls_with_different_settings_equal_serial_calls(tiny_model):
    """Nothing per call is stored on the model: threads sharing one model and decoding with different length
    penalties get exactly what each setting gives alone."""
    input_ids = torch.tensor([[5, 6, 2], [9, 10, 2]])

    def decode(setting):
        length_penalty_type, alpha = setting
        out = tiny_model.generate(
            input_ids=input_ids,
            length_penalty_type=length_penalty_type,
            length_penalty=alpha,
            logits_processor=[ShortOrLong()],
            return_dict_in_generate=True,
            output_scores=True,
        )
        return out.sequences.tolist(), out.sequences_scores.tolist()

    serial = {setting: decode(setting) for setting in PENALTY_SETTINGS}
    assert serial[PENALTY_SETTINGS[0]][0] != serial[PENALTY_SETTINGS[1]][0]  # the settings do decode differently
    assert len({str(result) for result in serial.values()}) == len(PENALTY_SETTINGS)

    barrier = threading.Barrier(len(PENALTY_SETTINGS))

    def decode_repeatedly(setting):
        barrier.wait()
        return [decode(setting) for _ in range(6)]

    with ThreadPoolExecutor(len(PENALTY_SETTINGS)) as pool:
        concurrent = dict(zip(PENALTY_SETTINGS, pool.map(decode_repeatedly, PENALTY_SETTINGS)))
    for setting, results in concurrent.items():
        assert results == [serial[setting]] * 6, setting


class TwoEarlyEndings(LogitsProcessor):
    """Two beams. `[</s>]` (log-probability -0.2) and `[7, </s>]` (-0.15) finish in the first two steps; after them
    every running hypothesis loses 0.05 or more per token and never ends, so only the early-stop bound stops the
    search before `max_new_tokens`: the best running hypothesis is 7 7 7 ..., at -0.2 - 0.05 (t - 2) after t tokens."""

    endings = {(EOS,): -0.2, (7, EOS): -0.15}

    def __call__(self, input_ids, scores):
        position = input_ids.shape[1] - 1
        scores = torch.full_like(scores, -30.0)
        if position == 0:
            scores[:, 7], scores[:, EOS], scores[:, 8] = -0.1, -0.2, -0.3
        elif position == 1:
            scores[:, 7], scores[:, EOS], scores[:, 8] = -0.1, -0.05, -0.35
        else:
            scores[:, 7], scores[:, 8] = -0.05, -0.06
        return scores

    @classmethod
    def predicted_steps(cls, penalty, early_stopping, max_new_tokens):
        """Decoding steps until no running hypothesis, at its best possible length, can beat the worse finished one:
        the longest length under "never" (a positive alpha), the current one otherwise."""
        worst_finished = min(score / penalty(len(ending)) for ending, score in cls.endings.items())
        for steps in range(2, max_new_tokens):
            best_running = -0.2 - 0.05 * (steps - 2)
            if best_running / penalty(max_new_tokens if early_stopping == "never" else steps) <= worst_finished:
                return steps
        return max_new_tokens


@pytest.mark.parametrize("early_stopping", ["never", False])
def test_beam_search_stops_where_the_length_penaltys_bound_says(tiny_model, early_stopping):
    """The early-stop bound divides the best running score by the same penalty as the finished ones (for GNMT, through
    the `_check_early_stop_heuristic` hook): GNMT's bound stops this search after 8 steps ("never") or 3 (False), while
    transformers' |Y| ** 0.6 runs to the length limit of 20 either way."""
    alpha, max_new_tokens = 0.6, 20
    penalties = {"gnmt": lambda length: gnmt_length_penalty(length, alpha), "transformers": lambda length: length**alpha}
    steps = {}
    for length_penalty_type, penalty in penalties.items():
        out = tiny_model.generate(
            input_ids=torch.tensor([[5, 6, 2]]),
            num_beams=2,
            length_penalty=alpha,
            length_penalty_type=length_penalty_type,
            early_stopping=early_stopping,
            max_new_tokens=max_new_tokens,
            logits_processor=[TwoEarlyEndings()],
            return_dict_in_generate=True,
            output_scores=True,
        )
        steps[length_penalty_type] = len(out.scores)
        assert steps[length_penalty_type] == TwoEarlyEndings.predicted_steps(penalty, early_stopping, max_new_tokens)
        assert strip(out.sequences[0])[1:] == [7, EOS]
    assert steps == {"gnmt": 8 if early_stopping == "never" else 3, "transformers": max_new_tokens}


@pytest.mark.parametrize("num_beams", [1, 4])
def test_a_minimum_length_beyond_source_plus_n_wins_and_the_output_still_ends_with_eos(tiny_model, num_beams):
    """min_new_tokens past the source + N limit: the limit moves to the first position the minimum allows, and the
    output ends with </s> there (not with padding)."""
    input_ids = torch.tensor([[5, 6, 2]])
    out = tiny_model.generate(
        input_ids=input_ids,
        num_beams=num_beams,
        max_length_over_source=2,  # a limit of 3 + 2 = 5 generated tokens
        min_new_tokens=8,
        logits_processor=[DiscourageEOS()],
    )
    generated = out[0, 1:].tolist()
    assert generated.index(EOS) == 8  # the 9th generated token: the first one min_new_tokens allows to be </s>
    assert tiny_model.config.pad_token_id not in generated[:8]


# --- The static cache (compiled decoding's) ------------------------------------------------------------------------


@pytest.mark.parametrize("num_beams", [1, 4])
def test_a_static_cache_gives_the_default_caches_tokens(tiny_model, batch, num_beams):
    """cache_implementation="static": the same tokens and scores as the default cache, at a forced length and with
    section 6.1's source + 50 limit (the paper's defaults otherwise)."""
    inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], num_beams=num_beams,
                  return_dict_in_generate=True, output_scores=True)
    for lengths in (dict(min_new_tokens=30, max_new_tokens=30), {}):
        dynamic = tiny_model.generate(**inputs, **lengths)
        static = tiny_model.generate(**inputs, **lengths, cache_implementation="static")
        assert torch.equal(static.sequences, dynamic.sequences)
        torch.testing.assert_close(torch.stack(static.scores), torch.stack(dynamic.scores), atol=1e-4, rtol=1e-4)


def test_sampling_with_a_static_cache_draws_the_default_caches_tokens(tiny_model, batch):
    inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], do_sample=True, num_beams=1,
                  top_k=10, min_new_tokens=20, max_new_tokens=20)
    torch.manual_seed(0)
    dynamic = tiny_model.generate(**inputs)
    torch.manual_seed(0)
    static = tiny_model.generate(**inputs, cache_implementation="static")
    assert static.shape == (2, 21) and torch.equal(static, dynamic)


def test_beam_search_reorders_a_static_cache_in_place(tiny_model, batch, monkeypatch):
    """A compiled step (or a CUDA graph) keeps the static cache's tensors' addresses: reordering copies into them."""
    model_class = type(tiny_model)
    ours = model_class._reorder_cache
    kept = []

    def watched(self, cache, beam_idx):
        layers = cache.self_attention_cache.layers
        before = [(layer.keys.data_ptr(), layer.values.data_ptr()) for layer in layers]
        cache = ours(self, cache, beam_idx)
        kept.append(before == [(layer.keys.data_ptr(), layer.values.data_ptr()) for layer in layers])
        return cache

    monkeypatch.setattr(model_class, "_reorder_cache", watched)
    tiny_model.generate(input_ids=batch["input_ids"], num_beams=4, min_new_tokens=6, max_new_tokens=6,
                        cache_implementation="static")
    assert len(kept) >= 5 and all(kept)


def test_a_static_cache_takes_positions_beyond_the_precomputed_sinusoids(tiny_model, batch):
    forced = dict(input_ids=batch["input_ids"], num_beams=1, min_new_tokens=12, max_new_tokens=12)
    expected = tiny_model.generate(**forced)
    positions = tiny_model.model.decoder.embed_positions
    positions.table = positions.table[:4]  # positions 4 and on come from a table computed for the cache's length
    assert torch.equal(tiny_model.generate(**forced, cache_implementation="static"), expected)
    assert torch.equal(tiny_model.generate(**forced), expected)


@pytest.mark.parametrize("where", ["call", "generation_config"])
def test_attentions_asked_of_generate_come_back_filled_whatever_the_models_kernel(tiny_model, batch, tmp_path, where):
    # from_pretrained's default kernel is sdpa, which forms no weights: generate switches to eager for the call.
    tiny_model.save_pretrained(tmp_path)
    loaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path).eval()
    eager = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert loaded.config._attn_implementation == "sdpa"
    inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=4,
                  num_beams=2, return_dict_in_generate=True)
    if where == "call":
        inputs["output_attentions"] = True
    else:
        loaded.generation_config.output_attentions = eager.generation_config.output_attentions = True
    outputs, reference = loaded.generate(**inputs), eager.generate(**inputs)
    assert loaded.config._attn_implementation == "sdpa"  # restored after the call
    torch.testing.assert_close(outputs.sequences, reference.sequences, rtol=0, atol=0)
    for name in ("encoder_attentions", "decoder_attentions", "cross_attentions"):
        got, expected = getattr(outputs, name), getattr(reference, name)
        assert len(got) == len(expected) > 0, name
        torch.testing.assert_close(got, expected, msg=name)
    # One tensor a decoder layer at each step, (beams * batch, heads, 1, source length) for the encoder-decoder one.
    assert outputs.cross_attentions[0][0].shape == (4, 4, 1, batch["input_ids"].shape[1])
    assert torch.all(outputs.cross_attentions[1][0].sum(-1).sub(1).abs() < 1e-5)  # softmax rows
