"""Expert parallelism over ``torch.distributed``: experts sharded across ranks, tokens moved
to their experts and back with ``all_to_all_single``.

With ``W`` ranks and ``E`` experts (``E % W == 0``) rank ``r`` holds experts
``[r * E/W, (r+1) * E/W)`` -- a contiguous shard of ``w_gate_up`` and ``w_down`` -- while every
rank keeps its own tokens and a full copy of the (tiny) router. One forward:

1. **route** locally: ``(weights, ids)`` ``[T_r, k]`` for this rank's ``T_r`` tokens;
2. **dispatch**: sort the ``T_r * k`` routed slots by owning rank ``ids // (E/W)``, swap the
   per-rank counts (one small ``all_to_all_single``), then send each slot's token row and its
   *local* expert id to the owner (two ``all_to_all_single`` with uneven splits);
3. **compute**: each rank runs its experts on whatever rows arrived, as ``k = 1`` routing with
   weight 1 (:func:`~minimax_lab.moe.experts.moe_experts`, any ``impl``);
4. **combine**: send the results back along the reversed splits, undo the sort, multiply by the
   routing weights and sum each token's ``k`` slots.

The result equals the single-process layer on the same tokens (:func:`run_gloo_check` checks
it with 2 ``gloo`` processes on this machine's kernel device). The code only uses collectives
both ``gloo`` and ``nccl`` implement, on whatever device the tensors live: ``gloo`` moves CUDA
tensors through host memory (so several ranks may share one GPU, as in that check), ``nccl``
needs one GPU per rank and runs it unchanged. Forward only: the collectives here are the
non-differentiable ``torch.distributed`` ones (training would use
``torch.distributed.nn.functional.all_to_all_single``). Split sizes travel to the host once
per forward (``.tolist()``), as every all-to-all needs them there.

This is the scheme of GShard (arXiv 2006.16668) and DeepSpeed-MoE (arXiv 2201.05596) with
dropless routing: no capacity factor, no token is dropped.
"""
from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import queue as queue_mod
import socket
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from minimax_lab import runtime
from minimax_lab.moe.experts import IMPLS, moe_experts
from minimax_lab.moe.layer import MoEFFN
from minimax_lab.validate import (FLOAT_DTYPES, INT_DTYPES, check_choice, check_positive_int, check_same_device,
                                  check_tensor, check_triton_inputs)


def shard_range(n_experts: int, world_size: int, rank: int) -> tuple[int, int]:
    """``(first, end)`` of the experts rank ``rank`` owns; raises if ``E`` is not divisible by ``W``."""
    check_positive_int(n_experts, "n_experts")
    check_positive_int(world_size, "world_size")
    if n_experts % world_size:
        raise ValueError(f"n_experts={n_experts} must be a multiple of the world size {world_size}")
    per = n_experts // world_size
    return rank * per, (rank + 1) * per


def _all_to_all(t: torch.Tensor, send: list[int], recv: list[int], group) -> torch.Tensor:
    out = t.new_empty((sum(recv),) + tuple(t.shape[1:]))
    dist.all_to_all_single(out, t.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group)
    return out


def expert_parallel_experts(x, w_gate_up_local, w_down_local, weights, ids, *, n_experts: int,
                            group=None, impl: str = "torch") -> torch.Tensor:
    """Routed SwiGLU experts with the experts sharded over the ranks of ``group``.

    Every rank calls this collectively with its own ``x`` ``[T_r, d]`` (``T_r`` may differ and
    may be 0), routing ``weights``/``ids`` ``[T_r, k]`` (global expert ids in ``[0, n_experts)``)
    and its shard ``w_gate_up_local`` ``[E/W, 2f, d]``, ``w_down_local`` ``[E/W, d, f]``.
    Returns ``[T_r, d]``: what :func:`~minimax_lab.moe.experts.moe_experts` would return with
    all ``n_experts`` experts on one device. All tensors live on one device (the collectives move
    them there); ``impl="triton"`` needs :func:`minimax_lab.runtime.kernel_device`. Raises
    ``ValueError`` for wrong shard shapes, mixed devices, a device the impl cannot use, or ids
    out of range (checked locally, before any collective, so a bad rank fails fast -- the
    others then time out in the collective).
    """
    check_choice(impl, "impl", IMPLS)
    check_tensor(x, "x", ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor(ids, "ids", ndim=2, shape=(x.shape[0], None), dtypes=INT_DTYPES)
    check_tensor(weights, "weights", shape=tuple(ids.shape), dtypes=FLOAT_DTYPES)
    check_same_device(x=x, w_gate_up_local=w_gate_up_local, w_down_local=w_down_local, weights=weights, ids=ids)
    if impl == "triton":
        check_triton_inputs(x=x, w_gate_up_local=w_gate_up_local, w_down_local=w_down_local)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    first, end = shard_range(n_experts, world, rank)
    per = end - first
    if w_gate_up_local.ndim != 3 or w_gate_up_local.shape[0] != per or w_gate_up_local.shape[2] != x.shape[1]:
        raise ValueError(f"w_gate_up_local must have shape [E/W={per}, 2f, d={x.shape[1]}], got "
                         f"{list(w_gate_up_local.shape)}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n_experts):
        raise ValueError(f"ids must lie in [0, {n_experts}), got values in [{int(ids.min())}, {int(ids.max())}]")
    T, k = ids.shape
    d = x.shape[1]

    # 1. dispatch: slots sorted by owning rank (stable, so each rank's slots keep token order)
    flat = ids.reshape(-1).long()
    owner = flat // per
    order = torch.sort(owner, stable=True).indices
    send_counts = torch.zeros(world, dtype=torch.long, device=x.device).scatter_add_(0, owner, torch.ones_like(owner))
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)
    send, recv = send_counts.tolist(), recv_counts.tolist()
    rows_in = _all_to_all(x[order // k], send, recv, group)
    local_ids = _all_to_all((flat[order] - owner[order] * per).unsqueeze(1), send, recv, group)

    # 2. compute: every arrived row through its (local) expert, weight 1
    ones = torch.ones(rows_in.shape[0], 1, dtype=x.dtype, device=x.device)
    y_local = moe_experts(rows_in, w_gate_up_local, w_down_local, ones, local_ids, impl=impl, check_ids=False)

    # 3. combine: results back along the reversed splits, unsorted, weighted, summed over k
    y_sorted = _all_to_all(y_local, recv, send, group)
    y_slots = torch.empty(T * k, d, dtype=torch.float32, device=x.device)
    y_slots[order] = y_sorted.float()
    y_slots = y_slots.view(T, k, d) * weights.float().unsqueeze(-1)
    return y_slots.sum(dim=1).to(x.dtype)


class ExpertParallelMoE(nn.Module):
    """This rank's part of an :class:`~minimax_lab.moe.layer.MoEFFN`: the full router, the
    shared expert if any, and the experts ``shard_range(E, W, rank)``.

    ``ExpertParallelMoE(layer, group=None)`` copies the weights out of ``layer`` (which every
    rank builds identically, e.g. from one seed or checkpoint); ``forward(x)`` ``[..., d]`` on
    this rank's tokens returns what ``layer(x)`` returns, computed collectively. Forward only.
    """

    def __init__(self, layer, group=None, *, impl: str | None = None):
        super().__init__()
        self.layer_router = layer            # router + shared expert live here (replicated)
        self.group = group
        self.impl = impl or layer.impl
        first, end = shard_range(layer.n_experts, dist.get_world_size(group), dist.get_rank(group))
        self.first_expert, self.end_expert = first, end
        self.w_gate_up = nn.Parameter(layer.w_gate_up.detach()[first:end].clone(), requires_grad=False)
        self.w_down = nn.Parameter(layer.w_down.detach()[first:end].clone(), requires_grad=False)

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lay = self.layer_router
        if x.shape[-1] != lay.d_model:
            raise ValueError(f"x must have shape [..., d_model={lay.d_model}], got {list(x.shape)}")
        lead = x.shape[:-1]
        x2d = x.reshape(-1, lay.d_model)
        weights, ids, _ = lay.route(x2d)
        out = expert_parallel_experts(x2d, self.w_gate_up.to(x.dtype), self.w_down.to(x.dtype), weights.to(x.dtype),
                                      ids, n_experts=lay.n_experts, group=self.group, impl=self.impl)
        if lay.shared_expert:
            h = lay.shared_gate_up(x2d)
            out = out + lay.shared_down(torch.nn.functional.silu(h[:, :lay.d_ff]) * h[:, lay.d_ff:])
        return out.reshape(*lead, lay.d_model)


# ---------------------------------------------------------------------------------------------
# A self-contained multi-process check with gloo on one machine: used by the tests and the notebook.

def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _token_split(T: int, world: int, skew: str) -> list[int]:
    if skew == "empty_rank":           # the last rank has no tokens at all
        return [T // (world - 1) + (r < T % (world - 1)) for r in range(world - 1)] + [0]
    base = [T // world + (r < T % world) for r in range(world)]
    if skew == "ragged" and world > 1 and base[-1] > 1:
        base[0] += base[-1] // 2
        base[-1] -= base[-1] // 2
    return base


def _one_case(rank: int, world: int, case: dict, device: torch.device) -> tuple[float, int]:
    torch.manual_seed(case.get("seed", 0))        # same seed: identical layer and tokens on every rank
    layer = MoEFFN(case["d"], case["f"], case["E"], case["k"], router=case.get("router", "softmax"),
                   shared_expert=case.get("shared_expert", False), impl=case.get("impl", "reference")).eval()
    x = torch.randn(case["T"], case["d"])         # drawn on the CPU (same numbers everywhere), then moved
    layer, x = layer.to(device), x.to(device)
    if case.get("one_expert"):                    # every token to experts 0 (then 1): rank 0 gets all
        with torch.no_grad():
            layer.gate.weight.zero_()
            layer.gate.weight[0].fill_(1.0)
            layer.gate.weight[1].fill_(0.5)
        x = x.abs() + 0.1
    with torch.no_grad():
        want = layer(x)                           # the single-process layer, all tokens
    split = _token_split(case["T"], world, case.get("skew", "even"))
    lo = sum(split[:rank])
    got = ExpertParallelMoE(layer)(x[lo:lo + split[rank]])
    err = float((got - want[lo:lo + split[rank]]).abs().max()) if split[rank] else 0.0
    return err, split[rank]


def _check_worker(rank: int, world: int, port: int, cases: list, queue, collective_timeout_s: float,
                  device: str = "cpu") -> None:
    """One rank of :func:`run_gloo_check`; puts ``(rank, [(max_abs_err, n_tokens) per case])`` or ``(rank, error)``."""
    try:
        torch.set_num_threads(1)
        dev = torch.device(device)
        if dev.type == "cuda":                    # ranks share the GPUs there are (gloo allows several per GPU)
            dev = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(dev)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=collective_timeout_s))
        out = [_one_case(rank, world, c, dev) for c in cases]
        dist.barrier()
        queue.put((rank, out))
    except Exception as e:  # noqa: BLE001 - reported to the parent, which raises it
        queue.put((rank, f"{type(e).__name__}: {e}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_gloo_check(cases, *, world_size: int = 2, timeout_s: float = 90.0,
                   device: str | torch.device | None = None) -> list[list[tuple[float, int]]]:
    """Run :class:`ExpertParallelMoE` in ``world_size`` spawned ``gloo`` processes on this machine.

    ``cases``: a dict or a list of dicts with ``T, d, f, E, k`` and optionally ``router``,
    ``shared_expert``, ``impl``, ``skew`` (``"even"``, ``"ragged"``, ``"empty_rank"``),
    ``one_expert``, ``seed``. Every rank builds the same layer and tokens, runs the
    single-process layer on all tokens and the expert-parallel one on its slice, and compares.
    ``device`` (default :func:`minimax_lab.runtime.kernel_device`) is where the ranks compute:
    ``"cuda"`` puts every rank's tensors on a GPU (ranks share GPUs when there are fewer; gloo
    stages CUDA tensors through host memory) and runs the compiled kernels; ``"cpu"`` keeps them
    on the CPU, where ``impl="triton"`` runs in Triton's interpreter (the children are started
    in the interpreter even on a GPU machine).
    Returns, per case, ``[(max_abs_err, n_tokens) per rank]``. Raises ``ValueError`` for an
    unknown device, ``RuntimeError`` if a rank failed and ``TimeoutError`` (after killing the
    children) if they do not finish within ``timeout_s`` -- it never hangs.
    """
    cases = [cases] if isinstance(cases, dict) else list(cases)
    dev = runtime.kernel_device() if device is None else torch.device(device)
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {dev}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but PyTorch sees no CUDA device")
    if dev.type == "cpu" and not runtime.INTERPRET and runtime.interpreter_problem():
        # the CPU ranks of a GPU machine start Triton's interpreter in their processes
        raise RuntimeError(f"device='cpu' runs the ranks in Triton's interpreter, which cannot run here: "
                           f"{runtime.interpreter_problem()}")
    # inherited by the spawned children: one thread each; the runtime decision for CPU ranks
    child_env = {"OMP_NUM_THREADS": "1"}
    if dev.type == "cpu" and not runtime.is_interpreter():
        child_env.update(MINIMAX_LAB_DEVICE="cpu", MINIMAX_LAB_INTERPRET="1")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    saved = {k: os.environ.get(k) for k in child_env}
    os.environ.update(child_env)
    procs = [ctx.Process(target=_check_worker, args=(r, world_size, port, cases, q, max(10.0, timeout_s / 2),
                                                     dev.type), daemon=True) for r in range(world_size)]
    try:
        for p in procs:
            p.start()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    results, deadline = {}, time.monotonic() + timeout_s
    try:
        while len(results) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"expert-parallel gloo check did not finish in {timeout_s:.0f} s "
                                   f"({len(results)}/{world_size} ranks reported)")
            try:
                rank, payload = q.get(timeout=min(left, 1.0))
                results[rank] = payload
            except queue_mod.Empty:
                if any(p.exitcode not in (None, 0) for p in procs) and q.empty():
                    codes = [p.exitcode for p in procs]
                    raise RuntimeError(f"an expert-parallel worker died (exit codes {codes})") from None
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    failed = {r: m for r, m in results.items() if isinstance(m, str)}
    if failed:
        raise RuntimeError("expert-parallel workers failed: " + "; ".join(f"rank {r}: {m}" for r, m in failed.items()))
    return [[results[r][i] for r in range(world_size)] for i in range(len(cases))]
