"""What every part of the bridge shares: the exit codes, BridgeError (a
problem-file defect, answered as {"error": ...}), short renderings of an
exception, and the answer channel (JSON lines on the caller's stdout)."""

import json
import traceback


EXIT_BAD_PROBLEM = 2


EXIT_INTERNAL = 3


# Reductions over huge outputs go chunk by chunk so that a 4 GiB output does
# not need 4 GiB of temporaries on top of itself.
CHUNK_ELEMENTS = 1 << 24


class BridgeError(Exception):
    """A problem-file defect, reported to the caller as {"error": ...}."""

    def __init__(self, kind, message, detail=""):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.detail = detail


def _traceback_tail(exc, max_lines=12, max_chars=2000):
    lines = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip().splitlines()
    tail = "\n".join(lines[-max_lines:])
    return tail[-max_chars:]


def _first_line(exc, limit=500):
    text = str(exc).strip()
    line = text.splitlines()[0] if text else ""
    return line[:limit]


def _human(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1024.0


_ANSWER = [None]  # the caller's stdout (main): JSON lines only


def _answer_line(obj):
    """One JSON line on the caller's stdout, before the final answer (main's emit)."""
    _ANSWER[0].write(json.dumps(obj, allow_nan=False) + "\n")
    _ANSWER[0].flush()
