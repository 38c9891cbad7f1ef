"""The chat and agent workloads, served turn by turn, and what a run measures.

Both are built from the text sources of :mod:`minimax_lab.kvcache.workloads` (its deterministic
tokenizer, its system prompts and chat vocabulary, standard-library sources as the codebase) and
from the workbook's generated images (:mod:`minimax_lab.data`), folded into the model's vocabulary:

* :func:`chat_sessions` -- ``users`` conversations sharing one long system prompt (a few thousand
  tokens at the GPU size), each turn a short user message; the first message carries an image.
* :func:`agent_sessions` -- coding-agent ``sessions`` sharing one codebase in context (32k-128k
  tokens at the GPU size): turn 0 is system prompt + codebase + a task, every later turn appends a
  tool result (a file read; turn 1 also a screenshot image) and asks for a short answer.

:func:`serve` drives an engine like a client would: every session's turn 0 is submitted at
once; when a turn finishes, the session's next turn is submitted with the whole conversation so far
(prompt + the model's answer + the new text). With ``forced`` (day 0's answers) every turn's
answer is forced, so each day sees the same contexts and its logits can be compared with day 0's.

:func:`summarize` turns a run into the waterfall's numbers: TTFT (submission to first token),
inter-token latency, decode tokens/s (tokens of decode-only steps over their time), output
tokens/s, prompt tokens computed vs served by the prefix cache, and memory.
"""
from __future__ import annotations

import functools
import random
import statistics
from dataclasses import dataclass, field

import numpy as np
import torch

from minimax_lab.data.examples import random_scene
from minimax_lab.data.shapes import render
from minimax_lab.engine.config import M3Config
from minimax_lab.engine.sampling import SamplingParams
from minimax_lab.kvcache.workloads import CHAT_WORDS, SYSTEM_AGENT, SYSTEM_CHAT, package_sources, tokenize
from minimax_lab.validate import check_positive_int

#: standard-library packages whose sources make the codebase (and the chat's long system prompt)
CODEBASE_PACKAGES = ("json", "http", "logging", "email", "asyncio", "unittest", "multiprocessing")


@dataclass
class Turn:
    """What a turn adds to its session: ``text`` ids (image placeholders included), the ``images``
    ``[M, 3, H, W]`` for those placeholders (or ``None``), and how many tokens the answer has."""

    text: list
    images: torch.Tensor | None
    max_tokens: int


@dataclass
class Session:
    name: str
    turns: list


@dataclass
class TurnResult:
    """One served turn: its request id, prompt length, prompt tokens served by the prefix cache,
    answer, times (seconds) and, when recorded, the answer's fp32 logits ``[n, vocab]``."""

    session: int
    turn: int
    request_id: object
    prompt_len: int
    cached_tokens: int
    output: list
    ttft_s: float
    itl_s: list
    logits: torch.Tensor | None = None


@dataclass
class RunResult:
    turns: list = field(default_factory=list)
    wall_s: float = 0.0


def fold(ids, cfg: M3Config) -> list[int]:
    """Text ids into the model's text vocabulary ``[0, vocab_size - 1)`` (the last id is the image placeholder)."""
    n = cfg.vocab_size - 1
    return [int(t) % n for t in ids]


@functools.lru_cache(maxsize=None)
def _package_tokens(package: str) -> tuple:
    return tuple(t for path, src in package_sources(package).items() for t in tokenize(f"### {path}\n{src}\n"))


def source_tokens(n: int, *, skip: int = 0) -> list[int]:
    """``n`` tokens of standard-library sources (``### path`` headers, then the file), from token
    ``skip`` on; raises ``ValueError`` when the sources are shorter."""
    out: list[int] = []
    for pkg in CODEBASE_PACKAGES:
        out += _package_tokens(pkg)
        if len(out) >= skip + n:
            return out[skip:skip + n]
    raise ValueError(f"the codebase sources hold {len(out)} tokens, fewer than {skip + n}")


def _image(cfg: M3Config, rng: np.random.Generator) -> tuple[list[int], torch.Tensor]:
    img = render(random_scene(rng), size=cfg.image_size, rng=rng)
    return [cfg.img_id] * cfg.patches_per_image, img[None]


def _words(rng: random.Random, n: int) -> list[int]:
    return tokenize(" ".join(rng.choice(CHAT_WORDS) for _ in range(n)))


def chat_sessions(cfg: M3Config, *, users: int, turns: int, system_tokens: int, message_words=(10, 60),
                  max_tokens: int = 32, seed: int = 0) -> list[Session]:
    """``users`` chats sharing a system prompt of ``system_tokens`` tokens (a chat system prompt,
    then reference text); ``turns`` user messages each; the first carries an image."""
    for name, v in (("users", users), ("turns", turns), ("system_tokens", system_tokens), ("max_tokens", max_tokens)):
        check_positive_int(v, name)
    rng, img_rng = random.Random(seed), np.random.default_rng(seed)
    head = tokenize(SYSTEM_CHAT[0] + "\nReference material follows.\n")
    system = fold((head + source_tokens(system_tokens))[:system_tokens], cfg)
    sessions = []
    for u in range(users):
        ts = []
        for k in range(turns):
            text = fold(_words(rng, rng.randint(*message_words)), cfg)
            images = None
            if k == 0:
                placeholders, images = _image(cfg, img_rng)
                text = system + placeholders + text
            ts.append(Turn(text, images, max_tokens))
        sessions.append(Session(f"chat{u}", ts))
    return sessions


def agent_sessions(cfg: M3Config, *, sessions: int, turns: int, codebase_tokens: int, tool_tokens=(200, 2000),
                   task_words=(20, 60), max_tokens: int = 32, seed: int = 0) -> list[Session]:
    """``sessions`` agents sharing a context of ``codebase_tokens`` (system prompt + codebase);
    each has its own task (``task_words`` words), then ``turns - 1`` tool results (file reads of
    ``tool_tokens`` tokens; turn 1 adds a screenshot image)."""
    for name, v in (("sessions", sessions), ("turns", turns), ("codebase_tokens", codebase_tokens),
                    ("max_tokens", max_tokens)):
        check_positive_int(v, name)
    rng, img_rng = random.Random(seed), np.random.default_rng(seed)
    head = tokenize(SYSTEM_AGENT)
    base = fold((head + source_tokens(codebase_tokens))[:codebase_tokens], cfg)
    out = []
    for s in range(sessions):
        ts = [Turn(base + fold(_words(rng, rng.randint(*task_words)), cfg), None, max_tokens)]
        for k in range(1, turns):
            n = rng.randint(*tool_tokens)
            text = fold(tokenize("read_file()\n") + source_tokens(n, skip=rng.randrange(0, 20_000)), cfg)
            images = None
            if k == 1:
                placeholders, images = _image(cfg, img_rng)
                text = placeholders + text
            ts.append(Turn(text, images, max_tokens))
        out.append(Session(f"agent{s}", ts))
    return out


def two_requests(cfg: M3Config, *, seed: int = 0) -> list:
    """A small demonstration: ``[(prompt, images), (prompt, images)]``, the first a few words, an
    image's placeholders and three pages of text; the second the first's first two pages and a few
    words of its own (with the image when the pages hold its placeholders)."""
    rng, img_rng = random.Random(seed), np.random.default_rng(seed)
    placeholders, image = _image(cfg, img_rng)
    first = fold(_words(rng, 6), cfg)[:6] + placeholders + fold(source_tokens(3 * cfg.block_size), cfg)
    second = first[:2 * cfg.block_size] + fold(_words(rng, 5), cfg)[:5]
    return [(first, image), (second, image if cfg.img_id in second else None)]


def serve(engine, sessions: list, *, forced: dict | None = None) -> RunResult:
    """Serve ``sessions`` turn by turn (module docstring). ``forced`` maps ``(session, turn)`` to the
    answer ids that turn must emit. Returns every turn's :class:`TurnResult` (with the answer's
    logits when the engine records them) and the wall time."""
    forced = forced or {}
    history: list = [[] for _ in sessions]
    images: list = [[] for _ in sessions]
    where: dict = {}
    result = RunResult()

    def submit(si: int, ti: int) -> None:
        turn = sessions[si].turns[ti]
        prompt = history[si] + turn.text
        if turn.images is not None:
            images[si].append(turn.images)
        imgs = torch.cat(images[si]) if images[si] else None
        sampling = SamplingParams(max_tokens=turn.max_tokens, forced_tokens=forced.get((si, ti)))
        rid = engine.add_request(prompt, images=imgs, sampling=sampling, request_id=(sessions[si].name, ti))
        where[rid] = (si, ti)

    t0 = engine.clock.now()
    for si in range(len(sessions)):
        submit(si, 0)
    while engine.has_work():
        for seq in engine.step():
            if seq.seq_id not in where:
                continue
            si, ti = where.pop(seq.seq_id)
            history[si] = seq.prompt + seq.output
            times = seq.token_times
            result.turns.append(TurnResult(
                si, ti, seq.seq_id, seq.prompt_len, seq.cached_tokens, list(seq.output), seq.first_token - seq.arrival,
                [b - a for a, b in zip(times, times[1:])], torch.stack(seq.logits) if seq.logits else None))
            if ti + 1 < len(sessions[si].turns):
                submit(si, ti + 1)
    result.wall_s = engine.clock.now() - t0
    result.turns.sort(key=lambda r: (r.session, r.turn))
    return result


def _stats(xs: list, prefix: str, scale: float = 1e3) -> dict:
    if not xs:
        return {}
    q = statistics.quantiles(xs, n=10, method="inclusive") if len(xs) > 1 else [xs[0]] * 9
    return {f"{prefix}_mean_ms": statistics.fmean(xs) * scale, f"{prefix}_p50_ms": statistics.median(xs) * scale,
            f"{prefix}_p90_ms": q[8] * scale}


def decode_rate(step_times: list) -> float | None:
    """Tokens per second of the decode-only steps in ``engine.step_times``
    (:class:`~minimax_lab.engine.engine.StepTime`)."""
    steps = [(st.seconds, st.decodes) for st in step_times if st.decodes and st.decodes == st.tokens]
    total = sum(dt for dt, _ in steps)
    return sum(nd for _, nd in steps) / total if total > 0 else None


def summarize(run: RunResult, engine) -> dict:
    """The run's numbers (see the module docstring); times in ms, rates per second."""
    out = {"turns": len(run.turns), "wall_s": run.wall_s,
           "output_tokens": sum(len(t.output) for t in run.turns),
           "prompt_tokens": sum(t.prompt_len for t in run.turns),
           "cached_tokens": sum(t.cached_tokens for t in run.turns)}
    out.update(_stats([t.ttft_s for t in run.turns], "ttft"))
    out.update(_stats([x for t in run.turns for x in t.itl_s], "itl"))
    out["decode_tok_s"] = decode_rate(engine.step_times)
    out["output_tok_s"] = out["output_tokens"] / run.wall_s if run.wall_s > 0 else None
    out["kv_cache_gib"] = engine.kv_bytes() / 2**30
    if engine.device.type == "cuda":
        out["peak_memory_gib"] = torch.cuda.max_memory_allocated(engine.device) / 2**30
    return out


def quality(run: RunResult, reference: RunResult) -> dict:
    """Logits of ``run`` against ``reference`` (day 0) on the same contexts (forced answers):
    ``logits_rel_err`` = ``||l - l0|| / ||l0||`` over every answer token together, the median and
    largest of the same ratio for one token's logits (``token_err_p50``, ``token_err_max``: a
    pooled error over a few tokens can be one token's), and the share of tokens whose top-1 id
    agrees."""
    a = torch.cat([t.logits for t in run.turns]).double()
    b = torch.cat([t.logits.to(a.device) for t in reference.turns]).double()
    if a.shape != b.shape:
        raise ValueError(f"the runs answered {a.shape[0]} and {b.shape[0]} tokens; compare runs of one workload")
    rel = float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))
    per_token = torch.linalg.vector_norm(a - b, dim=-1) / torch.linalg.vector_norm(b, dim=-1)
    top1 = float((a.argmax(-1) == b.argmax(-1)).double().mean())
    return {"logits_rel_err": rel, "token_err_p50": float(per_token.median()), "token_err_max": float(per_token.max()),
            "top1_agreement": top1, "compared_tokens": int(a.shape[0])}
