"""Serving connections: the daemon's connection shell, admission, the read, push and admin services and
what they run (input gates, push sessions, subpartition readers)."""
