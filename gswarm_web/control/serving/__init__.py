"""Served models: the gateway's replica table and live counts, cold starts, the measures of each request, the state
of services and replicas, the reconciler, the autoscaler and its policy, the engines' own metrics."""
