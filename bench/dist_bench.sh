#!/usr/bin/env bash
# The CPU benchmark of the tensor-parallel node (bench/RESULTS.md): tapegrad_dist_bench with one rank (one and two
# threads) and two ranks (one thread each), then the bytes Open MPI sent per rank and step, measured by its pml
# monitoring (internal point-to-point traffic: what the collectives sent) as the difference between runs of 5 and 25
# steps. Writes $OUT/cpu_dist.jsonl (time) and $OUT/cpu_dist_bytes.jsonl (bytes).
#   bench/dist_bench.sh [build folder, default build-native]
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build-native}
OUT=${OUT:-bench/results}
exe=$B/bench/tapegrad_dist_bench
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
mpi() { mpirun --allow-run-as-root --oversubscribe --bind-to none "$@"; }
: >"$OUT/cpu_dist.jsonl"
mpi -np 1 $exe --threads 1 | tee -a "$OUT/cpu_dist.jsonl"
mpi -np 1 $exe --threads 2 | tee -a "$OUT/cpu_dist.jsonl"
mpi -np 2 $exe --threads 1 | tee -a "$OUT/cpu_dist.jsonl"

work=$(mktemp -d)
: >"$OUT/cpu_dist_bytes.jsonl"
for cfg in 256,256,1024 1024,512,2048; do
  for mode in tensor sequence; do
    for dtype in f32 f64; do
      for steps in 5 25; do
        mkdir -p $work/$steps
        mpi -np 2 --mca pml_monitoring_enable 2 --mca pml_monitoring_enable_output 3 \
          --mca pml_monitoring_filename $work/$steps/prof $exe --threads 1 --steps $steps --only $cfg --mode $mode \
          --dtype $dtype >/dev/null
      done
      python3 - "$work" "$cfg" "$mode" "$dtype" <<'PY' | tee -a "$OUT/cpu_dist_bytes.jsonl"
import json, sys
work, cfg, mode, dtype = sys.argv[1:5]
def sent(steps):  # rank 0's bytes to rank 1 inside collectives
    for line in open(f"{work}/{steps}/prof.0.prof"):
        f = line.split("\t")
        if f[0] == "I" and f[2] == "1":
            return int(f[3].split()[0])
    return 0
M, H, F = map(int, cfg.split(","))
print(json.dumps({"group": "dist_bytes", "ranks": 2, "M_H_F": [M, H, F], "mode": mode, "dtype": dtype,
                  "measured_bytes_per_rank_step": (sent(25) - sent(5)) / 20}))
PY
      rm -rf $work/5 $work/25
    done
  done
done
rmdir $work
