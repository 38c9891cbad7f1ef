"""Exercises of chapter 07 (The KV cache as a distributed store).

* 07.1 ``fetch_or_recompute`` -- the rule every replica applies to a prompt: with ``local`` tokens
  cached on this replica and ``pool`` tokens in the shared pool, fetch the pool's part beyond the
  local one only when moving its bytes is faster than recomputing it; compute the rest.
* 07.2 ``pool_prefix`` -- how much of a prompt the pool can serve: the leading keys present, asked
  with one ``batch_is_exist`` (Mooncake's call), an error counted as absent, a dead pool as none.
* 07.3 ``read_block`` -- serve only what you can verify: parse a value in the pool's layout (magic,
  header, payload, a tag keyed with the pool's secret) and refuse a corrupted, truncated, foreign,
  lying or forged one.
* 07.4 ``pick_replica`` -- the router: the replica that finishes the prompt first, queue included.

Each checker draws fresh cases, explains a wrong answer in the learner's terms, and refuses an
answer that hands the work to the package's own function (``PrefillCost.plan``,
``RemoteTier.prefix``, ``pool_value.ValueCodec``, ``routing.choose_replica``) in any form: an alias,
a method reached through an object, a call in another thread or process (:mod:`.forbidden`).
"""
from __future__ import annotations

import json
import math
import struct
from collections import Counter

import torch

from minimax_lab.exercises import exercise, fresh_rng
from minimax_lab.kvcache import block_file, pool_value
from minimax_lab.kvcache.blocks import page_hash
from minimax_lab.kvcache.pool_value import ValueCodec
from minimax_lab.kvcache.remote import RemoteTier
from minimax_lab.kvcache.routing import PrefillCost, choose_replica
from minimax_lab.kvcache.cost import M3_LAYER, MINIMAX_M2, LayerShape
from minimax_lab.model.config import tiny_model_shape


# --------------------------------------------------------------------------- 07.1 fetch or recompute


def fetch_or_recompute(n_tokens: int, local: int, pool: int, shape: LayerShape, link_gbps: float,
                       tflops: float, mfu: float = 0.5) -> tuple[float, int, int]:
    """Serve a prompt of ``n_tokens``: its first ``local`` tokens are cached on this replica and
    cost nothing; its first ``pool`` tokens are in the shared pool. Return
    ``(seconds, tokens fetched, tokens computed)`` with seconds = fetch time + compute time.

    Fetching ``k`` tokens moves ``k * shape.kv_bytes_per_token()`` bytes at ``link_gbps`` GB/s
    (1e9 bytes/s); computing tokens ``[a, b)`` costs ``shape.prefill_flops(a, b)`` FLOPs at
    ``tflops * mfu`` TFLOP/s (1e12 FLOP/s). Fetch the pool's tokens beyond ``local`` (all of them)
    only if moving them is faster than computing them; compute every token after that."""
    raise NotImplementedError  # your code here


@exercise("07.1", "fetch or recompute", "Price a prompt's prefix: local cache, the pool, or compute.",
          fetch_or_recompute, answers=(PrefillCost.plan, PrefillCost.fetch_s, PrefillCost.compute_s, choose_replica))
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
        cost = PrefillCost(shape, link, tflops)
        want = cost.plan(n, local, pool)
        got = fn(n, local, pool, shape, link, tflops)
        if not (isinstance(got, (tuple, list)) and len(got) == 3):
            return [f"expected (seconds, fetched, computed), got {got!r:.60}"]
        sec, fetched, computed = got
        where = (f"{shape.name}, {n:,} tokens, {local:,} cached here, {pool:,} in the pool, a {link:.3g} GB/s link, "
                 f"{tflops:.3g} TFLOP/s")
        if (fetched, computed) != want[1:]:
            if pool <= local and fetched:
                why = "the pool holds nothing beyond what this replica caches: there is nothing to fetch"
            elif pool > local:
                t_fetch, t_comp = cost.fetch_s(pool - local), cost.compute_s(local, pool)
                verb = "fetch them" if t_fetch < t_comp else "recompute them"
                why = (f"moving tokens {local:,}..{pool:,} takes {t_fetch:.3g} s, computing them {t_comp:.3g} s: "
                       f"{verb}")
            else:
                why = "every token neither cached nor fetched is computed"
            problems.append(f"{where}: expected {want[1]:,} fetched and {want[2]:,} computed, got {fetched!r} and "
                            f"{computed!r} ({why})")
        elif not math.isclose(sec, want[0], rel_tol=1e-6, abs_tol=1e-12):
            hint = ""
            if local and math.isclose(sec, want[0] + cost.compute_s(0, local), rel_tol=1e-6):
                hint = " -- you charged the cached tokens: they cost nothing"
            problems.append(f"{where}: expected {want[0]:.6g} s (fetch {cost.fetch_s(want[1]):.3g} s + compute "
                            f"{want[0] - cost.fetch_s(want[1]):.3g} s), got {sec!r}{hint}")
        if len(problems) >= 3:
            break
    return problems


# --------------------------------------------------------------------------- 07.2 the longest prefix in the pool


def pool_prefix(client, keys: list[str]) -> int:
    """How many leading ``keys`` (the pool keys of a prompt's pages, in order) the pool holds.

    Ask with **one** call, ``client.batch_is_exist(keys)``: it returns one code per key, 1 present,
    0 absent, a negative number an error (the pool cannot vouch for that block: count it absent).
    A prefix stops at the first key that is not present. If the call raises (the pool is down),
    the pool serves nothing: return 0."""
    raise NotImplementedError  # your code here


class _Pool:
    """A stand-in for Mooncake's client: keys it holds, codes it answers, calls it counts."""

    def __init__(self, present: set, errors: set = frozenset(), down: bool = False):
        self.present, self.errors, self.down = present, errors, down
        self.calls: Counter = Counter()

    def _codes(self, keys) -> list[int]:
        if self.down:
            raise ConnectionError("the master does not answer")
        return [-704 if k in self.errors else int(k in self.present) for k in keys]

    def batch_is_exist(self, keys):
        self.calls["batch_is_exist"] += 1
        return self._codes(keys)

    def is_exist(self, key):
        self.calls["is_exist"] += 1
        return self._codes([key])[0]

    def get(self, key):
        self.calls["get"] += 1
        return b""

    def get_batch(self, keys):
        self.calls["get_batch"] += 1
        return [b""] * len(keys)


def _expected_prefix(pool: _Pool, keys) -> int:
    if pool.down:
        return 0
    n = 0
    for k in keys:
        if k not in pool.present or k in pool.errors:
            break
        n += 1
    return n


@exercise("07.2", "the longest prefix in the pool", "Ask the pool, in one call, how much of a prompt it can serve.",
          pool_prefix, answers=(RemoteTier.prefix,))
def _check_pool_prefix(fn) -> list[str]:
    rng = fresh_rng()
    problems = []
    for trial in range(30):
        keys = [f"mmlkv-{rng.getrandbits(64):016x}-{page_hash(None, [trial, i]).hex()}" for i in range(rng.randint(0, 24))]
        run = rng.randint(0, len(keys))
        present = set(keys[:run]) | {k for k in keys[run + 1:] if rng.random() < 0.6}   # blocks after a gap too
        errors = {keys[rng.randrange(len(keys))]} if keys and rng.random() < 0.3 else set()
        pool = _Pool(present, errors, down=trial % 10 == 9)
        try:
            got = fn(pool, list(keys))
        except NotImplementedError:
            raise
        except Exception as e:  # noqa: BLE001 -- reported to the learner
            return [f"raised {type(e).__name__}: {e} when the pool was "
                    f"{'down' if pool.down else 'up'}: a pool that fails costs recomputation, never a crash "
                    "-- catch it and return 0"]
        want = _expected_prefix(pool, keys)
        calls = sum(pool.calls.values())
        if got != want:
            why = ""
            if not pool.down and isinstance(got, int) and got > want and want < len(keys):
                code = pool._codes([keys[want]])[0]
                why = (f" -- key {want} answered {code}: an error is not a block the pool can serve"
                       if code < 0 else f" -- key {want} is absent, and a page's KV depends on every page before "
                       "it: the prefix stops there even though later pages are in the pool")
            problems.append(f"{len(keys)} keys, the pool {'down' if pool.down else 'up'}: expected {want}, "
                            f"got {got!r}{why}")
        elif keys and not pool.down and (pool.calls["batch_is_exist"] != 1 or calls != 1):
            asked = ", ".join(f"{v} x {k}" for k, v in sorted(pool.calls.items()))
            problems.append(f"{len(keys)} keys: you asked the pool {asked}; ask once with batch_is_exist(keys) -- "
                            "every call is a round trip to the master (~0.2 ms over loopback, more across machines)")
        if len(problems) >= 3:
            break
    return problems


# --------------------------------------------------------------------------- 07.3 serve only what you can verify

MAGIC = pool_value.MAGIC


def read_block(value: bytes, name: bytes, model: str, dtype: torch.dtype, shape: tuple,
               secret: bytes) -> torch.Tensor | None:
    """The tensor in ``value`` (bytes a replica got from the pool for page ``name``), or None when
    it must not be served. Never raise: a damaged or forged value is a miss, recomputed.

    The value (section 2's layout) is ``MAGIC`` (8 bytes, ``b"MMLKVp01"``) | the header's length
    (4 bytes, little-endian unsigned) | the header (JSON: ``model``, ``hash`` = ``name.hex()``,
    ``dtype`` such as ``"float32"``, ``shape`` a list, ``nbytes`` the payload's length; padded with
    spaces) | the payload (the tensor's raw bytes) | the tag (32 bytes:
    ``blake3.blake3(everything before the tag, key=secret).digest()``). Serve it only if every part
    checks: the magic, the tag, a header naming this ``name``, ``model``, ``dtype`` and ``shape``,
    and a payload of exactly the bytes such a tensor has."""
    raise NotImplementedError  # your code here


def _signed(header: dict, payload: bytes, key: bytes | None, magic: bytes = MAGIC) -> bytes:
    """A value in the pool's layout whose header says whatever ``header`` says, tagged with keyed
    BLAKE3 under ``key`` (None: plain BLAKE3, what a writer without the secret can compute)."""
    import blake3  # deferred: only this exercise and the pool need it (requirements.txt carries it)

    body = json.dumps(header).encode()
    body += b" " * (-(12 + len(body)) % pool_value.ALIGN)
    out = magic + struct.pack("<I", len(body)) + body + payload
    return out + (blake3.blake3(out, key=key) if key is not None else blake3.blake3(out)).digest()


def _flip(data: bytes, at: int) -> bytes:
    b = bytearray(data)
    b[at] ^= 0x5A
    return bytes(b)


def _damaged(kv: torch.Tensor, name: bytes, model: str, secret: bytes, rng) -> dict[str, bytes]:
    """The values a reader must refuse, each named by what is wrong with it."""
    dtype, shape = kv.dtype, tuple(kv.shape)
    good = ValueCodec(model, dtype, shape, secret).encode(name, kv)
    raw = kv.contiguous().view(torch.uint8).numpy().tobytes()
    header = dict(model=model, hash=name.hex(), dtype=str(dtype).replace("torch.", ""), shape=list(shape),
                  nbytes=len(raw))
    half = dict(header, shape=[shape[0], shape[1], shape[2] // 2, *shape[3:]], nbytes=len(raw) // 2)
    other_dtype = torch.float16 if dtype != torch.float16 else torch.float32
    evil = bytes(len(raw))                                  # the tensor a forger wants served: zeros
    return {"a payload byte flipped": _flip(good, len(good) - 32 - len(raw) // 2),
            "a tag byte flipped": _flip(good, len(good) - 5),
            "the last 10 bytes lost": good[:-10],
            "another page's value under this key (signed)":
                ValueCodec(model, dtype, shape, secret).encode(page_hash(name, [1]), kv),
            "another model's block (signed)": ValueCodec(model + "-v2", dtype, shape, secret).encode(name, kv),
            f"the same page stored as {str(other_dtype).replace('torch.', '')} (signed)":
                ValueCodec(model, other_dtype, shape, secret).encode(name, kv.to(other_dtype)),
            "a forged payload, tag computed without the key (plain BLAKE3)": _signed(header, evil, None),
            "a forged payload, tag keyed with another pool's secret":
                _signed(header, evil, rng.getrandbits(256).to_bytes(32, "little")),
            "a header claiming half the payload (signed)": _signed(half, raw[:len(raw) // 2], secret),
            "a header whose nbytes does not match its payload (signed)":
                _signed(dict(header, nbytes=len(raw) + 4), raw, secret),
            "an older layout's magic b'MMLKVv02' (signed)": _signed(header, raw, secret, magic=b"MMLKVv02"),
            "garbage": b"not a block",
            "an empty value (a miss)": b""}


@exercise("07.3", "serve only what you can verify",
          "Check a value from the pool: magic, header, payload, and its tag keyed with the pool's secret.",
          read_block, answers=(ValueCodec, RemoteTier.get_many, block_file.decode_block, block_file.read_block_file))
def _check_read_block(fn) -> list[str]:
    rng = fresh_rng()
    g = torch.Generator().manual_seed(rng.getrandbits(32))
    problems = []
    for trial in range(6):
        dtype = rng.choice([torch.float32, torch.float16, torch.bfloat16])
        shape = (2, rng.randint(1, 3), rng.choice([4, 16]), rng.randint(1, 3), rng.choice([8, 16]))
        kv = torch.randn(shape, generator=g).to(dtype)
        name = page_hash(None, [trial, rng.getrandbits(30)])
        model = rng.choice(["tiny", "M3", "MiniMax-M2"])
        secret = rng.getrandbits(256).to_bytes(32, "little")
        good = ValueCodec(model, dtype, shape, secret).encode(name, kv)
        bad = _damaged(kv, name, model, secret, rng)
        try:
            got = fn(good, name, model, dtype, shape, secret)
        except NotImplementedError:
            raise
        except Exception as e:  # noqa: BLE001 -- reported to the learner
            return [f"a good value raised {type(e).__name__}: {e}"]
        verdicts = {}
        for what, value in bad.items():
            try:
                verdicts[what] = fn(value, name, model, dtype, shape, secret)
            except Exception as e:  # noqa: BLE001 -- reported to the learner
                verdicts[what] = e
        if not isinstance(got, torch.Tensor) or got.dtype != dtype or tuple(got.shape) != shape or \
                not torch.equal(got.contiguous().view(torch.uint8), kv.contiguous().view(torch.uint8)):
            what = f"a {got.dtype} tensor of shape {tuple(got.shape)}" if isinstance(got, torch.Tensor) else repr(got)[:40]
            problems.append(f"a good value ({str(dtype).replace('torch.', '')} {list(shape)}): expected the tensor it "
                            f"holds, got {what}")
        for what, v in verdicts.items():
            if isinstance(v, Exception):
                problems.append(f"{what}: raised {type(v).__name__}: {v} -- a value from the pool must never crash "
                                "the reader; return None")
            elif v is not None:
                why = (" -- anyone who can write to the pool can compute a tag without the secret: only the keyed "
                       "tag proves the pool's owner wrote it" if "forged" in what else "")
                problems.append(f"{what}: served it (expected None) -- a replica would compute on wrong KV{why}")
            if len(problems) >= 3:
                return problems
        if problems:
            return problems
    return problems


# --------------------------------------------------------------------------- 07.4 the router


def pick_replica(n_tokens: int, local: list[int], pool: int, queue_s: list[float], cost: PrefillCost) -> int:
    """The index of the replica that finishes a prompt of ``n_tokens`` first. Replica ``r`` first
    works through its queue (``queue_s[r]`` seconds), then serves the prompt with ``local[r]``
    tokens cached on it and ``pool`` tokens in the shared pool, by 07.1's rule on ``cost``'s shape,
    link, TFLOP/s and MFU (your ``fetch_or_recompute`` of 07.1). Ties go to the lower index."""
    raise NotImplementedError  # your code here


@exercise("07.4", "fetch here or go there", "Route a prompt to the replica that finishes it first.", pick_replica,
          answers=(choose_replica, PrefillCost.plan))
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
            done = [q + cost.plan(n, loc, pool)[0] for loc, q in zip(local, queue)]
            hint = ""
            if isinstance(got, int) and 0 <= got < r:
                no_queue = min(range(r), key=lambda i: cost.plan(n, local[i], pool)[0])
                no_pool = min(range(r), key=lambda i: queue[i] + cost.plan(n, local[i], 0)[0])
                if got == no_queue != want:
                    hint = " -- the queue counts: a replica is free only after the work it already has"
                elif got == no_pool != want:
                    hint = " -- the pool counts: a replica without the prefix may fetch it instead of computing it"
                else:
                    hint = f" (replica {got} finishes at {done[got]:.4g} s)"
            problems.append(f"{n:,} tokens, cached {local}, pool {pool:,}, queues {[round(q, 2) for q in queue]}: "
                            f"expected replica {want}, done at {done[want]:.4g} s, got {got!r}{hint}")
        if len(problems) >= 3:
            break
    return problems
