"""Pictures of what the workbook builds, one topic per module (``from minimax_lab.viz import engine``).

* ``viz.roofline`` -- ceilings, rooflines and recorded benchmark results
* ``viz.attention_maps`` -- attention heatmaps and image overlays (notebook 01)
* ``viz.selection`` -- MSA block-selection maps (notebook 03)
* ``viz.moe`` -- expert loads and routing pictures (notebook 04)
* ``viz.kvcache`` -- page maps and hit-ratio curves (notebook 05)
* ``viz.engine`` -- the engine's day-by-day waterfall and quality table from bench records (notebook 07)
* ``viz.live_vs_recorded`` -- what this machine measured now beside the recorded H200 numbers
* ``viz.widgets`` -- pickers: one picture, with ipywidgets controls wherever a frontend shows them
"""
