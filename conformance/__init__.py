"""attention-conformance: the attention specification as data, and its runner.

Importing this package imports nothing else: the pytest plugin that every pytest run of
an environment loads starts here, and must cost nothing until it is asked for.
"""

__version__ = "0.2.0"
