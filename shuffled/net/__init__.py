"""asyncio shell pieces shared by the daemon and the Python client."""
