"""The pure engine: token counting, the model catalog, budget maths, message
conversion and context building. No database, no HTTP, no clock."""
