"""What keeps a run going: checkpoints and their state, fingerprints, devices, distribution, tracking, sinks."""
