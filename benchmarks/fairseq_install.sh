#!/usr/bin/env bash
# fairseq 0.12.2, the reference toolkit of benchmarks/fairseq_side_by_side.py, in a venv of its own (never a
# dependency of the package, never run by CI).
#
#   bash benchmarks/fairseq_install.sh [VENV]      # default: .venv-fairseq
#
# fairseq 0.12.2 predates the Pythons and torch releases the package supports, so this venv has its own: Python 3.10
# (pyenv), torch 2.1.2 with torchaudio 2.1.2 (which fairseq requires: left to pip, the newest torchaudio comes with
# its own newer torch), numpy < 2, and pip < 24.1 (omegaconf 2.0.6's metadata is refused by newer pips). Its sdist
# lacks a file of its C++ torch extensions, which the side-by-side runs do not use, so setup.py skips them; on torch
# 2.1 the "BetterTransformer" inference fast path of its encoder layers fails in fairseq-generate and is switched off
# (training never takes it).
set -euo pipefail
venv=${1:-.venv-fairseq}
python=${FAIRSEQ_PYTHON:-$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")/versions/$(
    ls "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")/versions" | grep -E '^3\.10\.[0-9]+$' | sort -V | tail -n 1)/bin/python}
[ -x "$python" ] || { echo "fairseq_install.sh: no Python 3.10 found (set FAIRSEQ_PYTHON)" >&2; exit 2; }

if [ -x "$venv/bin/fairseq-train" ]; then
    echo "fairseq is installed in $venv"
    exit 0
fi
"$python" -m venv "$venv"
"$venv/bin/pip" install --quiet "pip<24.1"
"$venv/bin/pip" install --quiet "numpy<2" cython "setuptools<70" wheel torch==2.1.2 torchaudio==2.1.2 sacrebleu \
    sacremoses
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$venv/bin/pip" download --quiet --no-deps --no-binary fairseq --no-build-isolation fairseq==0.12.2 -d "$work"
tar xzf "$work"/fairseq-0.12.2.tar.gz -C "$work"
source_dir="$work/fairseq-0.12.2"
# No torch C++ extensions: the block that adds them raises ImportError, which setup.py already treats as "no torch".
sed -i 's/^    from torch.utils import cpp_extension$/    raise ImportError("no torch extensions")/' "$source_dir/setup.py"
# BetterTransformer off: the flags that select it are never set.
sed -i 's/^\( *\)self.BT_version = True$/\1self.BT_version = False/' "$source_dir/fairseq/modules/transformer_layer.py"
sed -i 's/^\( *\)BT_version = True$/\1BT_version = False/' "$source_dir/fairseq/models/transformer/transformer_encoder.py"
grep -q 'raise ImportError("no torch extensions")' "$source_dir/setup.py"
"$venv/bin/pip" install --quiet --no-build-isolation "$source_dir"
"$venv/bin/python" -c "import fairseq; print('fairseq', fairseq.__version__, 'installed in $venv')"
