"""delayq.delay_service.console: the web console over a cluster (issue 34; docs/DESIGN.md, "The console").

Records exchanged between its sides: :mod:`.records`.
"""
