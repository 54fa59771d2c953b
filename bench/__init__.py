"""delayq.bench: the benchmark suite behind ``delayq bench`` (figures in BENCHMARKS.md)."""
