"""Exercises of chapter 07 (The KV cache as a distributed store).

* 07.1 ``fetch_or_recompute`` -- the rule every replica applies to a prompt: with ``local`` tokens
  cached on this replica and ``pool`` tokens in the shared pool, fetch the pool's part beyond the
  local one only when moving its bytes is faster than recomputing it; compute the rest. The checker
  draws prompts, caches, links and devices at random (the M3-shaped layer and the tiny model) and
  compares with the package's ``routing.PrefillCost.plan``.
* 07.2 ``block_key`` -- the pool key of a block: its page name is a content address of the tokens,
  but the same tokens through another model, dtype or page layout give other bytes. The checker
  changes one part at a time and asks for a different key, and the same parts for the same key.
* 07.3 ``pick_replica`` -- the router: the replica where queue + prefill (07.1's price) is smallest.
"""
from __future__ import annotations

import math

import torch

from minimax_lab.exercises import exercise, fresh_rng
from minimax_lab.kvcache.blocks import page_hash
from minimax_lab.kvcache.routing import PrefillCost, choose_replica
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


# --------------------------------------------------------------------------- 07.2 the pool key


def block_key(name: bytes, model: str, dtype: torch.dtype, block_shape: tuple) -> str:
    """The key under which a block lives in the shared pool: a string that is equal for equal
    (name, model, dtype, block_shape) and differs when any of them differs. ``name`` is the page's
    chained content hash (16 bytes)."""
    raise NotImplementedError  # your code here


@exercise("07.2", "the pool key", "Name a block in the shared pool by its content and its format.", block_key)
def _check_block_key(fn) -> list[str]:
    rng = fresh_rng()
    problems = []
    for _ in range(20):
        name = page_hash(None, [rng.randrange(1000) for _ in range(rng.randint(1, 32))])
        model = rng.choice(["tiny", "M3", "MiniMax-M2", "M3 ckpt-2"])
        dtype = rng.choice([torch.float32, torch.bfloat16, torch.float8_e4m3fn])
        shape = (2, rng.randint(1, 62), rng.choice([16, 64, 128]), rng.choice([1, 4, 8]), rng.choice([64, 128]))
        key = fn(name, model, dtype, shape)
        if not isinstance(key, str):
            return [f"a key must be a string (Mooncake's keys are), got {type(key).__name__}"]
        if fn(bytes(name), str(model), dtype, tuple(shape)) != key:
            return ["the same block gave two different keys: a key must depend only on its four parts "
                    "(not on id(), hash() of a string or the time)"]
        other = page_hash(name, [1])
        changes = {"another page name": (other, model, dtype, shape),
                   "another model": (name, model + "-v2", dtype, shape),
                   "another dtype": (name, model, torch.float16, shape),
                   "another page size": (name, model, dtype, (*shape[:2], shape[2] * 2, *shape[3:])),
                   "another layer count": (name, model, dtype, (shape[0], shape[1] + 1, *shape[2:]))}
        for what, args in changes.items():
            if fn(*args) == key:
                problems.append(f"{what} gave the same key {key!r:.60}: another replica would be served bytes "
                                "computed for something else")
        if problems:
            return problems[:3]
    return problems


# --------------------------------------------------------------------------- 07.3 the router


def pick_replica(n_tokens: int, local: list[int], pool: int, queue_s: list[float], cost: PrefillCost) -> int:
    """The index of the replica where a prompt of ``n_tokens`` is done soonest: its queue
    ``queue_s[r]`` plus ``cost.plan(n_tokens, local[r], pool)[0]`` seconds (``local[r]``: tokens
    replica r caches; ``pool``: tokens in the shared pool). Ties go to the lower index."""
    raise NotImplementedError  # your code here


@exercise("07.3", "fetch here or go there", "Route a prompt to the replica where queue + prefill is cheapest.",
          pick_replica)
def _check_pick_replica(fn) -> list[str]:
    rng = fresh_rng()
    problems = []
    for _ in range(40):
        cost = PrefillCost(rng.choice((M3_LAYER, MINIMAX_M2)), 10 ** rng.uniform(-1, 2), 10 ** rng.uniform(1, 3))
        n = rng.randint(1, 100_000)
        r = rng.randint(1, 8)
        local = [rng.choice([0, rng.randint(0, n)]) for _ in range(r)]
        pool = rng.choice([0, n, rng.randint(0, n)])
        queue = [rng.choice([0.0, rng.uniform(0, 3)]) for _ in range(r)]
        want = choose_replica(n, local, pool, queue, cost)[0]
        got = fn(n, list(local), pool, list(queue), cost)
        if got != want:
            secs = [q + cost.plan(n, loc, pool)[0] for loc, q in zip(local, queue)]
            problems.append(f"{n:,} tokens, local {local}, pool {pool:,}, queues {[round(q, 2) for q in queue]}: "
                            f"expected replica {want} ({secs[want]:.4g} s), got {got!r}")
        if len(problems) >= 3:
            break
    return problems
