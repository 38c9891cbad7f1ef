"""``python -m minimax_lab.bench``: see :mod:`minimax_lab.bench.cli`."""
import sys

from minimax_lab.bench.cli import main

sys.exit(main())
