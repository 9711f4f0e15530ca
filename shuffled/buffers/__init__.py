"""Off-heap buffer pool (global and local pools, reference-counted buffers) and the chunks that carry them."""

from .chunk import Chunk
from .pool import Buffer, GlobalPool, LocalPool, PoolExhausted

__all__ = ["Buffer", "Chunk", "GlobalPool", "LocalPool", "PoolExhausted"]
