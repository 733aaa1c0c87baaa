"""Compiling generated source: ``nvcc`` (export, dry runs, the CPU tests; no GPU needed)
and NVRTC through CuPy's cache (launching, and the tuner's compile processes)."""
