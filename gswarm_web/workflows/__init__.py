"""Workflows: the YAML document, its validation, the DAG compiler and the dispatcher that runs it."""
