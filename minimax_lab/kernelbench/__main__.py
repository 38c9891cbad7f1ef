"""``python -m minimax_lab.kernelbench ARGS``: the same as ``python -m minimax_lab.bench kernelbench ARGS``."""
import sys

from minimax_lab.bench.cli import main

sys.exit(main(["kernelbench", *sys.argv[1:]]))
