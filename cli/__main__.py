"""`python -m crossprobe.cli`: the `crossprobe` command."""

from crossprobe.cli import app

app()
