"""`python -m crossprobe.service.cli`: the `crossprobe` command."""
from crossprobe.service.cli import app

app()
