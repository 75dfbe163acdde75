"""Cross-cutting code: settings, database, errors, logging."""
