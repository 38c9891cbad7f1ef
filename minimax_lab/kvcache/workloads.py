"""Reproducible workloads that emit Mooncake-format requests: a chat service and a coding agent.

Both are built from real text available offline, tokenized by a small deterministic
code-and-prose tokenizer (``tokenize``: words, numbers, runs of spaces and single punctuation
marks, each mapped to a stable id -- roughly one token per 3-4 characters of Python source, close
to what a BPE tokenizer gives).

* ``chat_workload`` -- many users, each a conversation of a few turns. Every request is one of a
  few short system prompts + the conversation so far + a new message. Reuse is small: a short
  shared system prompt and each user's own history.
* ``agent_workload`` -- coding-agent sessions: a system prompt with tool descriptions, then a
  *whole codebase* (the sources of a Python standard-library package, read with
  ``importlib.resources``), then hundreds of tool-call turns whose outputs are file reads,
  search results and test logs. Each request's context is everything before it, so consecutive
  requests of a session share almost all of their prefix; when the context passes
  ``max_context`` the agent *compacts* (keeps system + codebase + a summary + the last turns),
  which breaks the prefix after the codebase -- as real agents do.

A ``Workload`` holds the requests (``trace.Request``: ``timestamp`` ms, ``input_length``,
``output_length``, ``hash_ids`` of ``block_tokens``-token blocks named by a chained hash, then
numbered in order of first appearance as Mooncake does) and each request's tokens, so the same
workload drives the trace replay, the routing study and the engine.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.resources
import random
import re
from dataclasses import dataclass, field

from minimax_lab.kvcache.trace import Request, replay_trace

_TOKEN_RE = re.compile(r"[A-Za-z_]+|\d+| +|\n|\S")
VOCAB_SIZE = 50_000

SYSTEM_CHAT = [
    "You are a helpful assistant. Answer concisely and cite sources when you can.",
    "You are a friendly tutor. Explain step by step and check the student's understanding.",
    "You are a travel planner. Ask about dates and budget before proposing an itinerary.",
]
SYSTEM_AGENT = (
    "You are a coding agent working in a Python repository. Tools: read_file(path) returns a file; "
    "search(pattern) returns matching lines with file:line; run_tests(path) runs pytest and returns the log; "
    "edit_file(path, old, new) edits a file. Think, then call exactly one tool per turn. "
    "The repository follows below, file by file.\n"
)
CHAT_WORDS = ("the a of to and in is it that for on with as was at by this be from or have not are but what "
              "how why when can could would should please thanks idea plan trip budget week day city museum "
              "train hotel food code bug error test python list dict value answer explain example step").split()


_PIECE_IDS: dict[str, int] = {}


def tokenize(text: str) -> list[int]:
    """Deterministic ids in ``[0, VOCAB_SIZE)``: each piece hashed (blake2b) -- same text, same ids."""
    out = []
    for piece in _TOKEN_RE.findall(text):
        i = _PIECE_IDS.get(piece)
        if i is None:
            i = int.from_bytes(hashlib.blake2b(piece.encode(), digest_size=4).digest(), "little") % VOCAB_SIZE
            if len(_PIECE_IDS) < 1_000_000:
                _PIECE_IDS[piece] = i
        out.append(i)
    return out


def package_sources(package: str = "json") -> dict[str, str]:
    """``{relative path: source}`` of a standard-library package's ``.py`` files (offline, via importlib)."""
    root = importlib.resources.files(package)
    out = {}
    for f in sorted(root.iterdir(), key=lambda p: p.name):
        if f.name.endswith(".py"):
            out[f"{package}/{f.name}"] = f.read_text(encoding="utf-8", errors="replace")
    if not out:
        raise ValueError(f"package {package!r} has no .py sources to read")
    return out


@functools.lru_cache(maxsize=16)
def _codebase_tokens(package: str) -> tuple:
    return tuple(t for path, src in package_sources(package).items() for t in tokenize(f"### {path}\n{src}\n"))


@dataclass
class Workload:
    """Requests in Mooncake format plus their token lists and the session each belongs to."""

    name: str
    requests: list[Request] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list, repr=False)
    sessions: list[int] = field(default_factory=list, repr=False)
    block_tokens: int = 512

    @property
    def input_tokens(self) -> int:
        return sum(r.input_length for r in self.requests)

    def unique_blocks(self) -> int:
        return len({h for r in self.requests for h in r.hash_ids})

    def ideal_reuse(self) -> float:
        """Fraction of input tokens an unbounded block cache could serve (same contract as the replay)."""
        return replay_trace(self.requests, capacity_tokens=None, policy="lru", block_tokens=self.block_tokens).hit_ratio


class _Namer:
    """Chained block hashes -> small ints in order of first appearance (Mooncake's ``hash_ids``)."""

    def __init__(self, block_tokens: int):
        self.block_tokens = block_tokens
        self.ids: dict[bytes, int] = {}

    def hash_ids(self, tokens: list[int], prev: tuple | None = None) -> list[int]:
        """Ids of ``tokens``' blocks. ``prev = (tokens, ids, digests)`` of an earlier request of the
        same session: when ``tokens`` extends it, its full blocks are reused instead of rehashed."""
        out, parent, bt, start = [], b"", self.block_tokens, 0
        digests = []
        if prev is not None:
            ptoks, plen, pids, pdig = prev
            n_full = min(plen, len(tokens)) // bt
            # the same list grown in place is an extension by construction; otherwise compare
            if n_full and (ptoks is tokens or tokens[:n_full * bt] == ptoks[:n_full * bt]):
                out, digests, start = list(pids[:n_full]), list(pdig[:n_full]), n_full * bt
                parent = digests[-1]
        for i in range(start, len(tokens), bt):
            h = hashlib.blake2b(parent, digest_size=16)
            h.update(",".join(map(str, tokens[i:i + bt])).encode())
            parent = h.digest()
            digests.append(parent)
            out.append(self.ids.setdefault(parent, len(self.ids)))
        self.last = (tokens, len(tokens), out, digests)
        return out


def _emit(wl: Workload, namer: _Namer, t_ms: int, tokens: list[int], out_len: int, session: int,
          keep_tokens: bool, prev=None) -> tuple:
    wl.requests.append(Request(int(t_ms), len(tokens), int(out_len), namer.hash_ids(tokens, prev)))
    if keep_tokens:
        wl.tokens.append(list(tokens))
    wl.sessions.append(session)
    return namer.last


def _words(rng: random.Random, n: int) -> list[int]:
    return tokenize(" ".join(rng.choice(CHAT_WORDS) for _ in range(n)))


def chat_workload(n_users: int = 200, *, turns=(2, 8), seed: int = 0, block_tokens: int = 512,
                  mean_gap_ms: float = 300.0, keep_tokens: bool = True) -> Workload:
    """``n_users`` conversations interleaved in time; each turn = system + history + new message."""
    rng = random.Random(seed)
    namer, wl = _Namer(block_tokens), Workload("chat", block_tokens=block_tokens)
    systems = [tokenize(s) for s in SYSTEM_CHAT]
    events = []   # (time, user, turn)
    for u in range(n_users):
        t = rng.expovariate(1 / (mean_gap_ms * 4)) * u / 2
        for k in range(rng.randint(*turns)):
            events.append((t, u, k))
            t += rng.uniform(5_000, 60_000)      # user think time
    events.sort()
    history = {u: list(rng.choice(systems)) for u in range(n_users)}
    for t, u, _ in events:
        history[u] += _words(rng, rng.randint(10, 120))        # user message
        out_len = rng.randint(40, 400)
        _emit(wl, namer, t, history[u], out_len, u, keep_tokens)
        history[u] += _words(rng, out_len)                     # the assistant's reply joins the history
    return wl


def _test_log(rng: random.Random, files: list[str]) -> str:
    lines = []
    for i in range(rng.randint(5, 40)):
        f = rng.choice(files)
        ok = rng.random() > 0.15
        lines.append(f"tests/test_{f.split('/')[-1]}::test_case_{i} {'PASSED' if ok else 'FAILED'}")
        if not ok:
            lines.append(f"E   AssertionError: expected {rng.randint(0, 99)} got {rng.randint(0, 99)}")
    lines.append(f"==== {rng.randint(1, 40)} passed, {rng.randint(0, 5)} failed in {rng.uniform(0.1, 9):.2f}s ====")
    return "\n".join(lines)


def _search(rng: random.Random, sources: dict[str, str], lines: list[tuple]) -> str:
    path = rng.choice(list(sources))
    word = rng.choice(re.findall(r"[A-Za-z_]{4,}", sources[path][:4000]) or ["def"])
    want, hits = rng.randint(3, 30), []
    for p, i, ln in lines:
        if word in ln:
            hits.append(f"{p}:{i}: {ln.strip()}")
            if len(hits) == want:
                break
    return f"search({word!r})\n" + "\n".join(hits)


def agent_workload(n_sessions: int = 4, turns: int = 200, *, packages=("json", "email", "http", "logging"),
                   seed: int = 0, block_tokens: int = 512, max_context: int = 200_000,
                   keep_turns: int = 8, max_read_tokens: int = 4_000, keep_tokens: bool = False) -> Workload:
    """``n_sessions`` coding-agent sessions of ``turns`` tool calls each, interleaved in time.

    Session ``s`` works on ``packages[s % len(packages)]`` (so sessions on the same package share
    the codebase prefix). Each request is the whole context so far; its output is the tool call.
    ``keep_tokens`` stores every request's tokens (memory grows as turns x context: keep it for
    small workloads, e.g. the engine's).
    """
    rng = random.Random(seed)
    namer, wl = _Namer(block_tokens), Workload("agent", block_tokens=block_tokens)
    system = tokenize(SYSTEM_AGENT)
    state = []
    for s in range(n_sessions):
        pkg = packages[s % len(packages)]
        sources = package_sources(pkg)
        base = list(system) + list(_codebase_tokens(pkg))
        task = _words(rng, rng.randint(20, 80))
        lines = [(p, i + 1, ln) for p, src in sources.items() for i, ln in enumerate(src.splitlines())]
        state.append(dict(sources=sources, lines=lines, base=base, turns=[task], t=rng.uniform(0, 5_000)))
    events = []
    for s in range(n_sessions):
        t = state[s]["t"]
        for k in range(turns):
            events.append((t, s, k))
            t += rng.uniform(2_000, 20_000)       # model time + tool time
    events.sort()
    for t, s, _ in events:
        st = state[s]
        if "ctx" not in st:
            st["ctx"] = st["base"] + [tok for turn in st["turns"] for tok in turn]
        ctx = st["ctx"]                            # grown in place turn by turn
        if len(ctx) > max_context:                 # compact: summary + the last turns
            st["turns"] = [_words(rng, 300)] + st["turns"][-keep_turns:]
            ctx = st["ctx"] = st["base"] + [tok for turn in st["turns"] for tok in turn]
        call = _words(rng, rng.randint(15, 60))   # the model's reasoning + tool call
        st["prev"] = _emit(wl, namer, t, ctx, len(call), s, keep_tokens, st.get("prev"))
        kind = rng.random()
        files = list(st["sources"])
        if kind < 0.45:
            path = rng.choice(files)
            out = tokenize(f"read_file({path!r})\n" + st["sources"][path])[:max_read_tokens]
        elif kind < 0.75:
            out = tokenize(_search(rng, st["sources"], st["lines"]))
        else:
            out = tokenize("run_tests()\n" + _test_log(rng, files))
        st["turns"].append(call + out)
        ctx += call + out
    return wl
