"""Small shared helpers with no Django models of their own (the hardened outgoing HTTP client,
bounded JSON decoding)."""
