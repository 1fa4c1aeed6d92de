"""Neural-network ops: softmax and dropout, convolution, pooling, norms, batch norm, attention and its head layout, losses, the fused linear cross-entropy."""
