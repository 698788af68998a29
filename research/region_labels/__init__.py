"""Region-level labels: research/region_labels/README.md."""
