"""A workflow step on its node: the step task and the actions it runs."""
