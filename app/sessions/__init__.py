"""Sessions: the unit of history, with their model window and live accounting."""
