#!/bin/sh
# Install PyTorch into the given Python: keep a CUDA build on a GPU machine (installing the
# default CUDA wheel if none is there), and install the CPU build ($TORCH_CPU) otherwise.
# An open `pip install torch` on a CPU machine would pull a multi-GB CUDA build.
set -e
PY="$1"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  if "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "[setup] GPU found; keeping the installed CUDA build of torch"
  else
    echo "[setup] GPU found; installing a CUDA build of torch"
    "$PY" -m pip install -q torch triton
  fi
else
  if "$PY" -c "import torch" 2>/dev/null; then
    echo "[setup] no GPU; keeping the installed torch ($("$PY" -c 'import torch; print(torch.__version__)'))"
  else
    echo "[setup] no GPU; installing the CPU build: ${TORCH_CPU}"
    # shellcheck disable=SC2086
    "$PY" -m pip install -q ${TORCH_CPU}
  fi
fi
