"""CTranslate2 export and the `ct2` backend: CTranslate2 scores targets as the model does and searches as `generate()`
(greedy, and beam search with transformers' length penalty); GNMT re-ranks what its beam search finished, and the
backend searches on where CTranslate2 alone would stop, as `generate()`'s early_stopping="never" does."""


import pytest
import torch
from transformers import AutoTokenizer

ctranslate2 = pytest.importorskip("ctranslate2")

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration  # noqa: E402
from vanilla_transformer.backends import UnsupportedModelError  # noqa: E402
from vanilla_transformer.backends.table import BACKENDS  # noqa: E402
from vanilla_transformer.cli.main import main  # noqa: E402
from vanilla_transformer.backends.ctranslate2 import QUANTIZATIONS  # noqa: E402
from vanilla_transformer.backends.ctranslate2.export import export_ctranslate2, transformer_spec_of  # noqa: E402
from vanilla_transformer.model.generation_vanilla_transformer import gnmt_length_penalty  # noqa: E402
from vanilla_transformer.training.tokenization import train_tokenizer  # noqa: E402

SENTENCES = [
    "A man in an orange hat starring at something.",
    "Two dogs play in the snow.",
    "A girl is reading a book under a tree while her brother plays football nearby.",
    "People walk.",
    "Ein Mann mit einem orangefarbenen Hut.",
    "Zwei Hunde spielen im Schnee.",
    "Hi",
    "The cat sat on the mat and looked at the dog.",
]
MAX_NEW_TOKENS = 20  # random models rarely stop on their own


@pytest.fixture(scope="module")
def tokenizer():
    """This module's own BPE, learnt from SENTENCES (it stands in for conftest's number-words `tokenizer` here)."""
    return train_tokenizer(SENTENCES * 3, vocab_size=300, show_progress=False)


def saved_model(folder, tokenizer, lively=False, **config_overrides):
    """A random tiny model saved with its tokenizer in `folder`. A `lively` one has learned positions of large spread
    and a `</s>` embedding near the average token, so that its outputs change from step to step and sometimes end:
    a random model otherwise repeats one token."""
    config = VanillaTransformerConfig.from_preset("tiny", dropout=0.0, vocab_size=len(tokenizer), **config_overrides)
    torch.manual_seed(4)  # a seed whose random models exercise the searches' differences (the tests below)
    model = VanillaTransformerForConditionalGeneration(config).eval()
    with torch.no_grad():
        # Every projection Xavier-uniform with zero biases (the package's initialisation before it took fairseq's):
        # the feed-forward layers then weigh as much as attention, and a random model's outputs depend more on its
        # input, which is what these comparisons need to tell the two searches apart.
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module is not model.lm_head:
                torch.nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    torch.nn.init.zeros_(module.bias)
    if lively:
        with torch.no_grad():
            for stack in (model.model.encoder, model.model.decoder):
                stack.embed_positions.weight.normal_(0, 2.0)
            mean_token = model.model.shared.weight[3:].mean(0)
            model.model.shared.weight[config.eos_token_id] = 2.0 * mean_token / mean_token.norm()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def paper_model(tmp_path_factory, tokenizer):
    """The paper's architecture (post-norm, sinusoidal positions, attention projections without biases): (model
    folder, CTranslate2 folder)."""
    root = tmp_path_factory.mktemp("ct2-paper")
    model_dir = saved_model(root / "model", tokenizer)
    return model_dir, export_ctranslate2(model_dir, root / "ct2")


@pytest.fixture(scope="module")
def lively_model(tmp_path_factory, tokenizer):
    """Pre-norm with learned positions and attention biases, outputs that vary and end: (model folder, CTranslate2
    folder)."""
    root = tmp_path_factory.mktemp("ct2-lively")
    model_dir = saved_model(
        root / "model",
        tokenizer,
        lively=True,
        attention_bias=True,
        normalize_before=True,
        position_embedding_type="learned",
        max_position_embeddings=128,
    )
    return model_dir, export_ctranslate2(model_dir, root / "ct2")


def load(model_dir):
    return VanillaTransformerForConditionalGeneration.from_pretrained(model_dir).eval()


def tokens_of(tokenizer, text):
    return tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"])


def log_probs(model, tokenizer, source, target_ids):
    """log p(y_t | y_<t, x) of each token of `target_ids` under the PyTorch model."""
    labels = torch.tensor([target_ids])
    with torch.no_grad():
        logits = model(**tokenizer(source, return_tensors="pt"), labels=labels).logits
    return logits.log_softmax(-1)[0].gather(-1, labels[0, :, None])[:, 0]


@pytest.mark.parametrize("which", ["paper_model", "lively_model"])
def test_ctranslate2_scores_targets_with_the_models_log_probs(request, tokenizer, which):
    model_dir, ct2_dir = request.getfixturevalue(which)
    model, translator = load(model_dir), ctranslate2.Translator(str(ct2_dir))
    targets = [tokenizer(text)["input_ids"] for text in reversed(SENTENCES)]
    # score_batch adds the decoder start token and </s> itself.
    sources = [tokens_of(tokenizer, text) for text in SENTENCES]
    results = translator.score_batch(sources, [tokenizer.convert_ids_to_tokens(ids[:-1]) for ids in targets])
    for source, target_ids, result in zip(SENTENCES, targets, results):
        expected = log_probs(model, tokenizer, source, target_ids)
        torch.testing.assert_close(torch.tensor(result.log_probs), expected, rtol=0, atol=1e-4)


@pytest.mark.parametrize("which", ["paper_model", "lively_model"])
def test_greedy_search_gives_the_tokens_of_generate(request, tokenizer, which):
    model_dir, ct2_dir = request.getfixturevalue(which)
    model, translator = load(model_dir), ctranslate2.Translator(str(ct2_dir))
    results = translator.translate_batch(
        [tokens_of(tokenizer, text) for text in SENTENCES],
        beam_size=1,
        max_decoding_length=MAX_NEW_TOKENS,
        min_decoding_length=0,
        return_end_token=True,
    )
    for text, result in zip(SENTENCES, results):
        expected = model.generate(**tokenizer(text, return_tensors="pt"), num_beams=1, max_new_tokens=MAX_NEW_TOKENS)
        assert tokenizer.convert_tokens_to_ids(result.hypotheses[0]) == expected[0, 1:].tolist()


@pytest.mark.parametrize("which", ["paper_model", "lively_model"])
def test_ct2_backend_translates_as_the_torch_backend_with_greedy_search(request, which):
    """Section 6.1's per-sentence maximum length (source + 50) included, which a random model reaches."""
    model_dir, ct2_dir = request.getfixturevalue(which)
    lines = ["Hi", "People walk.", "", "Two dogs play in the snow.", "Zwei Hunde spielen im Schnee.", "   "]
    translations = BACKENDS["ct2"](ct2_dir, "cpu")(lines, num_beams=1, batch_size=3)
    assert translations == BACKENDS["torch"](model_dir, "cpu")(lines, num_beams=1, batch_size=3)
    assert translations[2] == translations[-1] == ""


@pytest.mark.parametrize("early_stopping", [True, "never"])
@pytest.mark.parametrize("alpha", [0.6, pytest.param(1.0, marks=pytest.mark.slow)])  # 1.0: over 5 s, searches as 0.6
def test_beam_search_matches_generate_with_transformers_length_penalty(lively_model, alpha, early_stopping):
    """CTranslate2's length penalty is transformers': log P(Y|X) / |Y|^alpha, with |Y| counting </s>. Its own stop,
    once 4 hypotheses are finished, is transformers' early_stopping=True; for "never" the backend searches on."""
    model_dir, ct2_dir = lively_model
    options = dict(num_beams=4, length_penalty=alpha, length_penalty_type="transformers", max_new_tokens=MAX_NEW_TOKENS,
                   early_stopping=early_stopping)
    translations = BACKENDS["ct2"](ct2_dir, "cpu")(SENTENCES, **options)
    assert len(set(translations)) > 2
    assert translations == BACKENDS["torch"](model_dir, "cpu")(SENTENCES, **options)


# The lively model's searches run to the length limit (over 10 s); the paper model's and the tests of each part (GNMT,
# "never") cover the fast tier.
@pytest.mark.parametrize("which", ["paper_model", pytest.param("lively_model", marks=pytest.mark.slow)])
def test_beam_search_matches_generate_with_the_papers_decoding(request, which):
    """The saved generation config's: beam 4, GNMT's penalty with alpha 0.6, "never", source + 50 tokens at most."""
    model_dir, ct2_dir = request.getfixturevalue(which)
    translations = BACKENDS["ct2"](ct2_dir, "cpu")(SENTENCES)
    assert translations == BACKENDS["torch"](model_dir, "cpu")(SENTENCES)


def test_gnmt_length_penalty_reranks_the_finished_hypotheses(lively_model, tokenizer):
    """The translation is the hypothesis with the best GNMT score, from the PyTorch model's probabilities, of all those
    CTranslate2's whole search finishes (its best 4 by log P(Y|X) / |Y|^beta, for several beta), where CTranslate2's
    own penalty (beta = alpha) prefers another for some sentences."""
    model_dir, ct2_dir = lively_model
    model, translator = load(model_dir), ctranslate2.Translator(str(ct2_dir))
    alpha = 1.0  # where the two penalties pick different hypotheses of this model
    options = dict(num_beams=4, length_penalty=alpha, max_new_tokens=MAX_NEW_TOKENS)
    translations = BACKENDS["ct2"](ct2_dir, "cpu")(SENTENCES, **options)  # GNMT: the saved generation config's

    sources = [tokens_of(tokenizer, text) for text in SENTENCES]
    search = dict(beam_size=4, num_hypotheses=4, max_decoding_length=MAX_NEW_TOKENS, min_decoding_length=0,
                  return_end_token=True, patience=MAX_NEW_TOKENS + 1)  # no stop before MAX_NEW_TOKENS
    own_best, candidates = [], [[] for _ in SENTENCES]
    for beta in (alpha, 0.75 * alpha, 0.5 * alpha, 0.25 * alpha, 0.01):
        for found, result in zip(candidates, translator.translate_batch(sources, length_penalty=beta, **search)):
            found += [tokenizer.convert_tokens_to_ids(tokens) for tokens in result.hypotheses]
            if beta == alpha:
                own_best.append(found[0])

    def gnmt_score(text, ids):
        return log_probs(model, tokenizer, text, ids).sum() / gnmt_length_penalty(len(ids), alpha)

    reranked = 0
    for text, found, own, translation in zip(SENTENCES, candidates, own_best, translations):
        best = max(found, key=lambda ids: gnmt_score(text, ids))
        assert translation == tokenizer.decode(best, skip_special_tokens=True).strip()
        reranked += best != own
    assert reranked  # GNMT chose other hypotheses than CTranslate2's own penalty did


@pytest.mark.slow
def test_beam_search_gives_generates_translations_on_a_trained_model(number_words_model_dir, corpus, tmp_path):
    """On a trained model the first 4 hypotheses to finish are often early endings of the right translation
    ("deux cent on" for "deux cent onze"): CTranslate2's own stop (early_stopping=True) keeps them, while generate()'s
    "never", the paper's and the saved default, searches on. The backend searches on as generate() does and gives its
    translations of the held-out numbers: greedy, and beam 4 with either length penalty."""
    ct2_dir = export_ctranslate2(number_words_model_dir, tmp_path / "ct2")
    torch_translate, ct2_translate = BACKENDS["torch"](number_words_model_dir, "cpu"), BACKENDS["ct2"](ct2_dir, "cpu")
    sources = [pair["en"] for pair in corpus["test"]["translation"]]
    tokenizer = AutoTokenizer.from_pretrained(number_words_model_dir)

    def ending_before_the_limit(translations, expected):
        """The pairs whose expected translation ends before the length limit (source + 50 tokens): a hypothesis that
        runs on to it may end differently in CTranslate2, which cuts it one token earlier (docs/decoding.md). Such
        run-ons must stay rare."""
        kept = [(translation, reference) for source, translation, reference in zip(sources, translations, expected)
                if len(tokenizer(reference)["input_ids"]) < len(tokenizer(source)["input_ids"]) + 48]
        assert len(kept) >= 0.99 * len(sources)
        return [translation for translation, _ in kept], [reference for _, reference in kept]

    for options in (dict(num_beams=1), dict(length_penalty_type="transformers", length_penalty=1.0), {}):
        expected = torch_translate(sources, batch_size=64, **options)
        translations = ct2_translate(sources, batch_size=64, **options)
        translations, references = ending_before_the_limit(translations, expected)
        assert translations == references, options
    # The whole search, to the maximum length, chooses the same: the staged search stops only where nothing can win.
    translations = ct2_translate(sources, batch_size=64, patience=100)
    translations, references = ending_before_the_limit(translations, expected)
    assert translations == references
    stopped_early = ct2_translate(sources, batch_size=64, early_stopping=True)
    assert sum(early != translation for early, translation in zip(stopped_early, expected)) > len(sources) // 10


def test_export_writes_a_self_contained_folder(paper_model, tokenizer):
    _, ct2_dir = paper_model
    names = {path.name for path in ct2_dir.iterdir()}
    assert {"model.bin", "config.json", "shared_vocabulary.json", "tokenizer.json", "generation_config.json"} <= names
    assert AutoTokenizer.from_pretrained(ct2_dir).get_vocab() == tokenizer.get_vocab()


def test_the_shared_embedding_matrix_is_stored_once(paper_model, tokenizer):
    spec = transformer_spec_of(load(paper_model[0]), tokenizer)
    spec.validate()
    spec.optimize()  # as saving does: equal weights become aliases of the first by name
    assert spec.encoder.embeddings[0].weight == spec.decoder.projection.weight == "decoder/embeddings/weight"


@pytest.mark.parametrize(("which", "attention_bias"), [("paper_model", False), ("lively_model", True)])
def test_attention_projections_have_biases_in_the_spec_only_when_the_model_has_them(
    request, tokenizer, which, attention_bias
):
    model = load(request.getfixturevalue(which)[0])
    assert model.config.attention_bias is attention_bias
    spec = transformer_spec_of(model, tokenizer)
    decoder_layer = spec.decoder.layer[0]
    attention_linears = [*decoder_layer.self_attention.linear, *decoder_layer.attention.linear]
    assert [linear.has_bias() for linear in attention_linears] == [attention_bias] * 5
    assert decoder_layer.ffn.linear_0.has_bias()  # the feed-forward layers keep theirs


def test_the_quantizations_are_those_ctranslate2_accepts():
    from ctranslate2.specs.model_spec import ACCEPTED_MODEL_TYPES

    assert QUANTIZATIONS == ACCEPTED_MODEL_TYPES


def test_int8_export_via_the_command_line_translates(paper_model, tmp_path):
    model_dir, ct2_dir = paper_model
    out = tmp_path / "int8"
    main(["export-ct2", "--model", str(model_dir), "--out", str(out), "--quantization", "int8"])
    assert (out / "model.bin").stat().st_size < (ct2_dir / "model.bin").stat().st_size
    source, target = tmp_path / "source.txt", tmp_path / "target.txt"
    source.write_text("\n".join(SENTENCES[:3] + [""]) + "\n", encoding="utf-8")
    main(["translate", "--model", str(out), "--backend", "ct2", "--device", "cpu", "--input", str(source),
          "--output", str(target), "--num-beams", "2", "--max-new-tokens", "5"])  # fmt: skip
    translations = target.read_text(encoding="utf-8").split("\n")
    assert len(translations) == 5 and translations[0] and translations[3] == ""


def test_export_refuses_an_activation_ctranslate2_lacks(tmp_path, tokenizer):
    model_dir = saved_model(tmp_path / "model", tokenizer, activation_function="relu6")
    with pytest.raises(ValueError, match="activation_function='relu6' has no CTranslate2 equivalent"):
        export_ctranslate2(model_dir, tmp_path / "ct2")


def test_export_refuses_keys_and_values_of_different_sizes_in_one_line(tmp_path, tokenizer, capsys):
    """Table 3 row (B)'s shape (d_k 4 < d_v 8): CTranslate2's attention has one size per head. The error names both
    fields, the command line prints it as one line, and nothing is written."""
    model_dir = saved_model(tmp_path / "model", tokenizer, d_k=4)
    with pytest.raises(UnsupportedModelError, match=r"d_k=4 with d_v=8"):
        export_ctranslate2(model_dir, tmp_path / "ct2")
    with pytest.raises(SystemExit) as exit_info:
        main(["export-ct2", "--model", str(model_dir), "--out", str(tmp_path / "ct2")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    last_line = err.splitlines()[-1]  # after the progress bars of saving and loading the weights
    assert last_line.startswith("vanilla-transformer export-ct2: error: ") and "d_k=4 with d_v=8" in last_line
    assert "Traceback" not in err
    assert not (tmp_path / "ct2").exists()


def test_heads_of_equal_key_and_value_size_other_than_d_model_over_h_export(tmp_path, tokenizer):
    """d_k = d_v = 16 with d_model 32 and h 4: CTranslate2's `head_dim` carries the size, and it scores as the model."""
    model_dir = saved_model(tmp_path / "model", tokenizer, d_k=16, d_v=16)
    model, translator = load(model_dir), ctranslate2.Translator(str(export_ctranslate2(model_dir, tmp_path / "ct2")))
    source, target_ids = SENTENCES[1], tokenizer(SENTENCES[2])["input_ids"]
    target = tokenizer.convert_ids_to_tokens(target_ids[:-1])
    (result,) = translator.score_batch([tokens_of(tokenizer, source)], [target])
    expected = log_probs(model, tokenizer, source, target_ids)
    torch.testing.assert_close(torch.tensor(result.log_probs), expected, rtol=0, atol=1e-4)


def test_export_keeps_existing_folders_unless_forced(paper_model, capsys):
    model_dir, ct2_dir = paper_model
    with pytest.raises(FileExistsError, match="force"):
        export_ctranslate2(model_dir, ct2_dir)
    with pytest.raises(ValueError, match="would replace the model folder"):
        export_ctranslate2(model_dir, model_dir.parent, force=True)
    with pytest.raises(SystemExit) as exit_info:
        main(["export-ct2", "--model", str(model_dir), "--out", str(ct2_dir)])
    assert exit_info.value.code == 2 and "--force" in capsys.readouterr().err


def test_ct2_backend_says_a_transformers_folder_needs_exporting(paper_model, capsys):
    model_dir, _ = paper_model
    with pytest.raises(ValueError, match="is a transformers model folder; the ct2 backend needs it exported first$"):
        BACKENDS["ct2"](model_dir, "cpu")
    # The command says the same in one line, with the command that exports it, and exits with status 2, without a
    # traceback.
    with pytest.raises(SystemExit) as exit_info:
        main(["translate", "--model", str(model_dir), "--backend", "ct2", "--input", str(model_dir / "config.json")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        f"vanilla-transformer translate: error: {model_dir} is a transformers model folder; the ct2 backend needs it "
        f"exported first: `vanilla-transformer export-ct2 --model {model_dir} --out {model_dir}-ct2`, then --model "
        f"{model_dir}-ct2.\n")


def test_inputs_longer_than_the_exported_positions_get_a_clear_error(paper_model, tmp_path):
    model_dir, _ = paper_model
    short = export_ctranslate2(model_dir, tmp_path / "short", max_positions=8)
    with pytest.raises(RuntimeError, match="larger max_positions"):
        BACKENDS["ct2"](short, "cpu")([SENTENCES[2]], num_beams=1)


def test_translate_command_reports_an_input_too_long_for_the_export_in_one_line(paper_model, tmp_path, capsys):
    model_dir, _ = paper_model
    short = export_ctranslate2(model_dir, tmp_path / "short", max_positions=8)
    source, output = tmp_path / "long.txt", tmp_path / "out.txt"
    source.write_text(SENTENCES[2] + "\n", encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        main(["translate", "--model", str(short), "--backend", "ct2", "--device", "cpu", "--input", str(source),
              "--output", str(output), "--num-beams", "1"])  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    last_line = err.splitlines()[-1]  # after the progress bar of loading the weights
    assert last_line.startswith("vanilla-transformer translate: error: ") and "--max-positions" in last_line
    assert "max_new_tokens" not in last_line and "--max-new-tokens" in last_line
    assert "Traceback" not in err and not output.exists()


@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_the_torch_backend_points_a_ctranslate2_folder_to_the_ct2_backend(paper_model, tmp_path, capsys, command):
    _, ct2_dir = paper_model
    sources = tmp_path / "sources.txt"
    sources.write_text("A man.\n", encoding="utf-8")
    arguments = ["--input", str(sources)] if command == "translate" else ["--src", str(sources), "--ref", str(sources)]
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--model", str(ct2_dir), *arguments])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(error.strip().splitlines()) == 1
    assert f"{ct2_dir} is a CTranslate2 folder (from export-ct2): run it with --backend ct2" in error


# Runs the console script's entry on the arguments in sys.argv[1] (JSON), then prints its output and whether torch was
# imported: the ct2 backend needs CTranslate2, tokenizers and transformers' torch-free parts only.
CT2_COMMAND_SCRIPT = """
import contextlib, io, json, sys
import vanilla_transformer_cli

sys.argv = ["vanilla-transformer", *json.loads(sys.argv[1])]
output = io.StringIO()
with contextlib.redirect_stdout(output):
    vanilla_transformer_cli.main()
print(json.dumps({"output": output.getvalue(), "torch": "torch" in sys.modules}))
"""


@pytest.mark.slow  # a process of its own
@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_the_ct2_backends_commands_import_no_torch(paper_model, tmp_path, command):
    import json
    import subprocess
    import sys

    model_dir, ct2_dir = paper_model
    source = tmp_path / "source.txt"
    source.write_text("\n".join(SENTENCES[:3]) + "\n")
    expected = BACKENDS["torch"](model_dir, "cpu")(SENTENCES[:3], max_new_tokens=MAX_NEW_TOKENS)
    arguments = ["--model", str(ct2_dir), "--backend", "ct2", "--max-new-tokens", str(MAX_NEW_TOKENS)]
    if command == "translate":
        arguments += ["--input", str(source)]
    else:
        hypotheses = tmp_path / "hypotheses.txt"
        arguments += ["--src", str(source), "--ref", str(source), "--output-hyps", str(hypotheses)]
    run = subprocess.run([sys.executable, "-c", CT2_COMMAND_SCRIPT, json.dumps([command, *arguments])],
                         capture_output=True, text=True, check=True)
    report = json.loads(run.stdout.splitlines()[-1])
    assert report["torch"] is False
    written = report["output"] if command == "translate" else hypotheses.read_text()
    assert written.splitlines() == expected


def test_the_ct2_backend_loads_the_tokenizer_autotokenizer_loads(paper_model, tmp_path):
    """The folder's tokenizer without AutoTokenizer (which imports torch) is AutoTokenizer's; a folder naming another
    class still goes through AutoTokenizer."""
    import json

    from vanilla_transformer.backends.ctranslate2.search import load_tokenizer

    _, ct2_dir = paper_model
    expected = AutoTokenizer.from_pretrained(ct2_dir)
    loaded = load_tokenizer(ct2_dir)
    assert type(loaded) is type(expected)
    assert loaded.get_vocab() == expected.get_vocab()
    assert loaded.special_tokens_map == expected.special_tokens_map
    assert loaded.model_max_length == expected.model_max_length
    assert loaded(SENTENCES)["input_ids"] == expected(SENTENCES)["input_ids"]
    config = json.loads((ct2_dir / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] in ("TokenizersBackend", "PreTrainedTokenizerFast")
    other = tmp_path / "other"
    other.mkdir()
    for path in ct2_dir.glob("tokenizer*.json"):
        (other / path.name).write_bytes(path.read_bytes())
    (other / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "BartTokenizer"}))
    assert type(load_tokenizer(other)).__name__ == type(AutoTokenizer.from_pretrained(other)).__name__
