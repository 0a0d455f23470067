"""From a checkpoint to a runnable model: files, weights, dimensions, the generated plan, tokenizers."""
