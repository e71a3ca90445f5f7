"""Serving-engine integrations of tutti's KV cache (docs/engines.md).

- ``tutti.integrations.transformers``: a prefix cache for Hugging Face
  transformers ``generate`` (needs torch and transformers).
"""
