"""attention-conformance: the attention specification as data, and its runner."""
