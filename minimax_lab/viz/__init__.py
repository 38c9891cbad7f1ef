"""Pictures of what the workbook builds, one topic per module, imported by name
(``from minimax_lab.viz import roofline``). Chapter by chapter:

* ``viz.roofline`` -- rooflines: an operator's FLOPs, bytes and intensity, the ceilings measured now
  and on the H200, timings drawn against the copy ceiling (chapter 00)
* ``viz.pitfalls`` -- chapter 00's timing mistakes as a table, a picture and computed sentences
* ``viz.step_zero`` -- chapter 01's training pictures: the checkpoint's history, the step-zero
  experiment over several seeds
* ``viz.early_fusion`` -- chapter 01's setup, the checks of the model built in cells, RoPE's picture
* ``viz.attention_maps`` -- attention heatmaps, an answer's attention on the image, grounding ratios
  (chapter 01)
* ``viz.flash`` -- chapter 02's pictures: naive attention's memory, the online softmax tile by tile,
  the tiles a causal query tile visits, what changed between two kernels
* ``viz.flash_checks`` -- chapter 02's checks of its kernels against the fp32 reference, and their
  timing on a GPU
* ``viz.flash_steps`` -- chapter 02's steps v0-v6: each checked, timed live on a GPU and set beside
  the H200's records
* ``viz.lookup`` -- chapter 03's lookup task: question rows, the selections compared, the needle
  test as the context grows
* ``viz.msa`` -- what chapter 03 (MSA, the idea) computes and draws: why sparse, attention
  concentration, the indexer's recall
* ``viz.selection`` -- MSA block-selection maps, concentration and recall plots (chapters 03 and 04)
* ``viz.msa_kernels`` -- chapter 04's inputs, the ranking key, the inverted index, training runs
  through each attention
* ``viz.msa_records`` -- chapter 04's recorded GPU numbers: prefill and backward against dense
  attention, the index branch's growth, the KV-outer memory floor
* ``viz.moe`` -- chapter 05's setup, routing, expert loads and biases, FP8 weight bytes, the
  expert-parallel check and the H200 figure
* ``viz.moe_records`` -- chapter 05's H200 records with their spread, this machine's timing at
  preset ``gpu``, the provenance
* ``viz.tuner`` -- what the launch-config tuner measured for the fused MoE experts, and its pick
  (chapter 05)
* ``viz.kvcache`` -- chapter 06's fragmentation, page maps, workloads, hit-ratio curves, fetch or
  recompute, and the recorded paged decode
* ``viz.block_books`` -- chapter 06's block manager built in cells, checked against the package's
* ``viz.paged_steps`` -- the paged-decode kernels chapter 06 grows, timed on a GPU beside the
  package's kernel and two peers
* ``viz.prefix_cost`` -- what prefix caching costs and buys per turn of an agent's task (chapter 06)
* ``viz.kvstore`` -- chapter 07's setup, the pool, a pool value, the router's prices, the fault
  drill, the recorded link rates and the break-even picture
* ``viz.kvstore_scale`` -- chapter 07's replay over 1-64 replicas, against Mooncake's published
  numbers
* ``viz.kvstore_eviction`` -- chapter 07's eviction policies: hit ratio and share of the
  LRU -> Belady gap on the recorded traces
* ``viz.kernelbench`` -- chapter 08's harness path, hack gallery, the two modes and the recorded
  scores
* ``viz.engine`` -- chapter 09's pictures and tables from the engine's bench records, a package of
  one module per topic whose public names it gathers: ``records`` (which record is a day's, what
  compares), ``days`` (what each day's switch buys), ``load`` (the load and preemption sweeps),
  ``prices`` (each day's step prices), ``ledger`` (each switch under load, the FP8 verdict),
  ``decode_roofline`` (each day's decode step on the roofline), ``timeline`` (a simulated run step
  by step), ``gpu_story`` (the recorded GPU runs in one figure), ``quality`` (each day's logits
  against day 0's), ``fp8_breakdown`` (what FP8 storage saves and where it moves the logits),
  ``targets`` (the H200 goals, met or not), ``setup`` (the chapter's setup call) and
  ``provenance`` (where its numbers come from)

Shared by the chapters:

* ``viz.live_vs_recorded`` -- what this machine measured now beside the recorded H200 numbers
* ``viz.noise`` -- sentences that call a difference a win or a loss only outside its noise
* ``viz.source`` / ``viz.excerpt`` -- the package's own code, whole or a few lines, with a link
* ``viz.widgets`` -- pickers: one picture, with ipywidgets controls wherever a frontend shows them
"""
