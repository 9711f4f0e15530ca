"""The wire protocol and flow-control state machines, free of IO.

Nothing in this package imports asyncio or touches a socket (a test enforces it):
bytes go in and frames come out, actions go in and bytes come out. The daemon's
asyncio shell and the clients drive these objects.
"""
