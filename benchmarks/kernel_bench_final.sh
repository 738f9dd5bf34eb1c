#!/usr/bin/env bash
# The end-of-session GPU check on the lent GPU (an H200 or an H100: the summary names it and takes its peaks),
# from the repo root with .whl/ carried:
#   bash benchmarks/kernel_bench_final.sh OUT
# 1. the whole GPU suite (`pytest -m gpu`) -> reports/kernel_bench/gpu_suite.log;
# 2. reports/kernel_bench/ re-measured (benchmarks/bench_kernel.py, torch reference timed, every config
#    checked) with the configs of the committed tuned_* batch tables, at B 1, 8, 32, 64, 128; the summary
#    gives each table's own row and judges issue 14's targets on it (--tables).
# Packed into OUT/final.tgz after each part and at exit, so a cut run still returns what it measured (also one
# killed outright, when no trap runs).
set -uo pipefail
out=${1:?usage: kernel_bench_final.sh OUT}
mkdir -p "$out" reports/kernel_bench
source benchmarks/device_env.sh || exit 1
export TRITON_CACHE_DIR=/tmp/triton-cache
pack() {  # OUT/final.tgz from what there is now, through a temporary name (a cut tar leaves the last one)
  tar czf "$out/.final.tgz.tmp" reports/kernel_bench/gpu_suite.log reports/kernel_bench/kernel_bench.csv \
    reports/kernel_bench/summary.md 2>/dev/null  # exit 2 while a file is still missing: the others are packed
  [ -s "$out/.final.tgz.tmp" ] && mv -f "$out/.final.tgz.tmp" "$out/final.tgz"
}
trap pack EXIT
timeout "${SUITE_TIMEOUT_S:-150}" python -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tee reports/kernel_bench/gpu_suite.log | tail -4
pack
CFGS=$(python - <<'PY'
import yaml
from kernelcamp.variant import parse_variant
labels = []
for n in ("tuned_deepseek_v32", "tuned_deepseek_v32_tp8", "tuned_deepseek_v4_flash"):
    v = parse_variant(yaml.safe_load(open(f"conf/variant/{n}.yaml")))
    for c in v.configs:
        lab = c.config_label()  # the row's config, without its batch bound
        if lab not in labels:
            labels.append(lab)
print(",".join(labels))
PY
)
echo "configs: $CFGS"
TABLES=v32=conf/variant/tuned_deepseek_v32.yaml,v32_tp8=conf/variant/tuned_deepseek_v32_tp8.yaml
TABLES=$TABLES,v4_flash=conf/variant/tuned_deepseek_v4_flash.yaml
timeout "${BENCH_TIMEOUT_S:-200}" python benchmarks/bench_kernel.py --out reports/kernel_bench --batches 1,8,32,64,128 \
  --configs "$CFGS" --tables "$TABLES" --check --precompile-jobs 12 > "$out/bench_final.log" 2>&1
pack
sed -n '/Best config per shape/,$p' reports/kernel_bench/summary.md | head -30
