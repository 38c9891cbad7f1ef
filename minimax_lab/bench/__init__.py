"""The benchmarks built on the measuring core (:mod:`minimax_lab.measure`): suites, their command
line, the report, the launch-config tuner and the peers.

* the suites -- ``suite_<topic>.py``, registered in :mod:`.suites` and run by ``python -m
  minimax_lab.bench SUITE`` (:mod:`.cli`); each checks before it times and writes records; a suite
  of several topics keeps them in ``suite_<topic>_<part>.py`` beside it (``suite_msa_decode``,
  ``suite_engine_load``, ...);
* :mod:`.report` -- every record on one page; :mod:`.tune` -- the launch-config tuner;
* :mod:`.peers`, ``peer_sglang_*.py`` -- the SGLang kernels timed beside ours (``tools/fetch_peers.py``
  downloads them);
* :mod:`.kvstore_sims` -- the KV store's simulations, recorded.

Each module is imported by name; this package re-exports nothing.
"""
