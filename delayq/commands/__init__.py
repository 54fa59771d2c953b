"""The ``delayq`` sub-commands, one module per part; each module has ``register(subparsers)``."""
