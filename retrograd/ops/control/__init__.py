"""Control flow: cond/switch_case, do, while_loop and its gradient, the per-iteration stacks loops keep, scan, TensorArray, custom gradients."""
