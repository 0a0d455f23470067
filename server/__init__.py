"""The HTTP server: one Sanic process owns the engine; every protocol (OpenAI, Anthropic, Ollama,
LM Studio, Ember's own routes) translates its requests into the one engine request type."""
