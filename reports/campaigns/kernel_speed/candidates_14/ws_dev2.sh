# device run: candidate probes (logs under $OUT) and one Nsight Compute profile; at most ~8 files come back
mkdir -p $OUT; nvidia-smi -L > $OUT/gpu.txt; date -u >> $OUT/gpu.txt; sha256sum kernels/*.py >> $OUT/gpu.txt
for m in $MODS; do timeout 100 python benchmarks/ws_probe.py /tmp/p/$m $m ${BS:-2 1 8 32 64 128} 2>&1 | tee $OUT/$m.log | grep -v "^  " | tail -8; done
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for m in $NCU_MODS; do n=${m##*.}
timeout 150 $NCU -f -o /tmp/ncu_$n -k regex:ws_split --launch-skip 1 --launch-count 1 --import-source no --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section SourceCounters --section MemoryWorkloadAnalysis python benchmarks/ws_one_launch.py $m 128 > /tmp/ncu_$n.log 2>&1
$NCU --import /tmp/ncu_$n.ncu-rep --page details > $OUT/ncu_$n.txt 2>&1
$NCU --import /tmp/ncu_$n.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > $OUT/ncu_$n.sass.csv.gz
grep -E "Duration|Issue Slots Busy|Eligible Warps|No Eligible|Memory Throughput" $OUT/ncu_$n.txt | head -8
done
