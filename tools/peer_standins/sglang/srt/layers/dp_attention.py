"""minimax-lab stand-in for ``sglang.srt.layers.dp_attention``: no data-parallel attention."""


def is_allocation_symmetric() -> bool:
    return False
