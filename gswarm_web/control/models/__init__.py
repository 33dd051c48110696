"""Models' bookkeeping: the model commands (download, copy, move, delete) and where each model's copies are."""
