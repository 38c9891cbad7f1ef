# minimax-lab: two commands do everything.
#   make lab    set up .venv if needed, then open the workbook in JupyterLab
#   make test   set up .venv if needed, then run every test, notebooks included
# Other targets: make setup | make bench SUITE=all | make clean

VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.minimax_lab_installed
# Without a GPU this CPU build is installed (it is the local CPU wheel on our CI machines).
TORCH_CPU ?= torch==2.13.0 triton==3.6.0
PYTEST_ARGS ?=
SUITE ?= all

.PHONY: setup lab test bench clean

setup: $(STAMP)

$(STAMP): requirements.txt pyproject.toml tools/install_torch.sh
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	TORCH_CPU="$(TORCH_CPU)" sh tools/install_torch.sh $(PY)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(PY) -m ipykernel install --sys-prefix --name minimax_lab --display-name "Python (minimax_lab)"
	touch $(STAMP)

lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks

test: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -n 2 --timeout=1800 $(PYTEST_ARGS)

bench: setup
	$(PY) -m minimax_lab.bench $(SUITE)

clean:
	rm -rf $(VENV) .pytest_cache
