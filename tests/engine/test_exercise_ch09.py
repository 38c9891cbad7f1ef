"""Exercise 09.4 is a Triton exercise: its solution passes, and the same numbers computed in
PyTorch alone are refused for launching no kernel."""
from minimax_lab import exercises
from minimax_lab.exercises.solutions import ch09


def test_the_fp8_exercise_wants_a_triton_kernel():
    ex = exercises.get("09.4")
    assert ex.writes_triton
    assert exercises.verdict("09.4", ch09.quantize_rows_fp8).passed
    assert exercises.verdict("09.4", ch09.quantize_rows_fp8_torch).problems == [exercises.NO_TRITON]


def test_the_fp8_checker_explains_a_block_shorter_than_the_row():
    def first_block_only(x):     # a kernel whose block covers only the first 16 columns
        rows = x.reshape(-1, x.shape[-1])
        _, scale = ch09.quantize_rows_fp8(rows[:, :16])          # the scales of the first 16 values
        return ch09.quantize_rows_fp8_torch(x)[0], scale.reshape(x.shape[:-1])

    problems = exercises.verdict("09.4", first_block_only).problems
    assert problems and any("block must cover the whole row" in p for p in problems)


def test_the_fp8_checker_explains_triton_imported_before_the_interpreter_was_on():
    def compiled_on_a_cpu(x):    # what a @triton.jit kernel defined before the interpreter was switched on raises
        raise RuntimeError("Cannot call @triton.jit'd outside of the scope of a kernel")

    problems = exercises.verdict("09.4", compiled_on_a_cpu).problems
    assert len(problems) == 1 and "import minimax_lab before triton" in problems[0], problems
