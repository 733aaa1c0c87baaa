"""Running kernels on the GPU: launch plans turned into driver launches, streams, CUDA
graphs, timing and checks. With ``nmgen.compiler.nvrtc`` the only code that needs CuPy (and,
for torch callers, PyTorch), imported when a kernel runs."""
