"""minimax-lab stand-in for ``sglang.srt.utils.custom_op``: SGLang registers these functions as
torch custom ops (for ``torch.compile``); here the decorator returns the function unchanged."""


def register_custom_op(fn=None, **_options):
    if fn is None:
        return lambda f: f
    return fn
