"""Tokenizers (tokenizer.json, GGUF vocabularies), chat templates, and a checkpoint's prompting setup."""
