"""minimax-lab stand-in for ``sglang.srt.layers.moe.utils``: no weight padding, Triton runner."""


def get_moe_padding_size(is_aiter_moe=False) -> int:
    return 0


def get_moe_runner_backend():
    class _Triton:
        @staticmethod
        def is_triton() -> bool:
            return True
    return _Triton()
