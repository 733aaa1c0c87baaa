"""What a kernel does to its FP32 sums before the one rounding to the output dtype: add a
bias (one value a column of C, in the kernel's dtype) and apply an elementwise activation.

An epilogue is not a tuned parameter: records are tuned without one, and a kernel with an
epilogue is a tuned configuration with its ``epilogue`` set. Its name then ends in the
epilogue's tag (``..._sm90_bias_silu``); a kernel without one keeps its name, JSON and
source.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np


class Activation(str, Enum):
    """The activations a kernel applies after the bias, as ``torch.nn`` names them."""

    NONE = "none"
    RELU = "relu"  # max(x, 0); NaN stays NaN
    GELU = "gelu"  # x * Phi(x) with erf: nn.GELU()
    GELU_TANH = "gelu_tanh"  # the tanh approximation: nn.GELU(approximate="tanh")
    SILU = "silu"  # x * sigmoid(x): nn.SiLU()

    @classmethod
    def parse(cls, value: Activation | str | None) -> Activation:
        """An activation from its name (``None``: none), or ``ValueError`` naming those
        taken."""
        try:
            return cls(value or cls.NONE)
        except ValueError:
            raise ValueError(f"activation {value!r}: expected one of "
                             f"{', '.join(a.value for a in cls)}") from None


@dataclass(frozen=True)
class Epilogue:
    """``bias``: the kernel adds ``bias[n]`` to column ``n``; ``activation``: then applies
    this. True where it does anything."""

    bias: bool = False
    activation: Activation = Activation.NONE

    def __post_init__(self) -> None:
        object.__setattr__(self, "bias", bool(self.bias))
        object.__setattr__(self, "activation", Activation.parse(self.activation))

    def __bool__(self) -> bool:
        return self.bias or self.activation is not Activation.NONE

    @property
    def tag(self) -> str:
        """``"bias"``, ``"silu"``, ``"bias_silu"``; ``""`` for none (the JSON value)."""
        parts = (["bias"] if self.bias else []) + (
            [self.activation.value] if self.activation is not Activation.NONE else [])
        return "_".join(parts)

    @property
    def suffix(self) -> str:
        """What a kernel name ends in: ``"_" + tag``, or nothing."""
        return f"_{self.tag}" if self else ""

    @property
    def formula(self) -> str:
        """The epilogue on a sum ``x`` of column ``n``, for people."""
        x = "x + bias[n]" if self.bias else "x"
        return x if self.activation is Activation.NONE else f"{self.activation.value}({x})"

    @classmethod
    def parse(cls, value: Epilogue | str | None) -> Epilogue:
        """An epilogue from itself, its tag (``"bias_silu"``) or ``None``/``""`` (none)."""
        if isinstance(value, Epilogue):
            return value
        epilogue = _BY_TAG.get(value or "")
        if epilogue is None:
            raise ValueError(f"epilogue {value!r}: expected one of "
                             f"{', '.join(repr(t) for t in _BY_TAG if t)}")
        return epilogue

    @classmethod
    def of(cls, bias: bool, activation: Activation | str | None) -> Epilogue:
        """The epilogue of a call: a bias or not, an activation (``None``: none)."""
        return cls(bias, activation or Activation.NONE)

    @classmethod
    def split_name(cls, name: str) -> tuple[str, Epilogue]:
        """(the kernel name without its epilogue tag, the epilogue)."""
        for tag in _TAGS_LONGEST_FIRST:
            if name.endswith("_" + tag):
                return name[:-len(tag) - 1], _BY_TAG[tag]
        return name, NO_EPILOGUE


NO_EPILOGUE = Epilogue()
_BY_TAG = {e.tag: e for e in (Epilogue(b, a) for b in (False, True) for a in Activation)}
_TAGS_LONGEST_FIRST = sorted((t for t in _BY_TAG if t), key=len, reverse=True)


def apply_reference(out: Any, bias: Any, activation: Activation | str | None) -> Any:
    """``out`` (float64, NumPy or CuPy, ``M×N``) with ``bias`` (``N``, any float dtype) added
    and the activation applied, in float64."""
    xp = array_module(out)
    if bias is not None:
        out = out + xp.asarray(bias).astype(xp.float64)
    act = Activation.parse(activation)
    if act is Activation.RELU:
        return xp.where(out < 0, 0.0, out)
    if act is Activation.GELU:
        return 0.5 * out * (1.0 + _erf(out / math.sqrt(2.0), xp))
    if act is Activation.GELU_TANH:
        inner = math.sqrt(2.0 / math.pi) * (out + 0.044715 * out**3)
        return 0.5 * out * (1.0 + xp.tanh(inner))
    if act is Activation.SILU:
        return out / (1.0 + xp.exp(-out))
    return out


def _erf(x: Any, xp: Any) -> Any:
    if xp is np:
        return np.frompyfunc(math.erf, 1, 1)(x).astype(np.float64)
    return importlib.import_module("cupyx.scipy.special").erf(x)


def array_module(a: Any) -> Any:
    """CuPy for a CuPy array (imported by name: this module imports no GPU library), else
    NumPy."""
    if hasattr(a, "__cuda_array_interface__") and type(a).__module__.startswith("cupy"):
        return importlib.import_module("cupy")
    return np
