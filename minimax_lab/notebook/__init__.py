"""What the chapters use behind the scenes, so a learner reads the lesson and not the plumbing.

* :mod:`.words` -- comparison words computed from the numbers they compare ("2.3x faster",
  "about the same"), so prose beside an output cannot contradict it;
* :mod:`.recorded` -- the recorded GPU benchmark records a chapter draws, looked up by name;
* :mod:`.runner` -- runs a notebook's code cells in order where Jupyter is absent
  (``python -m minimax_lab.notebook.runner``; ``make gpu-check`` uses it).
"""
