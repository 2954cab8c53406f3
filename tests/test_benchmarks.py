"""The benchmark scripts in `benchmarks/` run by hand; their `--smoke` mode runs here so that they do not rot: each
prints a table and writes JSON with both models and their ratio. The analytic FLOP count of `train_throughput.py`
is checked against torch's own FLOP counter."""

import gzip
import json
import math
import os
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import MULTI30K
from num2words import num2words
from torch.utils.flop_counter import FlopCounterMode


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """Multi30k where this project's machine keeps it, else a stand-in of English/German number words in its layout."""
    if all((MULTI30K / name).is_file() for name in ("train.en.gz", "train.de.gz", "val.en.gz")):
        return MULTI30K
    folder = tmp_path_factory.mktemp("multi30k")
    numbers = range(1000, 3000)
    files = {
        "train.en.gz": [num2words(n, lang="en") for n in numbers],
        "train.de.gz": [num2words(n, lang="de") for n in numbers],
        "val.en.gz": [num2words(n, lang="en") for n in range(5000, 5100)],
    }
    for name, lines in files.items():
        with gzip.open(folder / name, "wt", encoding="utf-8") as file:
            file.write("\n".join(lines) + "\n")
    return folder


def run_smoke(script: str, data_dir: Path, tmp_path: Path, *options: str) -> tuple[str, dict]:
    json_path = tmp_path / f"{script}.json"
    command = [sys.executable, str(BENCHMARKS / f"{script}.py"), "--smoke", "--data-dir", str(data_dir),
               "--json", str(json_path), *options]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-5000:]
    return result.stdout, json.loads(json_path.read_text())


def table_rows(markdown: str) -> list[list[str]]:
    """The cells of the Markdown table's rows, header first, separator left out."""
    rows = [line.strip("|").split("|") for line in markdown.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row] for row in rows if not set("".join(row)) <= set("- ")]


@pytest.mark.slow
def test_dropout_speed_smoke(data_dir, tmp_path):
    stdout, report = run_smoke("dropout_speed", data_dir, tmp_path, "--attention-dropout", "0.1")
    header, *rows = table_rows(stdout)
    assert header[:3] == ["dropout", "ms per step, median (min-max)", "target tok/s"]
    assert [row[0] for row in rows] == ["cpu_16bit", "torch"]
    assert all(len(times) == 2 and min(times) > 0 for times in report["step_ms"].values())
    assert report["speedup"] == pytest.approx(statistics.median(report["step_ms"]["torch"])
                                              / statistics.median(report["step_ms"]["cpu_16bit"]))
    assert report["settings"]["attention_and_relu_dropout"] == 0.1


@pytest.mark.slow
def test_loss_speed_smoke(data_dir, tmp_path):
    stdout, report = run_smoke("loss_speed", data_dir, tmp_path)
    header, *rows = table_rows(stdout)
    assert header[:3] == ["logits", "loss", "ms per batch, median (min-max)"]
    losses = ["torch cross_entropy", "chunked (package)"]
    assert [row[:2] for row in rows] == [[setting, loss] for setting in ("bf16", "fp32") for loss in losses]
    for setting, per_loss in report["times_ms"].items():
        assert all(len(times) == 2 and min(times) > 0 for times in per_loss.values())
        assert report["speedups"][setting] == pytest.approx(statistics.median(per_loss["torch cross_entropy"])
                                                            / statistics.median(per_loss["chunked (package)"]))
        torch_value, chunked_value = report["first_batch_losses"][setting].values()
        assert chunked_value == pytest.approx(torch_value, rel=1e-4)


@pytest.mark.slow
def test_generate_speed_smoke(data_dir, tmp_path):
    stdout, report = run_smoke("generate_speed", data_dir, tmp_path)
    header, *rows = table_rows(stdout)
    assert header[-3:] == ["ours tok/s", "Marian tok/s", "ours/Marian"]
    assert [(row[0], row[1]) for row in rows] == [("greedy", "1"), ("greedy", "32"), ("beam 4", "1"), ("beam 4", "32")]

    settings = report["settings"]
    # Same size: the Marian configuration really mirrors ours.
    assert settings["trainable_parameters"]["ours"] == settings["trainable_parameters"]["marian"]
    for result, row in zip(report["results"], rows):
        ours, marian = result["ours"], result["marian"]
        assert ours["median"] > 0 and marian["median"] > 0
        assert result["ratio"] == pytest.approx(ours["median"] / marian["median"])
        assert row[-1] == f"{result['ratio']:.2f}"
        # min_new_tokens = max_new_tokens: both decode exactly N tokens for every sentence.
        expected = result["sentences"] * settings["new_tokens"]
        assert ours["generated_tokens"] == marian["generated_tokens"] == expected


@pytest.mark.slow
def test_generate_speed_compiled_smoke(data_dir, tmp_path):
    """--compile: ours and Marian eager and compiled, and ours in CTranslate2; batch 32 only, to compile few shapes."""
    stdout, report = run_smoke("generate_speed", data_dir, tmp_path, "--compile", "--batch-sizes", "32")
    header, *rows = table_rows(stdout)
    names = ["ours", "ours_compiled", "marian", "marian_compiled", "ours_ct2"]
    labels = ["ours", "ours compiled", "Marian", "Marian compiled", "ours, CT2 float32"]
    others = [labels[0], *labels[2:]]
    assert header[3:] == [*(f"{label} tok/s" for label in labels), "ours compiled compile s",
                          "Marian compiled compile s", *(f"ours compiled / {label}" for label in others)]
    assert [(row[0], row[1]) for row in rows] == [("greedy", "32"), ("beam 4", "32")]
    assert report["settings"]["failed"] == {} and report["settings"]["compile_mode"] == "default"
    for result, row in zip(report["results"], rows):
        expected = result["sentences"] * report["settings"]["new_tokens"]  # forced lengths: N tokens per sentence
        assert [result[name]["generated_tokens"] for name in names] == [expected] * 5
        for name in ("ours_compiled", "marian_compiled"):
            seconds = statistics.median(expected / rate for rate in result[name]["values"])
            assert result[name]["compile_s"] == pytest.approx(result[name]["first_pass_s"] - seconds)
        ratio = result["ours_compiled_over_ours_ct2"]
        assert ratio == pytest.approx(result["ours_compiled"]["median"] / result["ours_ct2"]["median"])
        assert row[-1] == f"{ratio:.2f}"


@pytest.mark.slow
def test_train_throughput_smoke(data_dir, tmp_path):
    stdout, report = run_smoke("train_throughput", data_dir, tmp_path)
    header, *rows = table_rows(stdout)
    assert header[1:4] == ["ours tok/s", "Marian tok/s", "ours/Marian"]
    assert len(rows) == 1 and rows[0][0].startswith("tiny")

    (result,) = report["results"]
    ours, marian = result["ours"], result["marian"]
    assert ours["trainable_parameters"] == marian["trainable_parameters"]
    assert result["ratio"] == pytest.approx(ours["tokens_per_s"]["median"] / marian["tokens_per_s"]["median"])
    assert rows[0][3] == f"{result['ratio']:.2f}"
    for stats in (ours, marian):
        assert len(stats["tokens_per_s"]["values"]) == report["settings"]["repeats"]
        assert stats["gflops_per_s"]["median"] > 0 and stats["peak_rss_mib"] > stats["baseline_rss_mib"] > 0
        # Label-smoothed cross-entropy of a random model: about log(V), finite.
        assert 0 < stats["last_loss"] < 2 * math.log(report["settings"]["vocab_size"])


@pytest.mark.slow
def test_ct2_speed_smoke(data_dir, tmp_path):
    stdout, report = run_smoke("ct2_speed", data_dir, tmp_path)
    header, *rows = table_rows(stdout)
    assert header[3:] == ["ours, CT2 tok/s", "Marian, CT2 tok/s", "MarianMTModel.generate tok/s",
                          "ours CT2 / Marian CT2", "ours CT2 / MarianMTModel"]
    assert [(row[0], row[1]) for row in rows] == [("greedy", "1"), ("greedy", "32"), ("beam 4", "1"), ("beam 4", "32")]
    for result, row in zip(report["results"], rows):
        engines = [result[name] for name in ("ours_ct2", "marian_ct2", "marian_generate")]
        assert all(engine["median"] > 0 for engine in engines)
        assert result["ours_ct2_over_marian_ct2"] == pytest.approx(engines[0]["median"] / engines[1]["median"])
        assert row[-2:] == [f"{result['ours_ct2_over_marian_ct2']:.2f}", f"{result['ours_ct2_over_marian_generate']:.2f}"]
        # Forced lengths: every engine decodes exactly N tokens for every sentence.
        expected = result["sentences"] * report["settings"]["new_tokens"]
        assert [engine["generated_tokens"] for engine in engines] == [expected] * 3


@pytest.mark.slow
def test_ct2_speed_smoke_without_generate(data_dir, tmp_path):
    stdout, report = run_smoke("ct2_speed", data_dir, tmp_path, "--skip-generate")
    header, *rows = table_rows(stdout)
    assert header[3:] == ["ours, CT2 tok/s", "Marian, CT2 tok/s", "ours CT2 / Marian CT2"]
    assert len(rows) == 4 and all("marian_generate" not in result for result in report["results"])
    for result, row in zip(report["results"], rows):
        assert row[-1] == f"{result['ours_ct2_over_marian_ct2']:.2f}"
        assert result["ours_ct2"]["generated_tokens"] == result["marian_ct2"]["generated_tokens"]


class StandInTokenizer:
    pad_token_id, bos_token_id, eos_token_id = 0, 1, 2

    def __len__(self):
        return 1000


def counted_training_step_flops(model) -> tuple[int, torch.Tensor, torch.Tensor]:
    """torch's count of the forward + backward FLOPs of one label-smoothed training step of `model` (vocabulary 1,000)
    on 8 random pairs of 23 source and 19 target tokens, and those pairs' token ids."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(4, 1000, (8, 23), generator=generator)
    labels = torch.randint(4, 1000, (8, 19), generator=generator)
    with FlopCounterMode(display=False) as counter:
        logits = model(input_ids=input_ids, decoder_input_ids=labels, use_cache=False).logits
        torch.nn.functional.cross_entropy(logits.view(-1, 1000), labels.view(-1), label_smoothing=0.1).backward()
    return counter.get_total_flops(), input_ids, labels


@pytest.mark.parametrize("name", ["ours", "marian"])
def test_training_flops_match_torch_flop_counter(name, monkeypatch):
    """Forward + backward matmul FLOPs of one step equal `training_flops`' analytic count (eager attention, whose
    matmuls torch's counter sees one by one)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from common import SIZES, build_model, model_configs
    from train_throughput import training_flops

    config = model_configs("tiny", StandInTokenizer(), dropout=0.1)[name]
    model = build_model(name, config, seed=0, attn_implementation="eager").train()
    counted, input_ids, labels = counted_training_step_flops(model)
    batch = dict(input_ids=input_ids.numpy(), labels=labels.numpy())
    assert counted == training_flops(SIZES["tiny"], 1000, [batch])


def test_recipe_speeds_training_flops_count_what_torch_counts_on_unpadded_batches(monkeypatch):
    """`recipe_speed.training_flops`, from the pairs' real lengths, equals torch's count of forward + backward matmul
    FLOPs on a batch without padding (eager attention), and `train_throughput`'s count of padded shapes."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from common import SIZES
    from recipe_speed import peak_tflops, training_flops
    from train_throughput import training_flops as padded_training_flops

    from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

    shape = SIZES["tiny"]
    config = VanillaTransformerConfig.from_preset(
        "base", vocab_size=1000, d_model=shape["d_model"], encoder_layers=shape["layers"],
        decoder_layers=shape["layers"], encoder_attention_heads=shape["heads"], decoder_attention_heads=shape["heads"],
        encoder_ffn_dim=shape["ffn_dim"], decoder_ffn_dim=shape["ffn_dim"], attn_implementation="eager")
    model = VanillaTransformerForConditionalGeneration(config).train()
    counted, input_ids, labels = counted_training_step_flops(model)
    pairs, source, target = 8, 23, 19
    sums = dict(source=pairs * source, target=pairs * target, source_squared=pairs * source**2,
                target_squared=pairs * target**2, source_target=pairs * source * target)
    names = ("d_model", "encoder_layers", "decoder_layers", "encoder_ffn_dim", "decoder_ffn_dim", "vocab_size")
    flops = training_flops({name: getattr(config, name) for name in names}, sums)
    assert flops == counted
    assert flops == padded_training_flops(shape, 1000, [dict(input_ids=input_ids.numpy(), labels=labels.numpy())])
    assert peak_tflops("NVIDIA H100 80GB HBM3") == peak_tflops("NVIDIA H200") == 989.4
    assert peak_tflops("NVIDIA H100 PCIe") == 756.0 and peak_tflops("NVIDIA L4") == 121.0
    assert peak_tflops("cpu") is None


@pytest.mark.slow
def test_batch_shapes_smoke(data_dir, tmp_path):
    """The distinct shapes of an epoch, exact and bucketed, for Multi30k and a small simulated corpus."""
    stdout, report = run_smoke("batch_shapes", data_dir, tmp_path, "--multiples", "1,8")
    header, *rows = table_rows(stdout)
    assert header[:3] == ["corpus", "lengths rounded to a multiple of", "batches an epoch"]
    assert [row[1] for row in rows] == ["exact (1)", "8"] * 2
    for result in report["results"]:
        exact, bucketed = result["counts"]
        assert bucketed["shapes"] <= exact["shapes"] <= exact["batches"]
        assert exact["new_shapes_in_second_epoch"] == bucketed["new_shapes_in_second_epoch"] == 0
    simulated = report["results"][1]
    assert simulated["exact"] == simulated["checked"] > 0  # the summed lengths are the tokenizer's


def test_gpu_checks_script_parses():
    result = subprocess.run(["bash", "-n", str(BENCHMARKS / "gpu_checks.sh")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_gpu_checks_part_must_be_one_it_has(tmp_path):
    """PART picks one of the script's two parts (one per call where a call is time-limited); a misspelt one is refused
    in one line before anything runs, rather than running nothing or everything."""
    environment = dict(os.environ, OUT=str(tmp_path / "out"), PART="sped")
    result = subprocess.run(["bash", str(BENCHMARKS / "gpu_checks.sh"), "--smoke"], env=environment,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == "PART must be all, speed or seeds, not 'sped'"
    assert not (tmp_path / "out" / "gpu_checks.log").exists()


def test_gpu_checks_seeds_size_must_be_a_recipe_it_runs(tmp_path):
    environment = dict(os.environ, OUT=str(tmp_path / "out"), PART="seeds", SEEDS_SIZE="base")
    result = subprocess.run(["bash", str(BENCHMARKS / "gpu_checks.sh"), "--smoke"], env=environment,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == "SEEDS_SIZE must be tiny or wu2021, not 'base'"
    assert not (tmp_path / "out" / "gpu_checks.log").exists()


@pytest.mark.slow
def test_gpu_checks_smoke(multi30k, tmp_path):
    """The GPU checks' script with tiny settings on a CPU: every part runs and leaves its results (minutes)."""
    out = tmp_path / "out"
    environment = dict(os.environ, OUT=str(out), DATA=str(multi30k), PYTHON=sys.executable, TMPDIR=str(tmp_path))
    result = subprocess.run(["bash", str(BENCHMARKS / "gpu_checks.sh"), "--smoke"], env=environment,
                            capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-5000:]
    assert sorted(path.name for path in out.iterdir()) == [
        "environment.txt", "gpu_checks.log", "recipe_speed_base.json", "recipe_speed_base.md",
        "tiny_first_seed.tar.gz", "tiny_logs.txt", "tiny_seeds.md"]
    speed = json.loads((out / "recipe_speed_base.json").read_text())
    assert speed["complete"] and [result["variant"] for result in speed["results"]] == ["before", "after", "bucketed"]
    header, *rows = table_rows((out / "recipe_speed_base.md").read_text())
    assert [row[1] for row in rows] == ["before", "after", "bucketed"]
    seeds = (out / "tiny_seeds.md").read_text()
    assert "3 of 3 seeds finished" in seeds and "| sacreBLEU |" in seeds
    with tarfile.open(out / "tiny_first_seed.tar.gz") as archive:  # the first seed's averaged model and results
        names = archive.getnames()
    assert {"averaged/config.json", "averaged/model.safetensors", "results.md", "trainer_state.json"} <= set(names)


@pytest.mark.slow
def test_trainer_overhead_smoke(data_dir, tmp_path):
    """The Trainer (its batches collated in a worker process) against the bare step, the profile, the data path."""
    stdout, report = run_smoke("trainer_overhead", data_dir, tmp_path, "--workers", "1")
    step_table, profile_table, data_table = [table_rows(table) for table in stdout.split("###")]
    assert step_table[0][:2] == ["step", "steps/s, median (min-max)"]
    assert [row[0] for row in step_table[1:]] == ["Trainer", "bare"]
    results, settings = report["results"], report["settings"]
    # The cpu recipe's precision: bf16 where this CPU computes bfloat16, else float32.
    from vanilla_transformer.training.cpu_speedups import cpu_computes_bfloat16

    assert settings["dataloader_num_workers"] == 1 and settings["bf16"] is cpu_computes_bfloat16()
    for stats in results.values():
        assert len(stats["steps_per_s"]["values"]) == settings["rounds"] and stats["steps_per_s"]["min"] > 0
    assert report["ratio"] == pytest.approx(results["Trainer"]["steps_per_s"]["median"]
                                            / results["bare"]["steps_per_s"]["median"])
    assert profile_table[0][:4] == ["operator", "Trainer, self CPU ms", "bare, self CPU ms", "difference"]
    assert [row[0] for row in profile_table[-2:]] == ["all operators", "outside operators (Python, waiting)"]
    profiles = report["profile_ms_per_step"]
    assert any("addmm" in name for name in profiles["bare"]["operators"])
    assert [row[0] for row in data_table[1:]] == ["fetch", "check ids", "collate", "total"]
    assert report["data_path"]["ms_per_batch"]["total"]["median"] > 0


@pytest.mark.slow
def test_data_path_smoke(data_dir, tmp_path):
    """Loading, tokenizer training, tokenization with the length filter, token batching and a step on a small generated corpus."""
    stdout, report = run_smoke("data_path", data_dir, tmp_path)
    rows = table_rows(stdout)
    assert rows[0] == ["stage", "2,000 pairs: s, peak GiB"]
    assert len(rows) == 7 and rows[-1][0] == "**the data path (all but the step)**"
    (result,) = report["results"]
    assert result["pairs"] == 2000 and 0 < result["kept_pairs"] <= 2000 and result["batches"] > 0
    assert set(result["stages"]) == {"load", "tokenizer", "tokenize", "batch", "step"}
    for stage in result["stages"].values():
        assert stage["seconds"] > 0 and 0 < stage["peak_rss_gib"] < 8


@pytest.mark.slow
def test_generate_speed_compiled_smoke_with_chosen_engines(data_dir, tmp_path):
    """--engines: only the engines named are timed (CTranslate2 is not needed when ours_ct2 is not among them)."""
    stdout, report = run_smoke("generate_speed", data_dir, tmp_path, "--compile", "--batch-sizes", "32", "--beams", "1",
                               "--engines", "ours", "ours_compiled")
    header, *rows = table_rows(stdout)
    assert header[3:] == ["ours tok/s", "ours compiled tok/s", "ours compiled compile s", "ours compiled / ours"]
    assert [(row[0], row[1]) for row in rows] == [("greedy", "32")]
    assert report["environment"]["ctranslate2"] is None and "CTranslate2 (not run)" in stdout
    assert set(report["results"][0]) >= {"ours", "ours_compiled"}
    assert not set(report["results"][0]) & {"marian", "marian_compiled", "ours_ct2"}


@pytest.mark.slow
def test_recipe_speed_smoke_passes_unknown_flags_to_train(data_dir, tmp_path, monkeypatch):
    """One tree, a flag for `train` passed through, two variants of train flags: both speeds of each run, the bare
    step's, tokens/s and MFU against the peak given."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from recipe_speed import training_flops

    command = [sys.executable, str(BENCHMARKS / "recipe_speed.py"), "--smoke", "--data-dir", str(data_dir),
               "--trees", str(BENCHMARKS.parent), "--dataloader_num_workers", "1",
               "--variant", "all=", "--variant", "none=--cpu_speedups none", "--peak-tflops", "1e-5",
               "--json", str(tmp_path / "recipe_speed.json")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-5000:]
    assert "Multi30k cpu recipe, train flags --dataloader_num_workers 1, 4 steps a round" in result.stdout
    assert "device: cpu; MFU: model FLOPs (`training_flops`) per second over a peak of 1e-05 TFLOP/s" in result.stdout
    header, *rows = table_rows(result.stdout)
    assert header == ["tree", "variant", "steps/s, whole run, each round", "median", "steady steps/s, each round",
                      "median", "bare steps/s, median", "steady / bare", "target tok/s, steady", "target tok/s, bare",
                      "MFU, steady", "MFU, bare"]
    assert [row[1] for row in rows] == ["all", "none"]
    for row in rows:
        assert min(float(row[index].rstrip("%").replace(",", "")) for index in (3, 5, 6, 7, 8, 9, 10, 11)) > 0
    assert "none / . all:" in result.stdout
    report = json.loads((tmp_path / "recipe_speed.json").read_text())
    (run,) = report["results"][0]["rounds"]
    assert run["steady_steps"] == 3 and run["sums"]["target"] > 0 and run["pad_to_multiple_of"] is None
    assert run["steady_mfu"] == pytest.approx(
        training_flops(run["config"], run["sums"]) / 3 * run["steady_steps_per_second"] / 1e7)


@pytest.mark.slow
def test_onnx_speed_smoke(data_dir, tmp_path):
    pytest.importorskip("onnxruntime")
    stdout, report = run_smoke("onnx_speed", data_dir, tmp_path)
    header, *rows = table_rows(stdout)
    assert header[3:] == ["PyTorch eager tok/s", "ORT float32 tok/s", "ORT int8 tok/s", "CT2 float32 tok/s",
                          "ORT float32 / PyTorch eager", "ORT int8 / CT2 float32"]
    assert [(row[0], row[1]) for row in rows] == [("greedy", "1"), ("greedy", "32"), ("beam 4", "1"), ("beam 4", "32")]
    engines = ["torch", "ort_float32", "ort_int8", "ct2_float32"]
    for result, row in zip(report["results"]["tiny"], rows):
        assert all(result[engine]["median"] > 0 for engine in engines)
        ratios = [result["ort_float32_over_torch"], result["ort_int8_over_ct2_float32"]]
        assert ratios == pytest.approx([result["ort_float32"]["median"] / result["torch"]["median"],
                                        result["ort_int8"]["median"] / result["ct2_float32"]["median"]])
        assert row[-2:] == [f"{ratio:.2f}" for ratio in ratios]
        # Forced lengths: every engine decodes exactly N tokens for every sentence.
        expected = result["sentences"] * report["settings"]["new_tokens"]
        assert [result[engine]["generated_tokens"] for engine in engines] == [expected] * 4
    assert "ORT float32 >= 1.5x PyTorch eager at batch size 1: " in stdout
    assert "ORT int8 >= 1x CT2 float32 in every cell: " in stdout


# A fairseq training log's lines, as `fairseq-train --log-format json` writes them: losses in bits.
FAIRSEQ_LOG = """\
2026-11-28 03:36:45 | INFO | train_inner | {"epoch": 1, "update": 0.694, "loss": "12.6", "nll_loss": "12.485", \
"num_updates": "50", "lr": "0.000125"}
2026-11-28 03:39:04 | INFO | valid | {"epoch": 1, "valid_loss": "11.023", "valid_nll_loss": "10.735", \
"valid_num_updates": "72"}
2026-11-28 03:42:57 | INFO | valid | {"epoch": 2, "valid_loss": "10.16", "valid_nll_loss": "9.75", \
"valid_num_updates": "100", "valid_best_loss": "10.16"}
"""


@pytest.mark.slow
def test_fairseq_side_by_side_trains_ours_and_tables_both_in_nats(multi30k, tmp_path):
    """Without fairseq installed: `prepare` writes the tokenizer and the pieces, `ours` trains our tiny model for a
    few updates on them, and `compare` puts our curves beside a fairseq run's log in one unit (bits converted to
    nats), with our validation NLL computed from each checkpoint."""
    script, work = str(BENCHMARKS / "fairseq_side_by_side.py"), tmp_path / "work"
    common = ["--work", str(work), "--data-dir", str(multi30k), "--fairseq-venv", str(tmp_path / "no-fairseq")]

    def run(command, *arguments):  # the flags after `--` go to our train command
        result = subprocess.run([sys.executable, script, command, *common, *arguments], capture_output=True,
                                text=True, timeout=600)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return result.stdout

    assert "no fairseq" in run("prepare", "--vocab-size", "1000")
    pieces = (work / "pieces" / "valid.en").read_text(encoding="utf-8").splitlines()
    assert len(pieces) == 1014 and all(line.split() for line in pieces)
    run("ours", "--updates", "2", "--save-every", "1", "--", "--max_tokens", "1024", "--logging_steps", "1")
    history = json.loads((work / "ours-s0" / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    windows = [entry for entry in history if "loss" in entry]
    assert [entry["step"] for entry in windows] == [1, 2]  # the training NLL beside each window's loss
    assert all(math.log(100) < entry["nll"] < math.log(1000) + 1 for entry in windows), windows
    (work / "fairseq-s1").mkdir()
    (work / "fairseq-s1" / "train.log").write_text(FAIRSEQ_LOG)
    tables = run("compare")
    training, validation = tables.split("validation NLL")
    header, *rows = table_rows(validation)
    assert header == ["updates", "fairseq-s1", "ours-s0"]
    by_step = {row[0]: row[1:] for row in rows}
    assert by_step["72"][0] == f"{10.735 * math.log(2):.3f}" and by_step["100"][0] == f"{9.75 * math.log(2):.3f}"
    ours = [float(by_step[step][1]) for step in ("1", "2")]
    assert all(math.log(100) < nll < math.log(1000) + 1 for nll in ours), ours  # near chance after 2 updates
    training, training_nll = training.split("training NLL")
    header, *rows = table_rows(training)
    assert rows[0][:2] == ["50", f"{12.6 * math.log(2):.3f}"]
    header, *rows = table_rows(training_nll)
    assert rows[0][:2] == ["50", f"{12.485 * math.log(2):.3f}"]


def side_by_side_module():
    """benchmarks/fairseq_side_by_side.py as a module (benchmarks/ is no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fairseq_side_by_side", BENCHMARKS / "fairseq_side_by_side.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fairseq_side_by_side_seed_spread_groups_runs_by_system_at_common_updates():
    """Each system's mean, lowest and highest validation NLL over its seeds, only where every run validated."""
    module = side_by_side_module()
    runs = {"fairseq-s1": ({}, {250: 5.0, 500: 4.0, 504: 3.9}, {}), "fairseq-s2": ({}, {250: 5.2, 500: 3.0}, {}),
            "ours-s0-abc": ({}, {250: 5.4, 500: 3.5, 600: 3.4}, {}), "ours-s1-abc": ({}, {250: 5.6, 500: 3.7}, {})}
    spread = module.seed_spread(runs)
    assert list(spread) == [250, 500]
    assert spread[500]["fairseq"] == pytest.approx((3.5, 3.0, 4.0, 2))
    assert spread[250]["ours"] == pytest.approx((5.5, 5.4, 5.6, 2))


def test_fairseq_side_by_side_fixed_batches_keeps_epoch_0s_batches_in_a_new_order(monkeypatch):
    """The `fixed_batches` candidate: epoch 0 as without it, every later epoch the same batches as epoch 0 (fairseq's
    batches, cut once), in the order our sampler draws for that epoch, where without it the batches mix anew."""
    from vanilla_transformer.training.batch_samplers import TokenBatchSampler

    module = side_by_side_module()
    lengths = torch.Generator().manual_seed(0)
    sources, targets = (torch.randint(3, 12, (500,), generator=lengths).tolist() for _ in range(2))
    sampler = TokenBatchSampler(sources, targets, max_tokens=64, seed=3)

    def epochs():
        batches = []
        for epoch in range(3):
            sampler.set_epoch(epoch)
            batches.append(list(sampler))
        return batches

    def composition(batches):
        return sorted(tuple(sorted(batch)) for batch in batches)

    anew = epochs()
    monkeypatch.setattr(TokenBatchSampler, "__iter__", TokenBatchSampler.__iter__)  # restored after the test
    module.fairseq_fixed_batches()
    fixed = epochs()
    assert fixed[0] == anew[0]
    assert composition(anew[1]) != composition(anew[0])
    assert composition(fixed[1]) == composition(fixed[2]) == composition(fixed[0])
    assert fixed[1] != fixed[0] and [len(b) for b in fixed[1]] == [len(b) for b in anew[1]]


def test_fairseq_side_by_side_start_symbol_starts_the_decoder_from_end_of_sentence():
    """The `start_symbol` candidate: fairseq's decoder inputs begin with `</s>`; ours with `<s>` unless it is on, in
    training (the collator's shift) and in decoding (the generation config) alike."""
    from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

    module = side_by_side_module()
    sizes = dict(vocab_size=20, d_model=8, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                 decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, pad_token_id=0, bos_token_id=1,
                 eos_token_id=2, decoder_start_token_id=1)
    labels = torch.tensor([[5, 6, 2, -100]])
    ours = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig(**sizes))
    assert ours.prepare_decoder_input_ids_from_labels(labels).tolist() == [[1, 5, 6, 2]]
    config = VanillaTransformerConfig(**sizes)
    module.CONFIG_CANDIDATES["start_symbol"](config)
    fairseqs = VanillaTransformerForConditionalGeneration(config)
    assert fairseqs.prepare_decoder_input_ids_from_labels(labels).tolist() == [[2, 5, 6, 2]]
    assert fairseqs.generation_config.decoder_start_token_id == 2


def test_fairseq_side_by_side_positions_gives_fairseqs_table_in_training_and_when_loaded(tmp_path):
    """The `positions` candidate: fairseq's sinusoids (sines then cosines, wavelengths by 10000^(1/(d/2 - 1)), first
    position 2), in the model it builds and in the same checkpoint loaded back by `compare`; the paper's otherwise."""
    import math

    from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
    from vanilla_transformer.model.modeling_vanilla_transformer import sinusoidal_position_encoding

    module = side_by_side_module()
    d_model = 8
    table = module.fairseq_position_table(5, d_model)
    position, i = 3, 1  # our position 3 is fairseq's 5; frequency i of 4
    angle = (position + 2) / 10000 ** (i / (d_model // 2 - 1))
    assert table[position, i].item() == pytest.approx(math.sin(angle), abs=1e-6)
    assert table[position, d_model // 2 + i].item() == pytest.approx(math.cos(angle), abs=1e-6)
    sizes = dict(vocab_size=20, d_model=d_model, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                 decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16)
    for marked in (False, True):
        config = VanillaTransformerConfig(**sizes)
        if marked:
            module.CONFIG_CANDIDATES["positions"](config)
        with module.position_table_of(config):
            model = VanillaTransformerForConditionalGeneration(config)
        model.save_pretrained(tmp_path / str(marked))
        loaded = module.load_our_checkpoint(tmp_path / str(marked))
        expected = module.fairseq_position_table(1024, d_model) if marked else sinusoidal_position_encoding(1024, d_model)
        for stack in (model.model.encoder, model.model.decoder, loaded.model.encoder, loaded.model.decoder):
            torch.testing.assert_close(stack.embed_positions.table, expected, rtol=0, atol=0)


def wu2021_module():
    """benchmarks/fairseq_wu2021.py as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fairseq_wu2021", BENCHMARKS / "fairseq_wu2021.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fairseq_wu2021_trains_as_their_readme_says_and_averages_their_last_10_epochs(tmp_path):
    """fairseq-train with Wu et al.'s stopping and saving (README-baseline.md: patience 10, 8,000 updates, epoch
    checkpoints) after the tiny settings both toolkits share, extra flags last; the score averages the last 10 epoch
    checkpoints by epoch number (evaluate.sh's `--num-epoch-checkpoints 10`), whatever else the folder holds."""
    module = wu2021_module()
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "fairseq-train").touch()
    args = SimpleNamespace(work=str(tmp_path / "work"), seed=3, fairseq_venv=str(venv), extra=["--bf16"])

    command = [str(part) for part in module.train_command(args)]

    flags = dict(zip(command, command[1:]))
    assert flags["--max-update"] == "8000" and flags["--patience"] == "10" and flags["--keep-last-epochs"] == "10"
    assert flags["--max-tokens"] == "8192" and flags["--lr"] == "0.005" and flags["--dropout"] == "0.3"
    assert flags["--seed"] == "3" and flags["--save-dir"] == str(tmp_path / "work" / "fairseq-s3")
    assert "--no-epoch-checkpoints" not in command and "--save-interval-updates" not in command
    assert command[-1] == "--bf16"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name in [*(f"checkpoint{epoch}.pt" for epoch in range(1, 13)), "checkpoint_last.pt", "checkpoint_best.pt",
                 "checkpoint_last10_avg.pt", "checkpoint_2_500.pt"]:
        (run_dir / name).touch()
    assert [path.name for path in module.epoch_checkpoints(run_dir, 10)] == [f"checkpoint{e}.pt" for e in range(3, 13)]


def test_fairseq_wu2021_prepare_splits_the_runs_text_with_the_runs_tokenizer(tmp_path):
    """`prepare` without fairseq: the run's own tokenizer copied, each prepared split written as its pieces (the
    subwords our run trained on), and a line saying fairseq's binarized data is still to come."""
    from transformers import AutoTokenizer

    from vanilla_transformer.training.tokenization import train_tokenizer

    run_dir = tmp_path / "seed-0"
    lines = {"en": ["a man in an orange hat .", "two dogs &apos;s ball ."],
             "de": ["ein mann mit einem orangen hut .", "zwei hunde ."]}
    (run_dir / "prepared").mkdir(parents=True)
    for split in ("train", "val", "test_2016_flickr"):
        for lang, text in lines.items():
            with gzip.open(run_dir / "prepared" / f"{split}.{lang}.gz", "wt", encoding="utf-8") as file:
                file.write("".join(line + "\n" for line in text))
    train_tokenizer([line for text in lines.values() for line in text], vocab_size=300,
                    show_progress=False).save_pretrained(run_dir / "tokenizer")
    work = tmp_path / "work"

    result = subprocess.run([sys.executable, str(BENCHMARKS / "fairseq_wu2021.py"), "prepare", "--run", str(run_dir),
                             "--work", str(work), "--fairseq-venv", str(tmp_path / "no-fairseq")],
                            capture_output=True, text=True, timeout=300)

    assert result.returncode == 0, result.stderr[-3000:]
    assert "no fairseq" in result.stdout
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "tokenizer")
    copied, own = (folder / "tokenizer" / "tokenizer.json" for folder in (work, run_dir))
    assert copied.read_bytes() == own.read_bytes()
    assert (work / "pieces" / "test.de").read_text(encoding="utf-8").splitlines() == [
        " ".join(tokenizer.tokenize(line)) for line in lines["de"]]
    assert json.loads((work / "prepared_from.json").read_text())["prepared"] == str(run_dir / "prepared")


def test_fairseq_wu2021_curves_set_fairseqs_validation_loss_in_nats_beside_ours(tmp_path, capsys):
    """fairseq logs its validation loss in bits (and again for an epoch it validates after a resume: the last line
    counts); ours is in nats: `curves` converts fairseq's, keeps every epoch of either, and draws the plot."""
    module = wu2021_module()
    run_dir = tmp_path / "work" / "fairseq-s0"
    run_dir.mkdir(parents=True)
    valid = '2026-12-04 16:23:12 | INFO | valid | {{"epoch": {}, "valid_loss": "{}", "valid_nll_loss": "3.1"}}'
    (run_dir / "train.log").write_text("\n".join([
        valid.format(1, "8.0"), '| INFO | train | {"epoch": 1, "train_loss": "9.0"}', valid.format(2, "6.0"),
        valid.format(2, "5.0")]) + "\n", encoding="utf-8")
    ours = tmp_path / "seed-1"
    ours.mkdir()
    (ours / "trainer_state.json").write_text(json.dumps({"log_history": [
        {"epoch": 1.0, "loss": 7.0}, {"epoch": 1.0, "eval_loss": 5.5}, {"epoch": 2.0, "eval_loss": 3.5},
        {"epoch": 3.0, "eval_loss": 3.25}]}))

    assert module.fairseq_validation_losses(run_dir) == pytest.approx({1: 8 * math.log(2),
                                                                                    2: 5 * math.log(2)})
    module.main(["curves", "--work", str(tmp_path / "work"), "--ours", str(ours), "--plot", str(tmp_path / "c.png")])

    table = capsys.readouterr().out.splitlines()
    assert table[0] == "| epoch | fairseq, seed 0 | ours, seed 1 |"
    assert table[2:] == ["| 1 | 5.545 | 5.500 |", "| 2 | 3.466 | 3.500 |", "| 3 | - | 3.250 |"]
    assert (tmp_path / "c.png").read_bytes().startswith(b"\x89PNG")
