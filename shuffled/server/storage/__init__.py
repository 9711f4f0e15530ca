"""What the daemon holds and where: the store (shuffles, map outputs, subpartitions), the data dir, the
spiller that moves data between them, and the object store (`objects.py`), later a tier of its own. No
part of it knows a connection."""
