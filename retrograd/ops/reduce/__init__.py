"""Reductions: sums, means, products, logsumexp; extrema (max/min/argmax/topk); cumulative sums and products."""
