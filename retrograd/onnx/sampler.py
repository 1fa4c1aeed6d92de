"""``python -m retrograd.onnx.sampler``: the Milestone 3 contract's spelling of the command that
prints the lines an onnxruntime-only user needs. The command lives in ``retrograd.cli.onnx_sampler``;
this module only runs it (an entry point, classified with the command in tests/test_layering.py;
nothing in the library imports it)."""
from ..cli.onnx_sampler import main

if __name__ == "__main__":
    raise SystemExit(main())
