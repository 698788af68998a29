"""Research experiments, one package per topic (each with a README.md): run from the repository root as
`python -m research.<topic>.<script>`; not part of the installed distribution. Write-ups: docs/research/."""
