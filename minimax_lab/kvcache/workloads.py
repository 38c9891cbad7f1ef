"""Reproducible workloads that emit Mooncake-format requests: a chat service and a coding agent.

Both are built from real text available offline, tokenized by a small deterministic
code-and-prose tokenizer (``tokenize``: words, numbers, runs of spaces and single punctuation
marks, each mapped to a stable id -- roughly one token per 3-4 characters of Python source, close
to what a BPE tokenizer gives).

* ``chat_workload`` -- many users, each a conversation of a few turns. Every request is one of a
  few short system prompts + the conversation so far + a new message. Reuse is small: a short
  shared system prompt and each user's own history.
* ``conversation_workload`` -- multi-turn chat at scale, with conversation ids, realistic turn
  counts, think times and heavy-tailed lengths (``CONVERSATION_SOURCES`` says where each comes
  from); block ids only, no tokens, so it reaches tens of millions of tokens quickly.
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
import math
import random
import re
from dataclasses import dataclass, field

from minimax_lab.kvcache.trace import Request, replay_trace
from minimax_lab.validate import check_positive_int

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


#: Where ``conversation_workload``'s distributions come from:
#: * turns per conversation and message lengths -- LMSYS-Chat-1M (Zheng et al., ICLR 2024, Table 1:
#:   2.0 turns per conversation on average, 69.5 tokens per user prompt, 214.5 per response);
#:   turns are a rounded lognormal (55% single-turn, mean 2.0, 1.5% with 10 or more), lengths
#:   lognormal with those means (heavy right tails);
#: * think time -- "KVCache Cache in the Wild" (Wang et al., 2025, arXiv:2506.02634): in the to-C
#:   chat trace, 80% of reuses come within 10 minutes; here a mixture, 75% of gaps lognormal
#:   around 30 s (a user reading and typing) and 25% around 30 minutes (coming back later):
#:   78% under 10 minutes;
#: * system prompts and documents -- a few shared system prompts (Zipf popularity, ~800 tokens)
#:   and, in a share of conversations, a long attached document in the first turn (lognormal,
#:   median 4,000 tokens), as in Mooncake's conversation trace (Qin et al., FAST'25: average
#:   input ~12k tokens).
CONVERSATION_SOURCES = ("LMSYS-Chat-1M (Zheng et al., ICLR 2024): 2.0 turns, 69.5-token prompts, 214.5-token "
                        "responses on average; Wang et al. 2025 (arXiv:2506.02634): 80% of to-C reuses within "
                        "10 minutes; Mooncake (Qin et al., FAST'25): long-document conversations")


def conversation_workload(n_conversations: int = 6000, *, rate_per_s: float = 2.5, seed: int = 0,
                          doc_share: float = 0.3, n_system: int = 8, block_tokens: int = 512) -> Workload:
    """Multi-turn chat traffic with conversation ids (module docstring of ``CONVERSATION_SOURCES``):
    conversations arrive as a Poisson process at ``rate_per_s``; each picks a system prompt (Zipf
    over ``n_system``), maybe a document (``doc_share``), a number of turns, and think times between
    them; every request is the conversation so far plus a new message, its answer joining the
    history. The trace ends when the last conversation starts: later turns are cut, so the
    long think times are rarer in the trace than in the distribution it draws from. Requests carry ``conversation``; ``sessions`` holds the same ids. Block ids are
    chained as in Mooncake's traces (a block is named by its content and everything before it),
    without the tokens themselves."""
    check_positive_int(n_conversations, "n_conversations")
    rng = random.Random(seed)
    wl = Workload("conversations", block_tokens=block_tokens)
    ids: dict[tuple, int] = {}
    systems = [int(rng.lognormvariate(math.log(700), 0.5)) for _ in range(n_system)]
    weights = [1 / (i + 1) for i in range(n_system)]
    events = []                  # (time s, conversation, turn index)
    plans = []
    t = 0.0
    for c in range(n_conversations):
        t += rng.expovariate(rate_per_s)
        turns = max(1, round(math.exp(rng.gauss(0.3, 0.9))))
        s = rng.choices(range(n_system), weights)[0]
        doc = int(rng.lognormvariate(math.log(4000), 1.0)) if rng.random() < doc_share else 0
        plans.append((s, doc))
        at = t
        for k in range(turns):
            events.append((at, c, k))
            gap = rng.lognormvariate(math.log(30), 1.0) if rng.random() < 0.75 else \
                rng.lognormvariate(math.log(1800), 1.0)
            at += gap
    events = sorted(e for e in events if e[0] <= t)       # the trace ends when the last conversation starts
    length: dict[int, int] = {}
    for at, c, k in events:
        s, doc = plans[c]
        if c not in length:
            length[c] = systems[s] + doc
        length[c] += max(1, int(rng.lognormvariate(math.log(30), 1.3)))          # the user's message
        n = length[c]
        hash_ids = []
        for b in range((n + block_tokens - 1) // block_tokens):
            end = min(n, (b + 1) * block_tokens)
            if end <= systems[s]:
                name = ("system", s, b)                   # inside the shared system prompt
            elif end - b * block_tokens == block_tokens:
                name = ("conversation", c, b)             # a full block of this conversation
            else:
                name = ("partial", c, b, end)             # the last block, named by how full it is
            hash_ids.append(ids.setdefault(name, len(ids)))
        out = max(1, int(rng.lognormvariate(math.log(130), 1.0)))
        wl.requests.append(Request(int(at * 1000), n, out, hash_ids, c))
        wl.sessions.append(c)
        length[c] += out                                   # the answer joins the history
    return wl
