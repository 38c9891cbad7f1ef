"""Inputs shared by several test files: paged caches, MSA problems, routed MoE problems, and views of a
tensor that hold the same values in another memory layout (what a caller may hand an operator).

Device, seeds and tolerances come from :mod:`devices` (inputs on the kernel device, drawn from a
seeded CPU generator).
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.support.devices import DEVICE, generator, randn, to_device
from minimax_lab.bench.suite_kvcache import random_block_table
from minimax_lab.moe import route_softmax

#: float dtypes every Triton compute kernel accepts (float64 raises: minimax_lab.validate.TRITON_DTYPES)
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
LAYOUTS = ("contiguous", "last_dim_strided", "transposed_storage", "sliced")


def coarse(*shape, gen: torch.Generator, dtype=torch.float32) -> torch.Tensor:
    """Multiples of 1/4 in [-1/2, 1/2]: index dots are exact in any float dtype, so block scores tie
    often and exactly and a selection must match the reference bit for bit."""
    return (torch.randint(-2, 3, shape, generator=gen).float() / 4).to(DEVICE, dtype)


def relayout(x: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values as ``x`` in another memory layout (a view that is not a contiguous tensor):

    * ``"last_dim_strided"`` -- every other element of a twice-as-wide buffer (stride 2 in the last dim);
    * ``"transposed_storage"`` -- stored with its first two dims swapped (the rest unit-stride);
    * ``"sliced"`` -- a window into a larger buffer (non-zero offset, padded rows);
    * ``"contiguous"`` -- ``x`` itself.
    """
    if layout == "contiguous" or x.ndim == 0:
        return x
    if layout == "last_dim_strided":
        out = torch.repeat_interleave(x, 2, dim=-1)[..., ::2]
    elif layout == "transposed_storage":
        out = x.transpose(0, 1).contiguous().transpose(0, 1) if x.ndim >= 2 else x
    elif layout == "sliced":
        big = torch.zeros(*(s + 2 for s in x.shape), dtype=x.dtype, device=x.device)
        big.fill_(float("nan") if x.is_floating_point() else -7)  # poison: the padding must never be read
        big[tuple(slice(1, 1 + s) for s in x.shape)] = x
        out = big[tuple(slice(1, 1 + s) for s in x.shape)]
    else:
        raise ValueError(f"unknown layout {layout!r}")
    assert torch.equal(out, x)
    return out


def paged_cache(lengths, *, page: int, Hkv: int, D: int, gen: torch.Generator, dtype=torch.float32,
                spare: int = 2, d_idx: int | None = None) -> dict:
    """A shuffled page pool holding ``len(lengths)`` sequences: ``k_cache, v_cache [P, page, Hkv, D]``,
    ``block_table int32 [B, max_pages]`` (-1 unused), ``seq_lens int32 [B]`` and, with ``d_idx``,
    ``k_idx_cache [P, page, d_idx]`` (MSA's paged index keys, drawn from a coarse grid so scores tie)."""
    lengths = list(lengths)
    P = sum(-(-n // page) for n in lengths) + spare
    if lengths:
        table = random_block_table(lengths, page, P, "cpu", gen)
    else:
        table = torch.full((0, 1), -1, dtype=torch.int32)
    out = {"k_cache": randn(P, page, Hkv, D, gen=gen, dtype=dtype), "v_cache": randn(P, page, Hkv, D, gen=gen, dtype=dtype),
           "block_table": table.to(DEVICE), "seq_lens": torch.tensor(lengths, dtype=torch.int32, device=DEVICE)}
    if d_idx is not None:
        out["k_idx_cache"] = coarse(P, page, d_idx, gen=gen, dtype=dtype)
    return out


class DeviceWork(TorchDispatchMode):
    """Watches the torch ops a call dispatches:

    * ``largest_new`` -- the most elements of any float tensor an op *allocates* (views of its
      inputs, and the Triton interpreter's byte-level marshalling of kernel arguments, do not count);
    * ``syncs`` -- the calls that read device values back to the host (``.item()``, ``int()``,
      ``bool()``, ``.tolist()``, ``nonzero``, a copy from the GPU to the CPU).
    """

    def __init__(self):
        super().__init__()
        self.largest_new = 0
        self.syncs: list[str] = []

    def __enter__(self):
        # .tolist() of a CPU tensor dispatches no op: watch the method itself
        self._tolist = torch.Tensor.tolist
        watcher = self

        def tolist(t):
            watcher.syncs.append("Tensor.tolist")
            return watcher._tolist(t)
        torch.Tensor.tolist = tolist
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        leaves = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        name = str(func)
        if "_local_scalar_dense" in name or "nonzero" in name:
            self.syncs.append(name)
        outs = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        if any(t.device.type == "cuda" for t in leaves) and any(t.device.type == "cpu" for t in outs):
            self.syncs.append(name)
        storages = {t.untyped_storage().data_ptr() for t in leaves}
        for t in outs:
            if t.is_floating_point() and t.untyped_storage().data_ptr() not in storages:
                self.largest_new = max(self.largest_new, t.numel())
        return out


def moe_case(T, E, k, d, f, g, *, routing="random", dtype=torch.float32):
    """``(x [T, d] in dtype, w_gate_up [E, 2f, d], w_down [E, d, f], weights [T, k], ids [T, k])`` on
    the kernel device, init-scale fp32 weights. ``routing``: ``"random"`` (softmax top-k of random
    logits), ``"few_experts"`` (only experts 0 and 1 get tokens) or ``"one_expert"`` (k = 1, all to
    expert E - 1)."""
    x = randn(T, d, gen=g, dtype=dtype)
    wgu = randn(E, 2 * f, d, gen=g) / d ** 0.5
    wd = randn(E, d, f, gen=g) / f ** 0.5
    if routing == "one_expert":
        ids = torch.full((T, 1), E - 1)
        w = torch.rand(T, 1, generator=g)
    elif routing == "few_experts":       # most experts receive no token
        ids = torch.stack([torch.randperm(2, generator=g)[:k] for _ in range(T)])
        w = torch.rand(T, k, generator=g)
    else:
        w, ids = route_softmax(randn(T, E, gen=g), k)
    return x, wgu, wd, *to_device(w, ids)


def msa_decode_inputs(lengths, *, T=1, G=2, hpg=2, D=16, d_idx=16, seed=0, dtype=torch.float32):
    """The keyword arguments of ``msa_decode_paged`` (but ``topk``): a :func:`paged_cache` of ``lengths``
    with index keys, ``q [B, T, G*hpg, D]`` and coarse ``q_idx [B, T, G, d_idx]``."""
    g = generator(seed)
    ins = paged_cache(lengths, page=16, Hkv=G, D=D, gen=g, dtype=dtype, d_idx=d_idx)
    B = len(lengths)
    ins["q"] = randn(B, T, G * hpg, D, gen=g, dtype=dtype)
    ins["q_idx"] = coarse(B, T, G, d_idx, gen=g, dtype=dtype)
    return ins


def msa_prefill_inputs(B=2, S=45, G=2, hpg=2, D=16, d_idx=16, seed=0, dtype=torch.float32):
    """The tensors of ``msa_attention``: ``q [B, S, G*hpg, D]``, ``k, v [B, S, G, D]`` and coarse
    ``q_idx [B, S, G, d_idx]``, ``k_idx [B, S, d_idx]``."""
    g = generator(seed)
    return {"q": randn(B, S, G * hpg, D, gen=g, dtype=dtype), "k": randn(B, S, G, D, gen=g, dtype=dtype),
            "v": randn(B, S, G, D, gen=g, dtype=dtype),
            "q_idx": coarse(B, S, G, d_idx, gen=g, dtype=dtype), "k_idx": coarse(B, S, d_idx, gen=g, dtype=dtype)}


def moe_inputs(T=10, d=32, f=32, E=4, k=2, seed=0, dtype=torch.float32):
    """``(x [T, d], w_gate_up [E, 2f, d], w_down [E, d, f], weights [T, k], ids [T, k])`` in ``dtype``:
    uniform weights and uniform ids (a row may name one expert twice)."""
    g = generator(seed)
    return (randn(T, d, gen=g, dtype=dtype), (randn(E, 2 * f, d, gen=g) * d ** -0.5).to(dtype),
            (randn(E, d, f, gen=g) * f ** -0.5).to(dtype), torch.rand(T, k, generator=g).to(DEVICE, dtype),
            torch.randint(0, E, (T, k), generator=g).to(DEVICE))
