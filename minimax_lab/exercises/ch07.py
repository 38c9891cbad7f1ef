"""Exercises of chapter 07 (The KV cache as a distributed store).

* 07.1 ``fetch_or_recompute`` -- the rule every replica applies to a prompt: with ``local`` tokens
  cached on this replica and ``pool`` tokens in the shared pool, fetch the pool's part beyond the
  local one only when moving its bytes is faster than recomputing it; compute the rest. The checker
  draws prompts, caches, links and devices at random (the M3-shaped layer and the tiny model) and
  compares with the package's ``routing.PrefillCost.plan``.
"""
from __future__ import annotations

import math

from minimax_lab.exercises import exercise, fresh_rng
from minimax_lab.kvcache.routing import PrefillCost
from minimax_lab.kvcache.tiers import M3_LAYER, MINIMAX_M2, LayerShape, tiny_model_shape


def fetch_or_recompute(n_tokens: int, local: int, pool: int, shape: LayerShape, link_gbps: float,
                       tflops: float, mfu: float = 0.5) -> tuple[float, int, int]:
    """A prompt of ``n_tokens``; ``local`` tokens are cached on this replica, ``pool`` tokens (a
    prefix too) in the shared pool. Return (seconds, tokens fetched, tokens computed).

    Fetching ``k`` tokens moves ``k * shape.kv_bytes_per_token()`` bytes at ``link_gbps`` GB/s;
    computing tokens ``[a, b)`` costs ``shape.prefill_flops(a, b)`` FLOPs at ``tflops * mfu``
    TFLOP/s. Fetch the pool's tokens beyond ``local`` only if that is faster than computing them."""
    raise NotImplementedError  # your code here


@exercise("07.1", "fetch or recompute", "Price a prompt's prefix: local cache, the pool, or compute.",
          fetch_or_recompute)
def _check_fetch_or_recompute(fn) -> list[str]:
    rng = fresh_rng()
    shapes = (M3_LAYER, MINIMAX_M2, tiny_model_shape(preset="cpu"))
    problems = []
    for _ in range(40):
        shape = rng.choice(shapes)
        n = rng.randint(1, 200_000)
        local = rng.choice([0, rng.randint(0, n)])
        pool = rng.choice([0, local, rng.randint(0, n), n])
        link = 10 ** rng.uniform(-2, 2)
        tflops = 10 ** rng.uniform(-3, 3)
        want = PrefillCost(shape, link, tflops).plan(n, local, pool)
        got = fn(n, local, pool, shape, link, tflops)
        if not (isinstance(got, (tuple, list)) and len(got) == 3):
            return [f"expected (seconds, fetched, computed), got {got!r:.60}"]
        sec, fetched, computed = got
        where = (f"{shape.name}, {n:,} tokens, {local:,} local, {pool:,} in the pool, a {link:.3g} GB/s link, "
                 f"{tflops:.3g} TFLOP/s")
        if (fetched, computed) != want[1:]:
            problems.append(f"{where}: expected {want[1]:,} fetched and {want[2]:,} computed, got "
                            f"{fetched!r} and {computed!r}" + (" (the pool holds less than this replica: "
                            "nothing to fetch)" if pool <= local and fetched else ""))
        elif not math.isclose(sec, want[0], rel_tol=1e-6, abs_tol=1e-12):
            problems.append(f"{where}: expected {want[0]:.6g} s, got {sec!r}")
        if len(problems) >= 3:
            break
    return problems
