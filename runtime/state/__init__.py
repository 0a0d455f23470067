"""Per-request model state: the paged KV block pools, the prefix cache, state kinds and KV dtypes."""
