"""Libraries shared by every Teto part: the wire contracts and the runtime plumbing."""
