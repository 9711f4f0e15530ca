"""The daemon's asyncio shell: connections, reads, pushes, peers, store."""
