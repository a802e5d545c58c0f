"""Inputs, the float64 reference, and golden data computed, stored and frozen."""
