"""minimax-lab stand-in for ``sglang.srt.environ``: the switches the extracted kernel files read,
fixed at the values the bench runs them with (the process environment is not consulted).

``SGLANG_OPT_USE_MINIMAX_DECODE_TOPK_RADIX`` is False: SGLang's default decode top-k is a JIT-compiled
CUDA radix-select kernel that needs SGLang's build stack, so its Triton two-stage top-k runs instead.
Any other name raises ``AttributeError``, so a new dependence shows up at once.
"""


class _Fixed:
    def __init__(self, value):
        self._value = value

    def get(self):
        return self._value


class _Envs:
    SGLANG_USE_AITER = _Fixed(False)
    SGLANG_OPT_USE_MINIMAX_DECODE_TOPK_RADIX = _Fixed(False)
    SGLANG_EXPERIMENTAL_LORA_OPTI = _Fixed(False)
    SGLANG_OPT_USE_MINIMAX_GLUON_PREFILL = _Fixed(False)


envs = _Envs()
