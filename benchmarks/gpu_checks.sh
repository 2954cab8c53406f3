#!/usr/bin/env bash
# The GPU checks of the train command's GPU defaults (bucketed shapes, a compiled model, dataloader workers), in one
# run of about 12 minutes on one H100 or H200 (docs/speed.md#the-train-command):
#
# 1. recipe_speed.py, the Multi30k base recipe (200 steps, steady state from step 60, one round each): the command
#    as it trained before (each batch padded to its longest pair, no compilation), with the GPU defaults, and with
#    bucketed shapes alone; steady steps/s, target tokens/s and MFU of the command and of the bare step. The JSON
#    holds every round finished, even if the part runs over its time.
# 2. examples/multi30k/run.py, the tiny recipe's 8,000 updates with seeds 0, 1 and 2 side by side on the one GPU
#    (the GPU defaults, sdpa), each averaged, its length penalty chosen on validation, and scored on
#    test_2016_flickr: sacreBLEU and lowercased Moses-tokenized BLEU; then their mean and range. SEEDS_SIZE=wu2021
#    runs Wu et al.'s recipe instead (their preparation of the text, epoch checkpoints, patience 10, beam 5; its
#    results add BLEU on the tokenized text as fairseq computes it), SEEDS the seeds (default "0 1 2").
#
# Results in $OUT: environment.txt, recipe_speed_base.md and .json, SIZE_seeds.md, SIZE_logs.txt, SIZE_first_seed.tar.gz
# (the first seed's averaged model, its results and training state) and gpu_checks.log, SIZE being SEEDS_SIZE. Each
# part has a time limit, so a part that runs over still leaves the other's results.
#
#     OUT=results bash benchmarks/gpu_checks.sh           # on the GPU machine, from the repository's root
#     OUT=results bash benchmarks/gpu_checks.sh --smoke   # anywhere, on a CPU: tiny settings, checks the script
#     OUT=results PART=speed bash benchmarks/gpu_checks.sh # one part (speed or seeds), e.g. one per call where a
#                                                          # call may last at most 10 minutes
#
# Time limits (seconds, a part's processes are stopped after them): SPEED_LIMIT (default 360), SEEDS_LIMIT (360);
# TINY_MINUTES, the tiny runs' training guard (the train command's --max_train_minutes; the recipe's 60 if unset),
# stops training early enough for a run to still average, decode and score within SEEDS_LIMIT.
#
# Environment: PYTHON (default python3) with torch and the package's [train] extra importable; DATA, the Multi30k
# folder (default ../shared/data/multi30k beside the checkout, else shared/data/multi30k in it); WHEELS, a folder of
# wheels that the machine lacks (it has no network), installed without resolving dependencies into a folder put on
# PYTHONPATH ahead of the interpreter's own packages (a virtual environment made from a Python that is itself one would
# not see torch): so the folder holds every missing package, e.g. transformers>=5.24 (and regex, if older than
# transformers asks), datasets (with dill, multiprocess and fsspec), num2words (with docopt), sacremoses.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
: "${OUT:?set OUT to the folder for the results}"
mkdir -p "$OUT"
SMOKE=false
[[ "${1:-}" == "--smoke" ]] && SMOKE=true
PART=${PART:-all}
case "$PART" in all|speed|seeds) ;; *) echo "PART must be all, speed or seeds, not '$PART'" >&2; exit 2;; esac
PYTHON=${PYTHON:-python3}
SEEDS_SIZE=${SEEDS_SIZE:-tiny}
case "$SEEDS_SIZE" in tiny|wu2021) ;; *) echo "SEEDS_SIZE must be tiny or wu2021, not '$SEEDS_SIZE'" >&2; exit 2;; esac
read -r -a SEED_LIST <<< "${SEEDS:-0 1 2}"
if [[ -z "${DATA:-}" ]]; then
    DATA="$REPO/../shared/data/multi30k"
    [[ -d "$DATA" ]] || DATA="$REPO/shared/data/multi30k"
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_checks.XXXXXX")
LOG="$OUT/gpu_checks.log"
exec > >(tee -a "$LOG") 2>&1

SITE=""
if [[ -n "${WHEELS:-}" ]]; then
    SITE="$WORK/site"
    "$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --target "$SITE" "$WHEELS"/*.whl
fi
export PYTHONPATH="$REPO/src${SITE:+:$SITE}"

if $SMOKE; then
    DEVICE=cpu; RECIPE=cpu; SPEED_LIMIT=${SPEED_LIMIT:-600}; SEEDS_LIMIT=${SEEDS_LIMIT:-600}
    SPEED=(--smoke --device cpu)
    BEFORE="--pad_to_multiple_of 1"
    BUCKETED="--pad_to_multiple_of 8"
    AFTER="--pad_to_multiple_of 8 --torch_compile_backend eager --dataloader_num_workers 2 \
--dataloader_persistent_workers true"
    TINY=(--size smoke --use_cpu true)
    [[ "$SEEDS_SIZE" == tiny ]] || TINY+=(--preparation wu2021 --patience 2 --save_strategy epoch --eval_strategy epoch
                                    --average-last 2)
else
    DEVICE=cuda; RECIPE=base; SPEED_LIMIT=${SPEED_LIMIT:-360}; SEEDS_LIMIT=${SEEDS_LIMIT:-360}
    SPEED=(--device cuda --steps 200 --steady-from 60 --rounds 1)
    # The base recipe already collated in two persistent workers; before: exact lengths, no compilation.
    BEFORE="--pad_to_multiple_of 1 --torch_compile false"
    BUCKETED="--torch_compile false"
    AFTER=""
    TINY=(--size "$SEEDS_SIZE" --use_cpu false --bf16 true --attn_implementation sdpa --eval-steps 2000)
    [[ -z "${TINY_MINUTES:-}" ]] || TINY+=(--max_train_minutes "$TINY_MINUTES")
fi

echo "== environment"
{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
    "$PYTHON" - <<'PY'
import importlib, platform
import torch
print("python", platform.python_version(), "torch", torch.__version__,
      "cuda" if torch.cuda.is_available() else "no cuda", torch.cuda.get_device_name() if torch.cuda.is_available() else "")
for name in ("transformers", "accelerate", "datasets", "tokenizers", "sacrebleu", "sacremoses", "num2words",
             "matplotlib", "tensorboard", "jinja2"):
    try:
        module = importlib.import_module(name)
        print(name, getattr(module, "__version__", "?"))
    except ImportError as error:
        print(name, "MISSING:", error)
import vanilla_transformer.train_run.run  # fails here, not minutes later, if the package cannot be imported
PY
} | tee "$OUT/environment.txt"
[[ "$DEVICE" == cpu ]] || "$PYTHON" -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU'"

if [[ "$PART" != seeds ]]; then
    echo "== 1. the base recipe's train command: before, the GPU defaults, bucketed shapes alone"
    timeout "$SPEED_LIMIT" "$PYTHON" benchmarks/recipe_speed.py --recipe "$RECIPE" --data-dir "$DATA" "${SPEED[@]}" \
        --variant before="$BEFORE" --variant after="$AFTER" --variant bucketed="$BUCKETED" \
        --json "$OUT/recipe_speed_base.json" > "$OUT/recipe_speed_base.md" || echo "recipe_speed.py failed or ran over ($?)"
    cat "$OUT/recipe_speed_base.md"
fi

if [[ "$PART" != speed ]]; then
    echo "== 2. the $SEEDS_SIZE recipe, seeds ${SEED_LIST[*]} side by side"
    pids=()
    for seed in "${SEED_LIST[@]}"; do
        timeout "$SEEDS_LIMIT" "$PYTHON" examples/multi30k/run.py --data-dir "$DATA" --output-dir "$WORK/runs/seed-$seed" \
            --seed "$seed" "${TINY[@]}" > "$WORK/run-$seed.log" 2>&1 &
        pids+=($!)
    done
    for index in "${!pids[@]}"; do
        wait "${pids[$index]}" || echo "seed ${SEED_LIST[$index]} failed or ran over ($?)"
    done
    for seed in "${SEED_LIST[@]}"; do
        echo "--- seed $seed"
        tail -n 60 "$WORK/run-$seed.log"
    done > "$OUT/${SEEDS_SIZE}_logs.txt"
    "$PYTHON" - "$WORK/runs" "${#SEED_LIST[@]}" > "$OUT/${SEEDS_SIZE}_seeds.md" <<'PY'
import importlib.util, json, sys
from pathlib import Path

spec = importlib.util.spec_from_file_location("multi30k_run", "examples/multi30k/run.py")
run = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run)
runs = [path for path in sorted(Path(sys.argv[1]).glob("seed-*")) if (path / "results.json").is_file()]
if runs:
    print(run.seeds_table(runs))
for path in runs:
    state = json.loads((path / "trainer_state.json").read_text())
    losses = [(entry["epoch"], entry["eval_loss"]) for entry in state["log_history"] if "eval_loss" in entry]
    best = min(losses, key=lambda pair: pair[1]) if losses else None
    print(f"## {path.name}: {state['global_step']} updates, epoch {state.get('epoch', 0):.1f}, "
          f"best validation loss {best[1]:.4f} at epoch {best[0]:.0f}\n" if best else
          f"## {path.name}: {state['global_step']} updates\n")
    print((path / "results.md").read_text())
print(f"{len(runs)} of {sys.argv[2]} seeds finished")
PY
    cat "$OUT/${SEEDS_SIZE}_seeds.md"
    first="$WORK/runs/seed-${SEED_LIST[0]}"
    if [[ -d "$first/averaged" ]]; then
        tar -czf "$OUT/${SEEDS_SIZE}_first_seed.tar.gz" -C "$first" averaged trainer_state.json \
            $(cd "$first" && ls results.* length_penalty.json 2>/dev/null)
    fi
fi
rm -rf "$WORK"
