# Source on the lent GPU machine (which lacks dvc, Hydra and MLflow) from the repo root:
#   source benchmarks/device_env.sh
# Installs the wheels carried in .whl/ (gathered here by ../shared/tools/device-wheels.sh), puts the
# repo and the wheels on PYTHONPATH and PATH, and makes the copied tree a git repo with one commit
# when it is not one (`dvc exp run` needs a commit to base experiments on).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || return 1
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PATH="/tmp/site/bin:$PATH" PYTHONUNBUFFERED=1
command -v python >/dev/null || { mkdir -p /tmp/pybin && ln -sf "$(command -v python3)" /tmp/pybin/python \
  && export PATH="/tmp/pybin:$PATH"; }
if [ ! -d .git ]; then
  if command -v git >/dev/null; then
    git init -q && git add -A && git -c user.email=device@kernelcamp -c user.name=device commit -qm device
  else
    python3 - <<'PY'
from dulwich import porcelain
repo = porcelain.init(".")
porcelain.add(repo)
porcelain.commit(repo, message=b"device", author=b"device <device@kernelcamp>", committer=b"device <device@kernelcamp>")
PY
  fi
fi
git config --global user.email >/dev/null 2>&1 || git config --global user.email device@kernelcamp 2>/dev/null
git config --global user.name >/dev/null 2>&1 || git config --global user.name device 2>/dev/null
# The copied tree can arrive with the .git of an older commit and the newer files as changes: queued
# experiments run from a commit and would miss new untracked files, so commit the tree as it is.
if command -v git >/dev/null && [ -n "$(git status --porcelain 2>/dev/null)" ]; then
  git add -A && git commit -qm "device: the copied working tree" || return 1
fi
echo "device env: $(python3 -c 'import torch, triton, dvc.version, mlflow; print("torch", torch.__version__, "triton", triton.__version__, "dvc", dvc.version.__version__, "mlflow", mlflow.__version__)')"
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
