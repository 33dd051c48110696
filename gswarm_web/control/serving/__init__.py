"""Served models: the gateway's replica table, its pick rule and a request's attempts at replicas, live counts, cold
starts, the measures of each request, the state of services and replicas, the reconciler, the autoscaler and its
policy, the engines' own metrics."""
