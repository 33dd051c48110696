"""What a node measures of its GPUs: NVML, the 1 Hz sampler, and the spill that keeps frames through an outage."""
