"""What tests share: a real Kafka's topics, delayq's processes, clusters of nodes, stand-ins, traffic, wire cases.

Imported as ``from support.kafka_testing import ...``: tests/conftest.py puts tests/ first on sys.path
(pytest's default "prepend" import mode, tests/ having no __init__.py), so ``support`` is a top-level package.
"""
