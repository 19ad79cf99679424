"""The training loop around the pipeline: the AMP step, the StallMonitor and the loader tuner."""
