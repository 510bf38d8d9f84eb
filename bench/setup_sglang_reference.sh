#!/usr/bin/env bash
# Build a separate virtualenv holding SGLang's own code, so that bench/sglang_reference.py can
# time SGLang's radix cache and dfs-weight ordering beside ours. SGLang is a peer to measure
# against, never a dependency: this venv lives outside the repository and nothing in it is
# committed.
#
# Usage: bench/setup_sglang_reference.sh [TARGET_DIR]   (default .sglang-ref in the repository)
# Then:  TARGET_DIR/.venv/bin/python bench/sglang_reference.py --input BATCH.npz --repeat 3
#
# Re-runnable: an existing venv is reused and pip skips what is already installed.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TARGET="$(realpath -m "${1:-$REPO/.sglang-ref}")"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="2.13.0"      # the CPU wheel that lies on the machine's disk (pip's find-links)
SGLANG_VERSION="0.5.23"
TVM_FFI_VERSION="0.1.11"    # the exact version SGLang 0.5.23 declares

mkdir -p "$TARGET"
VENV="$TARGET/.venv"
if [[ ! -x "$VENV/bin/python" ]]; then
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip)

# Pin torch for every install below: a requirement that admits a newer torch would otherwise
# make pip fetch a multi-GB CUDA build in place of the CPU one on disk.
CONSTRAINTS="$TARGET/constraints.txt"
printf 'torch==%s\n' "$TORCH_VERSION" > "$CONSTRAINTS"

"${PIP[@]}" install --quiet -c "$CONSTRAINTS" "torch==$TORCH_VERSION"

# --no-deps: SGLang's declared dependencies include CUDA kernels and a matching torchvision,
# none of which load on a CPU machine. Only the packages its imports actually reach follow.
# pip then reports SGLang's own pins (torch==2.14.1, transformers==5.19.0, ...) as unmet: that
# is expected, and harmless for the radix cache and the scheduler policy.
"${PIP[@]}" install --quiet --no-deps "sglang==$SGLANG_VERSION"
"${PIP[@]}" install --quiet -c "$CONSTRAINTS" \
    numpy orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic pyzmq \
    tqdm IPython aiohttp dill transformers triton "apache-tvm-ffi==$TVM_FFI_VERSION" \
    sentencepiece compressed-tensors gguf openai partial-json-parser datasets

# Fail now, not in the middle of a benchmark: torch must be the CPU build, and SGLang's radix
# cache and scheduler policy must import and run (the benchmark script stubs torchvision,
# which SGLang imports but the radix cache never uses).
"$VENV/bin/python" -c 'import torch, sys; sys.exit(0 if torch.__version__.endswith("+cpu") else f"not the CPU torch: {torch.__version__}")'
"$VENV/bin/python" "$(dirname "${BASH_SOURCE[0]}")/sglang_reference.py" --synthetic 64 --repeat 1
