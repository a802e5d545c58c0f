"""A run's records, and its reports: JSON, Markdown, the matrix in HTML."""
