"""Bench suite ``msa``: MiniMax Sparse Attention kernels against dense attention and FlexAttention.

Shape (GPU): MSA's public one -- bf16, Hq=64, Hkv=G=4, D=128, D_idx=128, Bk=128, topk=16, B=1
for prefill. Every GPU case first checks the Triton kernels against the ``torch`` impl on the
same GPU (selection exact where scores are distinct; outputs within bf16 tolerance), then times
ours and the peers in the same process with :func:`minimax_lab.measure.time_fn`.

Cases and what is counted:

* ``prefill_s{S}`` (S = 32k, 64k, 128k): end to end = index scores + top-k + sparse attention,
  from ``q, k, v, q_idx, k_idx``. Peers: dense causal SDPA on cuDNN (GQA), SDPA's flash backend
  (K/V repeated to Hq heads, as it needs), our dense Triton FlashAttention, and -- at 64k --
  FlexAttention computing the **same output** (``mask_mod`` from our selection, block mask
  built with ``_compile=True`` outside the timed region; its output is compared with ours).
  FLOPs: the dense causal count, so ``tflops`` of ours reads as "dense-equivalent" rate.
  ``triton_kv_fp8idx``: the same with FP8 index tensors (``q_idx`` and ``k_idx`` quantized to
  e4m3 inside the timed call, one power-of-two scale per vector); its records carry how many
  selection rows equal the bf16 indexer's and the share of selected blocks both keep.
* ``index_s{S}`` / ``sparse_attn_s{S}``: the two parts alone (``index_s{S}`` also with FP8
  index tensors, quantization included: ``triton_fused_topk_fp8idx``). The sparse part's ``tflops`` is
  the **effective** rate over the tokens actually selected (``4 * Hq * D`` per (query, key)
  pair, causal inside the local block), to be read against the dense kernel's rate.
* ``prefill_s1048576``: ours (time and peak memory) and dense cuDNN SDPA timed once (one call,
  ~30 s on an H200; the record says so), beside the estimate from the 128k cuDNN time x 64
  (quadratic scaling).
* ``decode_b{B}_ctx{L}`` (B = 32, 64; L = 32k, 64k, 128k; one query token, page = Bk = 128, pages
  of each sequence scattered at random over the cache): end-to-end paged sparse decode (index
  scores over all pages + top-k + attention) and the attention part alone, against a dense
  paged decode (our own split-K paged kernel with every page selected: the same code, so the
  ratio is the sparsity's) and gather-pages + SDPA where memory allows. ``bytes_moved`` of the
  attention part = the selected pages' K and V; end to end adds the index keys of every page.

* ``decode_fp8kv_b{B}_ctx{L}`` (B = 32, L = 128k, the decode inputs above): end-to-end
  ``msa_decode_paged(impl="triton")`` on the bf16 K/V cache and on FP8 (e4m3) K/V caches with
  per-token and per-page scales (the index keys stay bf16), eager and under CUDA graphs; checked
  first against the torch impl on the same FP8 pages. ``bytes_moved``: the selected pages' K/V at
  their width (plus their scales) and the index keys of every page.

* ``backward_s{S}`` (S = :data:`LENGTHS`, or ``lengths``): training's attention step at MSA's
  shape, checked first (at S = 4,173, against the torch backward in fp32 over the same
  selection). ``triton_fwd_bwd``: ``msa_attention(impl="triton")`` under autograd, selection +
  forward (saving ``lse``) + backward, from ``q, k, v, q_idx, k_idx`` and ``do``; ``triton_bwd``:
  the backward kernels alone from the saved ``o``, ``lse`` and selection. Peers: dense causal
  forward + backward through SDPA on cuDNN (GQA) and on FlashAttention-2 (K/V repeated). FLOPs:
  FlashAttention-2's dense count (backward = 2.5 x forward), so ours reads as a dense-equivalent
  rate; its records carry the selected pairs per head.

Peer SGLang (``sglang_triton``): when the folder ``tools/fetch_peers.py`` lays out is present
(:mod:`minimax_lab.bench.peers`), SGLang's Triton MSA kernels run beside ours in the prefill and decode
cases (end to end, index + top-k alone, attention alone; decode also under CUDA graphs), after
:mod:`.suite_msa_peer` checked them against ours and a float64 brute force on sampled rows; their
records carry ``peer_sglang_version``. Without the folder the suite says so and every record
carries ``peer_notes.sglang_triton = "absent: <why>"``.

Case groups (:data:`CASES`, ``run(cases=...)`` or ``--cases``; all by default): ``prefill`` (the
prefill, index and sparse-attention cases at :data:`LENGTHS`), ``1m``, ``decode`` (at
:data:`DECODE_SIZES`), ``flex`` (the FlexAttention peer at 64k, with ``prefill``), ``query`` (the
query-schedule kernel up to 64k, with ``prefill``), ``fp8kv`` (at :data:`FP8KV_SIZES`), ``backward``
(at :data:`LENGTHS`). Options
(:data:`OPTIONS`): ``lengths``, ``decode_sizes``, ``fp8kv_sizes`` pick the sizes; ``dense=False``
(``--no-dense``) leaves out the dense prefill peers (cuDNN, flash, dense Triton) and the gather
decode peer to save time; ``partial=FILE`` appends each case's records to ``FILE`` as soon as it
is done (a run cut short keeps them).

    python -m minimax_lab.bench msa --cases prefill --lengths 131072 --no-dense

At ``preset="cpu"`` the shapes are tiny (interpreter, fp32) and it runs in seconds: only the
``prefill`` and ``backward`` groups have a CPU version (the other groups add nothing there); the
CPU ``backward`` checks ours and the torch impl's autograd against float64 autograd through the
reference.

Each case group lives in a module of its own: :mod:`.suite_msa_prefill` (``prefill``, ``flex``,
``query``, ``1m``, the CPU prefill), :mod:`.suite_msa_decode`, :mod:`.suite_msa_fp8kv`,
:mod:`.suite_msa_backward`, all built on the shapes and inputs of :mod:`.suite_msa_inputs`; SGLang's
kernels are run by :mod:`.suite_msa_peer`.
"""
from __future__ import annotations

import argparse

import torch

from minimax_lab import measure, runtime
from minimax_lab.bench import suite_msa_peer as msa_bench_peer
from minimax_lab.bench.suite_msa_backward import check_backward, run_backward, run_backward_cpu
from minimax_lab.bench.suite_msa_decode import check_decode, run_decode
from minimax_lab.bench.suite_msa_fp8kv import run_decode_fp8kv
from minimax_lab.bench.suite_msa_inputs import GPU, SUITE
from minimax_lab.bench.suite_msa_prefill import check_prefill, run_cpu, run_prefill, run_prefill_1m


#: case groups (see the module doc); all run by default
CASES = ("prefill", "1m", "decode", "flex", "query", "fp8kv", "backward")
LENGTHS = (32768, 65536, 131072)
DECODE_SIZES = ((32, 32768), (32, 65536), (32, 131072), (64, 32768), (64, 65536), (64, 131072))
FP8KV_SIZES = ((32, 131072),)


def batch_context(text: str) -> tuple[int, int]:
    """``"B:context"`` (e.g. ``"32:131072"``) -> ``(32, 131072)``."""
    try:
        b, c = (int(x) for x in str(text).split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected B:context such as 32:131072, got {text!r}") from None
    if b < 1 or c < 1:
        raise argparse.ArgumentTypeError(f"expected positive B:context, got {text!r}")
    return b, c


#: options of :func:`run` as ``python -m minimax_lab.bench msa`` arguments (``--decode-sizes`` ...)
OPTIONS = {
    "lengths": dict(type=int, nargs="+", metavar="S",
                    help=f"prefill and backward lengths (default {' '.join(map(str, LENGTHS))})"),
    "decode_sizes": dict(type=batch_context, nargs="+", metavar="B:CTX",
                         help="decode batch:context pairs (default " + " ".join(f"{b}:{c}" for b, c in DECODE_SIZES)
                              + ")"),
    "fp8kv_sizes": dict(type=batch_context, nargs="+", metavar="B:CTX",
                        help="FP8 K/V decode batch:context pairs (default "
                             + " ".join(f"{b}:{c}" for b, c in FP8KV_SIZES) + ")"),
    "dense": dict(action=argparse.BooleanOptionalAction,
                  help="time the dense prefill peers and the gather decode peer (default: yes)"),
    "partial": dict(metavar="FILE", help="append each case's records to FILE as soon as it is done"),
}


def run(preset: str = "auto", cases=None, *, lengths=None, decode_sizes=None, fp8kv_sizes=None,
        dense: bool = True, partial: str | None = None) -> list[dict]:
    """The case groups ``cases`` (default all of :data:`CASES`) with the options of the module doc;
    returns the records (the CLI writes them)."""
    parts = set(measure.select_cases(cases, CASES))
    lengths = [int(x) for x in (LENGTHS if lengths is None else lengths)]
    decode_sizes = [batch_context(x) if isinstance(x, str) else tuple(x)
                    for x in (DECODE_SIZES if decode_sizes is None else decode_sizes)]
    fp8kv_sizes = [batch_context(x) if isinstance(x, str) else tuple(x)
                   for x in (FP8KV_SIZES if fp8kv_sizes is None else fp8kv_sizes)]

    def save(recs):
        if partial and recs:
            measure.append_records(recs, partial)

    if runtime.resolve_preset(preset) != "gpu":
        recs = (run_cpu() if "prefill" in parts else []) + (run_backward_cpu() if "backward" in parts else [])
        save(recs)
        return recs
    dev, dtype, s = runtime.kernel_device(), runtime.compute_dtype(), GPU
    records: list[dict] = []
    peer = msa_bench_peer.peer_status()
    print(f"  peer {msa_bench_peer.PEER}: {'present' if peer['available'] else 'ABSENT, skipped'} -- {peer['reason']}")
    check = check_prefill(s, dev, dtype, S=4096 + 77)
    dense_128k = None
    if "prefill" in parts:
        for S in lengths:
            try:
                recs = run_prefill(s, S, dev, dtype, reps=10, check=check, with_flex="flex" in parts and S == 65536,
                                   with_query="query" in parts and S <= 65536, peer=peer, dense_peers=dense)
            except Exception as e:  # noqa: BLE001 - keep the other cases' numbers
                print(f"  prefill S={S} FAILED: {type(e).__name__}: {e}")
                continue
            dense_128k = next((r["ms"] for r in recs if r["impl"] == "sdpa_cudnn" and S == 131072), dense_128k)
            records += recs
            save(recs)
            torch.cuda.empty_cache()
    if "1m" in parts:
        if dense_128k is None:  # a run of the 1M case alone: the 128k cuDNN time of the latest recorded run
            prev = [r for r in measure.load_records(suite=SUITE) if r["case"] == "prefill_s131072"
                    and r["impl"] == "sdpa_cudnn"]
            dense_128k = prev[-1]["ms"] if prev else None
        try:
            recs = run_prefill_1m(s, dev, dtype, dense_128k)
            records += recs
            save(recs)
        except Exception as e:  # noqa: BLE001
            print(f"  prefill S=1M FAILED: {type(e).__name__}: {e}")
    if "decode" in parts:
        dcheck = check_decode(s, dev, dtype)
        for B, L in decode_sizes:
            try:
                recs = run_decode(s, B, L, dev, dtype, reps=30, check=dcheck, gather_peer=L <= 65536 and dense,
                                  peer=peer)
            except Exception as e:  # noqa: BLE001
                print(f"  decode B={B} L={L} FAILED: {type(e).__name__}: {e}")
                continue
            records += recs
            save(recs)
    if "backward" in parts:
        bcheck = check_backward(s, dev, dtype, S=4096 + 77)
        for S in lengths:
            try:
                recs = run_backward(s, S, dev, dtype, reps=5, check=bcheck, dense_peers=dense)
            except Exception as e:  # noqa: BLE001 - keep the other cases' numbers
                print(f"  backward S={S} FAILED: {type(e).__name__}: {e}")
                continue
            records += recs
            save(recs)
            torch.cuda.empty_cache()
    if "fp8kv" in parts:
        for B, L in fp8kv_sizes:
            try:
                recs = run_decode_fp8kv(s, B, L, dev, dtype, reps=30)
            except Exception as e:  # noqa: BLE001
                print(f"  decode fp8 K/V B={B} L={L} FAILED: {type(e).__name__}: {e}")
                continue
            records += recs
            save(recs)
    return records
