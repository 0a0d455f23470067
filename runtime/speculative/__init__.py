"""Speculative decoding's host side: drafters (what proposes tokens) and acceptance statistics.

The verification itself runs on device (`ember.compiler.kernels.speculative`); how a row with drafts becomes
a segment of an ordinary step is written down in docs/speculative.md.
"""
