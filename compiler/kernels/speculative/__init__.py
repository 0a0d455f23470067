"""Lossless verification of drafted tokens (speculative decoding): greedy verify and rejection sampling."""
