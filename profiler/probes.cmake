# Memory probes. Defines accumplan_probes when LibTorch is found (CPU counting allocator always;
# CUDA caching-allocator probe with ACCUMPLAN_HAS_CUDA; CUPTI with ACCUMPLAN_HAS_CUPTI).
