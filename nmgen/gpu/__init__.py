"""The GPU boundary: everything that needs CuPy and a device lives in this package.

Its modules import CuPy only when called, so ``import nmgen`` works without a GPU.
"""
