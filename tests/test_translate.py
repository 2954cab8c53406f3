"""`translate_lines`, `text_files.read_lines` and the `translate` and `evaluate` commands, on a tiny random model whose
outputs are restricted to lowercase letters and spaces, so that every translation is readable text that tells its input
apart."""

import argparse
import gzip
import io
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu
import torch
from conftest import tiny_config_for

from vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer.cli.main import main
from vanilla_transformer.cli.translate import _target_lang
from vanilla_transformer.inference.metrics import score_translations
from vanilla_transformer.training.tokenization import train_tokenizer
from vanilla_transformer.paths.text_files import InvalidUTF8Error, iter_lines, read_lines
from vanilla_transformer.inference.translate import translate_lines


TOKENIZER_TEXT = [
    "the cat sat on the mat",
    "a dog runs in the park",
    "the bird sings in a big tree",
    "le chat est assis sur le tapis",
    "un chien court dans le parc",
]
# Shuffled lengths, with an empty and a whitespace-only line.
LINES = [
    "the big red house in the park",
    "",
    "a cat",
    "the bird sings",
    "   ",
    "dog",
    "small blue tree on a mat near the house",
    "sat on",
]
MODEL_MAX_LENGTH = 40  # the fixture tokenizer's model_max_length: the default length past which a line is reported
DECODING = dict(num_beams=1, max_new_tokens=8)  # the tests check the plumbing, not the search: greedy and short
DECODING_FLAGS = ["--num-beams", "1", "--max-new-tokens", "8"]


@pytest.fixture(scope="module")
def model_and_tokenizer():
    tokenizer = train_tokenizer(TOKENIZER_TEXT, vocab_size=260, show_progress=False)
    tokenizer.model_max_length = MODEL_MAX_LENGTH
    # Larger random embeddings, and a seed whose random model translates each of LINES differently (checked by
    # `one_by_one`): the output of a random model then depends on its input.
    config = tiny_config_for(tokenizer, init_std=0.5)
    torch.manual_seed(176)
    model = VanillaTransformerForConditionalGeneration(config).eval()
    # Saved with the model, so the commands decode the same way.
    allowed = set(tokenizer.convert_tokens_to_ids(list("abcdefghijklmnopqrstuvwxyz") + ["Ġ", "</s>"]))
    model.generation_config.suppress_tokens = [i for i in range(len(tokenizer)) if i not in allowed]
    return model, tokenizer


@pytest.fixture(scope="module")
def model_dir(model_and_tokenizer, tmp_path_factory):
    model, tokenizer = model_and_tokenizer
    path = tmp_path_factory.mktemp("tiny-translator")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def one_by_one(model_and_tokenizer):
    """The translation of each of LINES translated alone, "" for blank lines."""
    model, tokenizer = model_and_tokenizer
    translations = [translate_lines(model, tokenizer, [line], **DECODING)[0] for line in LINES]
    texts = [text for text in translations if text]
    assert len(set(texts)) == len(texts) == 6, f"every sentence must translate differently: {translations}"
    return translations


def record_batches(model, monkeypatch) -> list[tuple[int, int]]:
    """Make `model.generate` record the (sentences, padded length) of every batch it receives."""
    shapes, generate = [], model.generate

    def recording_generate(input_ids, **kwargs):
        shapes.append(tuple(input_ids.shape))
        return generate(input_ids=input_ids, **kwargs)

    monkeypatch.setattr(model, "generate", recording_generate)
    return shapes


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


# --- translate_lines -----------------------------------------------------------------------------------------------


def test_translations_come_back_in_input_order(model_and_tokenizer, one_by_one, monkeypatch):
    model, tokenizer = model_and_tokenizer
    batches = record_batches(model, monkeypatch)
    assert translate_lines(model, tokenizer, LINES, batch_size=2, **DECODING) == one_by_one
    assert sum(sentences for sentences, _ in batches) == 6  # blank lines never reach the model
    assert all(sentences <= 2 for sentences, _ in batches)
    widths = [width for _, width in batches]
    assert widths == sorted(widths, reverse=True)  # batched by length, longest first
    assert model.training is False


def test_max_tokens_bounds_the_padded_batch(model_and_tokenizer, one_by_one, monkeypatch):
    model, tokenizer = model_and_tokenizer
    batches = record_batches(model, monkeypatch)
    assert translate_lines(model, tokenizer, LINES, max_tokens=40, **DECODING) == one_by_one
    assert all(sentences * width <= 40 for sentences, width in batches)
    assert len(batches) > 1


def test_blank_input_never_calls_the_model(model_and_tokenizer, monkeypatch):
    model, tokenizer = model_and_tokenizer
    monkeypatch.setattr(model, "generate", lambda **kwargs: pytest.fail("generate was called"))
    assert translate_lines(model, tokenizer, ["", " \t", ""]) == ["", "", ""]
    assert translate_lines(model, tokenizer, []) == []


def test_long_line_is_reported_and_translated_whole(model_and_tokenizer, caplog, monkeypatch):
    model, tokenizer = model_and_tokenizer
    long_line = " ".join(["the cat sat"] * 4)  # 48 tokens, more than the tokenizer's model_max_length
    expected = translate_lines(model, tokenizer, [long_line], **DECODING)
    batches = record_batches(model, monkeypatch)
    translations = translate_lines(model, tokenizer, ["a cat", long_line], **DECODING)
    assert f"Line 2 (48 tokens) longer than {MODEL_MAX_LENGTH} tokens" in caplog.text
    assert translations[1] == expected[0]
    assert max(width for _, width in batches) == 48  # not truncated


def test_a_line_past_the_bound_is_left_untranslated_with_a_warning_and_the_others_translated(model_and_tokenizer,
                                                                                               caplog, monkeypatch):
    model, tokenizer = model_and_tokenizer
    bound = 4 * MODEL_MAX_LENGTH  # UNTRANSLATED_FACTOR times the tokenizer's model_max_length
    at_bound, past_bound = " ".join(["the cat sat"] * 13), " ".join(["the cat sat"] * 14)  # 156 and 168 tokens
    assert len(tokenizer(at_bound)["input_ids"]) <= bound < len(tokenizer(past_bound)["input_ids"])
    expected = [translate_lines(model, tokenizer, [line], **DECODING)[0] for line in ("a cat", at_bound, "dog")]
    batches = record_batches(model, monkeypatch)
    translations = translate_lines(model, tokenizer, ["a cat", past_bound, at_bound, "dog"], **DECODING)
    assert translations == [expected[0], "", expected[1], expected[2]]
    assert max(width for _, width in batches) < 168  # never reached the model
    assert f"Line 2 (168 tokens) longer than {bound} tokens: left untranslated (an empty line" in caplog.text
    assert f"Line 3 (156 tokens) longer than {MODEL_MAX_LENGTH} tokens: translated whole" in caplog.text


def test_warn_length_sets_the_reported_length(model_and_tokenizer, caplog):
    model, tokenizer = model_and_tokenizer
    translate_lines(model, tokenizer, ["a cat", "", "dog", "a dog"], warn_length=4, **DECODING)  # 6, -, 4, 6 tokens
    assert "Lines 1 (6 tokens), 4 (6 tokens) longer than 4 tokens" in caplog.text


@pytest.mark.slow
def test_compiled_beam_search_equals_eager_with_one_batch_shape_per_source_length(model_and_tokenizer, monkeypatch):
    """Sources of 40, 30 and 4-15 tokens: padded to 48, 32 and 16, each batch filled up to 3 sentences."""
    model, tokenizer = model_and_tokenizer
    decoding = dict(batch_size=3, num_beams=4, max_new_tokens=8)
    eager = translate_lines(model, tokenizer, LINES, **decoding)
    batches = record_batches(model, monkeypatch)
    assert translate_lines(model, tokenizer, LINES, **decoding, compile=True) == eager
    assert batches == [(3, 48), (3, 32), (3, 16), (3, 16)]
    assert "forward" not in vars(model)


# --- read_lines ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["input.txt", "input.txt.gz"])
def test_read_lines_splits_on_newlines_only(tmp_path, name):
    path = write(tmp_path / name, "\ufeffone\r\ntwo\u2028still two\n\nfour".encode())
    assert read_lines(path) == ["one", "two\u2028still two", "", "four"]


@pytest.mark.parametrize("name", ["bad.txt", "bad.txt.gz"])
def test_invalid_utf8_names_the_line_byte_and_column(tmp_path, name):
    path = write(tmp_path / name, "fine\nçà ".encode() + b"\xff rest\n")
    with pytest.raises(InvalidUTF8Error) as error:
        read_lines(path)
    assert str(error.value) == f"{path}: line 2 is not valid UTF-8 (byte 0xff at column 4)"


def test_iter_lines_reads_one_line_at_a_time(tmp_path):
    path = write(tmp_path / "input.txt.gz", b"one\ntwo\n\xff\n")
    lines = iter_lines(path)
    assert [next(lines), next(lines)] == ["one", "two"]  # the bad line is not read yet
    with pytest.raises(InvalidUTF8Error, match="line 3 is not valid UTF-8"):
        next(lines)


def test_read_lines_reads_stdin(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("a\n\nb\n".encode())))
    assert read_lines("-") == ["a", "", "b"]


# --- The commands --------------------------------------------------------------------------------------------------


def test_translate_command_writes_one_line_per_input_line(model_dir, one_by_one, tmp_path):
    source = write(tmp_path / "in.txt", "\n".join(LINES).encode() + b"\n")
    output = tmp_path / "out.txt"
    main(["translate", "--model", str(model_dir), "--input", str(source), "--output", str(output), "--batch-size", "3",
          *DECODING_FLAGS])
    assert output.read_text(encoding="utf-8").split("\n") == [*one_by_one, ""]


def test_translate_command_reads_stdin_and_writes_stdout(model_dir, one_by_one, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("\n".join(LINES[:4]).encode())))
    main(["translate", "--model", str(model_dir), *DECODING_FLAGS])
    assert capsys.readouterr().out == "".join(f"{text}\n" for text in one_by_one[:4])


@pytest.mark.slow
def test_translate_command_compiles_for_the_torch_backend_only(model_dir, one_by_one, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("\n".join(LINES[:4]).encode())))
    main(["translate", "--model", str(model_dir), "--compile", *DECODING_FLAGS])
    assert capsys.readouterr().out == "".join(f"{text}\n" for text in one_by_one[:4])
    with pytest.raises(SystemExit) as exit_info:
        main(["translate", "--model", str(model_dir), "--compile", "--backend", "ct2"])
    assert exit_info.value.code == 2
    assert "--compile compiles PyTorch's decoding; --backend ct2 has its own" in capsys.readouterr().err


def test_translate_command_reports_lines_longer_than_the_tokenizer_maximum(model_dir, tmp_path, caplog, capsys):
    long_line = " ".join(["the cat sat"] * 4)  # 48 tokens
    source = write(tmp_path / "in.txt", f"a cat\n{long_line}\n".encode())
    main(["translate", "--model", str(model_dir), "--input", str(source), *DECODING_FLAGS])
    assert f"Line 2 (48 tokens) longer than {MODEL_MAX_LENGTH} tokens" in caplog.text
    output = capsys.readouterr()
    translations = output.out.split("\n")
    assert len(translations) == 3 and translations[1]
    # Said once: not again by transformers' tokenizer, whose "maximum sequence length" does not apply here.
    assert "Token indices sequence length" not in output.err + caplog.text


def test_translate_command_refuses_invalid_utf8(model_dir, tmp_path, capsys):
    source = write(tmp_path / "bad.txt", b"fine\nalso fine\nbad \xe9 byte\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["translate", "--model", str(model_dir), "--input", str(source)])
    assert exit_info.value.code == 2
    message = f"{source}: line 3 is not valid UTF-8 (byte 0xe9 at column 5)"
    assert capsys.readouterr().err == f"vanilla-transformer translate: error: {message}\n"


@pytest.mark.slow  # a fresh process
def test_console_script_refuses_invalid_utf8_without_a_traceback(model_dir, tmp_path):
    script = Path(sys.executable).with_name("vanilla-transformer")
    if not script.exists():
        pytest.skip("the vanilla-transformer console script is not installed next to this Python")
    source = write(tmp_path / "bad.txt", b"\xc3\x28\n")
    result = subprocess.run([script, "translate", "--model", model_dir, "--input", source], capture_output=True)
    assert result.returncode == 2
    assert f"{source}: line 1 is not valid UTF-8 (byte 0xc3 at column 1)".encode() in result.stderr
    assert b"Traceback" not in result.stderr and result.stdout == b""


def test_evaluate_prints_bleu_and_chrf_with_signatures(model_dir, one_by_one, tmp_path, capsys):
    sources = [line for line in LINES if line.strip()]
    hypotheses = [text for text in one_by_one if text]
    # Half the references are the hypotheses themselves, so that the scores are neither 0 nor 100.
    references = [hypothesis if i % 2 else "the cat sat on the mat" for i, hypothesis in enumerate(hypotheses)]
    source = write(tmp_path / "test.en.gz", "\n".join(sources).encode())
    reference = write(tmp_path / "test.fr", "\n".join(references).encode())
    hyps_file = tmp_path / "hyps.txt"
    main(["evaluate", "--model", str(model_dir), "--src", str(source), "--ref", str(reference),
          "--output-hyps", str(hyps_file), *DECODING_FLAGS])
    printed = capsys.readouterr().out.splitlines()
    bleu = sacrebleu.corpus_bleu(hypotheses, [references])
    chrf = sacrebleu.corpus_chrf(hypotheses, [references])
    assert 0 < chrf.score < 100
    assert printed[0].startswith(f"BLEU = {bleu.score:.2f} ")
    assert printed[1] == f"  signature: nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{sacrebleu.__version__}"
    assert printed[2] == f"chrF2 = {chrf.score:.2f}"
    assert printed[3].startswith("  signature: nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|")
    # The model's config names no target language: the Moses tokenizer's default, English.
    lc_moses = score_translations(hypotheses, references, moses_lang="en")
    assert printed[4] == lc_moses["bleu_lc_moses_report"]
    assert printed[4].startswith(f"BLEU (lowercased, Moses-tokenized) = {lc_moses['bleu_lc_moses']:.2f} ")
    assert printed[5] == f"  signature: {lc_moses['bleu_lc_moses_signature']}"
    assert "|case:lc|eff:no|tok:none|" in printed[5] and "|moses:en|sacremoses:" in printed[5]
    assert hyps_file.read_text(encoding="utf-8").splitlines() == hypotheses


def test_evaluate_tokenizes_for_the_target_language_it_is_given_or_the_models(tmp_path):
    (tmp_path / "config.json").write_text('{"target_lang": "de"}')
    assert _target_lang(argparse.Namespace(target_lang=None, model=str(tmp_path))) == "de"
    assert _target_lang(argparse.Namespace(target_lang="fr", model=str(tmp_path))) == "fr"
    assert _target_lang(argparse.Namespace(target_lang=None, model=str(tmp_path / "no-config"))) == "en"


@pytest.mark.parametrize(
    ("source_text", "reference_text", "problem"),
    [
        ("a\nb\nc\n", "x\ny\n", "{src} has 3 lines but {ref} has 2"),
        ("a\nb\n", "", "{ref} is empty"),
        ("\n\n", "x\ny\n", "{src} is empty"),
    ],
)
def test_evaluate_refuses_unaligned_or_empty_files(model_dir, tmp_path, capsys, source_text, reference_text, problem):
    source = write(tmp_path / "src.txt", source_text.encode())
    reference = write(tmp_path / "ref.txt", reference_text.encode())
    with pytest.raises(SystemExit) as exit_info:
        main(["evaluate", "--model", str(model_dir), "--src", str(source), "--ref", str(reference)])
    assert exit_info.value.code == 2
    assert problem.format(src=source, ref=reference) in capsys.readouterr().err


# --- Outputs written whole, checked first; long inputs a chunk at a time ---------------------------------------------


def refuse_to_translate(monkeypatch):
    """Loading a model fails the test: the command must stop before."""
    from vanilla_transformer.backends import table as backends

    monkeypatch.setitem(backends.BACKENDS, "torch", lambda *args: pytest.fail("the model was loaded"))


@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_an_output_that_cannot_be_written_stops_the_command_before_translating(
    command, model_dir, tmp_path, capsys, monkeypatch
):
    refuse_to_translate(monkeypatch)
    source = write(tmp_path / "in.txt", b"a cat\n")
    flag = {"translate": ["--input", str(source)], "evaluate": ["--src", str(source), "--ref", str(source)]}[command]
    output_flag = "--output" if command == "translate" else "--output-hyps"
    missing = tmp_path / "missing" / "out.txt"
    for output, problem in [
        (missing, f"no such folder: {missing.parent} (to write {missing} in)"),
        (tmp_path, f"{tmp_path} is a folder; give the name of a file to write"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--model", str(model_dir), *flag, output_flag, str(output)])
        assert exit_info.value.code == 2
        assert capsys.readouterr().err == f"vanilla-transformer {command}: error: {problem}\n"


def test_output_file_is_replaced_whole_or_not_at_all(tmp_path):
    from vanilla_transformer.paths.text_files import output_file

    target = tmp_path / "out.txt"
    target.write_text("old\n")
    target.chmod(0o640)
    for interruption in (KeyboardInterrupt, RuntimeError):
        with pytest.raises(interruption), output_file(target) as file:
            file.write("half of the new\n")
            raise interruption
        assert target.read_text() == "old\n" and sorted(tmp_path.iterdir()) == [target]
    with output_file(target) as file:
        file.write("new\n")
    assert target.read_text() == "new\n" and sorted(tmp_path.iterdir()) == [target]
    assert target.stat().st_mode & 0o777 == 0o640


@pytest.mark.slow  # a process of its own
def test_what_a_killed_command_left_beside_its_output_is_removed_by_the_next(tmp_path):
    import os
    import socket

    from vanilla_transformer.paths.text_files import output_file, output_folder

    gone = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)  # a process that has ended
    host = socket.gethostname()
    left = [tmp_path / f".out.txt.{host}-{gone}.0123abcd.tmp", tmp_path / f".model.{host}-{gone}.0123abcd.tmp"]
    kept = [tmp_path / f".out.txt.{host}-{os.getpid()}.89abcdef.tmp",  # a live process's
            tmp_path / f".out.txt.elsewhere-{gone}.0123abcd.tmp"]  # another host's, whose processes are not known here
    for path in left + kept:
        path.write_text("half")
    left[1].unlink()
    left[1].mkdir()
    with output_file(tmp_path / "out.txt") as file:
        file.write("new\n")
    with output_folder(tmp_path / "model") as folder:
        (folder / "config.json").write_text("{}")
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        ["out.txt", "model", *(path.name for path in kept)])


def in_chunks_of(size, monkeypatch) -> list[int]:
    """Make the commands translate `size` lines at a time; the sizes of the chunks translated are recorded."""
    from vanilla_transformer.inference import lines as lines_module

    sizes, translate_in_chunks = [], lines_module.translate_in_chunks

    def recording(translate, lines, **options):
        def recording_translate(chunk, **chunk_options):
            sizes.append(len(chunk))
            return translate(chunk, **chunk_options)

        return translate_in_chunks(recording_translate, lines, chunk_lines=size, **options)

    monkeypatch.setattr(lines_module, "translate_in_chunks", recording)
    return sizes


def test_translate_command_translates_a_chunk_at_a_time_in_input_order(
    model_dir, one_by_one, tmp_path, monkeypatch, caplog
):
    sizes = in_chunks_of(3, monkeypatch)
    long_line = " ".join(["the cat sat"] * 4)  # 48 tokens, reported with its line number in the file
    source = write(tmp_path / "in.txt", "\n".join(LINES + [long_line]).encode() + b"\n")
    output = tmp_path / "out.txt"
    main(["translate", "--model", str(model_dir), "--input", str(source), "--output", str(output), *DECODING_FLAGS])
    assert sizes == [3, 3, 3]
    assert output.read_text(encoding="utf-8").split("\n")[:-2] == one_by_one
    assert f"Line 9 (48 tokens) longer than {MODEL_MAX_LENGTH} tokens" in caplog.text


def test_an_interrupted_translation_leaves_the_old_output(model_dir, tmp_path, monkeypatch, capsys):
    from vanilla_transformer.backends import table as backends

    in_chunks_of(2, monkeypatch)
    load = backends.BACKENDS["torch"]

    def interrupted_on_the_second_chunk(model, device):
        translate, calls = load(model, device), []

        def translate_or_interrupt(lines, **options):
            calls.append(lines)
            if len(calls) == 2:
                raise KeyboardInterrupt
            return translate(lines, **options)

        return translate_or_interrupt

    monkeypatch.setitem(backends.BACKENDS, "torch", interrupted_on_the_second_chunk)
    source = write(tmp_path / "in.txt", "\n".join(LINES).encode())
    output = write(tmp_path / "out.txt", b"the old translations\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["translate", "--model", str(model_dir), "--input", str(source), "--output", str(output), *DECODING_FLAGS])
    assert exit_info.value.code == 130
    assert capsys.readouterr().err.splitlines()[-1] == "vanilla-transformer translate: interrupted"
    assert output.read_bytes() == b"the old translations\n"
    assert sorted(tmp_path.iterdir()) == [source, output]  # no temporary file left behind


def translate_peak_rss_mib(model_dir, input_path, output_path, *flags) -> float:
    """Peak resident memory (MiB) of `vanilla-transformer translate` on `input_path`, run in a child process."""
    import os

    script = Path(sys.executable).with_name("vanilla-transformer")
    command = [script, "translate", "--model", model_dir, "--input", input_path, "--output", output_path, *flags]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, process.stderr.read().decode()[-2000:]
    return usage.ru_maxrss / 1024  # kilobytes on Linux


@pytest.mark.slow
def test_translate_command_memory_does_not_grow_with_the_input(model_dir, tmp_path):
    if not Path(sys.executable).with_name("vanilla-transformer").exists():
        pytest.skip("the vanilla-transformer console script is not installed next to this Python")
    flags = ["--num-beams", "1", "--max-new-tokens", "1", "--batch-size", "256", "--device", "cpu"]
    peaks = {}
    for count in (2_500, 10_000):  # past the first chunk (2,048 lines), memory stays flat
        source = write(tmp_path / f"{count}.txt", "".join(f"{LINES[i % 8]} {i}\n" for i in range(count)).encode())
        peaks[count] = translate_peak_rss_mib(model_dir, source, tmp_path / "out.txt", *flags)
        assert len((tmp_path / "out.txt").read_text().split("\n")) == count + 1
    assert peaks[10_000] - peaks[2_500] < 10, peaks


def test_commands_show_no_loading_bar_and_leave_transformers_bars_as_they_were(model_dir, tmp_path, capsys):
    from transformers.utils import logging as transformers_logging

    source = write(tmp_path / "in.txt", b"a cat\n")
    assert transformers_logging.is_progress_bar_enabled()
    main(["translate", "--model", str(model_dir), "--input", str(source), *DECODING_FLAGS])
    assert "Loading weights" not in capsys.readouterr().err
    assert transformers_logging.is_progress_bar_enabled()
