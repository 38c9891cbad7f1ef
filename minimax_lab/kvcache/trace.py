"""Mooncake-format traces: read them, and replay them against a block cache.

Format (Mooncake, Qin et al., FAST'25, "Mooncake: Trading More Storage for Less Computation",
https://github.com/kvcache-ai/Mooncake): JSONL, one request a line with ``timestamp`` (ms),
``input_length`` and ``output_length`` (tokens) and ``hash_ids`` -- one id per 512-token block of
the input, chained: two requests share a block id only if they share the whole prefix up to it.

The package ships Mooncake's synthetic trace (Apache-2.0, unmodified; ``NOTICE`` beside it in
``minimax_lab/assets/traces/``): :func:`find_trace` returns its path.

Replay contract: for each request in order (the policy told its conversation, ``conversation_ids``,
and its arrival time), its
*hit* is the longest prefix of its ``hash_ids`` already cached, times ``block_tokens``, capped at
``input_length``; then all of its blocks are cached, touched in order (misses inserted, evicting
as the policy says when the cache holds ``capacity_tokens // block_tokens`` blocks). Hit ratio =
hit tokens / input tokens.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from minimax_lab import resources
from minimax_lab.kvcache.eviction import make_policy
from minimax_lab.validate import check_int, check_positive_int

TRACE_ENV = resources.TRACES_ENV
MOONCAKE_SYNTHETIC = resources.MOONCAKE_SYNTHETIC
HOW_TO_GET = ("minimax_lab ships Mooncake's synthetic trace in minimax_lab/assets/traces/; if it is missing, "
              "reinstall the package, or download FAST25-release/traces/synthetic_trace.jsonl from "
              f"https://github.com/kvcache-ai/Mooncake as {MOONCAKE_SYNTHETIC} into a folder and point the "
              f"{TRACE_ENV} environment variable at it.")


@dataclass
class Request:
    """One Mooncake request. ``hash_ids[i]`` names tokens ``[512 i, 512 (i+1))`` of the input.
    ``conversation`` (optional, ``conversation_id`` in JSON; not in Mooncake's traces) names the
    conversation or session it belongs to, as a serving system knows it."""

    timestamp: int
    input_length: int
    output_length: int
    hash_ids: list[int] = field(default_factory=list)
    conversation: int | None = None

    def to_json(self) -> str:
        d = dict(timestamp=self.timestamp, input_length=self.input_length, output_length=self.output_length,
                 hash_ids=list(self.hash_ids))
        if self.conversation is not None:
            d["conversation_id"] = self.conversation
        return json.dumps(d)


def _block_ids(value, name: str = "hash_ids") -> list[int]:
    """A list or tuple of integer block ids (a string is not a list of ids)."""
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be a list of integer block ids, got {type(value).__name__} {value!r:.40}")
    return [check_int(h, f"{name}[{i}]") for i, h in enumerate(value)]


def checked_request(timestamp, input_length, output_length, hash_ids, conversation=None) -> Request:
    """A ``Request`` whose fields are what the format says: ``timestamp``, ``input_length`` and
    ``output_length`` integers >= 0, ``hash_ids`` a list of integer ids. Raises ``TypeError`` for a
    wrong type (a float, a string -- ``"123"`` is not ``[1, 2, 3]``), ``ValueError`` for a negative count."""
    return Request(check_int(timestamp, "timestamp", minimum=0), check_int(input_length, "input_length", minimum=0),
                   check_int(output_length, "output_length", minimum=0), _block_ids(hash_ids),
                   None if conversation is None else check_int(conversation, "conversation_id"))


def read_trace(path) -> list[Request]:
    """Read a Mooncake JSONL file. Raises ``ValueError`` naming the line on a malformed record
    (missing field, wrong type, negative count -- see ``checked_request``)."""
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                if not isinstance(d, dict):
                    raise TypeError(f"a record must be a JSON object, got {type(d).__name__}")
                out.append(checked_request(d["timestamp"], d["input_length"], d["output_length"], d["hash_ids"],
                                           d.get("conversation_id")))
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{path}:{n}: not a Mooncake request ({type(e).__name__}: {e})") from e
    return out


def write_trace(requests, path) -> Path:
    """Write requests as Mooncake JSONL; returns the path."""
    path = Path(path)
    path.write_text("".join(r.to_json() + "\n" for r in requests))
    return path


def find_trace(name: str = MOONCAKE_SYNTHETIC) -> Path | None:
    """Locate a trace: ``$MINIMAX_LAB_TRACES/name`` if that file exists, else the shipped
    ``minimax_lab/assets/traces/name`` (Mooncake's synthetic trace by default); None if neither
    exists."""
    return resources.find_trace(name)


@dataclass
class ReplayResult:
    """What a replay measured. ``hit_ratio = hit_tokens / input_tokens``."""

    policy: str
    capacity_tokens: int | None
    block_tokens: int
    requests: int
    input_tokens: int
    hit_tokens: int
    evictions: int
    per_request_hits: list[int] = field(default_factory=list, repr=False)

    @property
    def hit_ratio(self) -> float:
        return self.hit_tokens / self.input_tokens if self.input_tokens else 0.0


def _as_requests(trace) -> list[Request]:
    """Checked requests from a path or an iterable of ``Request``/dicts (``checked_request``'s rules;
    a dict may leave out ``timestamp`` and ``output_length``, which default to 0)."""
    if isinstance(trace, (str, Path)):
        return read_trace(trace)
    if isinstance(trace, (bytes, dict)) or not hasattr(trace, "__iter__"):
        raise TypeError(f"trace must be a path or a list of Request/dict, got {type(trace).__name__}")
    reqs = []
    for i, r in enumerate(trace):
        try:
            if isinstance(r, Request):
                reqs.append(checked_request(r.timestamp, r.input_length, r.output_length, r.hash_ids, r.conversation))
            elif isinstance(r, dict):
                if "input_length" not in r or "hash_ids" not in r:
                    raise ValueError(f"a request needs input_length and hash_ids, got keys {sorted(r)}")
                reqs.append(checked_request(r.get("timestamp", 0), r["input_length"], r.get("output_length", 0),
                                            r["hash_ids"], r.get("conversation_id")))
            else:
                raise TypeError(f"trace entries must be Request or dict, got {type(r).__name__}")
        except (TypeError, ValueError) as e:
            raise (TypeError if isinstance(e, TypeError) else ValueError)(f"trace[{i}]: {e}") from None
    return reqs


def check_cache_size(capacity_tokens, block_tokens) -> int | None:
    """Validate ``block_tokens`` (int >= 1) and ``capacity_tokens`` (None, or an int of at least one
    block); returns the capacity in blocks (None = unbounded). Raises ``TypeError``/``ValueError``."""
    check_positive_int(block_tokens, "block_tokens")
    if capacity_tokens is None:
        return None
    if isinstance(capacity_tokens, bool) or not isinstance(capacity_tokens, int):
        raise TypeError(f"capacity_tokens must be an int or None, got {type(capacity_tokens).__name__}")
    if capacity_tokens < block_tokens:
        raise ValueError(f"capacity_tokens must hold at least one block of {block_tokens}, got {capacity_tokens}")
    return capacity_tokens // block_tokens


def replay_trace(trace, *, capacity_tokens: int | None, policy="lru", block_tokens: int = 512) -> ReplayResult:
    """Replay ``trace`` (a path, or a list of ``Request``/dicts) per the contract in the module docstring.

    ``capacity_tokens=None`` is an unbounded cache. ``policy`` is a name (``"lru"``, ``"agent"``,
    ``"belady"``) or an ``EvictionPolicy``; offline policies receive the access sequence first.
    Raises ``ValueError`` for a capacity below one block, ``block_tokens < 1``, an unknown policy
    or a request with a negative count; ``TypeError`` for a request field of the wrong type
    (``checked_request``) -- so the hit ratio is always in ``[0, 1]``.
    """
    cap = check_cache_size(capacity_tokens, block_tokens)
    reqs = _as_requests(trace)
    cache = BlockCache(cap, policy)
    cache.policy.plan(h for r in reqs for h in r.hash_ids)
    hit_tokens = input_tokens = 0
    per_req = []
    for r, conv in zip(reqs, conversation_ids(reqs)):
        hit = min(cache.prefix(r.hash_ids) * block_tokens, r.input_length)
        hit_tokens += hit
        input_tokens += r.input_length
        per_req.append(hit)
        cache.serve(r.hash_ids, conv, r.timestamp / 1e3, r.output_length)
    name = getattr(cache.policy, "name", type(cache.policy).__name__)
    return ReplayResult(name, capacity_tokens, block_tokens, len(reqs), input_tokens, hit_tokens, cache.evictions,
                        per_req)


def conversation_ids(requests) -> list:
    """Each request's conversation, as a serving system knows it: its ``conversation`` where the
    trace gives one; else inferred online from the prefix tree -- a request continues the
    conversation of the latest earlier request whose blocks it extends (it shares at least half of
    that request's blocks, from the start), else it starts a new one. Uses only earlier requests."""
    out, owner, last_len, fresh = [], {}, {}, 0
    for r in requests:
        if r.conversation is not None:
            out.append(("given", r.conversation))
            continue
        conv, shared = None, 0
        for h in r.hash_ids:
            c = owner.get(h)
            if c is None:
                break
            shared += 1
            conv = c
        if conv is None or shared < max(1, last_len.get(conv, 0) / 2):
            conv, fresh = ("inferred", fresh), fresh + 1
        for h in r.hash_ids:
            owner[h] = conv
        last_len[conv] = len(r.hash_ids)
        out.append(conv)
    return out


class BlockCache:
    """The replay contract's cache of block ids: at most ``capacity_blocks`` (None = unbounded),
    evicting as ``policy`` says; its clock counts block accesses."""

    def __init__(self, capacity_blocks: int | None, policy="lru"):
        self.cap, self.policy, self.cached = capacity_blocks, make_policy(policy), set()
        self.t = self.evictions = 0

    def prefix(self, hash_ids) -> int:
        """How many leading blocks of ``hash_ids`` are cached."""
        n = 0
        for h in hash_ids:
            if h not in self.cached:
                break
            n += 1
        return n

    def serve(self, hash_ids, conversation=None, now: float | None = None, output_tokens: int = 0) -> None:
        """Cache every block of a request, touched in order (misses inserted, evicting when full);
        the policy hears ``begin_request(conversation, now)`` (``now`` in seconds) before and
        ``end_request(hash_ids, output_tokens)`` after."""
        self.policy.begin_request(conversation, now)
        for h in hash_ids:
            if h in self.cached:
                self.policy.touch(h, self.t)
            else:
                self.cached.add(h)
                self.policy.insert(h, self.t)
                if self.cap is not None and len(self.cached) > self.cap:
                    self.cached.discard(self.policy.evict())
                    self.evictions += 1
            self.t += 1
        self.policy.end_request(hash_ids, output_tokens)
