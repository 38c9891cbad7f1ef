"""Pictures of what the workbook builds, one topic per module (``from minimax_lab.viz import engine``).

* ``viz.roofline`` -- ceilings, rooflines and recorded benchmark results
* ``viz.pitfalls`` -- chapter 00's timing mistakes
* ``viz.step_zero`` -- chapter 01's training pictures
* ``viz.early_fusion`` -- chapter 01's setup, the checks of the model built in cells, RoPE's picture
* ``viz.flash`` / ``viz.flash_steps`` -- chapter 02's pictures and its recorded steps v1-v6
* ``viz.attention_maps`` -- attention heatmaps and image overlays (chapter 01)
* ``viz.selection`` -- MSA block-selection maps (chapters 03 and 04)
* ``viz.msa`` -- what chapter 03 (MSA, the idea) computes and draws; ``viz.msa_kernels`` /
  ``viz.msa_records`` -- chapter 04's inputs, training runs and recorded GPU numbers
* ``viz.moe`` -- expert loads and routing pictures (chapter 05)
* ``viz.tuner`` -- what the launch-config tuner measured, its pick and its noise (chapter 05)
* ``viz.kvcache`` -- page maps and hit-ratio curves (chapter 06)
* ``viz.engine`` -- the engine's days from bench records, a package of one module per topic (what
  each day buys and costs, the load sweep and preemption, decode on the roofline, a timeline, the
  quality and FP8 tables, the recorded GPU run, the H200 goals) whose names it gathers (chapter 09)
* ``viz.kernelbench`` -- the harness's path and the recorded kernel-bench scores (chapter 08)
* ``viz.live_vs_recorded`` -- what this machine measured now beside the recorded H200 numbers
* ``viz.source`` / ``viz.excerpt`` -- the package's own code shown in a chapter, with a link
* ``viz.noise`` -- comparison sentences that call a difference a win or a loss only outside its noise
* ``viz.kvstore`` -- the pool, replicas and the store's bandwidth (chapter 07)
* ``viz.widgets`` -- pickers: one picture, with ipywidgets controls wherever a frontend shows them
"""
