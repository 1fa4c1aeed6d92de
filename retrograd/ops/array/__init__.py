"""Arrays: creation (data, parameters, fills), data movement (reshape, concat, slice, cast), shape ops, indexing, einsum, random ops."""
