"""n-best lists with scores and the scoring of given pairs, on every backend, against independent computations:
transformers' own `sequences_scores` of beam search, a teacher-forced pass computed here, and CTranslate2's search and
`score_batch` on the same exported model."""

import functools
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("ctranslate2")

from test_ctranslate2 import SENTENCES, log_probs, saved_model, tokenizer  # noqa: E402,F401 (a fixture)

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration  # noqa: E402
from vanilla_transformer.backends.ctranslate2.export import export_ctranslate2  # noqa: E402
from vanilla_transformer.backends.table import BACKENDS, SCORERS  # noqa: E402
from vanilla_transformer.cli.main import main  # noqa: E402
from vanilla_transformer.inference.hypotheses import EMPTY, Hypothesis  # noqa: E402
from vanilla_transformer.inference.translate import translate_lines  # noqa: E402
from vanilla_transformer.model.decoding_vanilla_transformer import gnmt_length_penalty  # noqa: E402

LINES = [SENTENCES[0], "", SENTENCES[1], SENTENCES[3], SENTENCES[6]]


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tokenizer):  # noqa: F811
    """A random model whose outputs vary and end (test_ctranslate2's lively model) and its CTranslate2 export."""
    root = tmp_path_factory.mktemp("nbest")
    model_dir = saved_model(root / "model", tokenizer, lively=True, attention_bias=True, normalize_before=True,
                            position_embedding_type="learned", max_position_embeddings=128)
    return model_dir, export_ctranslate2(model_dir, root / "ct2")


@pytest.fixture(scope="module")
def backends(folders):
    model_dir, ct2_dir = folders
    return BACKENDS["torch"](model_dir, "cpu"), BACKENDS["ct2"](ct2_dir, "cpu")


def test_nbest_scores_are_beam_searchs_own_sequences_scores(folders, tokenizer):  # noqa: F811
    model_dir, _ = folders
    model = VanillaTransformerForConditionalGeneration.from_pretrained(model_dir).eval()
    translate = BACKENDS["torch"](model_dir, "cpu")
    for settings in (dict(), dict(length_penalty_type="transformers", length_penalty=1.0, early_stopping=True)):
        found = translate([SENTENCES[1], SENTENCES[3]], nbest=4, **settings)
        for line, hypotheses in zip([SENTENCES[1], SENTENCES[3]], found):
            outputs = model.generate(**tokenizer(line, return_tensors="pt"), num_return_sequences=4,
                                     output_scores=True, return_dict_in_generate=True, **settings)
            texts = [text.strip() for text in tokenizer.batch_decode(outputs.sequences, skip_special_tokens=True)]
            assert [h.text for h in hypotheses] == texts
            assert [h.score for h in hypotheses] == pytest.approx(outputs.sequences_scores.tolist(), abs=1e-4)
            scores = [h.score for h in hypotheses]
            assert scores == sorted(scores, reverse=True) and len(set(texts)) == 4


def test_a_hypothesis_score_is_its_log_probability_over_the_length_penalty(backends):
    translate, _ = backends
    for hypothesis in translate([SENTENCES[0]], nbest=3, token_scores=True)[0]:
        assert hypothesis.tokens[-1] == "</s>" and len(hypothesis.tokens) == len(hypothesis.token_scores)
        assert hypothesis.log_probability == pytest.approx(math.fsum(hypothesis.token_scores), abs=1e-6)
        penalty = gnmt_length_penalty(len(hypothesis.tokens), 0.6)  # the saved decoding: section 6.1's
        assert hypothesis.score == pytest.approx(hypothesis.log_probability / penalty, abs=1e-6)


@pytest.mark.parametrize("settings", [
    {}, dict(max_new_tokens=12), dict(num_beams=2, length_penalty_type="transformers", early_stopping=True)
], ids=["paper", "max_new_tokens", "two_beams_transformers_penalty"])
def test_ctranslate2_gives_the_same_nbest_list_and_scores(backends, settings):
    torch_translate, ct2_translate = backends
    nbest = settings.get("num_beams", 4)
    ours = torch_translate(LINES, nbest=nbest, token_scores=True, **settings)
    theirs = ct2_translate(LINES, nbest=nbest, token_scores=True, **settings)
    assert [[h.text for h in found] for found in ours] == [[h.text for h in found] for found in theirs]
    for mine, other in zip(ours, theirs):
        for a, b in zip(mine, other):
            if a is EMPTY:
                assert b is EMPTY
                continue
            assert a.tokens == b.tokens
            assert a.score == pytest.approx(b.score, abs=1e-3)
            assert a.log_probability == pytest.approx(b.log_probability, abs=1e-3)
            assert a.token_scores == pytest.approx(b.token_scores, abs=1e-3)


def test_nbest_scores_are_ctranslate2s_own_return_scores(folders, backends, tokenizer):  # noqa: F811
    """Under transformers' length penalty, log P(Y|X) / |Y|^alpha (|Y| counting `</s>`), and early stopping at the
    beams' count, CTranslate2's search is that search: its own `return_scores` are the torch backend's scores."""
    import ctranslate2

    settings = dict(num_beams=3, length_penalty_type="transformers", length_penalty=1.0, early_stopping=True,
                    max_new_tokens=12)
    ours = backends[0](LINES, nbest=3, **settings)
    translator = ctranslate2.Translator(str(folders[1]))
    sources = [tokenizer.convert_ids_to_tokens(tokenizer(line)["input_ids"]) for line in LINES if line]
    theirs = translator.translate_batch(sources, beam_size=3, num_hypotheses=3, return_scores=True, length_penalty=1.0,
                                       return_end_token=True, max_decoding_length=12, max_input_length=0)
    for found, result in zip([found for line, found in zip(LINES, ours) if line], theirs):
        texts = [tokenizer.convert_tokens_to_string([t for t in tokens if t != "</s>"]).strip()
                 for tokens in result.hypotheses]
        assert [h.text for h in found] == texts
        assert [h.score for h in found] == pytest.approx(result.scores, abs=1e-3)


def test_the_best_of_the_nbest_list_is_the_translation(backends):
    for translate in backends:
        assert [found[0].text for found in translate(LINES, nbest=2)] == translate(LINES)


def test_an_empty_line_gives_one_empty_unscored_hypothesis(backends):
    for translate in backends:
        found = translate(["", "   "], nbest=3)
        assert found == [[Hypothesis("", None, None)], [Hypothesis("", None, None)]]


@pytest.mark.parametrize("which", [0, 1], ids=["torch", "ct2"])
def test_more_hypotheses_than_beams_are_refused(backends, which):
    with pytest.raises(ValueError, match=r"nbest must be between 1 and the number of beams \(4\), got 5"):
        backends[which](LINES, nbest=5)
    with pytest.raises(ValueError, match=r"number of beams \(1\), got 2"):
        backends[which](LINES, nbest=2, num_beams=1)


def test_score_pairs_is_a_teacher_forced_pass_and_ctranslate2s_score_batch(folders, tokenizer):  # noqa: F811
    model_dir, ct2_dir = folders
    model = VanillaTransformerForConditionalGeneration.from_pretrained(model_dir).eval()
    sources = [SENTENCES[0], SENTENCES[1], SENTENCES[2], "Hi"]
    targets = [SENTENCES[4], SENTENCES[5], "", SENTENCES[2]]
    ours = SCORERS["torch"](model_dir, "cpu")(sources, targets, batch_size=2)
    theirs = SCORERS["ct2"](ct2_dir, "cpu")(sources, targets, batch_size=3)
    for source, target, mine, other in zip(sources, targets, ours, theirs):
        target_ids = tokenizer(text_target=target)["input_ids"]
        expected = log_probs(model, tokenizer, source, target_ids)  # one pair, no padding, through `labels`
        assert mine.tokens == tuple(tokenizer.convert_ids_to_tokens(target_ids)) == other.tokens
        assert mine.token_scores == pytest.approx(expected.tolist(), abs=1e-5)
        assert other.token_scores == pytest.approx(expected.tolist(), abs=1e-3)
        assert mine.log_probability == pytest.approx(float(expected.sum()), abs=1e-4)
        assert mine.per_token == pytest.approx(mine.log_probability / len(target_ids))
    assert ours[2].tokens == ("</s>",)  # an empty target: the end alone


def test_score_pairs_refuses_unequal_lengths(folders):
    model_dir, ct2_dir = folders
    for score in (SCORERS["torch"](model_dir, "cpu"), SCORERS["ct2"](ct2_dir, "cpu")):
        with pytest.raises(ValueError, match="2 sources but 1 targets"):
            score(["a", "b"], ["c"])


# --- The command line ------------------------------------------------------------------------------------------------


def run_main(argv, capsys) -> str:
    """What `main(argv)` prints on standard error when it stops with exit status 2."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.fixture(scope="module")
def lines_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("lines") / "source.txt"
    path.write_text("".join(line + "\n" for line in LINES), encoding="utf-8")
    return path


@pytest.mark.parametrize("backend", ["torch", "ct2"])
def test_translate_writes_the_nbest_list_as_tsv_and_jsonl(folders, backends, lines_file, tmp_path, backend):
    folder = folders[0] if backend == "torch" else folders[1]
    expected = backends[0](LINES, nbest=3, token_scores=True)
    tsv, jsonl = tmp_path / "out.tsv", tmp_path / "out.jsonl"
    main(["translate", "--model", str(folder), "--backend", backend, "--input", str(lines_file), "--output", str(tsv),
          "--nbest", "3"])
    main(["translate", "--model", str(folder), "--backend", backend, "--input", str(lines_file), "--output",
          str(jsonl), "--nbest", "3", "--format", "jsonl", "--token-scores"])
    rows = [line.split("\t") for line in tsv.read_text(encoding="utf-8").splitlines()]
    records = [json.loads(line) for line in jsonl.read_text(encoding="utf-8").splitlines()]
    wanted = [(number, rank, h) for number, found in enumerate(expected, 1) for rank, h in enumerate(found, 1)]
    assert len(rows) == len(records) == len(wanted) == 4 * 3 + 1  # the empty line: one empty hypothesis
    for row, record, (number, rank, h) in zip(rows, records, wanted):
        assert row[:2] == [str(number), str(rank)] and row[4] == h.text.replace("\t", " ")
        assert (record["line"], record["rank"], record["translation"]) == (number, rank, h.text)
        if h.score is None:
            assert row[2:4] == ["", ""] and record["score"] is None and record["tokens"] == []
            continue
        assert float(row[2]) == pytest.approx(h.score, abs=2e-4) and float(row[3]) == pytest.approx(
            h.log_probability, abs=2e-4)
        assert record["score"] == pytest.approx(h.score, abs=1e-3)
        assert record["tokens"] == list(h.tokens)
        assert record["token_scores"] == pytest.approx(list(h.token_scores), abs=1e-3)


def test_translate_with_no_new_flag_writes_what_it_wrote(folders, lines_file, tmp_path, backends):
    out = tmp_path / "out.txt"
    main(["translate", "--model", str(folders[0]), "--input", str(lines_file), "--output", str(out)])
    assert out.read_text(encoding="utf-8") == "".join(text + "\n" for text in backends[0](LINES))


def test_the_nbest_flags_refuse_what_they_cannot_do_in_one_line(folders, lines_file, tmp_path, capsys):
    base = ["translate", "--model", str(folders[0]), "--input", str(lines_file), "--output", str(tmp_path / "o")]
    assert run_main([*base, "--nbest", "5"], capsys) == (
        "vanilla-transformer translate: error: --nbest 5 is more than the 4 beam(s) of the search: give --num-beams 5 "
        "or more, or a smaller --nbest\n")
    assert "--nbest 2 is more than the 1 beam(s)" in run_main([*base, "--nbest", "2", "--num-beams", "1"], capsys)
    assert run_main([*base, "--token-scores", "--format", "text"], capsys) == (
        "vanilla-transformer translate: error: --token-scores needs --format tsv or jsonl (text holds the "
        "translations only)\n")
    assert "--nbest 3 needs --format tsv or jsonl" in run_main([*base, "--nbest", "3", "--format", "text"], capsys)
    assert not (tmp_path / "o").exists()


def test_score_writes_each_pairs_scores_and_refuses_unaligned_files(folders, tmp_path, capsys):
    sources, targets = tmp_path / "src.txt", tmp_path / "tgt.txt"
    sources.write_text("Two dogs play in the snow.\n\nPeople walk.\n", encoding="utf-8")
    targets.write_text("Zwei Hunde spielen im Schnee.\n\nLeute.\n", encoding="utf-8")
    expected = SCORERS["torch"](folders[0], "cpu")(["Two dogs play in the snow.", "", "People walk."],
                                                   ["Zwei Hunde spielen im Schnee.", "", "Leute."])
    out = tmp_path / "scores.jsonl"
    main(["score", "--model", str(folders[0]), "--src", str(sources), "--tgt", str(targets), "--output", str(out),
          "--format", "jsonl", "--token-scores"])
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [record["line"] for record in records] == [1, 2, 3]
    for record, score in zip(records, expected):
        assert record["log_probability"] == pytest.approx(score.log_probability)
        assert record["per_token"] == pytest.approx(score.per_token)
        assert record["num_tokens"] == score.num_tokens and record["tokens"] == list(score.tokens)
    targets.write_text("Zwei Hunde spielen im Schnee.\n", encoding="utf-8")
    capsys.readouterr()  # loading the model above draws a progress bar
    assert run_main(["score", "--model", str(folders[0]), "--src", str(sources), "--tgt", str(targets)], capsys) == (
        f"vanilla-transformer score: error: {sources} has 3 lines but {targets} has 1; source and target files must "
        "be aligned line by line\n")
    assert "cannot both be standard input" in run_main(
        ["score", "--model", str(folders[0]), "--src", "-", "--tgt", "-"], capsys)


@pytest.mark.slow  # a process of its own
def test_the_installed_command_scores_piped_targets(folders, tmp_path):
    script = Path(sys.executable).with_name("vanilla-transformer")
    sources = tmp_path / "src.txt"
    sources.write_text("Two dogs play in the snow.\nPeople walk.\n", encoding="utf-8")
    piped = "Zwei Hunde spielen im Schnee.\nLeute.\n"
    result = subprocess.run([script, "score", "--model", str(folders[1]), "--backend", "ct2", "--src", str(sources),
                             "--tgt", "-"], input=piped, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    expected = SCORERS["ct2"](folders[1], "cpu")(["Two dogs play in the snow.", "People walk."], piped.splitlines())
    assert result.stdout == "".join(f"{n}\t{s.log_probability:.4f}\t{s.per_token:.4f}\t{s.num_tokens}\n"
                                    for n, s in enumerate(expected, 1))
    result = subprocess.run([script, "score", "--model", str(folders[1]), "--backend", "ct2", "--src", str(sources),
                             "--tgt", "-"], input="Leute.\n", capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and result.stderr.endswith("must be aligned line by line\n") and not result.stdout


# --- Sampling --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["torch", "ct2"])
def test_the_same_seed_draws_the_same_samples(folders, backend):
    # CTranslate2 seeds the generator of each of its threads when the thread first samples: a seeded call repeats
    # with a translator loaded again (as each run of the command loads one), PyTorch's with the same model.
    folder = folders[0] if backend == "torch" else folders[1]
    loaded = BACKENDS[backend](folder, "cpu")

    def translate(*args, **kwargs):
        return (loaded if backend == "torch" else BACKENDS[backend](folder, "cpu"))(*args, **kwargs)

    draw = dict(do_sample=True, num_beams=1, top_k=0, temperature=1.0, max_new_tokens=12)
    first, again = translate(LINES, seed=5, **draw), translate(LINES, seed=5, **draw)
    assert first == again and first[1] == ""
    assert translate(LINES, seed=6, **draw) != first
    # Drawn from the one most likely token, sampling is greedy search.
    assert translate(LINES, seed=5, **dict(draw, top_k=1)) == translate(LINES, num_beams=1, max_new_tokens=12)


def test_a_sample_is_scored_as_any_hypothesis(backends):
    translate, ct2_translate = backends
    draw = dict(do_sample=True, num_beams=1, top_k=0, max_new_tokens=12, seed=2)
    sample = translate([SENTENCES[1]], nbest=1, token_scores=True, **draw)[0][0]
    assert sample.text == translate([SENTENCES[1]], **draw)[0]
    assert sample.log_probability == pytest.approx(math.fsum(sample.token_scores), abs=1e-6)
    assert ct2_translate([SENTENCES[1]], nbest=1, **draw)[0][0].score is not None


def test_the_sampling_flags_go_with_sampling(folders, lines_file, tmp_path, capsys):
    base = ["translate", "--model", str(folders[0]), "--input", str(lines_file), "--output", str(tmp_path / "o")]
    assert run_main([*base, "--top-k", "5"], capsys) == (
        "vanilla-transformer translate: error: --top-k shapes sampling: give --sampling too\n")
    assert "takes no --num-beams 4" in run_main([*base, "--sampling", "--num-beams", "4"], capsys)
    assert "takes no --nbest 2" in run_main([*base, "--sampling", "--nbest", "2"], capsys)
    assert "--top-p must be in (0, 1], got 1.5" in run_main([*base, "--sampling", "--top-p", "1.5"], capsys)
    assert "--temperature must be positive, got 0" in run_main([*base, "--sampling", "--temperature", "0"], capsys)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("backend", ["torch", "ct2"])
def test_translate_samples_reproducibly_from_the_command_line(folders, lines_file, tmp_path, backend):
    folder = folders[0] if backend == "torch" else folders[1]
    outputs = []
    for seed in ("7", "7", "8"):
        out = tmp_path / f"{len(outputs)}.txt"
        main(["translate", "--model", str(folder), "--backend", backend, "--input", str(lines_file), "--output",
              str(out), "--sampling", "--seed", seed, "--max-new-tokens", "12"])
        outputs.append(out.read_text(encoding="utf-8"))
    # Split at line feeds only: a random model's samples hold other characters that str.splitlines breaks at.
    assert outputs[0] == outputs[1] != outputs[2] and outputs[0].count("\n") == len(LINES)


# --- Target prefixes -------------------------------------------------------------------------------------------------

PREFIXES = ["Ein Mann", "", "", "Leute", ""]  # one a line of LINES, "" for none (the empty line's is never used)


@pytest.mark.parametrize("settings", [dict(num_beams=1), {}], ids=["greedy", "paper"])
def test_every_translation_starts_with_its_prefix(backends, tokenizer, settings):  # noqa: F811
    for translate in backends:
        found = translate(LINES, target_prefixes=PREFIXES, max_new_tokens=10, **settings)
        for line, prefix, text in zip(LINES, PREFIXES, found):
            assert text.startswith(prefix) if line else text == ""
    # Greedy search continues a prefix the same way on both backends.
    greedy = [translate(LINES, target_prefixes=PREFIXES, num_beams=1, max_new_tokens=10) for translate in backends]
    assert greedy[0] == greedy[1]


def test_a_prefixed_hypothesis_scores_its_continuation_as_beam_search_ranks_it(
    folders, backends, tokenizer  # noqa: F811
):
    model = VanillaTransformerForConditionalGeneration.from_pretrained(folders[0]).eval()
    found = backends[0]([SENTENCES[1]], target_prefixes=["Zwei Hunde"], nbest=3, token_scores=True)[0]
    prefix = tokenizer(text_target="Zwei Hunde", add_special_tokens=False)["input_ids"]
    start = torch.tensor([[model.config.decoder_start_token_id, *prefix]])
    outputs = model.generate(**tokenizer(SENTENCES[1], return_tensors="pt"), decoder_input_ids=start,
                             num_return_sequences=3, output_scores=True, return_dict_in_generate=True)
    assert [h.score for h in found] == pytest.approx(outputs.sequences_scores.tolist(), abs=1e-4)
    for hypothesis, row in zip(found, outputs.sequences.tolist()):
        assert hypothesis.text.startswith("Zwei Hunde")
        continuation = row[1 + len(prefix):]
        continuation = continuation[: continuation.index(model.config.eos_token_id) + 1]  # then padding
        assert list(hypothesis.tokens) == tokenizer.convert_ids_to_tokens(continuation)


def test_a_prefix_file_of_another_length_is_refused(folders, lines_file, tmp_path, capsys):
    prefixes = tmp_path / "prefixes.txt"
    prefixes.write_text("Ein Mann\n\n", encoding="utf-8")
    err = run_main(["translate", "--model", str(folders[0]), "--input", str(lines_file), "--target-prefix",
                    str(prefixes), "--output", str(tmp_path / "o")], capsys)
    assert err == (f"vanilla-transformer translate: error: {prefixes} has 2 lines but {lines_file} has {len(LINES)}; "
                   "give one target prefix a line (an empty line for none)\n")
    assert not (tmp_path / "o").exists()
    with pytest.raises(ValueError, match="2 target prefixes for 5 lines"):
        BACKENDS["torch"](folders[0], "cpu")(LINES, target_prefixes=["a", "b"])


# --- Word alignment --------------------------------------------------------------------------------------------------


def test_pieces_merge_into_whitespace_words_and_the_strongest_link_wins():
    from vanilla_transformer.inference.alignment import hard_links, pharaoh, word_alignment, word_indices

    assert word_indices(["Ġje", "Ġt", "'", "Ġaime"]) == word_indices(["je", "Ġt", "'", "Ġaime"]) == [0, 1, 1, 2]
    assert word_indices(["▁I", "▁lo", "ve", "▁you"]) == [0, 1, 1, 2]
    # "I love you" (pieces I | lo ve | you) -> "je t' aime" (pieces je | t ' | aime), attention written by hand.
    attention = torch.tensor([
        [0.7, 0.1, 0.1, 0.1],  # je: I
        [0.0, 0.1, 0.0, 0.9],  # t: you
        [0.1, 0.1, 0.1, 0.7],  # ': you
        [0.0, 0.5, 0.4, 0.1],  # aime: lo + ve, love
    ])
    matrix = word_alignment(attention, [0, 1, 1, 2], [0, 1, 1, 2])
    assert torch.allclose(matrix, torch.tensor([[0.7, 0.2, 0.1], [0.05, 0.15, 0.8], [0.0, 0.9, 0.1]]))
    assert pharaoh(hard_links(matrix)) == "0-0 2-1 1-2"


def known_attention_model(folder, tokenizer, start: int):  # noqa: F811
    """A hand-built model whose encoder-decoder attention is known (saved in `folder`): every sublayer's output is zero
    (out_proj, fc2), so each position's state is its token's embedding normalised (section 3.1's residual connection
    and LayerNorm), with no positions; each used token's embedding is its own basis vector; one head, whose query
    projection is 20 times the identity and key projection the identity. A decoder position holding token a then
    attends to the source positions holding a (shared equally, to 1e-6). The decoder starts with token `start`."""
    config = VanillaTransformerConfig.from_preset(
        "tiny", d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=1, decoder_attention_heads=1,
        position_embedding_type="learned", max_position_embeddings=64, dropout=0.0, vocab_size=len(tokenizer),
        decoder_start_token_id=start)
    model = VanillaTransformerForConditionalGeneration(config).eval()
    with torch.no_grad():
        for stack in (model.model.encoder, model.model.decoder):
            stack.embed_positions.weight.zero_()
            for layer in stack.layers:
                for attention in filter(None, (layer.self_attn, getattr(layer, "encoder_attn", None))):
                    attention.out_proj.weight.zero_()
                layer.fc2.weight.zero_()
                layer.fc2.bias.zero_()
        cross = model.model.decoder.layers[0].encoder_attn
        cross.q_proj.weight.copy_(20 * torch.eye(64))
        cross.k_proj.weight.copy_(torch.eye(64))
        model.model.shared.weight.copy_(torch.eye(len(tokenizer), 64)[torch.arange(len(tokenizer)) % 64])
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


def test_a_model_whose_cross_attention_is_known_gives_the_expected_links(tokenizer, tmp_path):  # noqa: F811
    from vanilla_transformer.backends.ctranslate2.outputs import _alignments
    from vanilla_transformer.inference.alignment import align, word_alignment, word_indices
    from vanilla_transformer.inference.scoring import teacher_forced_pass

    source = tokenizer("Two dogs play in the snow")["input_ids"]  # T w o | Ġdog s | Ġplay | Ġin | Ġthe | Ġs n o w
    # A translation: Ġplay | Ġthe | Ġs n o w, then </s>.
    target = tokenizer.convert_tokens_to_ids(["Ġplay", "Ġthe", "Ġs", "n", "o", "w", "</s>"])
    assert len(set(source + target) - {tokenizer.eos_token_id}) < 64  # each used token its own basis vector
    model = known_attention_model(tmp_path / "model", tokenizer, start=source[0])
    # The row of target token t is the attention of the decoder position holding token t - 1 (the start token for
    # t = 0): spread equally over the source positions that hold that token.
    inputs = [source[0], *target[:-1]]
    expected = torch.tensor([[float(token == held) for token in source] for held in inputs])
    expected /= expected.sum(-1, keepdim=True)
    _, weights = teacher_forced_pass(model, [source], [target], attention_layer=0)
    assert torch.allclose(weights[0], expected, atol=1e-6)
    # The word matrix and links of those rows, computed here from the construction alone.
    pieces = tokenizer.convert_ids_to_tokens
    words = word_alignment(expected[:-1, :-1], word_indices(pieces(source[:-1])), word_indices(pieces(target[:-1])))
    links = [(int(s), t) for t, s in enumerate(words.argmax(-1).tolist())]
    # Source words Two dogs play in the snow = 0-5. play <- T (the start): Two; the <- play: play; s n o w <- the, s,
    # n, o (o in "Two" and "snow" alike): snow, 2.5 of 4 rows.
    assert links == [(0, 0), (2, 1), (5, 2)]
    assert align(tokenizer, [source], [target], weights, "hard") == [links]
    assert torch.allclose(torch.tensor(align(tokenizer, [source], [target], weights, "soft")[0]), words, atol=1e-6)
    # CTranslate2's attention of the same model, exported, read as the ct2 backend reads it.
    import ctranslate2

    translator = ctranslate2.Translator(str(export_ctranslate2(tmp_path / "model", tmp_path / "ct2", alignment_layer=0)))
    assert _alignments(translator, tokenizer, [pieces(source)], [pieces(target)], "hard") == [links]


def test_alignments_are_the_models_cross_attention_whatever_its_kernel(folders, backends, tokenizer):  # noqa: F811
    model = VanillaTransformerForConditionalGeneration.from_pretrained(folders[0]).eval()  # sdpa, the default
    assert model.config._attn_implementation == "sdpa"
    translate = functools.partial(translate_lines, model, tokenizer)
    found = translate(LINES, nbest=1, token_scores=True, alignment="soft", alignment_layer=1, max_new_tokens=10)
    assert model.config._attn_implementation == "sdpa"  # restored
    eager = VanillaTransformerForConditionalGeneration.from_pretrained(folders[0], attn_implementation="eager").eval()

    def words(tokens):  # a piece after a space marker starts the next word
        return [sum(token.startswith("Ġ") for token in tokens[1: n + 1]) for n in range(len(tokens))]

    for line, (hypothesis,) in zip(LINES, found):
        if not line:
            assert hypothesis.alignment is None
            continue
        source = tokenizer(line)["input_ids"]
        target = tokenizer.convert_tokens_to_ids(list(hypothesis.tokens))
        with torch.no_grad():  # one pair alone, no padding: the weights as the model forms them
            outputs = eager(input_ids=torch.tensor([source]), labels=torch.tensor([target]), output_attentions=True)
        weights = outputs.cross_attentions[1][0].mean(0)  # heads averaged
        special = set(tokenizer.all_special_ids)  # </s>, and any special token a random model emits: left out
        rows, columns = [[k for k, i in enumerate(ids) if i not in special] for ids in (target, source)]
        source_words = words(tokenizer.convert_ids_to_tokens([source[k] for k in columns]))
        target_words = words(tokenizer.convert_ids_to_tokens([target[k] for k in rows]))
        expected = torch.zeros(target_words[-1] + 1, source_words[-1] + 1)
        for t, target_word in zip(rows, target_words):
            for s, source_word in zip(columns, source_words):
                expected[target_word, source_word] += weights[t, s] / target_words.count(target_word)
        assert torch.allclose(torch.tensor(hypothesis.alignment), expected, atol=1e-5)
        hard = translate([line], nbest=1, alignment="hard", alignment_layer=1, max_new_tokens=10)[0][0].alignment
        assert hard == [(int(i), j) for j, i in enumerate(expected.argmax(-1).tolist())]


@pytest.mark.parametrize("layer", [0, -1])
def test_ctranslate2_aligns_as_the_torch_backend_does(folders, tmp_path, layer):
    """CTranslate2's `return_attention` of an export that averages a layer's heads, read while each hypothesis is
    forced as a target prefix, gives the torch backend's alignment of the same hypotheses (n-best, with a prefix)."""
    ct2_dir = export_ctranslate2(folders[0], tmp_path / "ct2", alignment_layer=layer)
    assert json.loads((ct2_dir / "config.json").read_text())["exported_alignment"] == dict(
        decoder_layer=layer % 2, decoder_layers=2, heads="averaged")
    ours, theirs = BACKENDS["torch"](folders[0], "cpu"), BACKENDS["ct2"](ct2_dir, "cpu")
    for kind in ("soft", "hard"):
        for options in (dict(nbest=3), dict(nbest=2, target_prefixes=["", "", SENTENCES[4], "", ""])):
            mine = ours(LINES, alignment=kind, alignment_layer=layer, **options)
            other = theirs(LINES, alignment=kind, **options)
            assert [[h.text for h in found] for found in mine] == [[h.text for h in found] for found in other]
            for a, b in ((a, b) for found, others in zip(mine, other) for a, b in zip(found, others)):
                if kind == "hard" or a.alignment is None:
                    assert a.alignment == b.alignment
                else:
                    assert torch.allclose(torch.tensor(a.alignment), torch.tensor(b.alignment), atol=1e-4)
    assert any(found[0].alignment for found in mine)


def test_ctranslate2_refuses_an_alignment_its_export_cannot_give(folders, tmp_path):
    from vanilla_transformer.inference.hypotheses import AlignmentLayerError, AlignmentUnavailableError

    translate = BACKENDS["ct2"](folders[1], "cpu")  # exported with the default: the last layer
    with pytest.raises(AlignmentUnavailableError, match="returns decoder layer 1's attention.*not layer 0's"):
        translate(LINES, nbest=1, alignment="hard", alignment_layer=0)
    assert translate(LINES[:1], nbest=1, alignment="hard", alignment_layer=-1)[0][0].alignment
    with pytest.raises(AlignmentLayerError, match="alignment_layer 2 is not a layer of the model's 2-layer decoder"):
        translate(LINES, nbest=1, alignment="hard", alignment_layer=2)
    with pytest.raises(AlignmentLayerError):
        export_ctranslate2(folders[0], tmp_path / "ct2", alignment_layer=-3)
    old = tmp_path / "old"  # an export that recorded no averaged heads (CTranslate2's default returns one head's)
    shutil.copytree(folders[1], old)
    config = json.loads((old / "config.json").read_text())
    del config["exported_alignment"]
    (old / "config.json").write_text(json.dumps(config))
    with pytest.raises(AlignmentUnavailableError, match="keeps no encoder-decoder attention with its heads averaged"):
        BACKENDS["ct2"](old, "cpu")(LINES, nbest=1, alignment="soft")


def test_alignment_flags_refuse_what_they_cannot_do_in_one_line(folders, lines_file, tmp_path, capsys):
    base = ["translate", "--input", str(lines_file), "--output", str(tmp_path / "o")]
    error = "vanilla-transformer translate: error: "
    assert "--alignment needs --format tsv or jsonl" in run_main(
        [*base, "--model", str(folders[0]), "--alignment", "hard", "--format", "text"], capsys)
    assert run_main([*base, "--model", str(folders[0]), "--alignment-layer", "0"], capsys) == (
        f"{error}--alignment-layer chooses the layer that --alignment reads: give --alignment hard or soft\n")
    assert run_main([*base, "--model", str(folders[0]), "--alignment", "hard", "--alignment-layer", "-3"], capsys) == (
        f"{error}--alignment-layer -3 is not a layer of the model's 2-layer decoder (0 to 1, or -1 to -2 from the "
        "last)\n")
    assert run_main([*base, "--model", str(folders[1]), "--backend", "ct2", "--alignment", "hard",
                     "--alignment-layer", "0"], capsys) == (
        f"{error}this CTranslate2 export aligns with decoder layer 1 (export-ct2 --alignment-layer chose it): leave "
        "--alignment-layer out, or export again with --alignment-layer 0\n")
    assert run_main([*base, "--model", str(folders[0]), "--backend", "onnx", "--alignment", "hard"], capsys) == (
        f"{error}--alignment reads the encoder-decoder attention, which the ONNX export's decoder does not return: "
        "use --backend torch or ct2\n")
    assert not (tmp_path / "o").exists()
    assert run_main(["export-ct2", "--model", str(folders[0]), "--out", str(tmp_path / "ct2"), "--alignment-layer",
                     "2"], capsys) == ("vanilla-transformer export-ct2: error: --alignment-layer 2 is not a layer of "
                                       "the model's 2-layer decoder (0 to 1, or -1 to -2 from the last)\n")
    assert not (tmp_path / "ct2").exists()


def test_alignment_is_written_as_pharaoh_links(folders, lines_file, tmp_path):
    base = ["translate", "--input", str(lines_file), "--output", str(tmp_path / "o")]
    main([*base, "--model", str(folders[0]), "--alignment", "hard", "--max-new-tokens", "6"])
    rows = [line.split("\t") for line in (tmp_path / "o").read_text(encoding="utf-8").split("\n")[:-1]]
    assert len(rows) == len(LINES) and all(len(row) == 6 for row in rows)
    assert all(re.fullmatch(r"(\d+-\d+( \d+-\d+)*)?", row[5]) for row in rows)
