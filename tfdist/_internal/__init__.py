"""Private helpers of tfdist (and of the trainer that ships with it): not public API."""
