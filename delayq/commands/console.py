"""``delayq console``: the web console over a cluster, on a port of its own, until SIGTERM."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from delayq.errors import ConfigurationError
from delayq.signals import StopSignals

log = logging.getLogger("delayq.console")


def register(subparsers) -> None:
    console = subparsers.add_parser(
        "console", help="the web console: shards, pending, upcoming, a message's history, dead letters, series; "
                        "cancel, reschedule, replay with DELAYQ_CONSOLE_ACTIONS=true and a login")
    console.add_argument("--host", help="the address to listen on (default DELAYQ_CONSOLE_HOST, 127.0.0.1)")
    console.add_argument("--port", type=int, help="the port (default DELAYQ_CONSOLE_PORT, 8090; 0: any free one)")
    console.add_argument("--data-dir", type=Path,
                         help="the console's index of the buffer and the dead letters (default "
                              "DELAYQ_CONSOLE_DATA_DIR, else DELAYQ_DATA_DIR/console)")
    console.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from delayq.settings import Settings

    overrides = {"console_host": args.host, "console_port": args.port, "console_data_dir": args.data_dir}
    settings = Settings(**{name: value for name, value in overrides.items() if value is not None})
    from delayq.delay_service.console import ConsoleServer, check_login_settings, open_console

    check_login_settings(settings)  # a refusal is one line, before logging is set up or anything is opened
    logging.basicConfig(level=settings.log_level, force=True,
                        format="%(asctime)s %(levelname)s %(name)s [%(threadName)s] %(message)s")
    logging.getLogger("kazoo").setLevel(logging.WARNING)

    console = open_console(settings)
    try:
        try:
            server = ConsoleServer(console, settings.console_host, settings.console_port)
        except OSError as err:
            raise ConfigurationError(f"the console cannot listen on {settings.console_host}:"
                                     f"{settings.console_port} ({err.strerror or err}): give another --port "
                                     "(DELAYQ_CONSOLE_PORT) or --host, or stop what listens there") from None
        with StopSignals() as signals:
            server.start()
            log.info("console of cluster %s: http://%s:%d/console/ (actions %s)", settings.cluster,
                     _url_host(settings.console_host), server.port, "on" if settings.console_actions else "off")
            while not signals.sleep(3600):
                pass
            server.stop()
    finally:
        console.close()
    log.info("console stopped")
    return 0


def _url_host(host: str) -> str:
    """``host`` as a URL names it (an IPv6 address in brackets; a wildcard address as loopback)."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host
