"""Faults of the shared pool, injected and counted: nothing crashes, no wrong KV is served.

``fault_drill(server, replicas, reference, trials)`` runs each fault ``trials`` times against live
replicas (``replicas.Replica``) sharing ``server``'s pool (``store.StoreServer``) and checks every
answer against ``reference(tokens, n)`` -- the tokens one process with no pool produces:

* ``master_killed`` -- replica 0 computes and publishes a prompt; the master is killed; replica 1
  asks for a longer prompt sharing it: the pool's calls fail, the prefix is recomputed;
* ``master_restarted_empty`` -- the master comes back with no blocks: a miss, recomputed; later
  publishes land again;
* ``master_unreachable`` -- the master is paused (SIGSTOP): calls time out, the prompt is
  recomputed, the pool's circuit stays open for ``retry_s`` instead of waiting on every call;
* ``corrupted_value`` -- a block's value in the pool is damaged: it fails verification, is
  counted as rejected and removed, and its tokens are recomputed;
* ``replica_died_mid_put`` -- a third replica exits after half a batch of puts: what it put is
  served, the rest recomputed (it is replaced by a fresh replica);
* ``concurrent_same_block`` -- two replicas compute and put the same prompt at once; with both
  local caches cleared, a longer prompt sharing it is fetched from the pool.

``python -m minimax_lab.engine.store_faults --trials 3 --out FILE`` runs the drill on a fresh
pool and writes the table.

Each row counts trials, answers equal to the reference, wrong answers, crashes (a replica that
died or failed a request it should have answered), and tokens fetched and recomputed.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from minimax_lab.engine.slice import PagedEngine
from minimax_lab.kvcache import store as mc
from minimax_lab.engine.replicas import Replica, ReplicaConfig, ReplicaError, start_replicas
from minimax_lab.model.train import load_pretrained

FAULTS = ("master_killed", "master_restarted_empty", "master_unreachable", "corrupted_value",
          "replica_died_mid_put", "concurrent_same_block")


@dataclass
class FaultRow:
    fault: str
    trials: int = 0
    equal: int = 0           # answers equal to the single-process reference
    wrong: int = 0           # answers that differ (wrong KV served)
    crashed: int = 0         # a replica died or failed a request it should have answered
    fetched: int = 0         # prompt tokens served from the pool
    recomputed: int = 0      # prompt tokens computed

    @property
    def ok(self) -> bool:
        return self.trials > 0 and self.equal == self.trials and not self.wrong and not self.crashed


def _prompt(rng: random.Random, n: int, vocab: int = 141) -> list[int]:
    return [rng.randrange(4, vocab) for _ in range(n)]


def fault_drill(server, replicas: list[Replica], reference, *, trials: int = 1, faults=FAULTS,
                prompt_tokens: int = 96, new_tokens: int = 4, seed: int = 0, progress=None) -> list[FaultRow]:
    """Run every fault of ``faults`` ``trials`` times (module docstring); returns one row per fault.
    Needs two live replicas; leaves the master running and two live replicas in ``replicas``."""
    if len(replicas) < 2:
        raise ValueError(f"the drill needs two replicas, got {len(replicas)}")
    rng = random.Random(seed)
    rows = {f: FaultRow(f) for f in faults}
    for r in replicas:
        r.call("clear_cache")                         # every trial starts from empty local caches

    def ask(rep: Replica, row: FaultRow, tokens) -> None:
        try:
            got = rep.generate(tokens, new_tokens)
        except ReplicaError:
            row.crashed += 1
            return
        want = reference(tokens, new_tokens)
        row.equal += got["tokens"] == want
        row.wrong += got["tokens"] != want
        row.fetched += got["fetched"]
        row.recomputed += got["computed"]

    def shared_pair():
        base = _prompt(rng, prompt_tokens)
        return base, base + _prompt(rng, 1 + rng.randrange(24))

    for fault in faults:
        row = rows[fault]
        for _ in range(trials):
            wait_pool_ready(replicas)
            row.trials += 1
            base, longer = shared_pair()
            if fault == "master_killed":
                replicas[0].generate(base, new_tokens)
                server.kill_master()
                ask(replicas[1], row, longer)
                server.restart_master()
            elif fault == "master_restarted_empty":
                replicas[0].generate(base, new_tokens)
                server.restart_master()
                ask(replicas[1], row, longer)
            elif fault == "master_unreachable":
                replicas[0].generate(base, new_tokens)
                server.pause_master()
                try:
                    ask(replicas[1], row, longer)
                finally:
                    server.resume_master()
            elif fault == "corrupted_value":
                replicas[0].generate(base, new_tokens)
                replicas[0].call("tamper", tokens=base, page=len(base) // replicas[0].cfg.page_size // 2)
                ask(replicas[1], row, longer)
            elif fault == "replica_died_mid_put":
                log = str(Path(replicas[0].cfg.log).with_name("victim.log")) if replicas[0].cfg.log else ""
                victim = Replica(ReplicaConfig(**{**vars(replicas[0].cfg), "log": log}), name="victim").start()
                try:
                    victim.generate(base, new_tokens, die_after_blocks=len(base) // victim.cfg.page_size // 2)
                    row.crashed += 1                       # it was meant to die; answering is a failure
                except ReplicaError:
                    pass
                finally:
                    victim.stop()
                ask(replicas[1], row, longer)
            elif fault == "concurrent_same_block":
                ids = [r.submit("generate", tokens=base, max_new_tokens=new_tokens) for r in replicas[:2]]
                want = reference(base, new_tokens)
                for r, rid in zip(replicas[:2], ids):
                    try:
                        got = r.wait(rid, "generate")
                        row.wrong += got["tokens"] != want
                    except ReplicaError:
                        row.crashed += 1
                for r in replicas:
                    r.call("clear_cache")               # the next request must come from the pool
                ask(replicas[0], row, longer)
            for r in replicas:
                r.call("clear_cache")
            if progress is not None:
                progress(fault, row)
    wait_pool_ready(replicas)
    return list(rows.values())


def wait_pool_ready(replicas: list[Replica], timeout_s: float = 20.0) -> bool:
    """Wait until every replica's puts land (after a restart the pool node lends its memory to the
    new master within a few heartbeats). Returns False when ``timeout_s`` passed first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(r.call("pool_ready")["ready"] for r in replicas):
            return True
        time.sleep(0.2)
    return False


def rows_as_dicts(rows: list[FaultRow]) -> list[dict]:
    return [dict(asdict(r), ok=r.ok) for r in rows]


def single_process_reference(page_size: int = 16):
    """``reference(tokens, n)``: greedy tokens of one engine with no pool (the shipped checkpoint)."""
    model, _ = load_pretrained()
    eng = PagedEngine(model, num_pages=1024, page_size=page_size)
    ids = iter(range(1 << 62))
    return lambda tokens, n: eng.generate(("ref", next(ids)), tokens, n)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Inject every fault of the shared KV pool and count the outcomes.")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--out", default="results/kvstore_faults.json")
    a = p.parse_args(argv)
    try:
        with mc.StoreServer(pool_bytes=128 << 20) as server:
            reps = start_replicas(server, 2, page_size=16, timeout_s=1.0, retry_s=0.3)
            try:
                t0 = time.perf_counter()
                rows = fault_drill(server, reps, single_process_reference(16), trials=a.trials)
                secs = time.perf_counter() - t0
            finally:
                for r in reps:
                    r.stop()
    except (mc.StoreUnavailable, ReplicaError, ValueError) as e:
        print(f"store_faults: {e}", file=sys.stderr)
        return 2
    Path(a.out).write_text(json.dumps(dict(trials=a.trials, seconds=round(secs, 1), rows=rows_as_dicts(rows)),
                                      indent=1) + "\n")
    for r in rows:
        print(f"{r.fault:<24} tried {r.trials}  equal {r.equal}  wrong {r.wrong}  crashed {r.crashed}  "
              f"fetched {r.fetched}  recomputed {r.recomputed}")
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
