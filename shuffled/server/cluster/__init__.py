"""The daemons as a cluster: peer connections, membership and placement, replication and the drain's
hand-over. It serves no connection itself: the serving side calls it."""
