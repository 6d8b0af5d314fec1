"""The decoder as a gRPC service: engine loop thread, Redis heartbeat, thin servicer."""
