"""The engine API (submit, stream, abort), its loop thread, and what turns sampled tokens into outputs."""
