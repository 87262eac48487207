"""SwapNet weight streaming: run a model inside a memory budget (see docs/swap.md).

weight_file (checksummed, 4 KiB-aligned weights; gemm_split cuts big FC weights) -> swapin
(O_DIRECT reads into one anonymous region) -> residency (the window: read-ahead, pinning, drops)
-> streamed (the planned engine over that region) -> control (the Engine's budget policy).
No ROS imports.
"""
