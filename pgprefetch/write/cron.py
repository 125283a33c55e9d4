"""Which epochs one run of ``dump`` writes, and which it deletes after: ``--epoch(s)``, ``--ahead``, ``--keep``.

Cron runs ``dump --ahead K --keep N`` every few minutes, beside training runs that record what they read
(:mod:`pgprefetch.store.consumers`); the same run from Python is :func:`pgprefetch.dump` with ``ahead=`` and
``keep=``. A :class:`Schedule` is validated once, when it is made; :meth:`Schedule.due` decides, before an
epoch is dumped, everything that can refuse the run (another config's store, a mistyped consumer) and the
epochs to write; :meth:`Schedule.tidy` deletes what ``--keep`` allows once they are written.
"""

from __future__ import annotations

from dataclasses import dataclass

from pgprefetch.config.model import Config
from pgprefetch.errors import ConfigError
from pgprefetch.store.base import Store
from pgprefetch.store.consumers import check_name
from pgprefetch.store.maintenance import PruneResult, ahead_window, check_consumer, prune, register_consumer
from pgprefetch.write.pipeline import check_same_config


@dataclass(frozen=True)
class Due:
    """The epochs a run writes, and for ``--ahead`` the window it looked at (what "nothing to do" names)."""

    epochs: list[int]
    window: range | None = None


@dataclass(frozen=True)
class Schedule:
    """One run's epochs: exactly one of ``epochs`` (given) and ``ahead``; ``keep``, ``consumer`` and ``new`` beside."""

    epochs: tuple[int, ...] | None = None
    ahead: int | None = None
    keep: int | None = None
    consumer: str | None = None
    new: bool = False  # register ``consumer`` as a run that has read nothing yet
    force: bool = False

    def __post_init__(self) -> None:
        if (self.epochs is None) == (self.ahead is None):
            raise ConfigError("give one of --epoch N, --epochs A-B or --ahead K")
        if self.ahead is not None and self.ahead < 1:
            raise ConfigError(f"--ahead: expected at least 1 epoch, got {self.ahead}")
        if self.keep is not None and self.keep < 0:
            raise ConfigError(f"--keep: expected 0 or more epochs, got {self.keep}")
        if self.consumer is not None and self.ahead is None and self.keep is None:
            raise ConfigError("--consumer needs --ahead K or --keep N: it says whose epoch they go by")
        if self.new and self.consumer is None:
            raise ConfigError("--new needs --consumer NAME: the training run to register")
        if self.consumer is not None:
            check_name(self.consumer)

    def due(self, cfg: Config, store: Store) -> Due:
        """The epochs to write into ``store``, after refusing what would make the run wrong.

        Raises:
            ConfigError: the store holds another config's epochs (unless ``force``), or ``consumer`` names
                no recorded run where others exist (a typo: the closest name is given).
        """
        if not self.force:
            check_same_config(store, cfg)
        if self.consumer is not None:
            if self.new:
                register_consumer(store, self.consumer)
            check_consumer(store, self.consumer)
        if self.ahead is None:
            assert self.epochs is not None, "given epochs or --ahead (checked when made)"
            return Due(list(self.epochs))
        window = ahead_window(store, self.ahead, self.consumer)
        return Due([e for e in window if not store.is_complete(e)], window)

    def tidy(self, store: Store) -> PruneResult | None:
        """``--keep``: delete the complete epochs no recorded run may read any more (None without it)."""
        return None if self.keep is None else prune(store, self.keep, self.consumer)
