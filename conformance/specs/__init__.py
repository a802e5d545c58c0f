"""Reading the spec: YAML, the schema, validation, the cache, the loader, expected failures."""
