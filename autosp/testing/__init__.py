"""Reference models and helpers shared by the tests, the demo and the benchmarks."""
