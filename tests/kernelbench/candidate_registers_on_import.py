"""A candidate module that registers a kernel for a built-in operator when it is imported (before
any call): every ``torch.sinh`` on the CPU and on a CUDA GPU returns zeros from then on. The
harness imports it (in-process or in the candidate's process), names the registration and drops it."""
import torch

_LIBRARY = torch.library.Library("aten", "IMPL")
for _key in ("CPU", "CUDA"):
    _LIBRARY.impl("sinh", lambda t: torch.zeros_like(t), _key)


def softmax(x):
    return torch.softmax(x.float(), dim=-1).to(x.dtype)
