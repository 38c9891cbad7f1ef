# minimax-lab: two commands do everything.
#   make lab    set up .venv if needed, then open the workbook in JupyterLab
#   make test   set up .venv if needed, then run every test, notebooks included
# Other targets: make setup | make bench SUITE=all [CASES='g ...'] | make clean

VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.minimax_lab_installed
# Without a GPU this CPU build is installed (it is the local CPU wheel on our CI machines).
TORCH_CPU ?= torch==2.13.0 triton==3.6.0
PYTEST_ARGS ?=
SUITE ?= all
# Triton's newest release: without a GPU, `make test` runs again, under it, tests that together launch
# every Triton kernel (with every flag combination) the pinned run launched -- the run logs which test
# launched what to LAUNCH_LOG, tests/support/launch_log.py picks the cheapest covering set -- and
# notebooks 03 and 04 (installed beside the pinned one, in its own folder on PYTHONPATH).
TRITON_NEWEST ?= 3.9.0
NEWEST_DIR := $(VENV)/triton-$(TRITON_NEWEST)
LAUNCH_LOG := $(VENV)/tests-that-launch-triton.jsonl
NEWEST_TESTS := $(VENV)/tests-for-newest-triton.txt
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)

.PHONY: setup lab test test-pinned test-newest-triton bench gpu-check clean

setup: $(STAMP)

$(STAMP): requirements.txt pyproject.toml tools/install_torch.sh
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	TORCH_CPU="$(TORCH_CPU)" sh tools/install_torch.sh $(PY)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	@# the optional store extra (Mooncake's client): where its wheel does not install, the store says why
	$(PY) -m pip install -q --no-build-isolation -e ".[store]" || echo "[setup] minimax-lab[store] (Mooncake Store) did not install here; the KV pool tier will be off and say why"
	$(PY) -m ipykernel install --sys-prefix --name minimax_lab --display-name "Python (minimax_lab)"
	touch $(STAMP)

# As root (containers, cloud machines) JupyterLab refuses to start without --allow-root.
lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

test: test-pinned
ifneq ($(HAS_GPU),1)
	$(MAKE) test-newest-triton
endif

# Tests marked `exclusive` time against a clock (kernelbench's isolated mode): they run alone,
# after the parallel run, so no other test shares the GPU or the cores while they measure.
test-pinned: setup
	rm -f $(LAUNCH_LOG)
	MINIMAX_LAB_LAUNCH_LOG=$(abspath $(LAUNCH_LOG)) OMP_NUM_THREADS=1 $(PY) -m pytest -n 2 --timeout=1800 -m "not exclusive" $(PYTEST_ARGS)
	MINIMAX_LAB_LAUNCH_LOG=$(abspath $(LAUNCH_LOG)) $(PY) -m pytest --timeout=1800 -m exclusive $(PYTEST_ARGS) || test $$? -eq 5  # 5: none selected

$(NEWEST_DIR)/.stamp: | setup
	$(PY) -m pip install -q --no-deps --upgrade --target $(NEWEST_DIR) triton==$(TRITON_NEWEST)
	touch $@

# Tests that launch every kernel the pinned run launched, and notebooks 03 and 04, under the newest
# Triton (interpreter; CPU machines only).
test-newest-triton: setup $(NEWEST_DIR)/.stamp
	@test -s $(LAUNCH_LOG) || { echo "no $(LAUNCH_LOG): run make test-pinned first (it logs the tests that launch kernels)"; exit 2; }
	$(PY) -m tests.support.launch_log select $(LAUNCH_LOG) $(NEWEST_TESTS)
	PYTHONPATH=$(NEWEST_DIR) MINIMAX_LAB_EXPECT_TRITON=$(TRITON_NEWEST) OMP_NUM_THREADS=1 \
	  $(PY) -m pytest -n 2 --timeout=1800 @$(NEWEST_TESTS) \
	  "tests/workbook/test_notebooks.py::test_notebook_executes_within_budget[03_minimax_sparse_attention]" \
	  "tests/workbook/test_notebooks.py::test_notebook_executes_within_budget[04_sparse_attention_kernels]"

bench: setup
	$(PY) -m minimax_lab.bench $(SUITE) $(if $(CASES),--cases $(CASES))

# On a GPU machine: every test, every notebook at preset gpu and a bench smoke of every suite;
# writes results/gpu_check_<device>.json. Needs no `make setup` (machines without network):
# GPU_PY is .venv's python if there is one, else python3. GPU_CHECK_ARGS e.g. "--only tests".
GPU_PY ?= $(if $(wildcard $(VENV)/bin/python),$(VENV)/bin/python,python3)
GPU_CHECK_ARGS ?=
gpu-check:
	$(GPU_PY) tools/gpu_check.py $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
