#!/usr/bin/env bash
# Start a single-node fluxkv cache, show a put/get round trip and the status, then keep
# the node running until Ctrl-C (or stop it at once when not on a terminal). BIN, DIR and
# DRAM override the binary, the socket directory and the segment size.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-./bin/fluxkv}
DIR=${DIR:-out/demo}
mkdir -p "$DIR"
SOCK="$DIR/fluxkv.sock"
$BIN --log-format text --log-level warn up --dir "$DIR" --dram "${DRAM:-256MiB}" &
PID=$!
trap 'kill -TERM $PID 2>/dev/null || true; wait $PID 2>/dev/null || true' EXIT
for _ in $(seq 300); do
  [ -S "$SOCK" ] && break
  if ! kill -0 $PID 2>/dev/null; then # up exited: its error is above
    rc=0; wait $PID || rc=$?
    echo "fluxkv up exited (status $rc) before its socket appeared" >&2
    exit $((rc ? rc : 1))
  fi
  sleep 0.1
done
[ -S "$SOCK" ] || { echo "node did not start"; exit 1; }
echo "== node up: socket $SOCK"
echo "== put greeting"
echo "hello from fluxkv" | $BIN put --socket "$SOCK" greeting
echo "== get greeting"
$BIN get --socket "$SOCK" greeting
echo "== put a 5 MiB file and read it back"
head -c 5242880 /dev/urandom > "$DIR/blob.in"
$BIN put --socket "$SOCK" blob "$DIR/blob.in"
$BIN get --socket "$SOCK" -o "$DIR/blob.out" blob
cmp "$DIR/blob.in" "$DIR/blob.out" && echo "5 MiB round trip: byte-exact"
echo "== get of a missing key (exits 1)"
$BIN get --socket "$SOCK" missing || echo "(exit $?)"
echo "== status"
$BIN status --socket "$SOCK"
if [ -t 0 ]; then
  echo "== node running; try: $BIN get --socket $SOCK greeting   (Ctrl-C to stop)"
  wait $PID
fi
