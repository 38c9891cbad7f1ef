"""minimax-lab stand-in for ``sglang.srt.batch_invariant_ops``: batch-invariant mode is off."""


def is_batch_invariant_mode_enabled() -> bool:
    return False
