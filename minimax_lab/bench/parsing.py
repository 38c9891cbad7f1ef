"""The bench's command lines answer a mistake with one line, not a usage block or a traceback."""
from __future__ import annotations

import argparse
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    """argparse answering a mistake with one line on stderr (``prog: error: ...``) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")
