#!/usr/bin/env bash
# Builds the libFuzzer target over the safetensors reader with clang 14 (AddressSanitizer, UndefinedBehaviorSanitizer)
# against the library in ./build, runs it for $1 seconds (default 600) from tests/fuzz/corpus/ (seeds.py's valid files first), then
# merges what it found back into tests/fuzz/corpus/ (only inputs that add coverage). Needs clang-14 and Debian's
# libclang-rt-14-dev. Prints libFuzzer's summary (executions, time, crashes).
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-600}
out=build/fuzz
mkdir -p "$out/new" tests/fuzz/corpus
clang++-14 -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -Ibuild/include -isystem /usr/include/eigen3 -DEIGEN_USE_THREADS -DEIGEN_MAX_ALIGN_BYTES=64 \
  tests/fuzz/fuzz_safetensors.cpp tensor/io/safetensors.cpp -o "$out/fuzz_safetensors" \
  -Lbuild -ltapegrad -Wl,-rpath,"$PWD/build"
python3 tests/fuzz/seeds.py tests/fuzz/corpus  # (the valid starting points, kept in the corpus)
"$out/fuzz_safetensors" -max_total_time="$seconds" -max_len=4096 -dict=tests/fuzz/safetensors.dict \
  -print_final_stats=1 "$out/new" tests/fuzz/corpus 2>&1 | tail -25
"$out/fuzz_safetensors" -merge=1 tests/fuzz/corpus "$out/new" 2>&1 | tail -2
echo "corpus: $(ls tests/fuzz/corpus | wc -l) inputs"
