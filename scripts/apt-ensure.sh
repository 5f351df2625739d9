#!/usr/bin/env bash
# Install the named Debian packages if any is missing (needs root; CI runs as root).
# NO_RECOMMENDS=1 installs them without their recommended packages (python3-torch's
# recommendations are a CUDA-less build's optional extras, hundreds of MiB).
set -euo pipefail
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing Debian packages: ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
opts=()
[ "${NO_RECOMMENDS:-}" = 1 ] && opts+=(--no-install-recommends)
$SUDO apt-get install -y -qq "${opts[@]}" "${missing[@]}" </dev/null
