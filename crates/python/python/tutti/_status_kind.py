"""The kinds of ``tutti.Status`` and ``tutti.ItemStatus``, as enums.

``Status.kind`` is a ``StatusKind`` and ``ItemStatus.kind`` an
``ItemStatusKind``. Each member's value is the string ``kind`` was before
they were enums, and the members are ``str``: ``status.kind == "success"``
still holds, and ``f"{kind}"``, ``str(kind)``, ``json.dumps`` and sorting
give the plain string (as ``enum.StrEnum`` does, on Python 3.9 too). New
code matches on the members: ``status.kind is StatusKind.NVME``.

The extension module (``tutti._tutti``) imports this file when it loads and
hands out these members; ``tutti`` re-exports both classes.
"""

from enum import Enum


class _StrKind(str, Enum):
    """A ``str`` enum whose ``str()`` and format are its value."""

    __str__ = str.__str__
    __format__ = str.__format__


class StatusKind(_StrKind):
    """What became of one request of a ``Runtime`` batch (``Status.kind``)."""

    SUCCESS = "success"
    """Every byte moved and every command completed with NVMe status 0."""
    NOT_ACCEPTED = "not_accepted"
    """Refused at submit; nothing was sent."""
    NVME = "nvme"
    """A drive completed a command with an error status (``sct``, ``sc``, ``dnr`` are set)."""
    TIMEOUT = "timeout"
    """Not final by the wait's deadline."""
    CONTROLLER_FATAL = "controller_fatal"
    """The drive failed (controller fatal status or gone); ``reset_drive`` it."""
    SUBMIT_FAILED = "submit_failed"
    """Accepted, but the runtime could not send it."""


class ItemStatusKind(_StrKind):
    """The outcome of one item of a ``KvStore`` batch (``ItemStatus.kind``)."""

    OK = "ok"
    """A put is durable; a remove done."""
    HIT = "hit"
    """A get loaded ``length`` bytes whose CRC32C matched."""
    MISS = "miss"
    """No object of this key."""
    CHECKSUM_MISMATCH = "checksum_mismatch"
    """The bytes read do not match the stored CRC32C: do not use them."""
    FULL = "full"
    """No free slot and nothing evictable."""
    TOO_LARGE = "too_large"
    """The value is larger than the store's objects."""
    BAD_VALUE = "bad_value"
    """The item itself is invalid (the message says why)."""
    DEVICE = "device"
    """A drive failed the I/O (``sct``/``sc``/``dnr`` when it gave an NVMe status)."""
    TIMEOUT = "timeout"
    """Not complete by the wait's deadline."""
