"""What the tensor-core families that give a block one index set share (``mma``:
``mma.sync``; ``wgmma``: Hopper ``wgmma``): the configuration's common parameters, rules
and name (``config``), the weight layout (``prepare``), the launch plan (``launch``), the
model's pipeline, memory and ranking (``model``) and the family methods that follow from
them (``family``).

Not a family itself (the registry holds none of it): the families build on it, and each
counts its files among its own sources (``Family.source_files``).
"""

from pathlib import Path

SOURCES = tuple(sorted(Path(__file__).resolve().parent.glob("*.py")))
