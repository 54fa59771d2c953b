"""Errors a user can act on. The command line prints them as one line; the message says what to do."""


class DelayqError(Exception):
    """Base of delayq's user-facing errors."""


class ConfigurationError(DelayqError, ValueError):
    """Something delayq needs is missing or set wrong (a topic, a setting); the message names the fix."""


class UnavailableError(DelayqError):
    """Kafka or ZooKeeper did not answer; the message names the address tried."""


class UsageError(DelayqError, ValueError):
    """An argument a user gave is not valid (a duration, a time, an id); the message names it and the form wanted."""
