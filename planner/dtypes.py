"""What a number format is called and how many bytes one element of it takes: one table for every reader of a
profile's, a device's or a request's ``dtype`` (the cost model, the memory model, the operator model, the
executor's emulation, the profile's own check). Pure Python.

Bytes per element: IEEE 754-2008 binary16 (fp16) 2, binary32 (fp32) 4, binary64 (fp64) 8; bfloat16 2 (Google's
brain floating point, 8 exponent and 7 mantissa bits); TF32 is a tensor-core compute mode whose operands are
stored as fp32 (4; NVIDIA A100 architecture whitepaper, "TF32"); fp8 (E4M3/E5M2, Micikevicius et al. 2022) 1.
"""

from __future__ import annotations

#: the names a dtype goes by (torch's, NumPy's, the short ones) -> its canonical short name
DTYPE_ALIASES = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "half": "fp16",
                 "fp32": "fp32", "float32": "fp32", "float": "fp32", "tf32": "tf32", "fp8": "fp8",
                 "fp64": "fp64", "float64": "fp64"}
#: bytes of one element, by canonical name (module docstring)
ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "tf32": 4, "fp8": 1, "fp64": 8}
#: bytes of one element, by any name of :data:`DTYPE_ALIASES` (lower case)
DTYPE_BYTES = {name: ELEMENT_BYTES[canon] for name, canon in DTYPE_ALIASES.items()}


def canonical_dtype(dtype: str) -> str:
    """``"bfloat16"`` -> ``"bf16"`` etc.; unknown names are returned lower-cased."""
    return DTYPE_ALIASES.get(dtype.lower(), dtype.lower())


def dtype_error(dtype: str) -> str | None:
    """Why ``dtype`` is no dtype this planner knows, or None when it is one (any case)."""
    if dtype.lower() in DTYPE_ALIASES:
        return None
    return f"dtype: {dtype[:40]!r} is not one of {', '.join(DTYPE_ALIASES)}"
