"""Models and bundles made for the tests: the real-model corpus, small models with known behaviour."""
