"""What the daemon counts and shares out: counters, the fair shares of push memory, the watchdog over
its connections."""
