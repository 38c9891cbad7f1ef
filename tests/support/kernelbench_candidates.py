"""Candidates for the isolated-mode tests, defined at module level so that the candidate's own
process can import them by reference."""
import os
import time

import torch

from minimax_lab.kernelbench import harness

#: what :func:`softmax_then_side_work` leaves running: a 50 ms sleep on the CPU, 10M GPU clock
#: cycles (at least 5 ms at the H200's 1.98 GHz) on a GPU
SIDE_WORK_MS = {"cpu": 50.0, "cuda": 10_000_000 / 1.98e6}


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


def softmax_then_side_work(x):
    """Right when it returns, but leaves work running that its output does not need (CPU: a
    side-work thread that sleeps 50 ms; GPU: a spin on a side stream): the isolated mode's time
    includes it, the in-process time (stopped at the return) does not."""
    y = softmax(x)
    if x.is_cuda:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(10_000_000)
    else:
        harness.launch_side_work(lambda: time.sleep(SIDE_WORK_MS["cpu"] / 1e3))
    return y
