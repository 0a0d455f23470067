"""Integer-sum batch-invariant matmul over GGUF Q4_K / Q6_K weights: README.md."""
