"""The label bridge experiments: research/bridge/README.md."""
