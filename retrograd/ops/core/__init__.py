"""The op machinery every family uses: the registry (`defop`), ONNX lowering tables, shape helpers, sub-block helpers shared by the control-flow ops, random streams of loop iterations."""
