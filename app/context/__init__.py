"""Context: the projection of the history the agent sends to its model."""
