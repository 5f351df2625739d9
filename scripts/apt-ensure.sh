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
# A fresh machine often runs an apt of its own (unattended upgrades, a first update):
# wait for its locks instead of failing. DPkg::Lock::Timeout makes apt wait for the dpkg
# lock; the lists lock of `apt-get update` is not covered by it on every apt release, so
# a run that failed on a lock is retried, up to APT_LOCK_WAIT seconds in all.
wait_s=${APT_LOCK_WAIT:-600}
apt_locked() {
  local deadline=$((SECONDS + wait_s)) err
  err=$(mktemp)
  trap 'rm -f "$err"' RETURN
  while :; do
    if $SUDO apt-get -o DPkg::Lock::Timeout="$wait_s" "$@" </dev/null 2>"$err"; then
      cat "$err" >&2
      return 0
    fi
    if ! grep -qiE 'could not get lock|unable to lock|is another process using it' "$err" || [ $SECONDS -ge $deadline ]; then
      cat "$err" >&2
      return 1
    fi
    echo "apt-ensure: another apt holds its lock; waiting (up to ${wait_s}s in all)" >&2
    sleep 5
  done
}
apt_locked update -qq
opts=()
[ "${NO_RECOMMENDS:-}" = 1 ] && opts+=(--no-install-recommends)
apt_locked install -y -qq "${opts[@]}" "${missing[@]}"
