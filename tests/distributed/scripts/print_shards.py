"""Prints this rank's shard of range(6) and the error for 5 examples; run by test_comm.py."""
import sys

import numpy as np

import retrograd as rg

try:
    rg.distributed.shard(np.arange(5))
except rg.FeedError as exc:
    error = f"{type(exc).__name__}: {str(exc)[:14]}"
sys.stdout.write(f"rank {rg.distributed.rank()} of {rg.distributed.world_size()}: "
                 f"{rg.distributed.shard(np.arange(6)).tolist()} | {error}\n")
