# An index of commands; each target is one line you could type yourself. `make help` lists them.
PY ?= python
# On a machine without an NVIDIA GPU, install the tested CPU pins (torch 2.13.0 CPU build, Triton
# 3.6.0, numpy 2.3.5: Triton 3.6's interpreter breaks with numpy >= 2.4); a GPU machine keeps its own torch.
PIP_PINS ?= $(shell command -v nvidia-smi >/dev/null 2>&1 || echo "-c .ci/constraints.txt")

.PHONY: help run test test-slow test-gpu params check-params lint format queue sweep exps campaign ui clean-server

help:  ## list the commands
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

run:  ## install, then run the pipeline on the default conf (dvc exp run)
	$(PY) -m pip install $(PIP_PINS) -e . && dvc exp run

test:  ## install with test extras, then run the CPU tests
	$(PY) -m pip install $(PIP_PINS) -e '.[test]' && $(PY) -m pytest

test-slow:  ## the slow CPU tests: end-to-end pipeline and sweep runs, real compiles (CI runs them after `make test`)
	$(PY) -m pytest -m 'slow and not gpu'

test-gpu:  ## run the GPU tests (on a machine with a CUDA GPU)
	$(PY) -m pytest -m gpu

params:  ## recompose params.yaml from conf/ exactly as dvc exp run does (commit the result)
	$(PY) -m kernelcamp.cli compose

check-params:  ## fail when the committed params.yaml differs from conf/
	$(PY) -m kernelcamp.cli compose --check

lint:  ## ruff lint and format check, whole tree
	ruff check . && ruff format --check .

format:  ## ruff format, whole tree
	ruff format .

queue:  ## run queued experiments (dvc exp run --queue ...)
	dvc queue start && dvc queue status

sweep:  ## run queued experiments with one worker pinned to each GPU
	kernelcamp sweep

# Columns `dvc exp show` names by a path are dependency hashes (stages/*.py, kernelcamp/..., reports/*.json that
# later stages read) or the kernels folder; metrics and params are dotted names without a slash.
EXPS_DROP ?= .*/|kernels$$|kernelcamp$$
exps:  ## compare experiments: the params and headline metrics that differ, without dependency-hash columns
	dvc exp show --only-changed --drop '$(EXPS_DROP)' $(EXPS_ARGS)

campaign:  ## reproduce the warp-occupancy campaign on a GPU (reports/campaigns/warp_occupancy/)
	bash benchmarks/campaign.sh

ui:  ## open the MLflow UI on the workspace store
	mlflow ui --backend-store-uri sqlite:///mlflow.db

clean-server:  ## stop the embedded server this workspace started
	$(PY) -m stages.deploy --stop
