"""Timestamp every line of a command's output and report the longest silences.

    some-command 2>&1 | python3 dev/quickstart/stamp.py LOG

Writes `<seconds since start> <line>` to LOG (lines end at \\n or \\r, so progress bars count), then the
total time and the 15 longest gaps between consecutive lines: the README promises no step silent > 5 s.
"""

from __future__ import annotations

import sys
import time


def main(log_path: str) -> int:
    start = last = time.monotonic()
    gaps: list[tuple[float, float, str]] = []
    pending = b""
    with open(log_path, "w") as log:
        while chunk := sys.stdin.buffer.read1(65536):
            pending += chunk
            while (end := _line_end(pending)) >= 0:
                line, pending = pending[:end].decode(errors="replace"), pending[end + 1 :]
                now = time.monotonic()
                gaps.append((now - last, now - start, line[:160]))
                last = now
                log.write(f"{now - start:8.1f} {line}\n")
                log.flush()
        log.write(f"END {time.monotonic() - start:.1f}\n")
        log.write("LONGEST SILENCES (the gap before the line):\n")
        for gap, at, line in sorted(gaps, reverse=True)[:15]:
            log.write(f"  {gap:6.1f}s before t={at:.1f}: {line}\n")
    return 0


def _line_end(buf: bytes) -> int:
    ends = [i for i in (buf.find(b"\n"), buf.find(b"\r")) if i >= 0]
    return min(ends) if ends else -1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
