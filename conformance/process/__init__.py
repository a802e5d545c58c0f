"""The process boundary: starting processes, the wire, the messages, the judge and the backend on each side of their pipes."""
