"""An engine slice: the tiny model's generate loop on the paged KV cache, with prefix sharing.

The smallest engine that shows what a paged, prefix-shared cache buys an agent (notebook 05);
:mod:`minimax_lab.engine.engine` is the full one (scheduler, batching, CUDA graphs). It runs the
model layer by layer through its step API (``blocks[i].qkv`` / ``finish``, ``tok_emb``,
``logits``), keeping K/V in a ``KVPages`` pool managed by a ``BlockManager``, and every
attention step goes through the package's paged kernels:

1. ``prefill(seq_id, tokens)`` asks the manager for the longest cached prefix; only the rest of
   the prompt is computed (``prefill_tokens`` counts them). Per layer, the new K/V go into their
   pages with :func:`~minimax_lab.paged_kv.write_kv` and the new queries attend over the whole
   sequence -- cached prefix and new tokens -- with :func:`~minimax_lab.paged_kv.paged_prefill`.
2. ``decode(seq_id, token)`` appends one token; it is written the same way and attends with
   :func:`~minimax_lab.paged_kv.paged_decode`.
3. ``free(seq_id)`` returns the pages; full ones stay cached (named by their content hash) for
   the next request that starts with the same tokens.

With a ``store`` (a ``kvcache.tiers.TieredStore``: host, disk and a shared remote pool), the
ladder below the GPU pages is used: pages the pool evicts are spilled to it; ``prefill`` asks it
for the pages after the locally cached prefix (``fetch_prefix``: host, disk, then one batched
remote get) and loads them (``fetched_tokens``) before computing the rest; pages it computed are
published to the pool (``publish``), full pages when a prompt is computed and when a sequence is
freed, and the prompt's last, partial page too (named by the same chained hash of its tokens),
so a decode worker can ``adopt`` a prompt computed elsewhere. A store that fails only costs
recomputation: its misses are computed here.

``impl`` (``"reference" | "torch" | "triton"``, default ``"torch"``) picks the implementation of
all three kernels. Greedy decoding; text only (no images). Time to first token (TTFT) is the wall
time of the prefill plus the first argmax.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import torch

from minimax_lab.kvcache import BlockManager, KVPages
from minimax_lab.paged_kv import paged_decode, paged_prefill, write_kv
from minimax_lab.kvcache.blocks import page_hash, token_id, token_ids
from minimax_lab.kvcache.workloads import SYSTEM_AGENT, _codebase_tokens, tokenize
from minimax_lab.validate import IMPLS, check_choice


@dataclass
class EngineStats:
    prefill_tokens: int = 0       # prompt tokens whose K/V were computed
    cached_tokens: int = 0        # prompt tokens served from the cache
    fetched_tokens: int = 0       # prompt tokens whose K/V came from the store (host, disk or pool)
    decode_tokens: int = 0
    ttft_s: list = field(default_factory=list)


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


class PagedEngine:
    """Generate with ``model`` (a ``TinyMultimodalModel``) on a paged, prefix-shared KV cache (see
    the module docstring). Raises ``ValueError`` for an unknown ``impl``."""

    def __init__(self, model, *, num_pages: int = 256, page_size: int = 16, prefix_caching: bool = True,
                 policy="lru", impl: str = "torch", store=None):
        check_choice(impl, "impl", IMPLS)
        self.model = model.eval()
        cfg = model.cfg
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.kv = KVPages.allocate(cfg.n_layers, num_pages, page_size, cfg.n_kv_heads, cfg.head_dim,
                                   dtype=self.dtype, device=self.device)
        self.mgr = BlockManager(num_pages, page_size, policy=policy, kv=self.kv, prefix_caching=prefix_caching)
        self.impl = impl
        self.stats = EngineStats()
        self.store = store
        self._published: dict = {}         # seq_id -> full pages already published
        if store is not None:
            self.mgr.on_evict = store.on_evict_hook(self.kv)

    # ---- attention over pages --------------------------------------------------------------
    def _attend(self, layer: int, seq_id, q, k, v, slots):
        """Write ``k, v [1, S, Hkv, D]`` at ``slots``, then attend with ``q [1, S, Hq, D]`` (the last S
        tokens of the sequence) over all of its cached keys -> ``[1, S, Hq, D]``."""
        kp, vp = self.kv.layer(layer)
        write_kv(k[0], v[0], kp, vp, slots, impl=self.impl)
        bt = self.mgr.block_table([seq_id], device=self.device)
        lens = self.mgr.seq_lens([seq_id], device=self.device)
        if q.shape[1] == 1:
            return paged_decode(q[:, 0], kp, vp, bt, lens, impl=self.impl)[:, None]
        return paged_prefill(q, kp, vp, bt, lens, impl=self.impl)

    @torch.no_grad()
    def _forward(self, seq_id, tokens: list[int], start: int) -> torch.Tensor:
        """Run ``tokens`` (positions ``start..``) through every layer, writing their K/V; last logits."""
        m = self.model
        ids = torch.tensor([tokens], device=self.device)
        pos = torch.arange(start, start + len(tokens), device=self.device)[None]
        slots = self.mgr.slots(seq_id, start, start + len(tokens)).to(self.device)
        h = m.tok_emb(ids)
        for i, blk in enumerate(m.blocks):
            q, k, v = blk.qkv(h, pos)
            h = blk.finish(h, self._attend(i, seq_id, q, k, v, slots))
        return m.logits(h[:, -1:])[0, -1]

    # ---- public ----------------------------------------------------------------------------
    def prefill(self, seq_id, tokens) -> torch.Tensor:
        """Create ``seq_id`` with ``tokens``; compute what is not cached; return the last logits ``[vocab]``."""
        tokens = token_ids(tokens)
        if len(tokens) > self.model.cfg.max_seq_len:
            raise ValueError(f"prompt of {len(tokens)} tokens is longer than max_seq_len={self.model.cfg.max_seq_len}")
        cached = self.mgr.allocate(seq_id, tokens)
        fetched = self._fetch(seq_id, cached, (len(tokens) - 1) // self.kv.page_size)
        self.stats.cached_tokens += cached
        self.stats.fetched_tokens += fetched
        self.stats.prefill_tokens += len(tokens) - cached - fetched
        logits = self._forward(seq_id, tokens[cached + fetched:], cached + fetched)
        self._publish(seq_id, (cached + fetched) // self.kv.page_size, tail=True)
        return logits

    def adopt(self, seq_id, tokens) -> int:
        """Create ``seq_id`` holding ``tokens`` whose K/V another engine computed and published
        (a decode worker taking over a prefill): every page, the last partial one included, is
        taken from the local cache or the store; what neither has is computed here. Returns the
        number of tokens computed here (0 when the hand-off is complete). Continue with ``decode``."""
        tokens = token_ids(tokens)
        ps = self.kv.page_size
        cached = self.mgr.allocate(seq_id, tokens)
        fetched = self._fetch(seq_id, cached, -(-len(tokens) // ps))
        done = min(cached + fetched, len(tokens))
        self.stats.cached_tokens += cached
        self.stats.fetched_tokens += done - cached
        self.stats.prefill_tokens += len(tokens) - done
        if done < len(tokens):
            self._forward(seq_id, tokens[done:], done)
        self._published[seq_id] = len(tokens) // ps
        return len(tokens) - done

    # ---- the store ---------------------------------------------------------------------------
    def _page_names(self, seq_id, first: int, last: int) -> list[bytes]:
        """Names of pages ``[first, last)`` of ``seq_id``: the manager's chained hashes for full
        pages, the same chained hash of its tokens for a last, partial page."""
        seq, ps = self.mgr.seqs[seq_id], self.kv.page_size
        names = [rec.name for rec in seq.prefix[first:last]]
        if last > len(seq.prefix) >= first and len(seq.tokens) % ps:
            parent = seq.prefix[-1].name if seq.prefix else None
            names.append(page_hash(parent, seq.tokens[len(seq.prefix) * ps:]))
        return names

    def _fetch(self, seq_id, cached: int, last_page: int) -> int:
        """Load the store's blocks for pages ``cached // page_size ..< last_page``; tokens loaded."""
        if self.store is None or not self.mgr.prefix_caching:
            return 0
        first = cached // self.kv.page_size
        names = self._page_names(seq_id, first, last_page)
        blocks = self.store.fetch_prefix(names) if names else []
        pages = self.mgr.seqs[seq_id].pages
        for i, b in enumerate(blocks):
            self.kv.load_block(pages[first + i], b)
        return len(blocks) * self.kv.page_size

    def _publish(self, seq_id, first: int, *, tail: bool = False) -> None:
        """Publish pages ``first..`` of ``seq_id`` that are full (and the partial last one if ``tail``)."""
        if self.store is None or not self.mgr.prefix_caching:
            return
        seq, ps = self.mgr.seqs[seq_id], self.kv.page_size
        last = -(-len(seq.tokens) // ps) if tail else len(seq.tokens) // ps
        first = max(first, self._published.get(seq_id, 0))
        if first < last:
            names = self._page_names(seq_id, first, last)
            self.store.publish(names, [self.kv.page_block(seq.pages[first + i]) for i in range(len(names))])
        self._published[seq_id] = len(seq.tokens) // ps

    def decode(self, seq_id, token: int) -> torch.Tensor:
        token = token_id(token)
        pos = len(self.mgr.seqs[seq_id].tokens)
        self.mgr.append(seq_id, token)
        self.stats.decode_tokens += 1
        return self._forward(seq_id, [token], pos)

    def free(self, seq_id) -> None:
        """Drop ``seq_id``; its full pages not yet in the store are published first."""
        if seq_id in self.mgr.seqs:
            self._publish(seq_id, 0)
        self._published.pop(seq_id, None)
        self.mgr.free(seq_id)

    def generate(self, seq_id, tokens, max_new_tokens: int, *, keep: bool = False) -> list[int]:
        """Greedy: prefill then ``max_new_tokens`` tokens. Records TTFT; frees the sequence unless ``keep``."""
        _sync(self.device)
        t0 = time.perf_counter()
        logits = self.prefill(seq_id, tokens)
        nxt = int(logits.argmax())
        _sync(self.device)
        self.stats.ttft_s.append(time.perf_counter() - t0)
        out = [nxt]
        for _ in range(max_new_tokens - 1):
            nxt = int(self.decode(seq_id, nxt).argmax())
            out.append(nxt)
        if not keep:
            self.free(seq_id)
        return out


def agent_session_chunks(n_turns: int, *, vocab_size: int, base_tokens: int = 512, turn_tokens=(40, 120),
                         seed: int = 0) -> tuple[list[int], list[list[int]]]:
    """A miniature coding-agent session in the model's vocabulary: the system prompt + codebase
    (the first ``base_tokens`` tokens of the ``json`` package's sources, from ``workloads``) and
    ``n_turns`` tool outputs (slices of the same sources: file reads) of ``turn_tokens`` tokens.
    Ids are folded into ``[4, vocab_size)`` (skipping the special tokens)."""
    rng = random.Random(seed)
    src = list(tokenize(SYSTEM_AGENT)) + list(_codebase_tokens("json"))
    fold = lambda ts: [4 + t % (vocab_size - 4) for t in ts]  # noqa: E731
    base = fold(src[:base_tokens])
    turns = []
    for _ in range(n_turns):
        n = rng.randint(*turn_tokens)
        at = rng.randrange(0, max(1, len(src) - n))
        turns.append(fold(src[at:at + n]))
    return base, turns


def run_agent_session(engine: PagedEngine, base: list[int], turns: list[list[int]], *, new_tokens: int = 8) -> dict:
    """Each turn: prompt = everything so far; generate ``new_tokens``; append them and the next tool
    output. Returns the generated tokens per turn, prefill/cached token counts and TTFTs."""
    history, outs = list(base), []
    s0 = engine.stats.prefill_tokens, engine.stats.cached_tokens, len(engine.stats.ttft_s)
    for k, tool_out in enumerate(turns):
        out = engine.generate(("turn", k, id(history)), history, new_tokens)
        outs.append(out)
        history += out + tool_out
    st = engine.stats
    return dict(outputs=outs, prefill_tokens=st.prefill_tokens - s0[0], cached_tokens=st.cached_tokens - s0[1],
                ttft_s=st.ttft_s[s0[2]:], final_length=len(history))
