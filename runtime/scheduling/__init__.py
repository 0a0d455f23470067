"""Which requests run in the next step, with which KV slots; run-ahead steps; the request bookkeeping."""
