"""The tables every layer reads: dtypes, ops, shapes, policies, errors, a case as data, tolerances, the spec folder."""
