#!/usr/bin/env bash
# Regenerates the Python thrift code of the fluxkv client from protocol/*.thrift with
# Debian's thrift-compiler (`thrift`, 0.17). The IDL's `namespace py fluxkv._gen.<name>`
# places the modules under clients/python/fluxkv/_gen/. The compiler writes into a
# temporary directory and only fluxkv/_gen/ is copied back, so the package's own
# fluxkv/__init__.py is never overwritten.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
thrift_bin="${THRIFT:-thrift}"
if ! command -v "$thrift_bin" >/dev/null 2>&1; then
	echo "gen-python.sh: '$thrift_bin' not found (apt-get install thrift-compiler)" >&2
	exit 1
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# The Python client speaks only the external service; common.thrift comes with it (-r).
"$thrift_bin" -r --gen py -out "$tmp" "$root/protocol/external.thrift"

if [[ ! -d "$tmp/fluxkv/_gen/external" || ! -d "$tmp/fluxkv/_gen/common" ]]; then
	echo "gen-python.sh: thrift did not produce fluxkv/_gen/{external,common} (namespace py changed?)" >&2
	exit 1
fi

dest="$root/clients/python/fluxkv/_gen"
rm -rf "$dest"
mkdir -p "$dest"
cp -R "$tmp/fluxkv/_gen/." "$dest/"
# The compiler names the package after the namespace prefix; keep a package marker for _gen.
[[ -f "$dest/__init__.py" ]] || : >"$dest/__init__.py"
# Drop the generated command-line remote tool: it is not part of the library.
find "$dest" -name '*-remote' -delete
echo "generated $(find "$dest" -name '*.py' | wc -l) modules under ${dest#"$root/"}"
