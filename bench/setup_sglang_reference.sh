#!/usr/bin/env bash
# Build SGLang's own CPU environment: the real SGLang 0.5.23 server (scheduler, radix cache,
# priority queue, HTTP server, unmodified) on a Linux x86-64 machine without a GPU, and a tiny
# random-weight model it can serve. SGLang is a peer to run and measure against, never a
# dependency of the project: it lives in a virtualenv of its own, outside the repository.
#
# Usage: bench/setup_sglang_reference.sh [TARGET_DIR]
#   TARGET_DIR defaults to $INFERENCE_AUCTION_SGLANG_HOME, else
#   ~/.cache/inference-auctions/sglang-cpu-0.5.23. It gets:
#     .venv/     the virtualenv (about 2.8 GB): torch's CPU build, the pinned list in
#                bench/sglang_cpu/requirements.txt and sglang, all without dependency
#                resolution (SGLang's own pins name CUDA builds; the list's versions work);
#     .venv/.../sgl_kernel/    the pure-torch kernel stand-in (bench/sglang_cpu/sgl_kernel_stub.py);
#     .venv/.../ia_torchvision_stub.py and .pth: the torchvision import stub, loaded by every
#                SGLang process (bench/torchvision_stub.py);
#     model/     a tokenizer and a tiny Llama config, generated on the spot
#                (bench/sglang_cpu/make_model.py);
#     .complete  a fingerprint of all the inputs above: a second run with the same inputs does
#                nothing and returns at once.
# Then: .venv/bin/python -m bench.sglang_cpu.launcher (make run-sglang) starts the server.
#
# `pip install torch==2.13.0` comes first and is pinned for every step: a requirement that
# admits another torch would otherwise make pip fetch a multi-GB CUDA build in place of the CPU
# wheel the machine holds.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HERE="$REPO/bench/sglang_cpu"
DEFAULT_TARGET="${INFERENCE_AUCTION_SGLANG_HOME:-$HOME/.cache/inference-auctions/sglang-cpu-0.5.23}"
TARGET="$(realpath -m "${1:-$DEFAULT_TARGET}")"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="2.13.0"
REQUIREMENTS="$HERE/requirements.txt"

die() { echo "setup_sglang_reference: $*" >&2; exit 1; }

FINGERPRINT="$(cat "$REQUIREMENTS" "$HERE/sgl_kernel_stub.py" "$HERE/make_model.py" \
    "$REPO/bench/torchvision_stub.py" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1)"
if [[ -f "$TARGET/.complete" && "$(cat "$TARGET/.complete")" == "$FINGERPRINT" ]]; then
    echo "setup_sglang_reference: $TARGET is complete"
    exit 0
fi

START_SECONDS=$SECONDS
mkdir -p "$TARGET"
rm -f "$TARGET/.complete"
VENV="$TARGET/.venv"
if [[ ! -x "$VENV/bin/python" ]]; then
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --quiet --disable-pip-version-check)
CONSTRAINTS="$TARGET/constraints.txt"
printf 'torch==%s\n' "$TORCH_VERSION" > "$CONSTRAINTS"

echo "== torch $TORCH_VERSION (CPU)"
"${PIP[@]}" install -c "$CONSTRAINTS" "torch==$TORCH_VERSION"
"$VENV/bin/python" -c 'import sys, torch
sys.exit(0 if torch.__version__.endswith("+cpu") else f"not the CPU torch: {torch.__version__}")'

echo "== $(grep -c . "$REQUIREMENTS") pinned packages, sglang included, without dependencies"
# pip reports SGLang's own pins (torch 2.14.1, transformers 5.19, CUDA kernels) as unmet: that
# is expected; the list's versions are the ones its CPU code paths run with.
"${PIP[@]}" install -c "$CONSTRAINTS" --no-deps -r "$REQUIREMENTS" 2>&1 \
    | grep -v -E "requires .*, which is not installed|requires .*, but you have|dependency conflicts|dependency resolver" \
    || true
"$VENV/bin/python" -c 'import sglang, torch
assert torch.__version__.endswith("+cpu"), torch.__version__' \
    || die "sglang or the CPU torch did not install"

SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "== kernel stand-in and torchvision stub in $SITE"
mkdir -p "$SITE/sgl_kernel"
cp "$HERE/sgl_kernel_stub.py" "$SITE/sgl_kernel/__init__.py"
cp "$REPO/bench/torchvision_stub.py" "$SITE/ia_torchvision_stub.py"
echo "import ia_torchvision_stub; ia_torchvision_stub.install()" > "$SITE/ia_torchvision_stub.pth"

echo "== tiny Llama model in $TARGET/model"
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$VENV/bin/python" "$HERE/make_model.py" "$TARGET/model"

# SGLang's server modules must import with the stubs in place (the launcher would otherwise
# only find out after its start-up deadline).
SGLANG_USE_CPU_ENGINE=1 "$VENV/bin/python" -c 'import sglang.srt.entrypoints.http_server' \
    || die "SGLang's HTTP server does not import"

echo "$FINGERPRINT" > "$TARGET/.complete"
echo "setup_sglang_reference: $TARGET ready in $(( SECONDS - START_SECONDS )) s"
