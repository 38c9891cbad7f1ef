"""Every operator's Triton launcher chooses a kernel and a config that exist on the GPU a learner
has: a Colab T4 (sm_75: fp16 only, 64 KB of shared memory per block), an L4 (sm_89: FP8, no TMA),
an A100 (sm_80: bf16, no FP8 or TMA), an H100 and the H200 (sm_90: all of it).

Each test makes the runtime answer as on one of them (:func:`tests.support.gpus.fake_gpu`), calls
the launchers on CPU tensors of production-like shapes and records what each would launch --
kernel, constexprs, warps, stages, grid and argument dtypes -- instead of launching it. A launch
fails the test where it needs a feature the GPU lacks (bf16, FP8, TMA) or more shared memory per
block than the GPU has, by the estimate its launch block gives (:attr:`minimax_lab.configs.Launch.smem`).
A launcher that cannot run there must refuse before launching (``UnsupportedOnDevice``).

The file sweeps every operator at once on purpose: the matrix is GPUs x launchers, one rule (what a
GPU has), and a launcher missing from it is what the sweep exists to catch."""
from __future__ import annotations

import inspect
import re
import tokenize
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path

import pytest
import torch
from triton.runtime.jit import KernelInterface
from triton.tools.tensor_descriptor import TensorDescriptor

from minimax_lab import configs, runtime
from minimax_lab.attention import dense_triton, msa_triton_decode, msa_triton_prefill, msa_triton_select
from minimax_lab.fp8 import FP8
from minimax_lab.kernelbench import ops_triton
from minimax_lab.paged_kv import decode_triton, prefill_triton, write_triton
from minimax_lab.moe import align_triton, experts_triton
from tests.support.gpus import GPUS, KB, fake_gpu

KERNEL_MODULES = (dense_triton, msa_triton_decode, msa_triton_prefill, msa_triton_select, decode_triton,
                  prefill_triton, write_triton, experts_triton, align_triton, ops_triton)
LAUNCH_BLOCKS = [v for m in KERNEL_MODULES for v in vars(m).values() if isinstance(v, configs.Launch)]
#: kernel name -> shared-memory estimate, from every launch block
ESTIMATES = {name: est for block in LAUNCH_BLOCKS for name, est in block.smem.items()}
PACKAGE = Path(runtime.__file__).resolve().parent


@dataclass
class Launch:
    """One recorded launch: the kernel's name, its grid and its arguments by name (constexprs,
    ``num_warps`` and ``num_stages`` included, defaults filled in)."""
    kernel: str
    grid: tuple
    args: dict = field(default_factory=dict)
    uses_dot: bool = False


def _python_fn(kernel):
    """The Python function under a Triton kernel (an autotuner or heuristics wraps a JITFunction)."""
    fn = kernel.fn
    while not inspect.isfunction(fn):
        fn = fn.fn
    return fn


def _calls_dot(kernel: KernelInterface, seen: set | None = None) -> bool:
    """Whether ``kernel`` or a ``@triton.jit`` function it calls uses ``tl.dot``."""
    seen = set() if seen is None else seen
    seen.add(id(kernel))
    src = inspect.getsource(_python_fn(kernel))
    if "tl.dot(" in src:
        return True
    for name, value in _python_fn(kernel).__globals__.items():
        if (isinstance(value, KernelInterface) and id(value) not in seen
                and re.search(rf"\b{re.escape(name)}\(", src) and _calls_dot(value, seen)):
            return True
    return False


@pytest.fixture
def recorded(monkeypatch) -> list[Launch]:
    """Every kernel of the kernel modules records its launches here instead of running."""
    out: list[Launch] = []
    for module in KERNEL_MODULES:
        for value in vars(module).values():
            if isinstance(value, KernelInterface) and hasattr(value, "fn"):
                monkeypatch.setattr(value, "run", _recorder(value, out))
    return out


def _recorder(kernel, out):
    params = inspect.signature(_python_fn(kernel)).parameters
    defaults = {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}
    dot = _calls_dot(kernel)

    def run(*args, grid, warmup, **kwargs):
        named = {**defaults, "num_warps": 4, "num_stages": 3, **dict(zip(kernel.arg_names, args)), **kwargs}
        g = grid(named) if callable(grid) else grid
        out.append(Launch(_python_fn(kernel).__name__, tuple(g), named, dot))
    return run


def launch_problems(launch: Launch, caps: runtime.Capabilities) -> list[str]:
    """What keeps ``launch`` from existing on ``caps``'s GPU ([] when nothing does)."""
    problems = []
    tensors = {n: v for n, v in launch.args.items() if isinstance(v, torch.Tensor)}
    for name, t in tensors.items():
        if t.dtype == torch.bfloat16 and not caps.bf16:
            problems.append(f"{launch.kernel}: {name} is bf16, {caps.name} has no bf16")
        if t.dtype == FP8 and not caps.fp8:
            problems.append(f"{launch.kernel}: {name} is float8_e4m3fn, {caps.name} has no FP8")
    uses_tma = launch.args.get("USE_TMA") or any(isinstance(v, TensorDescriptor) for v in launch.args.values())
    if uses_tma and not caps.tma:
        problems.append(f"{launch.kernel}: TMA descriptors, {caps.name} has no TMA")
    if launch.args["num_warps"] not in (1, 2, 4, 8, 16, 32) or launch.args["num_stages"] < 1:
        problems.append(f"{launch.kernel}: num_warps={launch.args['num_warps']}, num_stages={launch.args['num_stages']}")
    if not launch.grid or min(launch.grid) < 1:
        problems.append(f"{launch.kernel}: empty grid {launch.grid}")
    if launch.kernel in ESTIMATES:
        need = ESTIMATES[launch.kernel](launch.args)
        if need > caps.smem_per_block:
            problems.append(f"{launch.kernel}: needs ~{need // KB} KB of shared memory per block (estimate), "
                            f"{caps.name} has {caps.smem_per_block // KB} KB")
    elif launch.uses_dot:
        problems.append(f"{launch.kernel} calls tl.dot but no launch block estimates its shared memory")
    return problems


# --- the operators at production-like shapes (CPU tensors: nothing runs) ----------------------------

def _paged(B, pages_per_seq, page, Hkv, D, dtype, fp8=False):
    n_pages = B * pages_per_seq
    cache_dtype = FP8 if fp8 else dtype
    k = torch.zeros(n_pages, page, Hkv, D, dtype=cache_dtype)
    v = torch.zeros(n_pages, page, Hkv, D, dtype=cache_dtype)
    table = torch.arange(n_pages, dtype=torch.int32).view(B, pages_per_seq)
    scales = dict(k_scale=torch.ones(n_pages, page, Hkv), v_scale=torch.ones(n_pages, page, Hkv)) if fp8 else {}
    return k, v, table, scales


def paged_decode(dtype, fp8=False):
    k, v, table, scales = _paged(2, 128, 16, 8, 128, dtype, fp8)    # 2048 tokens: the context is split
    q = torch.zeros(2, 32, 128, dtype=dtype)
    decode_triton.paged_decode_triton(q, k, v, table, torch.tensor([2000, 2048], dtype=torch.int32), **scales)


def paged_prefill(dtype, fp8=False):
    k, v, table, scales = _paged(1, 16, 16, 8, 128, dtype, fp8)
    q = torch.zeros(1, 64, 32, 128, dtype=dtype)
    prefill_triton.paged_prefill_triton(q, k, v, table, torch.tensor([256], dtype=torch.int32), **scales)


def write_kv(dtype, fp8=False):
    k, v, _, scales = _paged(1, 16, 16, 8, 128, dtype, fp8)
    new = torch.zeros(8, 8, 128, dtype=dtype)
    write_triton.write_kv_triton(new, new, k, v, torch.arange(8), **scales)


def _index(S, dtype, fp8):
    q_idx, k_idx = torch.zeros(1, S, 4, 128, dtype=dtype), torch.zeros(1, S, 128, dtype=dtype)
    if not fp8:
        return dict(q_idx=q_idx, k_idx=k_idx)
    return dict(q_idx=q_idx.to(FP8), k_idx=k_idx.to(FP8), k_idx_scale=torch.ones(1, S))


def msa_select(dtype, fp8=False):
    msa_triton_select.msa_select_triton(**_index(17 * 128, dtype, fp8), block_size=128, topk=16)


def msa_prefill(dtype, fp8=False):
    S, Bk, topk = 130, 128, 16
    q = torch.zeros(1, S, 64, 128, dtype=dtype)
    kv = torch.zeros(1, S, 4, 128, dtype=dtype)
    local = torch.arange(S) // Bk                                  # every visible block, local last
    slot = torch.arange(topk)
    sel = torch.where(slot[None, :] <= local[:, None], slot[None, :], -1).to(torch.int32)
    sel = sel[None, :, None, :].expand(1, S, 4, topk).contiguous()
    idx = _index(S, dtype, fp8)
    msa_triton_prefill.msa_attention_triton(q, kv, kv, idx["q_idx"], idx["k_idx"], block_size=Bk, topk=topk,
                                            selected=sel, k_idx_scale=idx.get("k_idx_scale"))


def msa_decode(dtype, fp8=False):
    B, pages, page, G = 2, 20, 128, 4
    k, v, table, scales = _paged(B, pages, page, G, 128, dtype, fp8)
    k_idx = torch.zeros(B * pages, page, 128, dtype=FP8 if fp8 else dtype)
    idx_scale = torch.ones(B * pages, page) if fp8 else None
    q, q_idx = torch.zeros(B, 1, 64, 128, dtype=dtype), torch.zeros(B, 1, G, 128, dtype=dtype)
    msa_triton_decode.msa_decode_paged_triton(q, k, v, table, torch.tensor([2500, 2560], dtype=torch.int32), q_idx,
                                              k_idx, topk=16, k_idx_scale=idx_scale, **scales)


def flash(dtype, fp8=False):
    q = torch.zeros(1, 256, 16, 128, dtype=dtype)
    dense_triton.flash_attention(q, q, q, causal=True, config=dense_triton.DEFAULT_CONFIG)


MOE = dict(E=16, k=8, d=2048, f=768)
MOE_TOKENS = (1, 16, 48, 128, 640)     # slot blocks, decode, decode_wide, prefill, prefill alignment


def _moe_weights(dtype, fp8):
    E, d, f = MOE["E"], MOE["d"], MOE["f"]
    wgu, wd = torch.zeros(E, 2 * f, d, dtype=FP8 if fp8 else dtype), torch.zeros(E, d, f, dtype=FP8 if fp8 else dtype)
    scales = dict(w_gate_up_scale=torch.ones(E, 2 * f), w_down_scale=torch.ones(E, d)) if fp8 else {}
    return wgu, wd, scales


def moe_experts(dtype, fp8=False):
    wgu, wd, scales = _moe_weights(dtype, fp8)
    for T in MOE_TOKENS:
        ids = (torch.arange(T * MOE["k"]) % MOE["E"]).view(T, MOE["k"])
        experts_triton.experts_triton(torch.zeros(T, MOE["d"], dtype=dtype), wgu, wd, torch.ones(T, MOE["k"]),
                                      ids, **scales)


def alignment(dtype, fp8=False):
    ids = (torch.arange(4096 * 8) % 128).view(-1, 8)
    align_triton.align_decode(ids[:64], 128, 16)
    align_triton.align_tokens_triton(ids[:64], 128, 16)
    align_triton.align_prefill(ids, 128, 128)


def kernelbench(dtype, fp8=False):
    ops_triton.softmax_triton(torch.zeros(4, 1000, dtype=dtype))
    x = torch.zeros(4, 2048, dtype=dtype)
    ops_triton.rmsnorm_residual_triton(x, x, torch.ones(2048, dtype=dtype))
    ops_triton.rope_triton(torch.zeros(1, 4, 8, 128, dtype=dtype), torch.arange(4).view(1, 4))


OPERATORS = {"paged_decode": paged_decode, "paged_prefill": paged_prefill, "write_kv": write_kv,
             "msa_select": msa_select, "msa_prefill": msa_prefill, "msa_decode": msa_decode, "flash": flash,
             "moe_experts": moe_experts, "alignment": alignment, "kernelbench": kernelbench}
#: operators with an FP8 variant (FP8 caches, index tensors or expert weights; the prefill's FP8
#: index tensors are the selection's, msa_select)
FP8_OPERATORS = ("paged_decode", "paged_prefill", "write_kv", "msa_select", "msa_decode", "moe_experts")


@pytest.mark.parametrize("gpu", list(GPUS))
@pytest.mark.parametrize("operator", list(OPERATORS))
def test_every_launch_exists_on_the_gpu(gpu, operator, monkeypatch, recorded):
    caps = GPUS[gpu]
    fake_gpu(monkeypatch, caps)
    OPERATORS[operator](runtime.compute_dtype())
    assert recorded, f"{operator} launched nothing"
    problems = [p for launch in recorded for p in launch_problems(launch, caps)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("gpu", list(GPUS))
@pytest.mark.parametrize("operator", FP8_OPERATORS)
def test_fp8_variants_launch_where_the_gpu_has_fp8_and_refuse_elsewhere(gpu, operator, monkeypatch, recorded):
    caps = GPUS[gpu]
    fake_gpu(monkeypatch, caps)
    if not caps.fp8:
        with pytest.raises(runtime.UnsupportedOnDevice, match="FP8.*compute capability 8.9"):
            OPERATORS[operator](runtime.compute_dtype(), fp8=True)
        assert not any(launch.args.get(n) is not None and getattr(launch.args[n], "dtype", None) == FP8
                       for launch in recorded for n in launch.args), "an FP8 tensor reached a launch"
        return
    OPERATORS[operator](runtime.compute_dtype(), fp8=True)
    assert any(isinstance(v, torch.Tensor) and v.dtype == FP8 for launch in recorded for v in launch.args.values())
    problems = [p for launch in recorded for p in launch_problems(launch, caps)]
    assert not problems, "\n".join(problems)


def test_each_gpu_computes_in_its_own_dtype_and_takes_its_own_paths(monkeypatch, recorded):
    """fp16 on the T4 and bf16 elsewhere; TMA only on Hopper (flash's fixed config, MoE prefill);
    the KV-outer MSA prefill where its K/V block fits, the query-outer one on the T4; the decode
    splits sized by each GPU's SM count."""
    for gpu, caps in GPUS.items():
        fake_gpu(monkeypatch, caps)
        assert runtime.compute_dtype() == (torch.bfloat16 if gpu != "T4" else torch.float16)
        dtype = runtime.compute_dtype()
        recorded.clear()
        flash(dtype)
        assert recorded[0].args["USE_TMA"] == caps.tma, gpu
        recorded.clear()
        moe_experts(dtype)
        prefill_gemm = [launch for launch in recorded if launch.kernel == "_gate_up_kernel"][-1]
        assert prefill_gemm.args["USE_TMA"] == caps.tma, gpu
        recorded.clear()
        msa_prefill(dtype)
        assert {launch.kernel for launch in recorded} >= {"_query_outer_kernel" if gpu == "T4" else "_kv_outer_kernel"}
        recorded.clear()
        paged_decode(dtype)
        splits = recorded[0].grid[1]
        assert splits == decode_triton.choose_num_splits(
            2, 8, 2048, sms=caps.sm_count, block_n=recorded[0].args["BLOCK_N"],
            programs_per_sm=configs.launch_config(decode_triton.LAUNCH)["programs_per_sm"]), gpu


def test_bf16_inputs_on_a_gpu_without_bf16_are_refused_before_any_launch(monkeypatch, recorded):
    fake_gpu(monkeypatch, GPUS["T4"])
    for operator in ("paged_decode", "flash", "msa_select", "moe_experts", "kernelbench"):
        with pytest.raises(runtime.UnsupportedOnDevice, match="needs bf16: compute capability 8.0 or newer; this "
                                                               "Tesla T4 is sm_75"):
            OPERATORS[operator](torch.bfloat16)
    assert not recorded


def test_the_flash_autotuner_keeps_only_configs_that_fit(monkeypatch):
    """On the GPU the flash kernel autotunes: its configs are pruned to those whose estimate fits
    (the Hopper rows where they fit, the small-device rows where none does); on the H200 every
    Hopper row stays, as before."""
    q = torch.zeros(1, 256, 16, 128, dtype=torch.bfloat16)
    every = dense_triton.AUTOTUNE_CONFIGS + dense_triton._configs(dense_triton.SMALL_DEVICE_ROWS, tma=False)
    for gpu, caps in GPUS.items():
        fake_gpu(monkeypatch, caps)
        q = q.to(runtime.compute_dtype())
        kept = dense_triton.fitting_configs(every, {"Q": q}, BLOCK_D=128)
        assert kept, gpu
        for c in kept:
            assert dense_triton._flash_smem({"Q": q, "BLOCK_D": 128, **c.kwargs, "num_stages": c.num_stages}) \
                <= caps.smem_per_block, (gpu, c)
        if gpu in ("H100", "H200"):
            assert kept == dense_triton.AUTOTUNE_CONFIGS
        if gpu in ("T4", "L4"):
            assert all(dense_triton._config_key(c) in {dense_triton._row_key(r) for r in dense_triton.SMALL_DEVICE_ROWS}
                       for c in kept)


def test_the_check_fails_a_launch_that_does_not_exist_on_the_gpu(monkeypatch, recorded):
    """The checks above can fail: the H200's launches taken to smaller GPUs are flagged for their
    shared memory, their TMA and their dtypes; a dot kernel without an estimate is flagged too."""
    fake_gpu(monkeypatch, GPUS["H200"])
    flash(torch.bfloat16)
    moe_experts(torch.bfloat16)
    h200 = list(recorded)
    assert not [p for launch in h200 for p in launch_problems(launch, GPUS["H200"])]
    t4 = [p for launch in h200 for p in launch_problems(launch, GPUS["T4"])]
    assert any("_flash_fwd: needs ~224 KB of shared memory per block (estimate), Tesla T4 has 64 KB" in p for p in t4)
    assert any("TMA descriptors" in p for p in t4) and any("is bf16" in p for p in t4)
    a100 = [p for launch in h200 for p in launch_problems(launch, GPUS["A100"])]
    assert any("_gate_up_kernel: needs" in p for p in a100) and any("TMA" in p for p in a100)
    assert not any("bf16" in p for p in a100)
    fake_gpu(monkeypatch, GPUS["L4"])
    recorded.clear()
    msa_select(torch.bfloat16, fp8=True)
    fp8 = recorded[0]
    assert launch_problems(fp8, GPUS["L4"]) == []
    assert any("has no FP8" in p for p in launch_problems(fp8, GPUS["A100"]))
    nameless = Launch("_some_dot_kernel", (1,), {"num_warps": 4, "num_stages": 2}, uses_dot=True)
    assert launch_problems(nameless, GPUS["H200"]) == ["_some_dot_kernel calls tl.dot but no launch block "
                                                       "estimates its shared memory"]


def test_every_launched_dot_kernel_has_an_estimate(monkeypatch, recorded):
    fake_gpu(monkeypatch, GPUS["H200"])
    for operator in OPERATORS.values():
        operator(torch.bfloat16)
    for operator in FP8_OPERATORS:
        OPERATORS[operator](torch.bfloat16, fp8=True)
    dot = {launch.kernel for launch in recorded if launch.uses_dot}
    assert dot == set(ESTIMATES) - {"_query_outer_kernel"}   # the H200 runs the KV-outer schedule
    assert {"_merge_splits_kernel", "_combine_kernel", "_align_sort_kernel"} <= \
        {launch.kernel for launch in recorded if not launch.uses_dot}


# --- nothing outside runtime.py and configs/ asks the hardware or hard-codes its numbers ------------

#: code (comments and strings stripped) that reads the hardware or hard-codes what it has
HARDWARE_PATTERNS = {
    "a capability read": r"get_device_capability|get_device_properties|multi_processor_count|"
                         r"shared_memory_per_block|max_shared_mem|\.major\b|\.minor\b",
    "a capability comparison": r"\bmajor\s*[<>=]=?\s*\d|\(\s*[6-9]\s*,\s*\d\s*\)\s*[<>]|[<>]=?\s*\(\s*[6-9]\s*,\s*\d\s*\)",
    "an SM count": r"\b(132|108|114)\b",
    "a shared-memory size": r"\b(232448|166912|101376|227\s*\*\s*1024|228\s*\*\s*1024|163\s*\*\s*1024|99\s*\*\s*1024)\b",
}


def _code_only(path: Path) -> str:
    """``path``'s source without comments and string literals (docstrings included)."""
    out = []
    for tok in tokenize.generate_tokens(StringIO(path.read_text()).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.STRING):
            out.append(tok.string)
    return " ".join(out)


def hardware_checks(root: Path = PACKAGE) -> list[str]:
    """``file: what`` for every source file outside ``runtime.py`` and ``configs/`` whose code
    reads the hardware's capabilities or hard-codes an SM count or a shared-memory size."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == "runtime.py" or rel.startswith("configs/"):
            continue
        code = _code_only(path)
        found += [f"{rel}: {what}" for what, pattern in HARDWARE_PATTERNS.items() if re.search(pattern, code)]
    return found


def test_no_source_outside_runtime_and_configs_checks_the_hardware():
    assert hardware_checks() == []


def test_the_hardware_grep_finds_what_it_looks_for(tmp_path):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "ok.py").write_text("SMEM = 232448\n")
    (tmp_path / "runtime.py").write_text("props.multi_processor_count\n")
    (tmp_path / "kernel.py").write_text('"""132 SMs in a docstring is fine"""\n# 227 KB in a comment too\n'
                                        "want = 4 * 132\nif torch.cuda.get_device_capability()[0] >= 9: pass\n"
                                        "ok = cap >= (8, 9)\nlimit = 227 * 1024\n")
    assert hardware_checks(tmp_path) == ["kernel.py: a capability read", "kernel.py: a capability comparison",
                                         "kernel.py: an SM count", "kernel.py: a shared-memory size"]


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_chapter_02s_steps_fit_each_gpu(monkeypatch, gpu):
    """Chapter 02's live steps: TMA steps only where TMA exists, and every step's tiles fit the
    device's shared memory; the H100/H200 run every step, the T4 none of the 128-row ones."""
    from minimax_lab.bench import suite_attention

    caps = GPUS[gpu]
    fake_gpu(monkeypatch, caps)
    steps = suite_attention.steps_for("gpu")
    assert all(not cfg.get("USE_TMA") for cfg in steps.values()) or caps.tma
    if gpu in ("H100", "H200"):
        assert list(steps) == list(suite_attention.STEP_CONFIGS["gpu"])
    if gpu == "T4":
        assert not any(cfg["BLOCK_M"] == 128 and cfg["num_stages"] == 3 for cfg in steps.values())
