"""What the experiments that print a benchmark's table share: writing it to the terminal and to
its result file at once (decode_gemms, bfloat16_gemms).

Not a script (``test_experiments`` skips names that start with ``_``); the experiments import it
from their own folder.
"""

from __future__ import annotations

import io


class Tee(io.TextIOBase):
    """Writes to several streams at once (the table on the terminal and in the result file)."""

    def __init__(self, *streams):
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()
