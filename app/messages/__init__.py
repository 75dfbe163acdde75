"""Messages: the stored history, appended in batches and paged back."""
