"""A kernel bench that hacks cannot fool (notebook 06).

* :mod:`.problems` -- what to compute: references, seeded inputs, public validation shapes,
  held-out shape draws, tolerances, minimum traffic (softmax, RMSNorm+residual, RoPE, MSA top-k
  selection, paged decode, paged decode over an FP8 KV cache, MoE token alignment, fused MoE with
  FP8 experts, and the open problem: MSA's backward pass);
* :mod:`.ops` -- readable references and Triton kernels for the three small operators;
* :mod:`.harness` -- :func:`~.harness.evaluate`: named checks, held-out shapes drawn at
  evaluation time, timing against the reference and the workbook's best;
* :mod:`.isolate` -- ``evaluate(..., isolate=True)``: the candidate in its own process;
* :mod:`.naive` -- the naive harness the gallery fools;
* :mod:`.hacks` -- the hack gallery, each hack with its sources and the check that catches it;
* :mod:`.catalogue` -- the published hack families as a table (``HACKS.md``);
* :mod:`.suite` -- ``python -m minimax_lab.kernelbench``: score everything, write records.

Each module is imported by name (``from minimax_lab.kernelbench import harness``).
"""
