"""Elementwise math: arithmetic and comparisons, activations, special functions, logic, trigonometry, rounding division."""
