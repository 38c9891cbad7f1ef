"""``python -m minimax_lab.kernelbench``: see :mod:`minimax_lab.kernelbench.suite`."""
import sys

from minimax_lab.kernelbench.suite import main

sys.exit(main())
