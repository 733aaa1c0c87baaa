"""Reading SASS lines (cuobjdump listings, Nsight Compute source pages)."""

from __future__ import annotations


def opcode(instruction: str) -> str:
    """``FFMA`` of ``@!P0 FFMA.FTZ R1, R2, R3, R1 ;``: the opcode without predicate or
    modifiers."""
    words = instruction.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""
