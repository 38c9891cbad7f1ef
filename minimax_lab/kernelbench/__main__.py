"""``python -m minimax_lab.kernelbench ARGS``: the same as ``python -m minimax_lab.bench kernelbench ARGS``."""
import sys

from minimax_lab.bench.cli import main

if {"-h", "--help"} & set(sys.argv[1:]):
    print("python -m minimax_lab.kernelbench ARGS runs `python -m minimax_lab.bench kernelbench ARGS`; "
          "its usage and options:\n")
sys.exit(main(["kernelbench", *sys.argv[1:]]))
