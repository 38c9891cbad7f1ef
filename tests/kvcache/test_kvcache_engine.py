"""Engine slice: paged generation equals the model's full forward; prefix caching changes only the work.
The model and its page pool live on the kernel device, so on a GPU the engine's decode step runs
the compiled paged-decode kernel (fp32, TF32 dots: the greedy tokens' top-2 logit margins of
this model are >= 5e-3, far above the ~1e-4 a TF32 attention output moves them)."""
import pytest
import torch
from tests.support.devices import DEVICE, generator

from minimax_lab.engine.slice import PagedEngine, agent_session_chunks, run_agent_session
from minimax_lab.model import ModelConfig, TinyMultimodalModel


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64)
    return TinyMultimodalModel(cfg).to(DEVICE).eval()


def test_paged_generation_matches_full_forward(model):
    g = generator(1)
    prompt = torch.randint(4, model.cfg.vocab_size, (37,), generator=g).tolist()
    eng = PagedEngine(model, num_pages=16, page_size=8)
    assert eng.kv.layer(0)[0].device.type == DEVICE.type  # the pool follows the model
    out = eng.generate("a", prompt, 6, keep=True)
    seq = prompt + out
    with torch.no_grad():
        full = model(torch.tensor([seq], device=DEVICE))[0]
    assert out == full[len(prompt) - 1:-1].argmax(-1).tolist()       # greedy on the full forward
    eng.free("a")
    # a second request sharing the prompt: cached prefix, same output
    eng.stats.prefill_tokens = 0
    assert eng.generate("b", prompt, 6) == out
    assert eng.stats.prefill_tokens == len(prompt) - (len(prompt) - 1) // 8 * 8


@pytest.mark.parametrize("page_size", [4, 16])
def test_agent_session_prefix_caching(model, page_size):
    base, turns = agent_session_chunks(5, vocab_size=model.cfg.vocab_size, base_tokens=200, turn_tokens=(10, 40))
    on = run_agent_session(PagedEngine(model, num_pages=512, page_size=page_size), base, turns, new_tokens=4)
    off = run_agent_session(PagedEngine(model, num_pages=512, page_size=page_size, prefix_caching=False), base,
                            turns, new_tokens=4)
    assert on["outputs"] == off["outputs"]
    assert off["cached_tokens"] == 0
    assert on["prefill_tokens"] < off["prefill_tokens"] / 2
    assert on["prefill_tokens"] + on["cached_tokens"] == off["prefill_tokens"]


@pytest.mark.parametrize("impl", ["reference", "torch", "triton"])
def test_kernel_choice(model, impl, monkeypatch):
    """Every impl generates the same tokens, and the engine's attention goes through the package's
    paged kernels: write_kv for every new token, paged_prefill for the prompt, paged_decode after."""
    import minimax_lab.engine.slice as sl
    calls = {"write_kv": 0, "paged_prefill": 0, "paged_decode": 0}
    for name in calls:
        real = getattr(sl, name)
        monkeypatch.setattr(sl, name, lambda *a, _real=real, _name=name, **kw: calls.__setitem__(
            _name, calls[_name] + 1) or _real(*a, **kw))
    prompt = list(range(4, 30))
    a = PagedEngine(model, num_pages=16, page_size=8).generate("x", prompt, 4)
    layers = model.cfg.n_layers
    assert calls == {"write_kv": 4 * layers, "paged_prefill": layers, "paged_decode": 3 * layers}
    b = PagedEngine(model, num_pages=16, page_size=8, impl=impl).generate("x", prompt, 4)
    assert a == b
    with pytest.raises(ValueError, match="impl"):
        PagedEngine(model, impl="nope")
