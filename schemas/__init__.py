"""Message contracts of every gpulens topic: typed models, codec, topic registry, JSON Schemas."""
