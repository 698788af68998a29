"""T-EMDE shape, budget and variants: research/temde/README.md."""
