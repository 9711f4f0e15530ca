"""Off-heap buffer pool (global and local pools, reference-counted buffers)."""

from .pool import Buffer, GlobalPool, LocalPool, PoolExhausted

__all__ = ["Buffer", "GlobalPool", "LocalPool", "PoolExhausted"]
