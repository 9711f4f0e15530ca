"""Fair shares of push memory: a floor every writer is owed, caps per connection and per application.

Push memory is the pool less its read reserve. Every open map output holds a
push window there: its guaranteed floor (`push_min` segments) and, while memory
allows, more (up to `push-window`). Credit once granted cannot be taken back, so
a client that opens map outputs and never pushes keeps their windows for as long
as it likes; without limits one tenant could hold every window and the next
writer would wait for credit, with no error, until its timeout.

So windows are counted three ways, per connection, per application (over all its
connections) and in all, as floors and extras (segments beyond the floor):

- A map output is admitted only if its floor fits in the floors its connection,
  its application (each: a share of push memory) and the daemon (half of push
  memory, `FLOOR_SHARE`) may hold; otherwise it is refused at open with
  LIMIT_EXCEEDED naming the bound.
- A window grows beyond its floor only while its connection and its application
  hold less than their share, floors and extras together, and all extras less
  than the other half of push memory.

Replica pushes (a peer daemon's link, PROTOCOL.md §12.4) count against their
application's share and the daemon's, not against the link's (`conn` is None):
every tenant's copies from one primary share that link, and one tenant filling it
within its own share on the primary would otherwise take the copies of the others.

Floors and extras thus never hold more than push memory together, so the floor of
an admitted writer is never taken by other windows: it comes at once, or after
stored data spilled (back-pressure that ends, or a STORAGE_ERROR when it cannot,
see `spill.push_memory_error`). A connection or an application holds at most
its share once its windows stop growing; extras it got while it had few map
outputs open still count until they are used, so at worst (all its extras taken
first, then all its floors) it holds twice its share, never more.
"""

from __future__ import annotations

from ...config import DaemonConfig, format_size
from ...protocol.errors import LimitExceeded

#: share of push memory all writers' floors may take together; windows beyond their floors get the rest
FLOOR_SHARE = 0.5


class Share:
    """Segments of push windows one holder (a connection, an application, the daemon) has."""

    __slots__ = ("extras", "floors")

    def __init__(self) -> None:
        self.floors = 0
        self.extras = 0

    @property
    def total(self) -> int:
        return self.floors + self.extras


class PushShares:
    def __init__(self, config: DaemonConfig, usable: int) -> None:
        #: segments pushes may use (the pool less its read reserve)
        self.usable = usable
        self.config = config
        self.floor = config.push_min
        # Each bound admits at least one writer, or a small pool could take no push at all.
        self.per_connection = max(self.floor, int(config.push_share_per_connection * usable))
        self.per_application = max(self.floor, int(config.push_share_per_application * usable))
        self.floor_limit = max(self.floor, int(FLOOR_SHARE * usable))
        self.extra_limit = max(0, usable - self.floor_limit)
        self.all = Share()
        self.apps: dict[str, Share] = {}

    def check(self, conn: Share | None, app: str) -> None:
        """Raise LIMIT_EXCEEDED, saying which bound, if a new map output's floor would not fit (`reserve`
        takes it); `conn` None: a replica push, bounded by its application's share only."""
        floor, cfg = self.floor, self.config
        app_share = self.apps.get(app)
        app_floors = app_share.floors if app_share is not None else 0
        if conn is not None and conn.floors + floor > self.per_connection:
            raise LimitExceeded(
                f"push-share-per-connection ({cfg.push_share_per_connection:g}) reached: the map outputs open on "
                f"this connection are guaranteed {conn.floors} of the {self.per_connection} segments of push "
                "memory it may hold; commit or abort some first"
            )
        if app_floors + floor > self.per_application:
            raise LimitExceeded(
                f"push-share-per-application ({cfg.push_share_per_application:g}) reached: the map outputs of "
                f"{app!r} open on this daemon are guaranteed {app_floors} of the {self.per_application} segments "
                "of push memory one application may hold; commit or abort some first"
            )
        if self.all.floors + floor > self.floor_limit:
            raise LimitExceeded(
                f"push memory for guaranteed windows is taken: the map outputs open on this daemon are guaranteed "
                f"{self.all.floors} of its {self.floor_limit} segments (half of what pool-size "
                f"{format_size(cfg.pool_size)} leaves for pushes); retry when some are committed"
            )

    def reserve(self, conn: Share | None, app: str) -> Share:
        """Take a new map output's floor (after `check`). Returns the application's share, to hand back to
        `charge` and `release`."""
        app_share = self.apps.get(app)
        if app_share is None:
            app_share = self.apps[app] = Share()
        for share in self._holders(conn, app_share):
            share.floors += self.floor
        return app_share

    def room(self, conn: Share | None, app: Share) -> int:
        """How many segments beyond its floor a window of `conn` and `app` may take now."""
        room = min(self.per_application - app.total, self.extra_limit - self.all.extras)
        if conn is not None:
            room = min(room, self.per_connection - conn.total)
        return max(0, room)

    def charge(self, conn: Share | None, app: Share, extras: int) -> None:
        """A window's segments beyond its floor changed by `extras` (negative: given back)."""
        for share in self._holders(conn, app):
            share.extras += extras

    def release(self, conn: Share | None, app: str, app_share: Share, extras: int) -> None:
        """A map output ended: its floor and the `extras` still charged to it are free again."""
        for share in self._holders(conn, app_share):
            share.floors -= self.floor
            share.extras -= extras
        if app_share.total == 0 and self.apps.get(app) is app_share:
            del self.apps[app]

    def _holders(self, conn: Share | None, app: Share) -> tuple[Share, ...]:
        return (app, self.all) if conn is None else (conn, app, self.all)
