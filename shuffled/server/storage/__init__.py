"""Where committed data lives below the buffer pool: today the object store (`objects.py`), later the spill
files and the tiering between memory, local disk and objects, one module each."""
