"""The node worker itself: its start and stop (lifecycle), heartbeat, the restore of what a crash left."""
