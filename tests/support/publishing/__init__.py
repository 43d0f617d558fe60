"""Publishing a bundle with its signed offer first, so that devices fetch while its parts go out."""
