"""Engine replicas in separate processes sharing one KV pool, and a router that prices fetch vs go.

Each ``Replica`` is a process running the tiny model (the shipped checkpoint) on its own paged
cache (``engine.slice.PagedEngine``) with a tier ladder whose last rung is the shared pool on
Mooncake Store (``remote.RemoteTier``). Replica A computes a prompt and publishes its pages;
replica B, asked for a prompt sharing that prefix, fetches those pages and computes only the
rest -- with the tokens one process produces, because the fetched bytes are the ones A computed.

The parent talks to a replica over a pipe. Every request carries an id (``submit`` returns it,
``wait`` collects its answer; ``call`` does both) and a deadline (``timeout_s``); a replica that
dies or does not answer in time raises ``ReplicaError`` in the parent, never hangs it. A request
past its deadline is abandoned, not cancelled: the replica finishes it, and its late answer is
dropped when it arrives (counted in ``dropped``), so no call ever returns another request's answer.
``restart()`` ends the process whatever it is doing and starts a fresh one (an empty local cache;
requests still awaited are abandoned); ``kill()`` ends it at once, as a crash would. A
replica's native client logs go to its own file (``log``): in the server's log folder when
``start_replicas`` starts it, else in a temporary folder of its own, removed by ``stop()`` unless
the replica failed.

A replica never outlives the Python process that started it: ``stop()`` ends it, an ``atexit``
handler stops every replica still running, and the replica asks Linux for a parent-death signal
as it starts (``store.die_with_parent``), so a parent killed outright takes it down too.

``PoolRouter`` sends each prompt to the replica where *queue + prefill* is cheapest
(``routing.choose_replica``): it asks every replica for its locally cached prefix and one of them
for the pool's, and prices the options with ``routing.PrefillCost``.

Disaggregation: ``prefill_decode`` has a prefill replica compute a prompt and publish every page
(the last, partial one too) and a decode replica ``adopt`` them and decode.
"""
from __future__ import annotations

import atexit
import math
import multiprocessing as mp
import os
import shutil
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

from minimax_lab.engine.slice import PagedEngine
from minimax_lab.kvcache import store as mc
from minimax_lab.kvcache.blocks import page_hash, token_ids
from minimax_lab.kvcache.remote import RemoteTier
from minimax_lab.kvcache.routing import PrefillCost, choose_replica
from minimax_lab.kvcache.tiers import TieredStore
from minimax_lab.model.train import load_pretrained

MODEL_NAME = "minimax-lab tiny_cpu checkpoint"


class ReplicaError(RuntimeError):
    """A replica died, did not answer in time, or failed a request (the message says which)."""


def page_names(tokens, page_size: int) -> list[bytes]:
    """Chained names (``blocks.page_hash``) of the full pages of ``tokens``."""
    names, parent = [], None
    for i in range(len(tokens) // page_size):
        parent = page_hash(parent, tokens[i * page_size:(i + 1) * page_size])
        names.append(parent)
    return names


@dataclass
class ReplicaConfig:
    """What a replica runs: pool addresses, cache sizes, the remote tier's timeouts, its log."""

    master: str | None
    metadata: str | None
    num_pages: int = 256
    page_size: int = 16
    host_blocks: int = 0
    timeout_s: float = 2.0
    retry_s: float = 0.5
    log: str = ""
    netns: str | None = None          # the store's network namespace (StoreServer.netns), joined at start
    parent_pid: int | None = None     # the process that starts the replica (set by Replica.start)


def _build_engine(cfg: ReplicaConfig) -> PagedEngine:
    model, mcfg = load_pretrained()
    shape = (2, mcfg.n_layers, cfg.page_size, mcfg.n_kv_heads, mcfg.head_dim)
    dtype = next(model.parameters()).dtype
    remote = RemoteTier(cfg.master, cfg.metadata, model=MODEL_NAME, dtype=dtype, block_shape=shape,
                        timeout_s=cfg.timeout_s, retry_s=cfg.retry_s)
    store = TieredStore(cfg.host_blocks, model=MODEL_NAME, dtype=dtype, block_shape=shape, remote=remote)
    return PagedEngine(model, num_pages=cfg.num_pages, page_size=cfg.page_size, store=store)


class _Worker:
    """The replica's side of the pipe: one method per request."""

    def __init__(self, cfg: ReplicaConfig):
        self.engine = _build_engine(cfg)
        self.remote = self.engine.store.remote
        self.n = 0

    def _counts(self, before) -> dict:
        st = self.engine.stats
        return dict(cached=st.cached_tokens - before[0], fetched=st.fetched_tokens - before[1],
                    computed=st.prefill_tokens - before[2])

    def _snap(self):
        st = self.engine.stats
        return st.cached_tokens, st.fetched_tokens, st.prefill_tokens

    def generate(self, tokens, max_new_tokens: int, die_after_blocks: int | None = None) -> dict:
        """Greedy generation; ``die_after_blocks`` makes the process exit in the middle of
        publishing (after that many blocks of its first batch), for the fault tests."""
        if die_after_blocks is not None:
            real = self.remote.put_many

            def put_then_die(names, blocks):
                real(list(names)[:die_after_blocks], list(blocks)[:die_after_blocks])
                os._exit(3)
            self.remote.put_many = put_then_die
        before, self.n = self._snap(), self.n + 1
        t0 = time.perf_counter()
        out = self.engine.generate(("gen", self.n), tokens, max_new_tokens)
        return dict(tokens=out, seconds=time.perf_counter() - t0, ttft_s=self.engine.stats.ttft_s[-1],
                    **self._counts(before))

    def prefill(self, tokens) -> dict:
        """Compute ``tokens`` and publish every page; return the first generated token."""
        before, self.n = self._snap(), self.n + 1
        sid = ("prefill", self.n)
        first = int(self.engine.prefill(sid, tokens).argmax())
        self.engine.free(sid)
        return dict(first=first, **self._counts(before))

    def decode(self, tokens, first: int, max_new_tokens: int) -> dict:
        """Adopt ``tokens`` (computed elsewhere), then decode after ``first``: ``max_new_tokens`` in all."""
        before, self.n = self._snap(), self.n + 1
        sid = ("decode", self.n)
        self.engine.adopt(sid, tokens)
        out, nxt = [first], first
        for _ in range(max_new_tokens - 1):
            nxt = int(self.engine.decode(sid, nxt).argmax())
            out.append(nxt)
        self.engine.free(sid)
        return dict(tokens=out, **self._counts(before))

    def probe(self, tokens) -> dict:
        """Tokens of ``tokens`` cached here (full pages) and in the pool (leading full pages)."""
        ps = self.engine.kv.page_size
        local = len(self.engine.mgr.lookup(tokens)) * ps
        return dict(local=local, pool=self.remote.prefix(page_names(tokens, ps)) * ps)

    def stats(self) -> dict:
        return dict(engine=vars(self.engine.stats) | dict(ttft_s=list(self.engine.stats.ttft_s)),
                    remote=vars(self.remote.stats), remote_reason=self.remote.reason,
                    tiers=vars(self.engine.store.stats))

    def pool_ready(self) -> dict:
        """Whether the pool takes a put now (a throw-away block under a fresh name); closes the
        remote tier's circuit first, so the answer is about the pool, not about the past."""
        self.n += 1
        self.remote._open_until = 0.0
        name = page_hash(None, [os.getpid(), self.n, time.monotonic_ns()])
        block = torch.zeros(self.remote.block_shape, dtype=self.remote.dtype)
        ok = self.remote.put_many([name], [block]) == 1
        self.remote._open_until = 0.0
        return dict(ready=ok)

    def tamper(self, tokens, page: int = 0) -> dict:
        """Fault injection: flip one payload byte of page ``page``'s value in the pool (``upsert``
        replaces it). Returns whether a value was there to damage."""
        names = page_names(tokens, self.engine.kv.page_size)
        key = self.remote.key(names[page])
        raw = self.remote.raw("get", key)
        if not raw:
            return dict(tampered=False)
        bad = bytearray(raw)
        bad[len(bad) // 2] ^= 0xFF
        return dict(tampered=self.remote.raw("upsert", key, bytes(bad)) == 0)

    def clear_cache(self) -> dict:
        """Forget every cached page (the pool is untouched)."""
        mgr = self.engine.mgr
        while len(mgr.policy):
            mgr.evict(1)
        return {}


#: the id of the answer a replica sends once its engine is built (requests count from 1)
START_ID = 0


def _replica_main(conn, cfg: ReplicaConfig) -> None:
    """A replica process: build the engine, then answer requests ``(id, command, arguments)`` with
    ``(id, "ok" | "error", value)``, one at a time in order, until "stop" or a closed pipe."""
    mc.die_with_parent(cfg.parent_pid)      # first: a parent killed outright takes the replica down
    if cfg.log:
        fd = os.open(cfg.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 2)                       # the native client's log goes to the file
    mc.join_netns(cfg.netns)                 # before any thread: every later one inherits it
    mc.client_environment()
    torch.set_num_threads(1)
    try:
        worker = _Worker(cfg)
        conn.send((START_ID, "ok", dict(pid=os.getpid(), remote_reason=worker.remote.reason)))
    except Exception as e:  # noqa: BLE001 -- reported to the parent, which raises it
        conn.send((START_ID, "error", f"{type(e).__name__}: {e}"))
        os._exit(1)
    while True:
        try:
            rid, cmd, kw = conn.recv()
        except (EOFError, OSError):
            break
        if cmd == "stop":
            conn.send((rid, "ok", {}))
            break
        try:
            if cmd.startswith("_") or not callable(getattr(worker, cmd, None)):
                raise ValueError(f"unknown request {cmd!r}")
            conn.send((rid, "ok", getattr(worker, cmd)(**kw)))
        except Exception as e:  # noqa: BLE001 -- a failed request is answered, the replica lives on
            conn.send((rid, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"))
    os._exit(0)                              # skip the native client's slow teardown


@dataclass
class Replica:
    """A replica process (module docstring). ``start()`` waits until its engine is built.
    ``owner``: the ``store.StoreServer`` whose folder holds the log; a replica that dies marks it
    ``failed``, so the logs are kept. ``timeout_s``: the default deadline of a request, in
    seconds; ``dropped`` counts late answers thrown away."""

    cfg: ReplicaConfig
    name: str = "replica"
    timeout_s: float = 120.0
    proc: mp.Process | None = field(default=None, repr=False)
    conn: object = field(default=None, repr=False)
    info: dict = field(default_factory=dict)
    owner: object = field(default=None, repr=False)
    failed: bool = False
    dropped: int = 0
    _own_log_dir: str | None = field(default=None, repr=False)
    _last_id: int = field(default=START_ID, repr=False)
    _awaited: set = field(default_factory=set, repr=False)       # ids whose answers are still wanted
    _arrived: dict = field(default_factory=dict, repr=False)     # their answers, come while another was awaited
    _killed: bool = field(default=False, repr=False)             # ended by kill(): a death on purpose

    def start(self) -> "Replica":
        if not self.cfg.log:
            self._own_log_dir = tempfile.mkdtemp(prefix="replica-")
            self.cfg.log = str(Path(self._own_log_dir) / f"{self.name}.log")
        self.cfg.parent_pid = os.getpid()
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self._awaited, self._arrived, self._killed = {START_ID}, {}, False
        self.proc = ctx.Process(target=_replica_main, args=(child, self.cfg), name=self.name, daemon=True)
        _LIVE[id(self)] = self
        try:
            self.proc.start()
            child.close()
            self.info = self.wait(START_ID, "start")
        except BaseException:
            self._fail()
            self.stop()
            raise
        return self

    def _fail(self) -> None:
        self.failed = True
        if self.owner is not None:
            self.owner.failed = True

    def _died(self, what: str) -> ReplicaError:
        if self._killed:                    # on purpose: not a failure whose logs must be kept
            return ReplicaError(f"{self.name} died (killed by kill()) during {what}")
        self._fail()
        return ReplicaError(f"{self.name} died (exit code {self.proc.exitcode}) during {what}; its log: {self.cfg.log}")

    def _deadline(self, timeout_s) -> float:
        if timeout_s is None:
            timeout_s = self.timeout_s
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
                or not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"timeout_s must be a positive finite number of seconds, got {timeout_s!r}")
        return float(timeout_s)

    def submit(self, cmd: str, **kw) -> int:
        """Send request ``cmd`` (a ``_Worker`` method) with arguments ``kw``; returns its id, for
        ``wait``. Raises ``ReplicaError`` if the replica is not running."""
        if not self.alive():
            raise ReplicaError(f"{self.name} is not running")
        self._last_id += 1
        rid = self._last_id
        try:
            self.conn.send((rid, cmd, kw))
        except (OSError, EOFError):
            self.proc.join(1)
            raise self._died(cmd) from None
        self._awaited.add(rid)
        return rid

    def wait(self, rid: int, what: str = "request", timeout_s: float | None = None):
        """The answer to request ``rid`` (``what`` names it in errors), within ``timeout_s`` seconds
        (default ``self.timeout_s``). Answers to other awaited requests that come first are kept
        for their own ``wait``; answers nobody awaits any more are dropped. Past the deadline the
        request is abandoned (its late answer will be dropped) and ``ReplicaError`` says so; it is
        raised too when the replica dies or fails the request. ``ValueError`` for a ``rid`` not
        awaited (answered, abandoned, or never sent) or a deadline that is not a positive finite
        number."""
        timeout_s = self._deadline(timeout_s)
        if rid not in self._awaited:
            raise ValueError(f"{self.name}: request {rid!r} is not awaited (answered, abandoned or never sent)")
        deadline = time.monotonic() + timeout_s
        try:
            while rid not in self._arrived:
                left = deadline - time.monotonic()
                if not self.conn.poll(min(0.05, max(left, 0.0))):
                    if not self.proc.is_alive():
                        raise self._died(what)
                    if time.monotonic() >= deadline:
                        raise ReplicaError(f"{self.name} did not answer {what} within {timeout_s:g} s; "
                                           f"its late answer will be dropped")
                    continue
                try:
                    got, status, value = self.conn.recv()
                except (EOFError, OSError):
                    self.proc.join(1)
                    raise self._died(what) from None
                if got in self._awaited:
                    self._arrived[got] = (status, value)
                else:
                    self.dropped += 1         # the answer to a request abandoned at its deadline
        finally:
            self._awaited.discard(rid)       # answered or abandoned: nothing more is awaited for it
        status, value = self._arrived.pop(rid)
        if status != "ok":
            raise ReplicaError(f"{self.name} failed {what}: {value}")
        return value

    def call(self, cmd: str, timeout_s: float | None = None, **kw):
        """``submit`` then ``wait``: the answer to ``cmd(**kw)`` within ``timeout_s``."""
        self._deadline(timeout_s)                 # a bad deadline is refused before anything is sent
        return self.wait(self.submit(cmd, **kw), cmd, timeout_s)

    def generate(self, tokens, max_new_tokens: int, **kw) -> dict:
        return self.call("generate", tokens=token_ids(tokens), max_new_tokens=max_new_tokens, **kw)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def kill(self) -> None:
        """End the process at once (SIGKILL), as a crash would; a later ``wait`` says it died."""
        if self.alive():
            self._killed = True
            self.proc.kill()
            self.proc.join()

    def restart(self) -> "Replica":
        """End the process whatever it is doing and start a fresh one with the same config (its
        local cache starts empty); requests still awaited are abandoned."""
        self._end(grace_s=0.0)
        return self.start()

    def _end(self, grace_s: float = 5.0) -> None:
        """Ask the process to stop (it finishes the request in hand first, for up to ``grace_s``
        seconds), else kill it; close the pipe; abandon the requests still awaited."""
        if self.proc is not None and self.proc.pid is not None:
            try:
                if self.proc.is_alive() and grace_s > 0:
                    self._last_id += 1
                    self.conn.send((self._last_id, "stop", {}))
                    self.proc.join(grace_s)
            except (OSError, BrokenPipeError):
                pass
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join()
        if self.conn is not None:
            self.conn.close()
        self._awaited.clear()               # what was still awaited is abandoned

    def stop(self) -> None:
        """End the process (safe to call twice); remove the replica's own log folder unless it failed."""
        _LIVE.pop(id(self), None)
        self._end()
        if self._own_log_dir is not None and not self.failed:
            shutil.rmtree(self._own_log_dir, ignore_errors=True)
            self._own_log_dir = None
            self.cfg.log = ""

    def __enter__(self) -> "Replica":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_replicas(server: mc.StoreServer | None, n: int, **cfg) -> list[Replica]:
    """``n`` replicas joined to ``server``'s pool (None: no pool), started one after another; their
    logs go to ``server.log_dir`` (``replica-<i>.log``)."""
    reps = []
    try:
        for i in range(n):
            name = f"replica-{i}"
            where = dict(netns=server.netns, log=str(Path(server.log_dir) / f"{name}.log")) if server else {}
            c = ReplicaConfig(server.master_address if server else None, server.metadata_url if server else None,
                              **{**where, **cfg})
            reps.append(Replica(c, name=name, owner=server).start())
    except BaseException:
        for r in reps:
            r.stop()
        raise
    return reps


#: replicas started and not yet stopped, stopped at interpreter exit (before the store's servers:
#: ``atexit`` runs the handler registered last first)
_LIVE: dict[int, Replica] = {}


@atexit.register
def _stop_all() -> None:
    for replica in list(_LIVE.values()):
        replica.stop()


@dataclass
class PoolRouter:
    """Routes prompts over replicas by ``routing.choose_replica`` (module docstring). ``queue_s``
    is each replica's estimated outstanding prefill time: it grows by each routed prompt's price
    and is cleared with ``drain()`` (sequential use: nothing waits)."""

    replicas: list
    cost: PrefillCost
    queue_s: list = field(default_factory=list)
    log: list = field(default_factory=list)

    def __post_init__(self):
        self.queue_s = self.queue_s or [0.0] * len(self.replicas)

    def route(self, tokens) -> tuple[int, dict]:
        tokens = token_ids(tokens)
        probes = [r.call("probe", tokens=tokens) for r in self.replicas]
        local = [p["local"] for p in probes]
        pool = max(p["pool"] for p in probes)
        r, sec, fetch, comp = choose_replica(len(tokens), local, pool, self.queue_s, self.cost)
        self.queue_s[r] += sec
        plan = dict(replica=r, local=local, pool=pool, fetch=fetch, compute=comp, seconds=sec)
        self.log.append(plan)
        return r, plan

    def generate(self, tokens, max_new_tokens: int) -> dict:
        r, plan = self.route(tokens)
        return dict(plan=plan, **self.replicas[r].generate(tokens, max_new_tokens))

    def drain(self) -> None:
        self.queue_s = [0.0] * len(self.replicas)


def prefill_decode(prefill: Replica, decode: Replica, tokens, max_new_tokens: int) -> dict:
    """Disaggregated generation: ``prefill`` computes the prompt and publishes its pages, ``decode``
    adopts them and decodes. Returns the tokens and what each side computed."""
    tokens = token_ids(tokens)
    p = prefill.call("prefill", tokens=tokens)
    d = decode.call("decode", tokens=tokens, first=p["first"], max_new_tokens=max_new_tokens)
    return dict(tokens=d["tokens"], prefill=p, decode=d)
