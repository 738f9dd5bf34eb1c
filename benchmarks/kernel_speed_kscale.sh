#!/usr/bin/env bash
# Issue 14, campaign step "kscale", on the lent H200 in one device call, from a clone of this repo made
# from a bundle (the baseline's kernel_rev needs the git history; an archive has none):
#   git bundle create .probe/repo.bundle main             # here; .probe/ is git-ignored and carried
#   git clone -q .probe/repo.bundle /tmp/kc && cp -r .whl /tmp/kc/ && cd /tmp/kc \
#     && bash benchmarks/kernel_speed_kscale.sh OUT       # there
# Queues one DVC experiment per shape (conf/experiment/kernel_speed_kscale_{v32,tp8,v4}.yaml: the
# committed kernel and its grid_3 batch table against the kernel file and table of aaad5b0, through
# baseline.kernel_rev), runs them with `kernelcamp sweep` on GPU 0, collects each experiment's report,
# records, params and lock into reports/campaigns/kernel_speed/kscale_<shape>/ and packs that folder
# into OUT/kscale.tgz at exit, so a cut run still returns what finished. The run is
# benchmarks/kernel_speed_step.sh's for step "kscale" (the same commands; this file ran them inline).
out=${1:?usage: kernel_speed_kscale.sh OUT}
SWEEP_TIMEOUT_S=${SWEEP_TIMEOUT_S:-420} exec bash "$(dirname "$0")/kernel_speed_step.sh" "$out" kscale v32 tp8 v4
