"""Nodes: their state from heartbeats, devices named by address, the fleet as the scheduler sees it, live placement
of `auto` devices and bare tiers."""
