"""Which part of delayq needs which pip extra (pyproject.toml), and the one line a user sees when it is missing.

``pip install delayq`` is the producer side only; a command or call that needs more checks its
extra first (:func:`require`), before it imports anything of it, so a missing one is one line
naming what to install, never a ``ModuleNotFoundError`` traceback from deep inside.
"""

from __future__ import annotations

import importlib.util

from delayq.errors import DelayqError

# extra -> the modules it brings that delayq imports (pyproject.toml's [project.optional-dependencies]).
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "zookeeper": ("kazoo",),
    "node": ("kazoo", "rocksdict", "prometheus_client"),
    "reconcile": ("pyspark", "pyarrow", "pandas", "matplotlib"),
    "console": ("kazoo", "rocksdict", "prometheus_client", "flask"),
    "dev": ("kazoo", "rocksdict", "prometheus_client", "pyspark", "pyarrow", "pandas", "matplotlib", "flask", "redis"),
    "quix": ("quixstreams",),
}

# `delayq COMMAND` -> the extra it needs; the others (produce, cancel, get) run on the bare install.
COMMAND_EXTRAS: dict[str, str] = {
    "node": "node", "init": "node", "status": "node", "upgrade": "node", "acls": "node",
    "reconcile": "reconcile", "console": "console",
    "dev": "dev", "demo": "dev", "bench": "dev", "soak": "dev",
}


class MissingExtra(DelayqError, ImportError):
    """What was asked needs a pip extra of delayq that is not installed; the message names it and the fix."""


def missing(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here."""
    return [name for name in EXTRA_MODULES[extra] if importlib.util.find_spec(name) is None]


def require(extra: str, what: str, *, instead: str = "") -> None:
    """Return if ``extra`` is installed; else raise :class:`MissingExtra` saying ``what`` needs it.

    Args:
        extra: a key of :data:`EXTRA_MODULES`.
        what: what needs it, as the user asked for it (``"delayq node"``).
        instead: another way out, appended to the fix (``"or set DELAYQ_LOOKUP_URLS"``).

    Raises:
        MissingExtra: a module of ``extra`` is not installed.
    """
    absent = missing(extra)
    if absent:
        names = absent[0] if len(absent) == 1 else f"{', '.join(absent[:-1])} and {absent[-1]}"
        verb = "is" if len(absent) == 1 else "are"
        raise MissingExtra(f"{what} needs delayq's {extra!r} extra ({names} {verb} not installed): "
                           f"pip install 'delayq[{extra}]'{', ' + instead if instead else ''}")


def require_for_command(command: str) -> None:
    """:func:`require` the extra of ``delayq COMMAND``, if it needs one."""
    extra = COMMAND_EXTRAS.get(command)
    if extra is not None:
        require(extra, "this command")
