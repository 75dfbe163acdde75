"""The history as a tree: the tree of a session, navigation, forks, branch summaries."""
