"""The original gswarm's commands, kept compatible: `gsprof` (the profiler's) and `gsmodel` (the model manager's)
run gswarm's commands with the arguments and file layouts the original documents show; the commands of its gRPC era
print the one line to type now and exit 2. gswarm's own commands are the folder above."""
