"""A backend as the suite sees it: finding it, what it declares, calling it, its time limit."""
