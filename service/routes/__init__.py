"""The HTTP routes, one module per resource: search, explain, items, indexes (with admin and health), page, clip."""
