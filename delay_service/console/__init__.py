"""delayq.delay_service.console: the web console over a cluster (issue 34; docs/DESIGN.md, "The console").

Records exchanged between its sides: :mod:`.records`. The app: :func:`create_app` (Flask, under
``/console``), :func:`open_console` (the app with its index started: a :class:`ConsoleApp`, whose
``close()`` stops them), served by ``delayq console`` (:class:`ConsoleServer`) or on a node's own HTTP
port (:func:`node_app`, each request through :func:`serve`).

The names load on first use (PEP 562): a node imports :mod:`.records` without Flask, which only
the console extra brings.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from delayq.settings import Settings

    from .app import ConsoleApp, create_app, open_console
    from .auth import check_login_settings
    from .wsgi import ConsoleServer, serve

_HOMES = {"create_app": ".app", "open_console": ".app", "ConsoleApp": ".app", "serve": ".wsgi",
          "ConsoleServer": ".wsgi", "check_login_settings": ".auth"}
__all__ = ["ConsoleApp", "ConsoleServer", "check_login_settings", "create_app", "node_app", "open_console", "serve"]


def node_app(settings: Settings) -> ConsoleApp:
    """The console a node serves under /console on its HTTP port (DELAYQ_CONSOLE=true): :func:`open_console`.

    The node hands each /console request to :func:`serve` with it, and calls its ``close()`` when it stops.

    Raises:
        MissingExtra: Flask is not installed (delayq's ``console`` extra).
        ConfigurationError: actions on without a login, or half a login.
        ConsoleIndexError: the index's folder cannot be opened.
    """
    from delayq.extras import require

    require("console", "DELAYQ_CONSOLE=true (the console on the node's HTTP port)")
    from .app import open_console

    return open_console(settings)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
