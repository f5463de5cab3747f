"""The vision stage: the client's camera sampled into the vision model."""
