"""Exercise of chapter 04 (MSA kernels), the backward: one KV block's share of the gradients, as a
Triton kernel.

* 04.9 the backward of one block: given a tile of query rows, one selected key block, the
  forward's log-sum-exp and ``delta = do . o`` per row, compute that block's contribution to
  ``dq`` and its ``dk``, ``dv`` -- the step both of MSA's backward kernels repeat, for every block
  a query selected (``dq``) and for every query that selected a block (``dk``, ``dv``).

The checker draws fresh ragged sizes on every call (rows, keys, head dims, which keys each row
may see), compares with the formulas in float64, refuses an answer that launches no Triton
kernel, and says which gradient is wrong and what that usually means.
"""
from __future__ import annotations

import math

import torch

from minimax_lab import runtime
from minimax_lab.exercises import NO_TRITON, exercise, fresh_rng, tensor_problem, triton_launches


# --------------------------------------------------------------------------- 04.9 the backward of one block


def block_backward(q, k, v, do, lse, delta, q_pos, k_pos, scale):
    """One key block's share of the attention backward, computed by a ``@triton.jit`` kernel that
    you write above this function and launch here (one program is enough).

    ``q``, ``do`` ``[M, D]``: query rows and the output's gradient; ``k``, ``v`` ``[N, D]``: the
    block's keys and values; ``lse``, ``delta`` ``[M]`` fp32: each row's log-sum-exp from the
    forward and ``sum(do * o)``; ``q_pos [M]``, ``k_pos [N]`` int32 positions (row ``i`` sees key
    ``j`` when ``k_pos[j] <= q_pos[i]``); ``scale`` the softmax scale. All on
    ``runtime.kernel_device()``, fp32, ``M, N <= 64``, ``D <= 64`` (pad to powers of two >= 16
    inside the kernel and mask the padding).

    Return ``(dq [M, D], dk [N, D], dv [N, D])``::

        p  = exp(scale * q @ k.T - lse[:, None])    on visible pairs, 0 elsewhere
        dv = p.T @ do
        ds = p * (do @ v.T - delta[:, None])
        dq = scale * ds @ k
        dk = scale * ds.T @ q
    """
    raise NotImplementedError  # your code here: the kernel above, its launch here


def _case(g: torch.Generator, M: int, N: int, D: int) -> dict:
    """Inputs of one call: a query tile at positions ``t0 ..``, a key block that overlaps it (the
    local block: causal) or lies before it, ``lse`` the log-sum-exp over these keys plus others."""
    q, k, v, do = (torch.randn(n, D, generator=g, dtype=torch.float64) for n in (M, N, N, M))
    start = int(torch.randint(0, 40, (1,), generator=g))
    local = bool(torch.randint(0, 2, (1,), generator=g))
    k_pos = torch.arange(start, start + N)
    q_pos = start + (torch.randint(0, N, (M,), generator=g) if local else N + torch.randint(0, 30, (M,), generator=g))
    scale = 1.0 / math.sqrt(D)
    s = (q @ k.T) * scale
    seen = k_pos[None, :] <= q_pos[:, None]
    elsewhere = torch.randn(M, generator=g, dtype=torch.float64)  # the row's mass in its other blocks
    lse = torch.logaddexp(torch.logsumexp(s.masked_fill(~seen, -math.inf), -1), elsewhere)
    delta = torch.randn(M, generator=g, dtype=torch.float64)
    return dict(q=q, k=k, v=v, do=do, lse=lse, delta=delta, q_pos=q_pos.to(torch.int32), k_pos=k_pos.to(torch.int32),
                scale=scale)


def block_backward_formulas(q, k, v, do, lse, delta, q_pos, k_pos, scale):
    """The answer, in PyTorch (float64 for the checker)."""
    seen = k_pos[None, :].long() <= q_pos[:, None].long()
    p = torch.exp((q @ k.T) * scale - lse[:, None]).masked_fill(~seen, 0.0)
    ds = p * (do @ v.T - delta[:, None])
    return scale * ds @ k, scale * ds.T @ q, p.T @ do


_HINTS = {
    "dv": "dv = p.T @ do needs only p: check p = exp(scale * q.k - lse) on visible keys and 0 where "
          "k_pos > q_pos (the causal mask) or past the N real keys",
    "dq": "dq = scale * ds @ k with ds = p * (dp - delta), dp = do @ v.T: check the subtraction of "
          "delta per row and the factor scale",
    "dk": "dk = scale * ds.T @ q sums over the query rows: check the transpose, the factor scale, and "
          "that padded rows (past M) contribute 0",
}


@exercise("04.9", "the backward of one block", "Write the Triton kernel for one key block's share of the "
          "attention backward: recompute p from the log-sum-exp, then dv, ds, dq and dk.", block_backward,
          writes_triton=True)
def _check_block_backward(fn) -> list[str]:
    dev = runtime.kernel_device()
    bound = 1e-4 if runtime.is_interpreter() else 1e-2  # a GPU's fp32 tl.dot runs in TF32 by default
    rng = fresh_rng()
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    for trial in range(3):
        M, N, D = rng.randint(1, 40), rng.choice([16, 32, rng.randint(2, 32)]), rng.choice([8, 16, 32, 48])
        case = _case(g, M, N, D)
        want = block_backward_formulas(**case)
        args = {n: (t.to(dev, torch.float32) if t.is_floating_point() else t.to(dev)) if isinstance(t, torch.Tensor)
                else t for n, t in case.items()}
        with triton_launches() as launched:
            got = fn(**args)
        if launched["count"] == 0:
            return [NO_TRITON]
        call = f"block_backward(M={M} rows, N={N} keys, D={D})"
        if not (isinstance(got, (tuple, list)) and len(got) == 3):
            return [f"{call} should return three tensors (dq, dk, dv), got {type(got).__name__}"]
        problems = []
        for name, a, w in zip(("dq", "dk", "dv"), got, want):
            wrong = tensor_problem(a, f"{call}: {name}", tuple(w.shape))
            if wrong:
                problems.append(wrong)
                continue
            err = ((a.detach().cpu().double() - w).norm() / w.norm().clamp_min(1e-12)).item()
            if not err < bound:  # NaN fails too
                problems.append(f"{call}: {name} is off by a relative error of {err:.3g} (tolerance {bound:g}); "
                                + _HINTS[name])
        if problems:
            return problems if trial == 0 else [f"(trial {trial + 1}, the earlier ones passed)"] + problems
    return []
