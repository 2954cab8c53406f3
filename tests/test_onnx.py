"""ONNX export and the ONNX Runtime model: on a number-words model trained here, ONNX Runtime's `generate()` gives
the PyTorch model's tokens in greedy and beam search (section 6.1's decoding: GNMT penalty, source + 50 limit), with
and without its cache; int8 costs under a point of exact match; the export refuses a bad --out; the translate and
evaluate commands and `pipeline("translation")` run the ONNX folder.

Slow: training the model and exporting it take ~30 s on 2 CPU cores. CI's version cells run this module beside the
fast subset (`-m "not slow or onnx"`): the exporter is what changes most from one torch to the next."""

import json
import random
import shutil

import pytest
import torch
from packaging.version import Version
from conftest import tiny_config_for
from transformers import AutoTokenizer, GenerationConfig, pipeline

pytestmark = [pytest.mark.slow, pytest.mark.onnx]

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")
pytest.importorskip("onnxscript")
num2words = pytest.importorskip("num2words").num2words
if Version(torch.__version__).release < (2, 9):  # onnx_export.EXPORTER_TORCH
    pytest.skip("the ONNX export needs torch >= 2.9", allow_module_level=True)

from vanilla_transformer import VanillaTransformerForConditionalGeneration  # noqa: E402
from vanilla_transformer.backends.table import BACKENDS, SCORERS  # noqa: E402
from vanilla_transformer.cli.main import main  # noqa: E402
from vanilla_transformer.backends.onnx import ONNX_FILES  # noqa: E402
from vanilla_transformer.backends.onnx.export import export_onnx, quantize_int8  # noqa: E402
from vanilla_transformer.backends.onnx.model import VanillaTransformerORTForConditionalGeneration  # noqa: E402
from vanilla_transformer.errors import InputTooLongError  # noqa: E402


MAX_POSITIONS = 64  # the exported position table: number words are short
# Every number below 1,000 (in training) and 400 larger ones (held out).
rng = random.Random(1)
LARGER = rng.sample(range(1000, 10000), 1900)
EVAL_NUMBERS = list(range(1000)) + LARGER[:400]
TRAIN_NUMBERS = list(range(1000)) + LARGER[400:]


def english(number: int) -> str:
    return num2words(number, lang="en")


def french(number: int) -> str:
    return num2words(number, lang="fr")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread for PyTorch here (ONNX Runtime sessions get theirs from `load`): tiny models on a busy
    machine run faster without waiting on a second thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def load(folder) -> VanillaTransformerORTForConditionalGeneration:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return VanillaTransformerORTForConditionalGeneration.from_pretrained(folder, session_options=options)


@pytest.fixture(scope="module")
def trained_dir(tokenizer_dir, tmp_path_factory):
    """A model of d_model 64 (2+2 layers, 4 heads) trained here for 250 Adam steps on English -> French number words
    (every number below 1,000 and 1,500 larger ones) to about 96% exact match, saved with conftest's BPE."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    sources = tokenizer([english(n) for n in TRAIN_NUMBERS])["input_ids"]
    targets = tokenizer([french(n) for n in TRAIN_NUMBERS])["input_ids"]
    config = tiny_config_for(tokenizer, d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128)
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(config).train()
    steps, batch_size = 250, 64
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98), eps=1e-9)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min((step + 1) / 100, 1 - step / steps))
    batches = random.Random(0)
    for _ in range(steps):
        rows = batches.sample(range(len(sources)), batch_size)
        batch = tokenizer.pad({"input_ids": [sources[k] for k in rows]}, return_tensors="pt")
        labels = tokenizer.pad({"input_ids": [targets[k] for k in rows]}, return_tensors="pt")["input_ids"]
        loss = model(**batch, labels=labels.masked_fill(labels == tokenizer.pad_token_id, -100)).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    folder = tmp_path_factory.mktemp("number-words")
    model.eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def onnx_dir(trained_dir, tmp_path_factory):
    """The trained model exported by the command, float32."""
    out = tmp_path_factory.mktemp("export") / "onnx"
    main(["export-onnx", "--model", str(trained_dir), "--out", str(out), "--max-positions", str(MAX_POSITIONS)])
    return out


@pytest.fixture(scope="module")
def int8_dir(onnx_dir, tmp_path_factory):
    """The export quantized as `export-onnx --quantize int8` does it, without exporting again."""
    out = tmp_path_factory.mktemp("export") / "int8"
    shutil.copytree(onnx_dir, out)
    for name in ONNX_FILES:
        quantize_int8(out / name)
    return out


@pytest.fixture(scope="module")
def tokenizer(trained_dir):
    return AutoTokenizer.from_pretrained(trained_dir)


@pytest.fixture(scope="module")
def torch_model(trained_dir):
    return VanillaTransformerForConditionalGeneration.from_pretrained(trained_dir).eval()


def generate_all(model, tokenizer, numbers, batch_size=100, **generate_kwargs) -> list[list[int]]:
    """The generated token ids of each number's English words, up to the first `</s>` (the padding after it depends
    on the batch), in batches of `batch_size`."""
    sequences = []
    for start in range(0, len(numbers), batch_size):
        batch = tokenizer([english(n) for n in numbers[start : start + batch_size]], return_tensors="pt", padding=True)
        for ids in model.generate(**batch, **generate_kwargs).tolist():
            end = ids.index(tokenizer.eos_token_id, 1) + 1 if tokenizer.eos_token_id in ids[1:] else len(ids)
            sequences.append(ids[:end])
    return sequences


def exact_match(tokenizer, sequences, numbers) -> float:
    texts = tokenizer.batch_decode(sequences, skip_special_tokens=True)
    return 100 * sum(text.strip() == french(n) for text, n in zip(texts, numbers)) / len(numbers)


@pytest.fixture(scope="module")
def decoded(trained_dir, onnx_dir, int8_dir, tokenizer, torch_model):
    """Every evaluation number decoded by each engine, greedy (num_beams=1) and with the saved generation config
    (section 6.1: beam 4, GNMT penalty 0.6, source + 50): {(engine, beams): sequences}, computed when first asked."""
    models = {"torch": lambda: torch_model, "ort": lambda: load(onnx_dir), "int8": lambda: load(int8_dir)}
    cache = {}

    def sequences(engine: str, beams: int):
        if (engine, beams) not in cache:
            options = {"num_beams": 1} if beams == 1 else {}
            cache[engine, beams] = generate_all(models[engine](), tokenizer, EVAL_NUMBERS, **options)
        return cache[engine, beams]

    return sequences


def test_the_saved_decoding_is_section_6_1s(trained_dir):
    config = GenerationConfig.from_pretrained(trained_dir)
    assert (config.num_beams, config.length_penalty, config.length_penalty_type) == (4, 0.6, "gnmt")
    assert config.max_length_over_source == 50


@pytest.mark.parametrize("beams", [1, 4])
def test_onnx_runtime_gives_the_torch_models_tokens(decoded, tokenizer, beams):
    torch_sequences, ort_sequences = decoded("torch", beams), decoded("ort", beams)
    assert exact_match(tokenizer, torch_sequences, EVAL_NUMBERS) > 90  # a trained model, not a random one
    different = [n for n, a, b in zip(EVAL_NUMBERS, torch_sequences, ort_sequences) if a != b]
    assert not different, f"{len(different)} numbers decode differently, e.g. {different[:5]}"


@pytest.mark.parametrize("beams", [1, 4])
def test_cached_and_uncached_onnx_decoding_agree(onnx_dir, tokenizer, decoded, beams):
    """Without a cache every step runs decoder_model.onnx on the whole prefix, as transformers does for any model."""
    options = {"num_beams": 1} if beams == 1 else {}
    uncached = generate_all(load(onnx_dir), tokenizer, EVAL_NUMBERS[::10], use_cache=False, **options)
    assert uncached == decoded("ort", beams)[::10]


@pytest.mark.parametrize("beams", [1, 4])
def test_int8_costs_at_most_a_point_of_exact_match(onnx_dir, int8_dir, tokenizer, decoded, beams):
    float32 = exact_match(tokenizer, decoded("ort", beams), EVAL_NUMBERS)
    int8 = exact_match(tokenizer, decoded("int8", beams), EVAL_NUMBERS)
    assert abs(float32 - int8) <= 1.0, (float32, int8)


def test_int8_graphs_multiply_int8_weights(onnx_dir, int8_dir):
    import onnx

    for name in ONNX_FILES:
        operators = {node.op_type for node in onnx.load(str(int8_dir / name)).graph.node}
        assert "DynamicQuantizeMatMul" in operators or "MatMulInteger" in operators, operators
        assert (int8_dir / name).stat().st_size < (onnx_dir / name).stat().st_size


GENERATION_ARGUMENTS = [
    dict(num_beams=4, num_return_sequences=3, length_penalty_type="transformers", length_penalty=1.0),
    dict(num_beams=3, early_stopping=True, no_repeat_ngram_size=2, max_new_tokens=6),
    dict(num_beams=1, max_length_over_source=None, min_new_tokens=12, max_new_tokens=14),
    dict(num_beams=2, output_scores=True, return_dict_in_generate=True),
    dict(do_sample=True, top_k=4, temperature=2.0, num_beams=1),
]


@pytest.mark.parametrize("arguments", GENERATION_ARGUMENTS, ids=lambda arguments: "-".join(map(str, arguments)))
def test_generation_arguments_give_the_torch_models_results(onnx_dir, tokenizer, torch_model, arguments):
    ort_model = load(onnx_dir)
    batch = tokenizer([english(n) for n in (7, 21, 480, 1999, 70071)], return_tensors="pt", padding=True)
    torch.manual_seed(3)
    expected = torch_model.generate(**batch, **arguments)
    torch.manual_seed(3)
    outputs = ort_model.generate(**batch, **arguments)
    if "return_dict_in_generate" in arguments:
        torch.testing.assert_close(outputs.sequences_scores, expected.sequences_scores, rtol=0, atol=1e-5)
        outputs, expected = outputs.sequences, expected.sequences
    assert outputs.tolist() == expected.tolist()


def test_export_writes_optimums_layout_with_dynamic_axes(onnx_dir, trained_dir, tokenizer):
    names = {path.name for path in onnx_dir.iterdir()}
    assert {*ONNX_FILES, "config.json", "generation_config.json", "tokenizer.json"} <= names
    assert AutoTokenizer.from_pretrained(onnx_dir).get_vocab() == tokenizer.get_vocab()
    saved = GenerationConfig.from_pretrained(trained_dir).to_dict()
    assert GenerationConfig.from_pretrained(onnx_dir).to_dict() == saved
    config = json.loads((onnx_dir / "config.json").read_text())
    assert config["model_type"] == "vanilla_transformer" and config["max_position_embeddings"] == MAX_POSITIONS
    assert list(config["auto_map"]) == ["AutoConfig"]  # the folder holds no model code

    def signature(name):
        session = ort.InferenceSession(str(onnx_dir / name))
        return ({value.name: value.shape for value in session.get_inputs()},
                {value.name: value.shape for value in session.get_outputs()})

    inputs, outputs = signature("encoder_model.onnx")
    assert inputs == {"input_ids": ["batch_size", "encoder_sequence_length"],
                      "attention_mask": ["batch_size", "encoder_sequence_length"]}
    assert outputs == {"last_hidden_state": ["batch_size", "encoder_sequence_length", 64]}
    inputs, outputs = signature("decoder_model.onnx")
    assert list(inputs) == ["encoder_attention_mask", "input_ids", "encoder_hidden_states"]
    assert outputs["present.1.encoder.key"] == ["batch_size", 4, "encoder_sequence_length", 16]
    assert outputs["present.1.decoder.value"] == ["batch_size", 4, "decoder_sequence_length", 16]
    inputs, outputs = signature("decoder_with_past_model.onnx")
    assert list(inputs)[:4] == ["encoder_attention_mask", "input_ids", "past_key_values.0.decoder.key",
                                "past_key_values.0.decoder.value"]
    assert inputs["past_key_values.1.decoder.key"] == ["batch_size", 4, "past_decoder_sequence_length", 16]
    assert inputs["past_key_values.1.encoder.value"] == ["batch_size", 4, "encoder_sequence_length", 16]
    assert list(outputs) == ["logits", *(f"present.{i}.decoder.{kind}" for i in (0, 1) for kind in ("key", "value"))]
    assert outputs["logits"] == ["batch_size", "decoder_sequence_length", len(tokenizer)]


def test_keys_and_values_of_their_own_sizes_export_and_decode_as_the_torch_model(tokenizer, tmp_path):
    """Table 3 row (B)'s kind of model, queries and keys of d_k = 4 and values of d_v = 12 per head (d_model 32, h 4;
    random weights): the cache tensors have their own sizes, and ONNX Runtime gives the PyTorch model's tokens."""
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(tiny_config_for(tokenizer, d_k=4, d_v=12)).eval()
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    out = tmp_path / "onnx"
    main(["export-onnx", "--model", str(tmp_path / "model"), "--out", str(out), "--max-positions", str(MAX_POSITIONS)])
    session = ort.InferenceSession(str(out / "decoder_with_past_model.onnx"))
    inputs = {value.name: value.shape for value in session.get_inputs()}
    assert inputs["past_key_values.1.decoder.key"] == ["batch_size", 4, "past_decoder_sequence_length", 4]
    assert inputs["past_key_values.1.encoder.value"] == ["batch_size", 4, "encoder_sequence_length", 12]
    batch = tokenizer([english(n) for n in (7, 81, 512, 3000)], return_tensors="pt", padding=True)
    ort_model = load(out)
    for beams in [1, 4]:
        forced = dict(num_beams=beams, min_new_tokens=6, max_new_tokens=6)
        assert torch.equal(ort_model.generate(**batch, **forced), model.generate(**batch, **forced))


def test_translation_pipeline_runs_the_onnx_model(onnx_dir, trained_dir):
    lines = [english(n) for n in (3, 45, 678)]
    translator = pipeline("translation", model=load(onnx_dir), tokenizer=AutoTokenizer.from_pretrained(onnx_dir))
    assert translator(lines) == pipeline("translation", model=str(trained_dir))(lines)


def test_onnx_gives_the_torch_backends_nbest_lists_and_pair_scores(onnx_dir, trained_dir):
    lines = [english(n) for n in (7, 45, 678, 4321)] + [""]
    ours = BACKENDS["torch"](trained_dir, "cpu")(lines, nbest=3, token_scores=True)
    theirs = BACKENDS["onnx"](onnx_dir, "cpu")(lines, nbest=3, token_scores=True)
    assert [[h.text for h in found] for found in theirs] == [[h.text for h in found] for found in ours]
    for mine, other in zip(ours, theirs):
        assert [h.score for h in other if h.score is not None] == pytest.approx(
            [h.score for h in mine if h.score is not None], abs=1e-3)
        assert [h.tokens for h in other] == [h.tokens for h in mine]
    with pytest.raises(ValueError, match="the ONNX export's decoder returns no attention to align with"):
        BACKENDS["onnx"](onnx_dir, "cpu")(lines, nbest=1, alignment="hard")
    targets = [french(n) for n in (7, 45, 678, 4321)] + [""]
    pair_scores = [SCORERS[name](folder, "cpu")(lines, targets) for name, folder in
                   (("torch", trained_dir), ("onnx", onnx_dir))]
    assert [s.log_probability for s in pair_scores[1]] == pytest.approx(
        [s.log_probability for s in pair_scores[0]], abs=1e-3)


@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_the_commands_run_the_onnx_backend(onnx_dir, trained_dir, tmp_path, capsys, command):
    source, reference = tmp_path / "source.en", tmp_path / "reference.fr"
    numbers = [5, 312, 999, 4321]
    source.write_text("\n".join([english(n) for n in numbers[:2]] + [""] + [english(n) for n in numbers[2:]]) + "\n")
    reference.write_text("\n".join([french(n) for n in numbers[:2]] + [""] + [french(n) for n in numbers[2:]]) + "\n")
    outputs = {}
    for backend, folder in (("onnx", onnx_dir), ("torch", trained_dir)):
        outputs[backend] = tmp_path / f"{backend}.fr"
        files = (["--input", str(source), "--output", str(outputs[backend])] if command == "translate" else
                 ["--src", str(source), "--ref", str(reference), "--output-hyps", str(outputs[backend])])
        main([command, "--model", str(folder), "--backend", backend, "--device", "cpu", *files])
    assert outputs["onnx"].read_text() == outputs["torch"].read_text()
    assert outputs["onnx"].read_text().split("\n")[2] == ""
    if command == "evaluate":
        scores = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("BLEU = ", "chrF2 = "))]
        assert len(scores) == 4 and scores[:2] == scores[2:]


def test_input_longer_than_the_exported_positions_is_one_line(onnx_dir, tmp_path, capsys):
    long_line = " ".join([english(77)] * 20)
    with pytest.raises(InputTooLongError, match="larger max_positions"):
        BACKENDS["onnx"](onnx_dir, "cpu")([long_line], num_beams=1)
    source, output = tmp_path / "long.en", tmp_path / "out.fr"
    source.write_text(long_line + "\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["translate", "--model", str(onnx_dir), "--backend", "onnx", "--input", str(source),
              "--output", str(output)])  # fmt: skip
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err and not output.exists()
    assert err.splitlines()[-1].startswith("vanilla-transformer translate: error: ") and "--max-positions" in err


def test_export_refuses_a_bad_out(trained_dir, onnx_dir, tmp_path, capsys):
    def refused(out, *flags):
        with pytest.raises(SystemExit) as exit_info:
            main(["export-onnx", "--model", str(trained_dir), "--out", str(out), *flags])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and len(err.splitlines()) == 1, err
        return err

    before = sorted(path.name for path in onnx_dir.iterdir())
    assert "already exists; pass --force to replace it" in refused(onnx_dir)
    assert sorted(path.name for path in onnx_dir.iterdir()) == before
    assert "would replace the model folder" in refused(trained_dir, "--force")
    assert "would replace the model folder" in refused(trained_dir.parent, "--force")
    (tmp_path / "file").write_text("")
    assert "is a file, not a folder" in refused(tmp_path / "file")
    with pytest.raises(SystemExit) as exit_info:  # argparse's own error, after its usage line
        main(["export-onnx", "--model", str(trained_dir), "--out", str(tmp_path / "new"), "--quantize", "int4"])
    assert exit_info.value.code == 2 and "invalid choice: 'int4'" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
    with pytest.raises(ValueError, match="max_positions must be positive"):
        export_onnx(trained_dir, tmp_path / "new", max_positions=0)


def test_each_backend_points_to_the_other_kind_of_folder(trained_dir, onnx_dir, tmp_path, capsys):
    with pytest.raises(ValueError, match="is a transformers model folder; the onnx backend needs it exported first$"):
        BACKENDS["onnx"](trained_dir, "cpu")
    with pytest.raises(SystemExit):  # the command adds the command that exports it
        main(["translate", "--model", str(trained_dir), "--backend", "onnx", "--input",
              str(trained_dir / "config.json")])
    assert f"export-onnx --model {trained_dir} --out {trained_dir}-onnx`, then" in capsys.readouterr().err
    with pytest.raises(ValueError, match="holds no ONNX model"):
        BACKENDS["onnx"](tmp_path, "cpu")
    source = tmp_path / "source.en"
    source.write_text("nine\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["translate", "--model", str(onnx_dir), "--input", str(source)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err == (f"vanilla-transformer translate: error: {onnx_dir} is an ONNX folder (from export-onnx): run it "
                   "with --backend onnx\n")


def test_a_device_without_its_provider_is_refused(onnx_dir):
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this ONNX Runtime has the CUDA provider")
    with pytest.raises(ValueError, match="onnxruntime-gpu"):
        VanillaTransformerORTForConditionalGeneration.from_pretrained(onnx_dir, device="cuda")


def test_loaded_sessions_sleep_between_runs_unless_told_otherwise(onnx_dir):
    """Between decoding steps PyTorch runs generate()'s own work; ONNX Runtime threads spinning meanwhile would take
    its cores. Options given by the caller are used as given."""
    model = VanillaTransformerORTForConditionalGeneration.from_pretrained(onnx_dir)
    for session in (model.encoder.session, model.decoder.session, model.decoder.session_with_past):
        assert session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    model = VanillaTransformerORTForConditionalGeneration.from_pretrained(onnx_dir, session_options=options)
    assert model.decoder.session.get_session_options().intra_op_num_threads == 1
    with pytest.raises(RuntimeError, match="does not have configuration"):  # never set: the default, spinning
        model.decoder.session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning")
