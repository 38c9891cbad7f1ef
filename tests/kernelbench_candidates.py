"""Candidates for the isolated-mode tests, defined at module level so that the candidate's own
process can import them by reference."""
import os
import time

import torch


def raises(x):
    raise RuntimeError("boom in its process")


def exits(x):
    os._exit(3)  # the candidate's process dies mid-call


def softmax(x):
    return torch.softmax(x.float(), dim=-1).to(x.dtype)


def softmax_50ms(x):
    """Honest, and 50 ms long whatever the machine's load (a sleep, not work): its time measures
    the harness's clock, not the contention on a shared CPU."""
    time.sleep(0.05)
    return softmax(x)
