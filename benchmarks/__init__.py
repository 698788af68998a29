"""Performance benchmarks (make bench, make bench-load): run from the repository root as
`python -m benchmarks.<name>`; not part of the installed distribution."""
