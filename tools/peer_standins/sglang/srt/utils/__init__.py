"""minimax-lab stand-in for ``sglang.srt.utils``: only the platform probes that the extracted
Triton kernel files import, answered from PyTorch. Not SGLang's code.

``is_cuda()`` is also True under Triton's CPU interpreter (``TRITON_INTERPRET=1``), which stands
in for a CUDA GPU there, so the extracted files take their CUDA code paths in CPU tests; every
capability probe (``is_sm90_supported`` and the like) is False there.
"""
from __future__ import annotations

import logging
import os

import torch


def _interpreter() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _capability() -> tuple[int, int] | None:
    if _interpreter() or torch.version.hip is not None or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability()


def is_cuda() -> bool:
    return torch.version.hip is None and (_interpreter() or torch.cuda.is_available())


def is_hip() -> bool:
    return torch.version.hip is not None


def is_xpu() -> bool:
    return False


def is_npu() -> bool:
    return False


def is_musa() -> bool:
    return False


def is_cpu() -> bool:
    return False


def cpu_has_amx_support() -> bool:
    return False


def is_gfx95_supported() -> bool:
    return False


def is_sm90_supported() -> bool:
    """SGLang's rule: a CUDA device of compute capability 9.x, CUDA >= 12.3."""
    cap = _capability()
    cuda = tuple(int(x) for x in (torch.version.cuda or "0.0").split(".")[:2])
    return cap is not None and cap[0] == 9 and cuda >= (12, 3)


def get_device_name(device_id: int = 0) -> str:
    if _interpreter() or not torch.cuda.is_available():
        return "cpu"
    return torch.cuda.get_device_name(device_id)


def get_bool_env_var(name: str, default: str = "false") -> bool:
    return os.getenv(name, default).strip().lower() in ("1", "true")


def _warning_once(self, msg, *args, **kwargs):
    """SGLang adds ``Logger.warning_once``; the extracted files call it."""
    key = (id(self), str(msg))
    if key not in _WARNED:
        _WARNED.add(key)
        self.warning(msg, *args, **kwargs)


_WARNED: set = set()
if not hasattr(logging.Logger, "warning_once"):
    logging.Logger.warning_once = _warning_once
