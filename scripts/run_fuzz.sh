#!/usr/bin/env bash
# Builds the libFuzzer target for the safetensors header parser with clang (ASan + UBSan) in build-fuzz/
# and runs it for SECONDS on a seed corpus made from a fixture's header. Exits non-zero on a crash; the
# crashing input is left in build-fuzz/fuzz_artifacts/.
# Usage: scripts/run_fuzz.sh [SECONDS]   (default 30)
set -euo pipefail

seconds="${1:-30}"
[[ "$seconds" =~ ^[0-9]+$ ]] || { echo "run_fuzz: SECONDS must be a whole number, got '$seconds'" >&2; exit 2; }
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build-fuzz"
target=fuzz_safetensors_header

# clang with the libFuzzer runtime (Debian: clang, libclang-rt-dev; scripts/setup.sh installs both).
for tool in clang clang++ cmake ninja python3; do
  command -v "$tool" >/dev/null || { echo "run_fuzz: '$tool' not found; run scripts/setup.sh" >&2; exit 2; }
done
probe_dir="$(mktemp -d)"
trap 'rm -rf "$probe_dir"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
  >"$probe_dir/probe.cc"
if ! clang++ -fsanitize=fuzzer,address,undefined "$probe_dir/probe.cc" -o "$probe_dir/probe" 2>"$probe_dir/log"; then
  cat "$probe_dir/log" >&2
  echo "run_fuzz: clang++ cannot link a libFuzzer target; install libclang-rt-dev (scripts/setup.sh)" >&2
  exit 2
fi

CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DEPINFER_FUZZ=ON -DEPINFER_BUILD_TESTS=ON >/dev/null
ninja -C "$build" -j2 "$target"

# Seed: a fixture's real header, as the target reads its input (u64 LE data size, then header text).
seeds="$build/fuzz_seeds/$target"
corpus="$build/fuzz_corpus/$target"
artifacts="$build/fuzz_artifacts"
mkdir -p "$seeds" "$corpus" "$artifacts"
python3 - "$root/tests/data/fixtures/mixtral_tiny/model.safetensors" "$seeds/mixtral_tiny" <<'PY'
import struct, sys
blob = open(sys.argv[1], "rb").read()
header_bytes = struct.unpack("<Q", blob[:8])[0]
data_bytes = len(blob) - 8 - header_bytes
open(sys.argv[2], "wb").write(struct.pack("<Q", data_bytes) + blob[8:8 + header_bytes])
PY

echo "run_fuzz: running $target for ${seconds}s"
log="$build/fuzz.log"
if ! "$build/tests/fuzz/$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -dict="$root/tests/fuzz/safetensors_header.dict" -artifact_prefix="$artifacts/" "$corpus" "$seeds" \
  >"$log" 2>&1; then
  tail -n 60 "$log"
  echo "run_fuzz: $target failed; the crashing input is under $artifacts/" >&2
  exit 1
fi
grep -E "^Done|stat::number_of_executed_units" "$log" | tail -n 1 || true
echo "run_fuzz: no crash in ${seconds}s (corpus: $corpus; log: $log)"
