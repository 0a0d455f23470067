"""A request's sampling settings, their packing for the on-device sampler, and guided decoding."""
