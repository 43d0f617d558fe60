"""The fleet as a benchmark farm: devices of a profile measure candidate bundles for the converter."""
