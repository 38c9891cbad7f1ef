"""A kernel bench that hacks cannot fool (notebook 06) -- work in progress.

Built so far: :mod:`.ops` (readable references and Triton kernels for row softmax, RMSNorm with
residual and RoPE) and :mod:`.problems` (the problem set with seeded inputs, public validation
shapes, held-out shape draws and tolerances). The harness, the naive harness and the hack gallery
are not written yet.
"""
