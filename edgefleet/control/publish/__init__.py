"""Publishing bundles on the broker: content-addressed chunks, signed offers, retention."""
