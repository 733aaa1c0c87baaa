"""``nmgen bench``: nmgen against cuBLAS on the device, and the tables and plots of its
results."""
