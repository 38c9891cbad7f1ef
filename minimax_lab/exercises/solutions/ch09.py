"""Solutions of chapter 09's exercises (``minimax_lab.exercises.ch09``)."""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


def next_step(running: list, waiting: list, step_tokens: int | None, max_batch: int) -> list:
    """Decodes first: every decoding sequence gets its token, whatever the budget (nobody's stream
    stalls). The rest of the budget goes to prompts, oldest first: running prompts continue, then
    waiting requests are admitted in arrival order while budget and batch slots are left."""
    budget = math.inf if step_tokens is None else step_tokens
    plan = []
    for sid, remaining in running:
        if remaining == 0:
            plan.append((sid, 1))
            budget -= 1
    for sid, remaining in running:
        if remaining > 0 and budget > 0:
            n = min(remaining, budget)
            plan.append((sid, n))
            budget -= n
    n_running = len(running)
    for sid, prompt_len in waiting:
        if budget <= 0 or n_running >= max_batch:
            break
        n = min(prompt_len, budget)
        plan.append((sid, n))
        budget -= n
        n_running += 1
    return plan


def sample_next(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator) -> int:
    """Greedy is an argmax and draws nothing. Otherwise sort the probabilities, keep each token whose
    better-ranked tokens hold less than top_p (so the most likely one always stays), scatter the kept
    mass back to the vocabulary's order, and draw once from the request's generator."""
    if temperature == 0:
        return int(logits.argmax())
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        keep = sorted_p.cumsum(0) - sorted_p < top_p
        probs = torch.zeros_like(probs).scatter_(0, order, torch.where(keep, sorted_p, 0.0))
        probs = probs / probs.sum()
    return int(torch.multinomial(probs, 1, generator=generator))


def logits_agreement(logits: list, reference: list) -> dict:
    """One flat [tokens, V] matrix per run; the error is one norm ratio (in fp64) over all of it, so
    a turn with large logits weighs as much as its logits do, not as one turn."""
    a, b = torch.cat(logits).double(), torch.cat(reference).double()
    return {"logits_rel_err": float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b)),
            "top1_agreement": float((a.argmax(-1) == b.argmax(-1)).double().mean()),
            "compared_tokens": int(a.shape[0])}


@triton.jit
def quantize_rows_kernel(X, Y, SCALE, n_cols, stride_row, stride_col, BLOCK: tl.constexpr):
    """One program per row: load it (masked: the row may be shorter than the block), find its
    largest magnitude, the power-of-two scale, and store row / scale (fp32) and the scale."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * stride_row + cols * stride_col, mask=mask, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=0)
    safe = tl.where(amax > 0, amax, 448.0)                      # an all-zero row: scale 1
    scale = tl.exp2(tl.ceil(tl.log2(safe / 448.0)))             # an estimate: fp32's log2 may be one off
    scale = tl.where(safe / scale > 448.0, scale * 2.0, scale)  # dividing by a power of two is exact,
    scale = tl.where(safe / (scale * 0.5) <= 448.0, scale * 0.5, scale)  # so these checks are too
    tl.store(Y + row * n_cols + cols, x / scale, mask=mask)
    tl.store(SCALE + row, scale)


def quantize_rows_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel computes every row's scale and x / scale; the cast to e4m3 is torch's (it rounds
    to nearest even; Triton's interpreter rounds its own fp32 -> fp8 conversion wrongly near a power
    of two, and on a GPU ``.to(tl.float8e4nv)`` in the kernel would do). The strides go to the
    kernel, so a strided view needs no copy."""
    D = x.shape[-1]
    rows = x.reshape(-1, D)
    y = torch.empty(rows.shape, dtype=torch.float32, device=x.device)
    scale = torch.empty(rows.shape[0], dtype=torch.float32, device=x.device)
    if rows.shape[0]:
        quantize_rows_kernel[(rows.shape[0],)](rows, y, scale, D, rows.stride(0), rows.stride(1),
                                               BLOCK=triton.next_power_of_2(D))
    x8 = y.clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return x8.reshape(x.shape), scale.reshape(x.shape[:-1])


def quantize_rows_fp8_torch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same numbers in PyTorch alone: scale = 2**ceil(log2(amax / 448)) with the log in fp64
    (fp32 could land a hair below an integer and give half the scale). Exercise 09.4's checker
    refuses it: no Triton kernel runs."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1).double()
    k = torch.ceil(torch.log2(amax / 448.0))
    scale = torch.where(amax > 0, torch.exp2(k), torch.ones_like(amax)).float()
    x8 = (xf / scale[..., None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return x8, scale
