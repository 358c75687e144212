#!/usr/bin/env bash
# One round on a GPU machine in one command (the device machine is lent briefly, and each fresh one starts bare):
# configure and build once (CUDA, the GPU op tests too), then run the given steps in order. Everything it writes
# goes to $OUT (default build-gpu/round, ignored by git): a log and the result files the steps name below.
#   bench/gpu_round.sh [step...]
#     tests                 meson test --suite gpu, four at a time (PREBUILT: each exe)    -> tests.txt
#     exe:<test_exe>        one test executable of build-gpu/tests, alone                  -> tests.txt
#     bandwidth             tapegrad_bench gpu_bandwidth                                   -> bandwidth.jsonl
#     node                  tapegrad_bench gpu_layernorm_mlp                               -> ours$RUN.jsonl
#     peers                 $PEER (default bench/peer_bench.py) and peer_jax_with_y.py over
#                           ITERS steps (default 200), then the table                       -> peers$RUN.jsonl
#     fp8peers              peer_torch_fp8.py (PyTorch eager, FP8 GEMMs) and $FLOOR (default
#                           bench/fp8_gemm_floor.py: the six GEMMs in fp8 and bf16)          -> fp8peers$RUN.jsonl
#     attention             tapegrad_bench --reps ITERS gpu_attention, then peer_attention.py for torch,
#                           then for jax (separate processes), ITERS steps (default 50)    -> attention$RUN.jsonl
#     layer                 tapegrad_bench gpu_transformer_layer, then
#                           peer_transformer_layer.py, as attention                        -> layer$RUN.jsonl
#     ncustep               ncu per kernel of one step: gpt_1k, gpt_1k_odd, gpt_4k         -> ncu$RUN.csv
#                           (NCU_CACHE=none: L2 kept as the step leaves it, not flushed before each kernel;
#                           NCU_TUNE=heuristic: cuBLASLt's heuristic GEMMs instead of autotuned ones;
#                           NCU_PRECISION=delayed|current|block: the products in fp8)
#     ncukernel:<regex>     ncu's full sections for the kernels whose names match, in one (4096, 1024, 4096)
#                           step (NCU_PRECISION as above): why a kernel is slow        -> ncu_kernel.txt
#     nculayer              ncu per kernel of one TransformerLayer step (layer_4k, layer_1k;
#                           NCU_PRECISION as above, default bf16)                           -> ncu_layer$RUN.csv
#     gemms                 gemm_candidates at gpt_1k, gpt_1k_odd and gpt_4k               -> gemms.txt
#     memcheck:<test_exe>, racecheck:<test_exe>   compute-sanitizer on one test executable -> <tool>.<exe>.txt
# ONLY=<regex> builds only the ninja targets that match (a restricted build takes a fraction of the full one).
# B=<dir> PREBUILT=1 runs executables built elsewhere (copied there, e.g. carried) instead of building.
# MESON_ARGS=<options> adds options to the first configure (e.g. -Dnccl_root=<where nccl.h and libnccl are>).
# LIB=<dir> runs the executables with the libtapegrad.so.0.1 in <dir> (another commit's, carried) instead of their
# own: two libraries compared in one call, steps run once with LIB and once without, RUN=<suffix> keeping them apart.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${B:-build-gpu}
OUT=${OUT:-$B/round}
PEER=${PEER:-bench/peer_bench.py}
FLOOR=${FLOOR:-bench/fp8_gemm_floor.py}
mkdir -p "$OUT"
[ -n "${LIB:-}" ] && export LD_LIBRARY_PATH="$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
log=$OUT/log.txt
say() { echo "== $(date +%T) $*" | tee -a "$log"; }

if [ -z "${PREBUILT:-}" ]; then
  if [ ! -f $B/build.ninja ]; then
    meson setup $B -Dcuda=enabled -Dgpu_tests=enabled ${MESON_ARGS:-} >>"$log" 2>&1 || { tail -30 "$log"; exit 1; }
  fi
  say build
  targets=()
  [ -n "${ONLY:-}" ] &&
    mapfile -t targets < <(ninja -C $B -t targets all | cut -d: -f1 | grep -E "$ONLY" | grep -v '\.p/')
  ninja -C $B "${targets[@]}" >>"$log" 2>&1 || { grep -E "error|FAILED" "$log" | head -40; exit 1; }
  say built
fi

for step in "$@"; do
  say "$step"
  case $step in
    tests)
      if [ -z "${PREBUILT:-}" ]; then
        meson test -C $B --suite gpu --num-processes 4 --print-errorlogs >>"$OUT/tests.txt" 2>&1
        grep -E "^Ok:|^Fail:|^Skipped:|FAIL" "$OUT/tests.txt" | tee -a "$log"
      else  # no meson here: each test executable, four at a time (exit 77 is a skip)
        mkdir -p "$OUT/tests"
        ls $B/tests/test_* | xargs -P 4 -I{} sh -c '{} >"$1/tests/${0##*/}.txt" 2>&1; echo "${0##*/} rc $?"' {} "$OUT" \
          >>"$OUT/tests.txt"
        grep -v " rc 0$" "$OUT/tests.txt" | tee -a "$log"
        echo "$(grep -c " rc 0$" "$OUT/tests.txt") of $(wc -l <"$OUT/tests.txt") passed" | tee -a "$log"
      fi ;;
    exe:*)
      $B/tests/"${step#exe:}" >>"$OUT/tests.txt" 2>&1
      echo "rc $?" | tee -a "$log" ;;
    bandwidth) $B/bench/tapegrad_bench gpu_bandwidth >"$OUT/bandwidth.jsonl" 2>>"$log" ;;
    node) $B/bench/tapegrad_bench gpu_layernorm_mlp >"$OUT/ours${RUN:-}.jsonl" 2>>"$log" ;;
    peers)
      peers=$OUT/peers${RUN:-}.jsonl
      ITERS=${ITERS:-200} python3 "$PEER" >"$peers" 2>>"$log"
      ITERS=${ITERS:-200} python3 bench/peer_jax_with_y.py "$PEER" >>"$peers" 2>>"$log"
      python3 bench/layernorm_mlp_peers.py "$OUT/ours${RUN:-}.jsonl" "$peers" | tee -a "$log" ;;
    attention | layer)
      group=gpu_attention peer=bench/peer_attention.py
      [ "$step" = layer ] && group=gpu_transformer_layer peer=bench/peer_transformer_layer.py
      $B/bench/tapegrad_bench --reps ${ITERS:-50} $group >"$OUT/$step${RUN:-}.jsonl" 2>>"$log"  # (the peers' run length)
      for framework in torch jax; do
        ITERS=${ITERS:-50} python3 $peer $framework >>"$OUT/$step${RUN:-}.jsonl" 2>>"$log"
      done
      cat "$OUT/$step${RUN:-}.jsonl" >>"$log" ;;
    fp8peers)
      fp8peers=$OUT/fp8peers${RUN:-}.jsonl
      ITERS=${ITERS:-200} python3 bench/peer_torch_fp8.py "$PEER" >"$fp8peers" 2>>"$log"
      ITERS=${ITERS:-200} python3 "$FLOOR" >>"$fp8peers" 2>>"$log"
      cat "$fp8peers" >>"$log" ;;
    ncustep)
      for shape in "4096 1024 4096" "4096 1021 4093" "8192 4096 16384"; do
        echo "### $shape gelu ${NCU_TUNE:-autotune} ${NCU_PRECISION:-bf16} cache ${NCU_CACHE:-all}" >>"$OUT/ncu${RUN:-}.csv"
        ncu --profile-from-start off --clock-control none --cache-control "${NCU_CACHE:-all}" \
          --metrics gpu__time_duration.sum --csv \
          $B/bench/layernorm_mlp_step $shape gelu ${NCU_TUNE:-autotune} ${NCU_PRECISION:-bf16} >>"$OUT/ncu${RUN:-}.csv" 2>&1
      done ;;
    ncukernel:*)
      ncu --profile-from-start off --clock-control none --set full -k "regex:${step#ncukernel:}" \
        $B/bench/layernorm_mlp_step 4096 1024 4096 gelu autotune ${NCU_PRECISION:-bf16} >>"$OUT/ncu_kernel.txt" 2>&1 ;;
    nculayer)
      for shape in "4 2048 4096 32 16384" "4 2048 1024 16 4096"; do
        echo "### $shape ${NCU_PRECISION:-bf16} cache ${NCU_CACHE:-all}" >>"$OUT/ncu_layer${RUN:-}.csv"
        ncu --profile-from-start off --clock-control none --cache-control "${NCU_CACHE:-all}" \
          --metrics gpu__time_duration.sum --csv \
          $B/bench/transformer_layer_step $shape ${NCU_PRECISION:-bf16} >>"$OUT/ncu_layer${RUN:-}.csv" 2>&1
      done ;;
    gemms)
      for shape in "4096 1024 4096" "4096 1021 4093" "8192 4096 16384"; do
        $B/bench/gemm_candidates $shape >>"$OUT/gemms.txt" 2>&1
      done ;;
    memcheck:* | racecheck:*)
      tool=${step%%:*} exe=${step#*:}
      compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 99 $B/tests/"$exe" \
        >"$OUT/$tool.$exe.txt" 2>&1
      echo "rc $? $(tail -3 "$OUT/$tool.$exe.txt" | tr '\n' ' ')" | tee -a "$log" ;;
    *) say "unknown step $step" ;;
  esac
done
say done
