#!/usr/bin/env bash
# Build a Python base image from Debian's packages and import it into podman, for machines
# that cannot pull an image from a registry. The Containerfile then takes it as its base:
#
#   deploy/make-base-image.sh                      # makes localhost/inference-auctions-base:bookworm
#   podman build --build-arg BASE_IMAGE=localhost/inference-auctions-base:bookworm \
#       -f deploy/Containerfile -t inference-auctions .
#
# Needs root (or a user namespace mmdebstrap can use), mmdebstrap and podman (Debian's
# packages). The suite's packages come from the sources this machine's apt uses
# (SOURCES=/path/to/file.sources to choose others). Debian bookworm's python3 is 3.11, the
# version the default base (python:3.11-slim) carries.
set -euo pipefail

SUITE="${SUITE:-bookworm}"
IMAGE="${IMAGE:-localhost/inference-auctions-base:$SUITE}"
SOURCES="${SOURCES:-/etc/apt/sources.list.d/debian.sources}"
[ -f "$SOURCES" ] || SOURCES=/etc/apt/sources.list

for tool in mmdebstrap podman; do
  command -v "$tool" >/dev/null || { echo "$tool is missing: apt-get install -y $tool" >&2; exit 1; }
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# `apt` variant: Essential packages plus apt, what python3 needs to run and pip to install.
# ca-certificates so that pip in the build stage can reach an HTTPS index; tzdata for the
# budget periods' time zones (python:3.11-slim carries both).
mmdebstrap --variant=apt --include=python3,python3-venv,ca-certificates,tzdata \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --aptopt='APT::Install-Recommends "false"' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/*' \
  "$SUITE" "$work/rootfs.tar" "$SOURCES"

podman import \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' \
  "$work/rootfs.tar" "$IMAGE" >/dev/null
echo "$IMAGE: $(podman run --rm "$IMAGE" python3 --version)"
