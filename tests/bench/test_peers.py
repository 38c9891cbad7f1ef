"""Peers fetched from a wheel (SGLang's Triton MSA and fused MoE): the fetch script's extraction
list and folder layout, our stand-in helpers against brute force / torch, the adapters' layout
conversions, the suites without the peers folder, and -- where the folder exists -- SGLang's real
kernels against ours (interpreter: tiny shapes; GPU: moderate shapes).

Tests that need the peers folder skip without it, saying how to fetch it (CI clones have none).
"""
from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from tests.support.devices import DEVICE, ON_GPU, fresh_seed, generator, gpu_only, randn, relative_error, tol
from minimax_lab.bench import peers
from minimax_lab.moe.align import align_tokens

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "tools"


def _load_tool(name: str):
    spec = importlib.util.spec_from_file_location(f"_tool_{name}", TOOLS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


fetch = _load_tool("fetch_peers")
HAVE_PEERS, WHY_NOT = peers.status()
needs_peers = pytest.mark.skipif(not HAVE_PEERS, reason=f"needs the peers folder: {WHY_NOT}")


@pytest.fixture
def standins():
    """``peer_standin_kernels`` from tools/peer_standins (needs no peers folder)."""
    sys.path.insert(0, str(TOOLS / "peer_standins"))
    try:
        import peer_standin_kernels
        yield peer_standin_kernels
    finally:
        sys.path.remove(str(TOOLS / "peer_standins"))


# --------------------------------------------------------------------------- fetch script


def _fake_wheel_names():
    """One member per extraction pattern plus decoys that must not be extracted."""
    names = []
    for pattern in fetch.EXTRACT:
        names.append(pattern.replace("triton_*", "triton_3_6_0").replace("E=*", "E=8,N=16,device_name=X")
                     .replace("*", "common/utils"))
    return names + ["sglang/__init__.py", "sglang/srt/server_args.py", "sglang/srt/layers/moe/fused_moe_triton/layer.py",
                    "sglang/srt/layers/moe/moe_runner/triton_utils/configs/README.md",
                    "sglang/srt/rust_extensions/_server.cpython-311-x86_64-linux-gnu.so", "sglang/kernels/"]


def test_extraction_list_takes_only_the_kernel_files():
    names = _fake_wheel_names()
    picked = fetch.selected_members(names)
    assert len(picked) == len(fetch.EXTRACT)
    for decoy in ("sglang/__init__.py", "sglang/srt/server_args.py", "sglang/srt/layers/moe/fused_moe_triton/layer.py",
                  "sglang/srt/layers/moe/moe_runner/triton_utils/configs/README.md"):
        assert decoy not in picked
    assert not any(n.endswith((".so", "/")) for n in picked)


def test_extraction_list_fails_loudly_when_the_wheel_layout_changes():
    names = [n for n in _fake_wheel_names() if "moe_align_block_size" not in n]
    with pytest.raises(ValueError, match="moe_align_block_size"):
        fetch.selected_members(names)


def test_build_lays_out_kernels_standins_markers_and_version(tmp_path):
    wheel = tmp_path / "fake.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for n in _fake_wheel_names():
            if not n.endswith("/"):
                z.writestr(n, "# sglang file\n")
    dest = tmp_path / "peers"
    info = fetch.build(wheel, dest)
    assert info["sglang"] == fetch.SGLANG_VERSION
    assert json.loads((dest / "VERSION.json").read_text())["extracted"] == info["extracted"]
    assert not (dest / "sglang/srt/server_args.py").exists()
    for rel in fetch.standin_files():
        assert (dest / rel).read_bytes() == (fetch.STANDINS / rel).read_bytes()
    # every package folder is importable; config folders are not packages
    assert (dest / "sglang/srt/layers/attention/minimax_sparse_ops/__init__.py").exists()
    assert not (dest / "sglang/srt/layers/moe/moe_runner/triton_utils/configs/__init__.py").exists()
    assert (dest / "sglang/srt/utils/__init__.py").read_text().startswith('"""minimax-lab stand-in')
    fetch.build(wheel, dest)                                    # rebuilding a peers folder is fine
    other = tmp_path / "not_peers"
    other.mkdir()
    (other / "precious.txt").write_text("x")
    with pytest.raises(FileExistsError):
        fetch.build(wheel, other)
    assert (other / "precious.txt").exists()


def test_real_wheel_extraction_is_small_and_complete():
    wheel = Path.home() / ".cache" / "minimax-lab" / "wheels" / fetch.WHEEL_NAME
    if not wheel.exists():
        pytest.skip(f"the sglang wheel is not in the cache ({wheel}); `python tools/fetch_peers.py` downloads it")
    with zipfile.ZipFile(wheel) as z:
        picked = fetch.selected_members(z.namelist())
        size = sum(z.getinfo(n).file_size for n in picked)
    assert size < 4 * 2**20, f"{size / 2**20:.1f} MiB extracted: too large to carry"
    assert any(n.endswith("triton_3_6_0/E=128,N=768,device_name=NVIDIA_H200.json") for n in picked)
    assert all(n.startswith(("sglang/kernels/ops/", "sglang/srt/layers/", "sglang-")) for n in picked)


def test_peers_folder_is_ignored_by_git():
    try:
        res = subprocess.run(["git", "check-ignore", "-q", "peers/VERSION.json"], cwd=REPO, capture_output=True,
                             timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        pytest.skip(f"git unavailable: {e}")
    if res.returncode == 128:
        pytest.skip("not a git checkout")
    assert res.returncode == 0, "peers/ must be ignored by git (nothing of SGLang is committed)"


# --------------------------------------------------------------------------- stand-ins


def _sglang_buffers(n_slots: int, E: int, block: int, dev):
    """Buffers sized as SGLang's ``moe_align_block_size`` wrapper sizes them, poisoned."""
    cap = n_slots * block if n_slots < E + 1 else n_slots + (E + 1) * (block - 1)
    cap = (cap + 3) // 4 * 4
    return (torch.full((cap,), -7, dtype=torch.int32, device=dev),
            torch.full((math.ceil(cap / block),), -7, dtype=torch.int32, device=dev),
            torch.full((1,), -7, dtype=torch.int32, device=dev))


@pytest.mark.parametrize("T,k,E,block", [(1, 8, 128, 16), (13, 2, 5, 16), (40, 4, 8, 64), (700, 8, 64, 32)])
def test_moe_align_standin_matches_brute_force(standins, T, k, E, block):
    g = generator()
    ids = torch.randint(0, E, (T, k), generator=g).to(DEVICE)
    n = T * k
    sorted_ids, expert_ids, post = _sglang_buffers(n, E, block, DEVICE)
    standins.moe_align_block_size(ids, E + 1, block, sorted_ids, expert_ids, post,
                                  torch.empty(E + 2, dtype=torch.int32, device=DEVICE), True)
    flat = ids.reshape(-1).cpu()
    counts = torch.bincount(flat, minlength=E)
    padded = (counts + block - 1) // block * block
    assert int(post[0]) == int(padded.sum())
    rows, blocks = sorted_ids.cpu(), expert_ids.cpu()
    start = 0
    for e in range(E):                                   # each expert's rows: its slots, ascending, then padding
        want = torch.nonzero(flat == e).flatten()
        got = rows[start:start + int(padded[e])]
        assert torch.equal(got[:len(want)], want.to(torch.int32))
        assert (got[len(want):] == n).all()
        assert (blocks[start // block:(start + int(padded[e])) // block] == e).all()
        start += int(padded[e])
    assert (rows[start:] == n).all() and (blocks[start // block:] == -1).all()
    # the same layout as our own alignment
    al = align_tokens(ids, E, block)
    assert torch.equal(al.sorted_ids[:start].cpu(), rows[:start])


def test_moe_align_standin_large_batch_uses_the_torch_chain(standins):
    g = generator()
    E, block = 16, 64
    ids = torch.randint(0, E, (700, 8), generator=g).to(DEVICE)   # 5600 slots > one-launch limit
    sorted_ids, expert_ids, post = _sglang_buffers(ids.numel(), E, block, DEVICE)
    standins.moe_align_block_size(ids, E + 1, block, sorted_ids, expert_ids, post)
    al = align_tokens(ids, E, block)
    used = int(post[0])
    assert used == int(al.num_rows[0])
    assert torch.equal(sorted_ids[:used].cpu(), al.sorted_ids[:used].cpu())
    assert torch.equal(expert_ids[:used // block].cpu(), al.block_expert[:used // block].cpu())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_silu_and_mul_standin_equals_torch(standins, dtype):
    g = generator()
    x = randn(37, 2, 2 * 50, gen=g, dtype=dtype)[:, 1]            # non-contiguous rows
    got = standins.silu_and_mul(x)
    want = torch.nn.functional.silu(x[:, :50].float()) * x[:, 50:].float()
    assert got.shape == (37, 50) and got.dtype == dtype
    assert relative_error(got, want) < tol(dtype, exact=1e-5, tf32=False)
    out = torch.full((37, 50), float("nan"), dtype=dtype, device=DEVICE)
    assert standins.silu_and_mul(x, out) is out and relative_error(out, want) < tol(dtype, exact=1e-5, tf32=False)


def test_standins_refuse_what_they_do_not_implement(standins):
    x = torch.zeros(4, 8, device=DEVICE)
    with pytest.raises(NotImplementedError, match="row filter"):
        standins.silu_and_mul(x, expert_ids=torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="even"):
        standins.silu_and_mul(torch.zeros(4, 7, device=DEVICE))
    ids = torch.zeros(2, 2, dtype=torch.int32, device=DEVICE)
    with pytest.raises(NotImplementedError, match="ignore_invalid_expert"):
        standins.moe_align_block_size(ids, 3, 16, *_sglang_buffers(4, 2, 16, DEVICE), None, True, True)
    with pytest.raises(NotImplementedError, match="quantized"):
        standins.absent("scaled_fp8_quant", "quantized MoE is not part of the minimax-lab peer")()


# --------------------------------------------------------------------------- adapters: layouts, absence


def test_selection_layout_round_trip_and_set_comparison():
    from minimax_lab.bench import peer_sglang_msa as sgl

    g = generator()
    B, S, G, topk = 2, 5, 3, 4
    ours = torch.randint(0, 50, (B, S, G, topk), generator=g).to(torch.int32)
    ours[0, 0, 0, 2:] = -1
    theirs = sgl.selection_to_sglang(ours)
    assert theirs.shape == (G, B * S, topk)
    assert torch.equal(theirs[1, S + 2], ours[1, 2, 1])
    assert torch.equal(sgl.selection_to_ours(theirs, B, S), ours)
    shuffled = ours.flip(-1)                                     # same sets, other order
    assert sgl.selection_sets_equal(ours, shuffled).all()
    other = ours.clone()
    other[1, 4, 2, 0] += 1000
    eq = sgl.selection_sets_equal(ours, other)
    assert not eq[1, 4, 2] and eq.sum() == eq.numel() - 1
    with pytest.raises(ValueError, match="shape"):
        sgl.selection_sets_equal(ours, ours[..., :2])


def test_decode_plan_maps_positions_to_slots():
    from minimax_lab.bench import peer_sglang_msa as sgl

    bt = torch.tensor([[3, 0, 2], [1, -1, -1]], dtype=torch.int32)
    plan = sgl.decode_plan(bt, torch.tensor([40, 9], dtype=torch.int32), 16)
    assert plan.req_to_token.shape == (2, 48) and plan.max_seqlen == 40
    assert int(plan.req_to_token[0, 0]) == 48 and int(plan.req_to_token[0, 17]) == 1 and int(plan.req_to_token[0, 33]) == 33
    assert int(plan.req_to_token[1, 5]) == 21


def test_adapters_say_why_without_the_peers_folder(tmp_path, monkeypatch):
    from minimax_lab.bench import peer_sglang_msa as sgl
    from minimax_lab.bench import peer_sglang_moe as peer_sglang

    monkeypatch.setenv(peers.ENV_VAR, str(tmp_path / "nowhere"))
    for mod in (sgl, peer_sglang):
        ok, why = mod.available()
        assert not ok and "fetch_peers.py" in why and "nowhere" in why
    assert peers.sglang_version() is None
    q = torch.zeros(1, 4, 2, 16, dtype=torch.bfloat16)
    with pytest.raises(peers.PeerUnavailable, match="fetch_peers"):
        sgl.prefill(q, q[:, :, :1], q[:, :, :1], q[:, :, :1], q[:, :, 0])
    bf = dict(dtype=torch.bfloat16)
    with pytest.raises(peers.PeerUnavailable):
        peer_sglang.fused_experts(torch.zeros(4, 16, **bf), torch.zeros(2, 8, 16, **bf), torch.zeros(2, 16, 4, **bf),
                                  torch.ones(4, 1, **bf), torch.zeros(4, 1, dtype=torch.int64))


def test_msa_suite_records_an_absent_peer(tmp_path, monkeypatch):
    from minimax_lab.bench import suite_msa_prefill as msa_bench, suite_msa_peer as msa_bench_peer

    monkeypatch.setenv(peers.ENV_VAR, str(tmp_path))
    status = msa_bench_peer.peer_status()
    assert not status["available"] and status["sglang"] is None
    notes = {}
    assert msa_bench._sglang_prefill(status, {}, None, None, {}, reps=1, notes=notes) == ({}, {})
    assert notes[msa_bench_peer.PEER].startswith("absent: ") and "fetch_peers" in notes[msa_bench_peer.PEER]


def test_moe_suite_records_an_absent_peer(tmp_path, monkeypatch):
    from minimax_lab.bench import suite_moe as bench_suite

    monkeypatch.setenv(peers.ENV_VAR, str(tmp_path))
    assert bench_suite.peer_status(torch.bfloat16)["reason"].startswith("absent: ")
    recs = bench_suite.run_shape(bench_suite.CPU_SHAPES[0], [1], reps=1, with_loop=False)
    assert recs and all(r["peer_notes"][bench_suite.PEER].startswith("absent: ") for r in recs)
    assert not any(r["impl"].startswith(bench_suite.PEER) for r in recs)


def test_bench_peers_summary_pairs_ours_with_sglang():
    tool = _load_tool("bench_peers")
    recs = [{"suite": "msa", "case": "prefill_s32768", "impl": "triton_kv", "ms": 10.0},
            {"suite": "msa", "case": "prefill_s32768", "impl": "sglang_triton", "ms": 25.0},
            {"suite": "moe", "case": "E128_k8_d2048_f768_T1", "impl": "triton_cudagraph", "ms": 0.05},
            {"suite": "moe", "case": "E128_k8_d2048_f768_T1", "impl": "sglang_triton_cudagraph", "ms": 0.04},
            {"suite": "moe", "case": "E128_k8_d2048_f768_T1", "impl": "triton", "ms": 0.4,
             "peer_notes": {"sglang_triton": "absent: x"}}]
    text = tool.summary(recs)
    assert "prefill end to end" in text and "2.50x" in text and "0.80x" in text and "absent: x" in text
    budget = tool.Budget(10.0)
    assert budget.allows("small", 1.0) and not budget.allows("huge", 100.0) and budget.skipped == ["huge"]


# --------------------------------------------------------------------------- SGLang's real kernels


def _prefill_case(s, B, S, dtype, seed):
    from minimax_lab.bench import suite_msa_inputs as msa_bench

    return msa_bench.prefill_inputs(s, S, DEVICE, dtype, seed=seed, B=B)


def _check_msa(s, B, S, L_dec, dtype, rows):
    """SGLang vs ours (selection sets, outputs) and both vs float64 brute force, prefill and decode."""
    from minimax_lab.bench import suite_msa_inputs as msa_bench, suite_msa_peer as msa_bench_peer
    from minimax_lab.attention.msa import msa_attention, msa_decode_paged, msa_select

    msa_bench_peer.SAMPLED_ROWS = rows
    fresh = fresh_seed() % 10_000
    ins = _prefill_case(s, B, S, dtype, seed=fresh)
    kw = dict(block_size=s["Bk"], topk=s["topk"])
    impl = "triton" if ON_GPU else "torch"
    sel = msa_select(ins["q_idx"], ins["k_idx"], impl=impl, **kw)
    o = msa_attention(**ins, impl=impl, selected=sel, **kw)
    pre = msa_bench_peer.check_prefill(ins, sel_ours=sel, o_ours=o, **kw)
    dins = msa_bench.decode_inputs(s, 3, L_dec, DEVICE, dtype, seed=fresh + 1)
    dins["seq_lens"] = torch.tensor([L_dec, s["Bk"] + 1, 5], dtype=torch.int32, device=DEVICE)
    od, seld = msa_decode_paged(**dins, topk=s["topk"], impl=impl, return_selected=True)
    dec = msa_bench_peer.check_decode(dins, topk=s["topk"], sel_ours=seld, o_ours=od)
    for check in (pre, dec):                                     # check_* raise on failure; these say how close
        assert check["selection_sets_equal"] >= msa_bench_peer.MIN_SETS_EQUAL, (fresh, check)
        assert check["sglang_triton_rel_err_fp64"] < tol(dtype), (fresh, check)


@needs_peers
@pytest.mark.slow
@pytest.mark.skipif(ON_GPU, reason="the GPU test below covers this at a real shape")
def test_sglang_msa_kernels_in_the_interpreter_match_ours():
    # tiny: every SGLang top-k program is a bitonic sort that the interpreter runs for seconds
    s = dict(Hq=2, G=1, D=32, Didx=16, Bk=16, topk=2)
    _check_msa(s, B=2, S=33, L_dec=70, dtype=torch.float16, rows=6)


@needs_peers
@pytest.mark.parametrize("T,k", [(40, 4), (3, 2)])
def test_sglang_fused_moe_matches_the_reference(T, k):
    from minimax_lab.bench import peer_sglang_moe as peer_sglang
    from minimax_lab.moe.experts_reference import experts_reference
    from minimax_lab.moe.router import route_softmax

    g = generator()
    E, d, f = (128, 512, 256) if ON_GPU else (8, 64, 48)
    dtype = torch.bfloat16 if ON_GPU else torch.float16
    w_gate_up = randn(E, 2 * f, d, gen=g, dtype=dtype) / d ** 0.5
    w_down = randn(E, d, f, gen=g, dtype=dtype) / f ** 0.5
    x = randn(T, d, gen=g, dtype=dtype)
    weights, ids = route_softmax(randn(T, E, gen=g), k)
    got = peer_sglang.fused_experts(x, w_gate_up, w_down, weights.to(dtype), ids)
    want = experts_reference(x, w_gate_up.float(), w_down.float(), weights, ids)
    assert got.shape == (T, d) and got.dtype == dtype
    assert relative_error(got, want.float()) < tol(dtype)
    calls = peer_sglang.standin_calls(x, w_gate_up, w_down, weights, ids)
    assert set(calls) == ({"align", "silu_and_mul", "moe_sum_reduce"} if T > 32 and k > 2 else {"align", "silu_and_mul"})


@needs_peers
@gpu_only
def test_sglang_msa_matches_ours_on_the_gpu():
    s = dict(Hq=16, G=2, D=128, Didx=128, Bk=128, topk=16)
    _check_msa(s, B=2, S=4096 + 77, L_dec=20_000 + 3, dtype=torch.bfloat16, rows=32)


@needs_peers
@gpu_only
def test_sglang_peers_replay_under_cuda_graphs():
    from minimax_lab.bench import suite_msa_inputs as msa_bench
    from minimax_lab.bench import peer_sglang_msa as sgl
    from minimax_lab.bench import peer_sglang_moe as peer_sglang
    from minimax_lab.moe.router import route_softmax

    s = dict(Hq=16, G=2, D=128, Didx=128, Bk=128, topk=16)
    ins = msa_bench.decode_inputs(s, 4, 9000, DEVICE, torch.bfloat16, seed=7)
    plan = sgl.decode_plan(ins["block_table"], ins["seq_lens"], s["Bk"])
    g = generator()
    E, d, f, T = 64, 512, 256, 48
    w13, w2 = randn(E, 2 * f, d, gen=g, dtype=torch.bfloat16), randn(E, d, f, gen=g, dtype=torch.bfloat16) / 16
    x = randn(T, d, gen=g, dtype=torch.bfloat16)
    weights, ids = peer_sglang.routing(*route_softmax(randn(T, E, gen=g), 8))
    calls = {"msa": lambda: sgl.decode(ins["q"], ins["k_cache"], ins["v_cache"], ins["q_idx"], ins["k_idx_cache"], plan),
             "moe": lambda: peer_sglang.fused_experts(x, w13, w2, weights, ids, check=False)}
    for name, call in calls.items():
        eager = call()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            call()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = call()
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert relative_error(out, eager) < 1e-6, name
