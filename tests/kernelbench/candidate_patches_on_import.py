"""A candidate module that patches the standard library when it is imported (before any call):
``statistics.median`` becomes ``min``. The harness imports it (in-process or in the candidate's
process), names the patch and puts the original back."""
import statistics

import torch

statistics.median = min


def softmax(x):
    return torch.softmax(x.float(), dim=-1).to(x.dtype)
