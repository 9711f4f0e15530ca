"""Off-heap buffer pool (global and local pools, reference-counted buffers) and the chunks that carry them."""

from .chunk import Chunk
from .pool import FRAME, LOAD, Buffer, GlobalPool, LocalPool, PoolExhausted

__all__ = ["FRAME", "LOAD", "Buffer", "Chunk", "GlobalPool", "LocalPool", "PoolExhausted"]
