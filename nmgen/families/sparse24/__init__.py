"""What the sparse-tensor-core families share: the weight as the sparse operand of the
hardware's 2:4 MMAs (``prepare``: values and metadata, one device layout for both) and
which patterns always fit 2:4 (``worst_group_count``)."""
