"""Judging one test: the context a check sees, the comparison, statistics, properties, every expectation, the verdict."""
