"""A kernel bench that hacks cannot fool (chapter 08).

* :mod:`.problem` -- what a problem is: a reference, seeded inputs, public validation shapes,
  held-out shape draws, a tolerance, the minimum traffic and the strong peer;
* :mod:`.problems` -- every problem by name, each defined in the module of its family:
  :mod:`.problem_ops` (softmax, RMSNorm+residual, RoPE), :mod:`.problem_msa_select` (MSA top-k
  selection), :mod:`.problem_paged_decode` (paged decode, also over an FP8 KV cache),
  :mod:`.problem_moe` (MoE token alignment, fused MoE with FP8 experts) and
  :mod:`.problem_msa_backward` (MSA's backward pass);
* :mod:`.ops` -- readable references and Triton kernels for the three small operators;
* :mod:`.harness` -- :func:`~.harness.evaluate`: named checks, held-out shapes drawn at
  evaluation time, timing against the strong peer, the reference and the workbook's best;
* :mod:`.calls` -- one call of a candidate: what the harness and the candidate's process share;
* :mod:`.integrity` -- what the judging uses, recorded before any candidate runs and put back
  after every call;
* :mod:`.isolate` -- ``evaluate(..., isolate=True)``: the candidate in its own process;
* :mod:`.naive` -- the naive harness the gallery fools;
* :mod:`.hacks` -- the hack gallery, each hack with its sources and the check that catches it;
* :mod:`.catalogue` -- the published hack families as a table (``HACKS.md``).

It measures with :mod:`minimax_lab.measure` and imports nothing of :mod:`minimax_lab.bench`; the
suite that scores every problem and writes records is ``python -m minimax_lab.bench kernelbench``
(:mod:`minimax_lab.bench.suite_kernelbench`). Each module is imported by name
(``from minimax_lab.kernelbench import harness``).
"""
